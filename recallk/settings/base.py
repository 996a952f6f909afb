"""The field helper of every settings class (a default, a rule and the sentence ``docs/params.md`` shows),
and what is built from the fields: a params mapping checked against a class, the object made from it,
and the object written back as params values.

A settings class is a frozen dataclass whose fields are made by :func:`setting`; a field whose default is
another settings class is a sub-section (``split.fractions``). A class may define ``problem(self)``: a
rule across its fields (``split.fractions`` must sum to 1), run once every field passed its own rule.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterator

from recallk.checks import ray_address_problem
from recallk.errors import clip, did_you_mean, quote

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


def setting_rule(cls: type, name: str) -> Rule:
    """The rule of ``cls``'s field ``name`` (one that passes everything when the field has none)."""
    rule = next(f for f in dataclasses.fields(cls) if f.name == name).metadata.get("rule")
    return rule if rule is not None else (lambda value: None)


def ray_address(doc: str) -> Any:
    """The ``address`` field of a ``ray`` sub-section (``encode.ray``, ``score.ray``): a cluster address or null
    (``$RAY_ADDRESS``, else a local cluster), by the one rule :func:`recallk.checks.ray_address_problem`."""
    return setting(None, ray_address_problem, doc)


def section_of(f: dataclasses.Field) -> type | None:
    """The settings class of a sub-section field (its default), or None for a value field."""
    sub = f.default_factory
    return sub if isinstance(sub, type) and dataclasses.is_dataclass(sub) else None


def plain(value: Any) -> Any:
    """``value`` as params.yaml writes it: a settings object as a mapping, a tuple as a list."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    return value


def default_of(f: dataclasses.Field) -> Any:
    """A value field's default as params.yaml writes it (:func:`plain`)."""
    return plain(f.default)


def as_params(settings: Any) -> dict[str, Any]:
    """A settings object as the params mapping it stands for (the inverse of :func:`from_mapping`)."""
    return plain(settings)


def defaults(cls: type) -> dict[str, Any]:
    """Every default of ``cls`` and its sub-sections, as params.yaml writes them."""
    return as_params(cls())


def fields(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
    """``(dotted name, field)`` of every value field of ``cls``, sub-sections walked in field order."""
    for f in dataclasses.fields(cls):
        sub = section_of(f)
        if sub is None:
            yield f"{prefix}{f.name}", f
        else:
            yield from fields(sub, f"{prefix}{f.name}.")


def from_mapping(cls: type, values: dict[str, Any]) -> Any:
    """A settings object of ``cls`` from a params mapping already checked (:func:`checked`): sub-sections
    become their settings classes and lists become tuples; a key the mapping lacks keeps its default."""
    kwargs: dict[str, Any] = {}
    hints = {f.name: f for f in dataclasses.fields(cls)}
    for name, value in values.items():
        sub = section_of(hints[name])
        if sub is not None and isinstance(value, dict):
            value = from_mapping(sub, value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)


def unknown_key(prefix: str, key: Any, known: list[str], renamed: dict[str, str] | None = None) -> str:
    """The sentence for a key ``prefix.key`` that is not among ``known``, with a "did you mean"; a key of an
    earlier release (``renamed``: old name -> new name, a settings class's ``RENAMED``) names its new name."""
    if renamed and key in renamed:
        return (f"`{prefix}.{key}` was renamed to `{prefix}.{renamed[key]}`; rename the key in params.yaml "
                "(its values are unchanged).")
    return (f"`{prefix}.{clip(str(key))}` is not a known param; remove it or fix the name."
            f"{did_you_mean(key, known)} Known keys: {', '.join(known)}.")


def checked(cls: type, given: Any, prefix: str, errors: list[str], check_values: bool = True) -> dict[str, Any]:
    """``given`` (a params mapping, or None for all defaults) checked against ``cls``; every problem is
    appended to ``errors`` as one sentence naming the dotted param (``prefix`` names ``cls``'s section; ``""``:
    the bare field names, as the Python API's arguments are named).

    Unknown keys are named with a "did you mean" and the known keys; with ``check_values`` each value
    also meets its field's rule, and then the class's ``problem()`` (a rule across fields). Returns the
    mapping with every default filled in (the values as given, defaults as params.yaml writes them)."""
    if given is None:
        given = {}
    if not isinstance(given, dict):
        errors.append(f"`{prefix}` must be a mapping of keys to values. Got {quote(given)} instead.")
        given = {}
    known = [f.name for f in dataclasses.fields(cls)]
    for key in given:
        if key not in known:
            errors.append(unknown_key(prefix, key, known, getattr(cls, "RENAMED", None)))
    out: dict[str, Any] = {}
    fields_ok = True
    for f in dataclasses.fields(cls):
        name = f"{prefix}.{f.name}" if prefix else f.name
        sub = section_of(f)
        if sub is not None:
            out[f.name] = checked(sub, given.get(f.name), name, errors, check_values)
            continue
        value = given.get(f.name, default_of(f))
        problem = field_problem(f, value, name) if check_values else None
        if problem:
            errors.append(problem)
            fields_ok = False
        out[f.name] = value
    if check_values and fields_ok and getattr(cls, "problem", None) is not None:
        problem = whole_problem(from_mapping(cls, out), prefix)
        if problem:
            errors.append(problem)
    return out


def field_problem(f: dataclasses.Field, value: Any, name: str) -> str | None:
    """The sentence for ``value`` breaking the rule of the value field ``f`` (the param ``name``), or None."""
    rule = f.metadata.get("rule")
    problem = rule(value) if rule is not None else None
    return f"`{name}` {problem}" if problem else None


def whole_problem(obj: Any, prefix: str) -> str | None:
    """The sentence for ``obj`` (its section named ``prefix``; ``""``: its class) breaking its class's rule across
    fields (``problem()``), or None."""
    whole = getattr(obj, "problem", None)
    problem = whole() if whole is not None else None
    if not problem:
        return None
    return f"`{prefix}` {problem}" if prefix else f"{type(obj).__name__} {problem}"


def with_values(obj: Any, given: dict[str, Any], errors: list[str]) -> Any:
    """``obj``, a settings object whose fields meet their rules (its class's defaults, say), with the value fields
    of ``given`` in place (lists as tuples): what :func:`from_mapping` of :func:`checked` gives for ``obj``'s params
    with ``given`` in them, with the same sentences in ``errors`` (prefix ``""``: the bare field names, as the
    Python API's arguments are named), at the cost of the given fields' rules alone: a training loop's call
    checks its few arguments, not every field of the section again. None when a problem was found."""
    by_name = _fields_by_name(type(obj))
    problems = []  # (field's place, sentence): in field order, as checked() writes them
    for name, value in given.items():
        if name in by_name:
            place, f = by_name[name]
            problem = field_problem(f, value, name)
            if problem:
                problems.append((place, problem))
    if problems:
        errors.extend(problem for _, problem in sorted(problems))
        return None
    out = _replaced(obj, {name: tuple(v) if isinstance(v, list) else v for name, v in given.items()})
    problem = whole_problem(out, "")
    if problem:
        errors.append(problem)
        return None
    return out


@functools.lru_cache(maxsize=None)
def _fields_by_name(cls: type) -> dict[str, tuple[int, dataclasses.Field]]:
    """Each field of ``cls`` by name, with its place (memoized per class: a class's fields never change; the dict is
    only read)."""
    return {f.name: (i, f) for i, f in enumerate(dataclasses.fields(cls))}


@functools.lru_cache(maxsize=None)
def _plain_copy_names(cls: type) -> frozenset[str]:
    """The fields of a ``cls`` object that a copy may replace in its ``__dict__``: every field, when the dataclass's
    own ``__init__`` sets each as given and nothing runs after it (no ``__post_init__``, no slots); else none
    (memoized per class)."""
    plain = cls.__dataclass_params__.init and not hasattr(cls, "__post_init__") and not hasattr(cls, "__slots__") \
        and all(f.init for f in dataclasses.fields(cls))
    return frozenset(f.name for f in dataclasses.fields(cls)) if plain else frozenset()


def _replaced(obj: Any, changes: dict[str, Any]) -> Any:
    """``dataclasses.replace(obj, **changes)``, without calling ``__init__`` again where a copy of the object's
    ``__dict__`` is the same (:func:`_plain_copy_names`): for a section of many fields ``__init__`` costs more than
    the rest of the check."""
    if not changes.keys() <= _plain_copy_names(type(obj)):
        return dataclasses.replace(obj, **changes)
    out = object.__new__(type(obj))
    out.__dict__.update(obj.__dict__)
    for name, value in changes.items():
        object.__setattr__(out, name, value)
    return out
