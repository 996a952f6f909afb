"""The field helper of every settings class: a default, a rule and the sentence ``docs/params.md`` shows."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

#: A rule: the value -> what is wrong with it (a sentence the caller prefixes with the param's name), or None.
Rule = Callable[[Any], "str | None"]


def setting(default: Any, rule: Rule | None = None, doc: str = "") -> Any:
    """A dataclass field with its ``default``, its ``rule`` and its ``doc`` (kept in the field's metadata).

    A list default is stored as a tuple (the classes are frozen and hashable); a settings-class default
    (a sub-section) is built by its ``default_factory``."""
    metadata = {"rule": rule, "doc": doc}
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=default, metadata=metadata)
    if isinstance(default, list):
        default = tuple(default)
    return dataclasses.field(default=default, metadata=metadata)
