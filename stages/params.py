"""Loading and checking ``params.yaml``: each stage's section as its settings object.

Each stage calls :func:`load_settings` with its own settings class (``recallk/settings/<section>.py``,
where each field carries its default, its rule and its doc). Every problem it can see (unknown
sections and keys anywhere in the file, each with a "did you mean", wrong types or values in its own
section) is reported at once, in one :class:`~recallk.errors.InputError`, before any work starts.
The file is read as DVC reads it, and refused where a YAML 1.1 reader would read it otherwise
(:func:`stages.params_yaml.read_params`).

A stage imports its own settings module, whose rules and defaults it runs: that module is one of
its DVC deps (dvc.yaml). The other sections' modules are imported by name
(:func:`recallk.settings.base.section_class`) for their key names only, so that a typo anywhere in
the file is caught by whichever stage runs first; their rules never run and their values never
reach the stage, so they are no deps of it, just as their params sections are not (``params:
[<own section>]``): an encode-only rule change re-runs encode alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recallk.errors import InputError, clip, did_you_mean
from recallk.settings import SECTIONS
from recallk.settings.base import checked, from_mapping, section_class
from stages.params_yaml import read_params


def validate_section(params: Any, section: str) -> dict[str, Any]:
    """Validate ``params[section]`` against its settings class; return it with defaults filled (the values
    as params.yaml writes them). Unknown sections and keys elsewhere in ``params`` are reported too."""
    errors: list[str] = []
    if not isinstance(params, dict):
        raise InputError("params.yaml must be a mapping with the sections split, encode and score.")
    for top in params:
        if top not in SECTIONS:
            errors.append(
                f"`{clip(str(top))}` is not a known params section; remove it or fix the name."
                f"{did_you_mean(top, SECTIONS)}"
                f" Known sections: {', '.join(SECTIONS)}."
            )
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
    return validate_section(read_params(p), section)


def load_settings(cls: type, path: str | Path = "params.yaml") -> Any:
    """The section of ``path`` that ``cls`` (one of :data:`SECTIONS`' classes) stands for, checked, as a
    ``cls`` object."""
    section = {class_name: name for name, class_name in SECTIONS.items()}[cls.__name__]
    return from_mapping(cls, load_section(section, path))
