"""The declared schema of ``params.yaml`` and its validation.

Each stage calls :func:`load_section` for its own section. Every problem it can
see (unknown sections and keys anywhere in the file, wrong types or values in its
own section) is reported at once, in one :class:`~stages.common.UserError`, before any work starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from stages.common import UserError, did_you_mean


@dataclass(frozen=True)
class Param:
    """One scalar or list param: its default and a checker returning an error or None."""

    default: Any
    check: Callable[[Any], str | None]
    help: str = ""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if not _is_int(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = f" between {lo} and {hi}" if hi is not None else (f" >= {lo}" if lo is not None else "")
            return f"must be an integer{rng}. Got {v!r} instead."
        return None

    return check


def _fraction(v: Any) -> str | None:
    if not (_is_int(v) or isinstance(v, float)) or not (0.0 <= v <= 1.0) or math.isnan(v):
        return f"must be a number between 0 and 1. Got {v!r} instead."
    return None


def positive_number(v: Any) -> str | None:
    """A finite number above 0 (bools rejected); a YAML string such as ``1e3`` gets a hint."""
    if not (_is_int(v) or isinstance(v, (float, np.floating))) or not v > 0 or math.isinf(v):
        hint = ""
        if isinstance(v, str):
            try:
                number = float(v)
                hint = (f" YAML reads {v} as text: write it with a dot, e.g. {number:.1f}."
                        if math.isfinite(number) and number > 0 else "")
            except ValueError:
                pass
        return f"must be a positive number. Got {v!r} instead.{hint}"
    return None


def _choice(*options: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if v not in options:
            return f"must be one of {', '.join(options)}. Got {v!r} instead.{did_you_mean(v, options)}"
        return None

    return check


def _path(optional: bool) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if v is None and optional:
            return None
        if not isinstance(v, str) or not v.strip():
            return f"must be a non-empty path string{' or null' if optional else ''}. Got {v!r} instead."
        return None

    return check


def _name(v: Any) -> str | None:
    if not isinstance(v, str) or not v:
        return f"must be a non-empty string. Got {v!r} instead."
    return None


#: Largest K: ranks are int64, and a K beyond every gallery means the whole gallery anyway.
MAX_K = 2**62


def check_ks(v: Any) -> str | None:
    """``ks`` must be a non-empty list of distinct positive integers (at most :data:`MAX_K`)."""
    if not isinstance(v, list) or not v or not all(
            isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k > 0 for k in v):
        return f"must be positive integers. Got {v!r} instead."
    if max(v) > MAX_K:
        return f"must be at most 2**62 (any K beyond the gallery size counts the whole gallery). Got {v!r} instead."
    if len(set(v)) != len(v):
        return f"must not repeat a value. Got {v!r} instead."
    return None


METRIC_NAMES = ("recall", "precision", "r_precision", "map@r", "map", "mrr")


def check_metric_names(v: Any) -> str | None:
    """``metrics`` must be a non-empty list of distinct names from :data:`METRIC_NAMES`."""
    if not isinstance(v, list) or not v or not all(isinstance(m, str) for m in v):
        return f"must be a non-empty list of names from {', '.join(METRIC_NAMES)}. Got {v!r} instead."
    bad = [m for m in v if m not in METRIC_NAMES]
    if bad:
        return (f"must name metrics from {', '.join(METRIC_NAMES)}. Got {bad[0]!r} instead."
                f"{did_you_mean(bad[0], METRIC_NAMES)}")
    if len(set(v)) != len(v):
        return f"must not repeat a metric. Got {v!r} instead."
    return None


def _columns(v: Any) -> str | None:
    if not isinstance(v, list) or not all(isinstance(c, str) and c for c in v) or len(set(v)) != len(v):
        return f"must be a list of distinct catalog column names (e.g. [camera]) or []. Got {v!r} instead."
    return None


def _open_fraction(v: Any) -> str | None:
    if not isinstance(v, float) or not 0.0 < v < 1.0:
        return f"must be a number strictly between 0 and 1, such as 0.95. Got {v!r} instead."
    return None


SCHEMA: dict[str, dict[str, Any]] = {
    "split": {
        "data_root": Param("data/digits", _path(False), "folder holding the images"),
        "csv": Param(None, _path(True), "manifest CSV inside data_root, or null for one folder per label"),
        "on_bad_image": Param("error", _choice("error", "skip"), "unreadable images: stop, or skip and report"),
        "strategy": Param("class_disjoint", _choice("class_disjoint", "per_class", "given")),
        "protocol": Param("query_gallery", _choice("query_gallery", "leave_one_out")),
        "seed": Param(0, _int(0)),
        "fractions": {
            "train": Param(0.5, _fraction),
            "val": Param(0.25, _fraction),
            "gallery": Param(0.25, _fraction),
        },
    },
    "encode": {
        "backbone": Param("pixels", _name),
        "batch_size": Param(64, _int(1, 65536)),
        "num_workers": Param(2, _int(1, 256)),
        "pixels": {"resolution": Param(16, _int(1, 1024))},
        "precomputed": {"path": Param(None, _path(True)), "ids": Param(None, _path(True))},
    },
    "score": {
        "ks": Param([1, 5, 10], check_ks),
        "metrics": Param(list(METRIC_NAMES), check_metric_names, "metrics to report; recall/precision per K"),
        "max_memory_mb": Param(512, positive_number),
        "backend": Param("numpy", _choice("numpy", "faiss")),
        "exclude_same": Param([], _columns, "catalog columns whose shared value excludes a gallery item"),
        "whiten": Param("none", _choice("none", "pca")),
        "bootstrap": {
            "resamples": Param(1000, _int(0, 1_000_000), "0 turns the confidence intervals off"),
            "confidence": Param(0.95, _open_fraction),
            "seed": Param(0, _int(0)),
        },
    },
}


def _validate(spec: dict[str, Any], given: Any, prefix: str, errors: list[str],
              check_values: bool = True) -> dict[str, Any]:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        errors.append(f"`{prefix}` must be a mapping of keys to values. Got {given!r} instead.")
        given = {}
    for key in given:
        if key not in spec:
            errors.append(
                f"`{prefix}.{key}` is not a known param; remove it or fix the name.{did_you_mean(key, spec)}"
                f" Known keys: {', '.join(spec)}."
            )
    out: dict[str, Any] = {}
    for key, sub in spec.items():
        name = f"{prefix}.{key}"
        if isinstance(sub, dict):
            out[key] = _validate(sub, given.get(key), name, errors, check_values)
            continue
        value = given.get(key, sub.default)
        problem = sub.check(value) if check_values else None
        if problem:
            errors.append(f"`{name}` {problem}")
        out[key] = value
    return out


def validate_section(params: Any, section: str) -> dict[str, Any]:
    """Validate ``params[section]`` against :data:`SCHEMA`; return it with defaults filled."""
    errors: list[str] = []
    if not isinstance(params, dict):
        raise UserError("params.yaml must be a mapping with the sections split, encode and score.")
    for top in params:
        if top not in SCHEMA:
            errors.append(
                f"`{top}` is not a known params section; remove it or fix the name.{did_you_mean(top, SCHEMA)}"
                f" Known sections: {', '.join(SCHEMA)}."
            )
    for other in SCHEMA:
        if other != section and other in params:
            _validate(SCHEMA[other], params[other], other, errors, check_values=False)
    values = _validate(SCHEMA[section], params.get(section), section, errors)
    if section == "split" and all(_fraction(v) is None for v in values["fractions"].values()):
        total = sum(values["fractions"].values())
        if not math.isclose(total, 1.0, abs_tol=1e-9):
            errors.append(
                f"`split.fractions` train + val + gallery must sum to 1. Got {total:g} instead."
            )
    if errors:
        raise UserError("invalid params.yaml:\n  - " + "\n  - ".join(errors))
    return values


def load_section(section: str, path: str | Path = "params.yaml") -> dict[str, Any]:
    """Read ``path`` and return its validated ``section``."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p} not found; run from the project root, where params.yaml lives.")
    try:
        params = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise UserError(f"{p} is not valid YAML ({exc}); fix the syntax.") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{p} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8.") from None
    return validate_section(params, section)
