"""The library's error types.

Every problem with the caller's data, files or arguments raises :class:`InputError`
(a :class:`ValueError`), with one message that names the argument, file or row and
says how to fix it. The stage scripts print such a message without a traceback and
exit 2; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
import errno
from typing import Any, Sequence

# ------------------------------------------------------------------ text helpers of every message


def did_you_mean(word: Any, choices: Sequence[str]) -> str:
    """``" Did you mean `x`?"`` for a close match among ``choices``, else ``""``."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" Did you mean `{close[0]}`?" if close else ""


#: Longest quoted value in a message: a 10 MB cell or param is cut, not printed whole.
QUOTE_LIMIT = 200


def clip(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` cut to its first ``limit`` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters in all)"


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for a message, at most ``limit`` characters of it (:func:`clip`); every param value
    and CSV cell a message quotes goes through this."""
    return clip(repr(value), limit)


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


#: errno -> what to do about it, for :func:`os_advice`.
_OS_ADVICE = {
    errno.ENOSPC: "free disk space",
    errno.EDQUOT: "free disk space (the disk quota is reached)",
    errno.EFBIG: "raise the file-size limit (`ulimit -f`) or free disk space",
    errno.EACCES: "fix the permissions of the file or its folder",
    errno.EPERM: "fix the permissions of the file or its folder",
    errno.EROFS: "the file system is read-only: write to another folder",
    errno.ENAMETOOLONG: "the path or one of its names is too long for the file system: shorten it",
    errno.ENOENT: "a folder on the path does not exist: create it or fix the path",
    errno.ENOTDIR: "a part of the path is a file, not a folder: fix the path",
    errno.EISDIR: "the path is a folder, not a file: fix the path",
}


def os_advice(exc: OSError) -> str:
    """What to do about an OS error, by its errno (a too-long name is not a full disk); a generic list
    when the errno says nothing more."""
    return _OS_ADVICE.get(exc.errno, "free disk space, raise the file-size limit (`ulimit -f`) or fix permissions")


def sqlite_advice(exc: Exception) -> str:
    """What to do about an SQLite error of the embedding cache, by its code (full disk, read-only, cannot open)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return {13: "free disk space or raise the file-size limit (`ulimit -f`)",  # SQLITE_FULL
            8: "the cache file or its folder is read-only: fix its permissions",  # SQLITE_READONLY
            3: "fix the permissions of the cache file or its folder",  # SQLITE_PERM
            14: "the cache file cannot be opened: fix its folder's permissions or the path",  # SQLITE_CANTOPEN
            }.get(code & 0xFF if isinstance(code, int) else None,
                  "free disk space, fix the cache file's permissions, or delete the cache file")
