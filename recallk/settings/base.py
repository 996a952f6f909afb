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


def from_mapping(cls: type, values: dict[str, Any]) -> Any:
    """A settings object of ``cls`` from a params mapping already checked (``stages/params.py``): sub-sections
    become their settings classes and lists become tuples; a key the mapping lacks keeps its default."""
    kwargs: dict[str, Any] = {}
    hints = {f.name: f for f in dataclasses.fields(cls)}
    for name, value in values.items():
        f = hints[name]
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if isinstance(sub, type) and dataclasses.is_dataclass(sub) and isinstance(value, dict):
            value = from_mapping(sub, value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)
