"""The library's error types.

Every problem with the caller's data, files or arguments raises :class:`InputError`
(a :class:`ValueError`), with one message that names the argument, file or row and
says how to fix it. The stage scripts print such a message without a traceback and
exit 2; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input the caller must fix (data, files, arguments or params)."""


class MissingExtraError(InputError):
    """An optional dependency (an ``extra`` of the package) is needed and not installed.

    Raised only where the optional import itself fails, so an unrelated ImportError
    inside a module stays a bug with its traceback.
    """

    def __init__(self, what: str, extra: str, package: str, exc: ImportError) -> None:
        missing = f"cannot import {exc.name!r}" if exc.name else str(exc)
        super().__init__(f"{what} needs the {extra} extra: pip install -c constraints.txt -e '.[{extra}]' "
                         f"({package}; {missing}).")
        self.extra = extra
