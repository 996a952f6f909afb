"""The declared schema of ``params.yaml`` and its validation.

Each stage calls :func:`load_section` for its own section. Every problem it can
see (unknown sections and keys anywhere in the file, wrong types or values in its
own section) is reported at once, in one :class:`~recallk.errors.InputError`, before
any work starts. The rules shared with the library's arguments (``ks``, ``metrics``,
``max_memory_mb``, ``backend``, ``exclude_same``) come from :mod:`recallk.checks`.

The file is read as DVC reads it (:func:`read_params`: ruamel.yaml, YAML 1.2), so a stage
runs with the values dvc.lock records; a repeated key (DVC refuses it) and a value that a
YAML 1.1 reader such as PyYAML reads otherwise (``010``, ``yes``/``off``, ``1:30``, ``1e3``)
are refused, naming the key and how to write it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import yaml
from ruamel.yaml import YAML
from ruamel.yaml import YAMLError as RuamelYAMLError

from recallk.checks import BACKENDS, choice_problem, columns_problem, is_int, ks_problem, positive_number_problem
from recallk.score.registry import METRIC_NAMES, metrics_problem
from recallk.errors import clip, did_you_mean, quote
from recallk.errors import InputError


@dataclass(frozen=True)
class Param:
    """One scalar or list param: its default and a checker returning an error or None."""

    default: Any
    check: Callable[[Any], str | None]


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if not is_int(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = f" between {lo} and {hi}" if hi is not None else (f" >= {lo}" if lo is not None else "")
            return f"must be an integer{rng}. Got {quote(v)} instead."
        return None

    return check


def _fraction(v: Any) -> str | None:
    if not (is_int(v) or isinstance(v, float)) or not (0.0 <= v <= 1.0) or math.isnan(v):
        return f"must be a number between 0 and 1. Got {quote(v)} instead."
    return None


def _choice(*options: str) -> Callable[[Any], str | None]:
    return partial(choice_problem, options=options)


def _path(optional: bool) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if v is None and optional:
            return None
        if not isinstance(v, str) or not v.strip():
            return f"must be a non-empty path string{' or null' if optional else ''}. Got {quote(v)} instead."
        return None

    return check


def _name(v: Any) -> str | None:
    if not isinstance(v, str) or not v:
        return f"must be a non-empty string. Got {quote(v)} instead."
    return None


def _optional_name(v: Any) -> str | None:
    return None if v is None else _name(v)


def _optional(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    def optional(v: Any) -> str | None:
        problem = None if v is None else check(v)
        return problem and problem.replace(". Got", " or null. Got", 1)

    return optional


def _channels(v: Any) -> str | None:
    if (not isinstance(v, list) or len(v) != 3
            or not all((is_int(x) or isinstance(x, float)) and math.isfinite(x) for x in v)):
        return f"must be a list of 3 numbers (R, G, B), such as [0.485, 0.456, 0.406]. Got {quote(v)} instead."
    return None


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"must be true or false. Got {quote(v)} instead."


def _open_fraction(v: Any) -> str | None:
    if not isinstance(v, float) or not 0.0 < v < 1.0:
        return f"must be a number strictly between 0 and 1, such as 0.95. Got {quote(v)} instead."
    return None


def _cosine(v: Any) -> str | None:
    if v is None:
        return None
    if not (is_int(v) or isinstance(v, float)) or not 0.0 < v <= 1.0:
        return f"must be a cosine above 0 and at most 1, such as 0.95, or null (off). Got {quote(v)} instead."
    return None


def _address(v: Any) -> str | None:
    if v is None or (isinstance(v, str) and v.strip()):
        return None
    return (f"must be a Ray cluster address such as \"ray://head:10001\" or \"auto\", or null (RAY_ADDRESS, else a "
            f"local cluster). Got {quote(v)} instead.")


def _gpus(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 64 or math.isnan(v):
        return (f"must be a number of GPUs per actor between 0 and 64 (0: CPU only; 0.5: two actors per GPU). "
                f"Got {quote(v)} instead.")
    return None


#: The default of every encode param naming a file DVC tracks (recallk.encode.base.NO_FILE; not imported, so
#: the params schema stays free of the encode code).
NO_FILE = "recallk/encode/no_file.txt"


def _tracked_path(v: Any) -> str | None:
    """A path param the encode stage depends on in dvc.yaml (``${encode.<...>}``)."""
    if not isinstance(v, str) or not v.strip():
        return (f"must be a path: the encode stage depends on it in dvc.yaml, so that replacing the file re-runs "
                f"encode, and DVC cannot track null. Keep {NO_FILE} (none) when it is not used. "
                f"Got {quote(v)} instead.")
    if v.startswith("local-dir:"):
        return (f"is a path DVC tracks, and DVC reads {quote(v)} as a file of that name; write the folder "
                f"itself, {quote(v[len('local-dir:'):])} (a folder is read as a local-dir: config and weights).")
    return None
#: The placeholders of the hostile-input work, one file since (kept as names: tests and docs use them).
PRECOMPUTED_PLACEHOLDER = IDS_PLACEHOLDER = MODULE_PLACEHOLDER = NO_FILE


#: Largest `split.near_duplicates.max_distance` (of 64 bits): beyond it unrelated photos match and the search slows.
MAX_HAMMING = 16

SCHEMA: dict[str, dict[str, Any]] = {
    "split": {
        "data_root": Param("data/digits", _path(False)),
        "csv": Param(None, _path(True)),
        "on_bad_image": Param("error", _choice("error", "skip")),
        "strategy": Param("class_disjoint", _choice("class_disjoint", "per_class", "given")),
        "protocol": Param("query_gallery", _choice("query_gallery", "leave_one_out")),
        "seed": Param(0, _int(0)),
        "images": Param("auto", _choice("auto", "files", "none")),
        "near_duplicates": {
            "policy": Param("report", _choice("report", "group", "error")),
            "max_distance": Param(10, _int(0, MAX_HAMMING)),
        },
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
        # where the cache misses are encoded: this process, or Ray Data actors (the ray extra; docs/scale.md)
        "engine": Param("local", _choice("local", "ray")),
        "ray": {"address": Param(None, _address), "concurrency": Param(2, _int(1, 4096)),
                "num_gpus": Param(0, _gpus), "batch_size": Param(64, _int(1, 65536))},
        "pixels": {"resolution": Param(16, _int(1, 1024))},
        # path: DVC tracks it (dvc.yaml), so never null; the default is a committed placeholder for "none"
        "precomputed": {"path": Param(NO_FILE, _tracked_path), "ids": Param(NO_FILE, _tracked_path)},
        # the module file of a `callable:` backbone (or a folder holding it): a dvc.yaml dep, like the weights
        "callable": {"module_file": Param(NO_FILE, _tracked_path)},
        # timm:<model>: a weights file or a local-dir folder (config.json + weights); none: the local HF cache
        "timm": {"weights": Param(NO_FILE, _tracked_path)},
        # open_clip:<model>: a checkpoint file or a local-dir folder (open_clip_config.json + weights)
        "open_clip": {"weights": Param(NO_FILE, _tracked_path), "tag": Param(None, _optional_name)},
        # torchvision:<model>: the whole classification model's state dict; preprocessing from a weights enum
        # member (preset) or, when it is null, from all of resize/crop/mean/std (there is no default)
        "torchvision": {"weights": Param(NO_FILE, _tracked_path), "preset": Param(None, _optional_name),
                        "resize": Param(None, _optional(_int(1, 8192))), "crop": Param(None, _optional(_int(1, 8192))),
                        "mean": Param(None, _optional(_channels)), "std": Param(None, _optional(_channels)),
                        "interpolation": Param("bilinear", _choice("bilinear", "bicubic", "nearest"))},
        # hf:<dir>: the same directory here, so that DVC tracks the model's files (dvc.yaml)
        "hf": {"dir": Param(NO_FILE, _tracked_path), "pooling": Param("cls", _choice("cls", "mean", "pooler"))},
        # torch backbones only (docs/backbones.md, "GPUs"): auto = cuda when torch sees a GPU, else cpu
        "device": Param("auto", _choice("auto", "cpu", "cuda")),
        "dtype": Param("float32", _choice("float32", "float16", "bfloat16")),
        "reproducible": Param(True, _bool),
    },
    "score": {
        "ks": Param([1, 5, 10], ks_problem),
        "metrics": Param(list(METRIC_NAMES), metrics_problem),
        "max_memory_mb": Param(512, positive_number_problem),
        "backend": Param("numpy", _choice(*BACKENDS)),
        # where the engine's tile jobs run: this machine's cores, or Ray tasks (the ray extra; docs/scale.md)
        "engine": Param("local", _choice("local", "ray")),
        "ray": {"address": Param(None, _address), "num_cpus": Param(1, _int(1, 1024))},
        "exclude_same": Param([], columns_problem),
        "whiten": Param("none", _choice("none", "pca")),
        "bootstrap": {
            "resamples": Param(1000, _int(0, 1_000_000)),
            "confidence": Param(0.95, _open_fraction),
            "seed": Param(0, _int(0)),
            "unit": Param("query", _choice("query", "label")),
        },
        "failures": {"queries": Param(8, _int(0, 1000)), "k": Param(5, _int(0, 100))},
        "near_duplicates": {"min_cosine": Param(None, _cosine)},
    },
}


def _validate(spec: dict[str, Any], given: Any, prefix: str, errors: list[str],
              check_values: bool = True) -> dict[str, Any]:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        errors.append(f"`{prefix}` must be a mapping of keys to values. Got {quote(given)} instead.")
        given = {}
    for key in given:
        if key not in spec:
            errors.append(
                f"`{prefix}.{clip(str(key))}` is not a known param; remove it or fix the name."
                f"{did_you_mean(key, spec)}"
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
        raise InputError("params.yaml must be a mapping with the sections split, encode and score.")
    for top in params:
        if top not in SCHEMA:
            errors.append(
                f"`{clip(str(top))}` is not a known params section; remove it or fix the name."
                f"{did_you_mean(top, SCHEMA)}"
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
        raise InputError("invalid params.yaml:\n  - " + "\n  - ".join(errors))
    return values


def _dvc_reading(text: str) -> Any:
    """``text`` as DVC reads params.yaml (``dvc/utils/serialize/_yaml.py``: ruamel.yaml ``typ="safe"``,
    YAML 1.2): the values dvc.lock records, so the values the stages must run with."""
    return YAML(typ="safe").load(text)


def _spell(value: Any) -> str:
    """How to write ``value`` so that YAML 1.1 and 1.2 read it alike."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, (int, float)):
        return repr(value).replace("inf", ".inf").replace("nan", ".nan")
    return json.dumps(str(value), ensure_ascii=False)  # a double-quoted YAML string


def _plain_scalars(node: yaml.Node) -> Iterator[yaml.ScalarNode]:
    """Every plain (unquoted, not block) scalar of the document: the ones a YAML version resolves."""
    if isinstance(node, yaml.ScalarNode):
        if not node.style:
            yield node
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _plain_scalars(item)
    elif isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            yield from _plain_scalars(key_node)
            yield from _plain_scalars(value_node)


def _readings(texts: Iterable[str]) -> dict[str, tuple[Any, Any]]:
    """``text -> (DVC's YAML 1.2 reading, PyYAML's YAML 1.1 reading)`` of plain scalars, read as one
    block sequence per reader (one at a time where that cannot be done, or fails)."""
    texts = list(dict.fromkeys(texts))
    single = [t for t in texts if "\n" in t]
    batch = [t for t in texts if "\n" not in t]
    document = "".join(f"- {t}\n" for t in batch)
    try:
        both = list(zip(_dvc_reading(document), yaml.safe_load(document))) if batch else []
    except (yaml.YAMLError, RuamelYAMLError, TypeError):
        both = []
    if len(both) != len(batch):
        both, single = [], texts
    out = dict(zip(batch, both))
    for text in single:
        try:
            out[text] = (_dvc_reading(text), yaml.safe_load(text))
        except (yaml.YAMLError, RuamelYAMLError):
            pass
    return out


def _reading_problems(node: yaml.Node, name: str, readings: dict[str, tuple[Any, Any]], problems: list[str]) -> None:
    """Walk the document: repeated keys, and plain scalars that YAML 1.1 and YAML 1.2 read differently
    (``010``, ``yes``/``no``/``on``/``off``, ``1:30``, ``1e3``, ``0o10``, ...), each named by its dotted key."""
    if isinstance(node, yaml.ScalarNode):
        v12, v11 = readings.get(node.value, (None, None)) if not node.style else (None, None)
        if (type(v12), repr(v12)) != (type(v11), repr(v11)):
            problems.append(f"`{clip(name)}` (line {node.start_mark.line + 1}) is written {clip(node.value)}, "
                            f"which DVC (YAML 1.2, the value dvc.lock records) reads as {quote(v12)} but a YAML 1.1 "
                            f"reader such as PyYAML as {quote(v11)}; write {clip(_spell(v12))} or "
                            f"{clip(_spell(v11))}, whichever you mean.")
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _reading_problems(item, f"{name}[{i}]", readings, problems)
    elif isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            plain_key = isinstance(key_node, yaml.ScalarNode) and not key_node.style and key_node.value in readings
            key = str(readings[key_node.value][0] if plain_key else getattr(key_node, "value", key_node))
            child = f"{name}.{key}" if name else key
            line = key_node.start_mark.line + 1
            if child in seen:
                problems.append(f"`{clip(child)}` is given twice (lines {seen[child]} and {line}); DVC refuses a "
                                "repeated key and a YAML 1.1 reader keeps the last one: keep one of them.")
            seen.setdefault(child, line)
            _reading_problems(key_node, f"{child} (the key)", readings, problems)
            _reading_problems(value_node, child, readings, problems)


#: How many reading problems a params.yaml message lists before summarising the rest.
MAX_PROBLEMS = 20


def read_params(path: Path) -> Any:
    """The params file as DVC reads it; an InputError lists every repeated key and every value
    that a YAML 1.1 reader would read differently, so that the values a stage runs with are
    always the ones dvc.lock records, whatever YAML tool wrote or reads the file."""
    try:
        text = path.read_text(encoding="utf-8")
        document = yaml.compose(text, Loader=yaml.SafeLoader)
        problems: list[str] = []
        if document is not None:
            _reading_problems(document, "", _readings(n.value for n in _plain_scalars(document)), problems)
        if problems:
            more = [f"... and {len(problems) - MAX_PROBLEMS} more"] if len(problems) > MAX_PROBLEMS else []
            raise InputError(f"invalid {path} (DVC reads it as YAML 1.2 and refuses repeated keys; the stages run "
                             "with what DVC records):\n  - " + "\n  - ".join(problems[:MAX_PROBLEMS] + more))
        return _dvc_reading(text)
    except (yaml.YAMLError, RuamelYAMLError) as exc:
        raise InputError(f"{path} is not valid YAML ({exc}); fix the syntax.") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8.") from None


def load_section(section: str, path: str | Path = "params.yaml") -> dict[str, Any]:
    """Read ``path`` (:func:`read_params`) and return its validated ``section``."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p} not found; run from the project root, where params.yaml lives.")
    return validate_section(read_params(p), section)
