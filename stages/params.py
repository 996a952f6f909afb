"""Loading and checking ``params.yaml``: each stage's section as its settings object.

Each stage calls :func:`load_settings` with its own settings class (``recallk/<wing>/settings.py``,
where each field carries its default, its rule and its doc). Every problem it can see (unknown
sections and keys anywhere in the file, each with a "did you mean", wrong types or values in its own
section) is reported at once, in one :class:`~recallk.errors.InputError`, before any work starts.
The file is read as DVC reads it, and refused where a YAML 1.1 reader would read it otherwise
(:func:`stages.params_yaml.read_params`).

A stage imports its own settings module, whose rules and defaults it runs: that module is one of
its DVC deps (dvc.yaml). The other sections' modules are imported by name
(:func:`section_class`) for their key names only, so that a typo anywhere in
the file is caught by whichever stage runs first; their rules never run and their values never
reach the stage, so they are no deps of it, just as their params sections are not (``params:
[<own section>]``): an encode-only rule change re-runs encode alone.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, Iterator

import yaml

from recallk.errors import InputError, clip, did_you_mean
from recallk.settings.base import checked, from_mapping, section_of, unknown_key
from stages.params_yaml import MAX_PROBLEMS, read_params

#: The sections of ``params.yaml``, in file order: each one's settings class, ``module:class`` in its stage's
#: wing (imported by name when asked for, :func:`section_class`: a stage imports only its own section's module).
SECTIONS = {"split": "recallk.data.settings:SplitSettings", "encode": "recallk.encode.settings:EncodeSettings",
            "score": "recallk.score.settings:ScoreSettings", "index": "recallk.index.settings:IndexSettings"}


def section_class(section: str) -> type:
    """The settings class of the params section ``section`` (one of :data:`SECTIONS`), its module imported by
    name: importing this module never imports every section's."""
    module, name = SECTIONS[section].split(":")
    return getattr(importlib.import_module(module), name)


def unknown_section(top: Any) -> str:
    """The sentence for a top-level key that is no params section, with a "did you mean"."""
    return (f"`{clip(str(top))}` is not a known params section; remove it or fix the name."
            f"{did_you_mean(top, SECTIONS)} Known sections: {', '.join(SECTIONS)}.")


def _key_text(node: yaml.Node) -> str:
    return node.value if isinstance(node, yaml.ScalarNode) else f"<a {node.id} as a key>"


def _unknown_keys(cls: type, node: yaml.Node, prefix: str) -> Iterator[tuple[str, Any, list[str], Any]]:
    """``(prefix, key, known keys, the class's renamed keys)`` of every key of the mapping ``node`` that ``cls``
    lacks, sub-sections walked where they are mappings; values are never looked at."""
    if not isinstance(node, yaml.MappingNode):
        return  # not a mapping: validate_section says so
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key_node, value_node in node.value:
        key = _key_text(key_node)
        if key not in fields:
            yield prefix, key, list(fields), getattr(cls, "RENAMED", None)
        elif (sub := section_of(fields[key])) is not None:
            yield from _unknown_keys(sub, value_node, f"{prefix}.{key}")


def unknown_keys(document: yaml.Node) -> list[str]:
    """The unknown sections and keys of a params document (its composed YAML nodes), at most
    :data:`~stages.params_yaml.MAX_PROBLEMS` sentences and then a count; each is removed from the document,
    so nothing under it is walked afterwards (an unknown section may hold anything)."""
    if not isinstance(document, yaml.MappingNode):
        return []
    problems: list[str] = []
    count = 0
    unknown_nodes: set[int] = set()
    for key_node, value_node in document.value:
        top = _key_text(key_node)
        found = ([(None, top, None, None)] if top not in SECTIONS
                 else _unknown_keys(section_class(top), value_node, top))
        for prefix, key, known, renamed in found:
            count += 1
            if len(problems) < MAX_PROBLEMS:
                problems.append(unknown_section(key) if prefix is None else unknown_key(prefix, key, known, renamed))
        if top not in SECTIONS:
            unknown_nodes.add(id(key_node))
    _prune(document, unknown_nodes)
    if count > len(problems):
        problems.append(f"... and {count - len(problems):,} more unknown keys")
    return problems


def _prune(document: yaml.MappingNode, top_level: set[int]) -> None:
    """Drop the unknown sections (``top_level``: ids of their key nodes) and unknown keys from the nodes."""
    document.value = [(k, v) for k, v in document.value if id(k) not in top_level]
    for key_node, value_node in document.value:
        _prune_keys(section_class(_key_text(key_node)), value_node)


def _prune_keys(cls: type, node: yaml.Node) -> None:
    if not isinstance(node, yaml.MappingNode):
        return
    fields = {f.name: f for f in dataclasses.fields(cls)}
    node.value = [(k, v) for k, v in node.value if _key_text(k) in fields]
    for key_node, value_node in node.value:
        if (sub := section_of(fields[_key_text(key_node)])) is not None:
            _prune_keys(sub, value_node)


def known_only(params: Any) -> Any:
    """``params`` (as read) without its unknown sections and keys (already reported by :func:`unknown_keys`)."""
    if not isinstance(params, dict):
        return params
    return {top: _known_values(section_class(top), value) for top, value in params.items() if top in SECTIONS}


def _known_values(cls: type, value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out = {}
    for key, v in value.items():
        if key in fields:
            sub = section_of(fields[key])
            out[key] = _known_values(sub, v) if sub is not None else v
    return out


def validate_section(params: Any, section: str, problems: list[str] | None = None) -> dict[str, Any]:
    """Validate ``params[section]`` against its settings class; return it with defaults filled (the values
    as params.yaml writes them). Unknown sections and keys elsewhere in ``params`` are reported too, after
    ``problems`` (found earlier, e.g. by :func:`unknown_keys`), in the same message."""
    errors: list[str] = list(problems or [])
    if not isinstance(params, dict):
        raise InputError("params.yaml must be a mapping with the sections split, encode and score.")
    for top in params:
        if top not in SECTIONS:
            errors.append(unknown_section(top))
    for other in SECTIONS:
        if other != section and other in params:
            checked(section_class(other), params[other], other, errors, check_values=False)
    values = checked(section_class(section), params.get(section), section, errors)
    if errors:
        raise InputError("invalid params.yaml:\n  - " + "\n  - ".join(errors))
    return values


def load_section(section: str, path: str | Path = "params.yaml") -> dict[str, Any]:
    """Read ``path`` (:func:`~stages.params_yaml.read_params`) and return its validated ``section`` as a
    mapping (tests and tools; a stage calls :func:`load_settings`)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p} not found; run from the project root, where params.yaml lives.")
    unknown: list[str] = []
    params = read_params(p, lambda document: unknown.extend(unknown_keys(document)))
    return validate_section(known_only(params) if unknown else params, section, unknown)


def load_settings(cls: type, path: str | Path = "params.yaml") -> Any:
    """The section of ``path`` that ``cls`` (one of :data:`SECTIONS`' classes) stands for, checked, as a
    ``cls`` object."""
    section = {spec.split(":")[1]: name for name, spec in SECTIONS.items()}[cls.__name__]
    return from_mapping(cls, load_section(section, path))
