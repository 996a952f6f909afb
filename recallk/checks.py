"""Every input rule of the library, each in one place.

Two forms per rule: ``*_problem(value) -> str | None`` says what is wrong (a settings field's rule,
:mod:`recallk.settings`: the params check prefixes it with the param's dotted name), and
``check_*(value)`` raises :class:`~recallk.errors.InputError` prefixed with the argument's name, in
the style of scikit-learn: "`ks` must be positive integers. Got [0, 5] instead." The rules of one
params section only live beside its settings class (``recallk/settings/<section>.py``).

Validate once, at the edge: the public functions call these, the engine trusts them.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import numpy as np

from recallk.errors import InputError, did_you_mean, quote

#: Largest K: ranks are int64, and a K beyond every gallery means the whole gallery anyway.
MAX_K = 2**62
#: Ranking backends of ``backend=`` / ``score.backend``.
BACKENDS = ("numpy", "torch")
#: Catalog columns that cannot be exclusion columns: the label decides the positives and the
#: query's own image (image_id) is always excluded.
RESERVED_COLUMNS = ("label", "image_id")


def is_int(v: Any) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _raise(name: str, problem: str | None) -> None:
    if problem:
        raise InputError(f"`{name}` {problem}")


def as_list(value: Any) -> Any:
    """An iterable argument (a tuple, an array, a generator) as the list its rule checks; a string or bytes as a
    one-item list; anything else (a bare number, None) as it is, for the rule to name."""
    if isinstance(value, (str, bytes)):
        return [value]
    try:
        return list(value)
    except TypeError:
        return value


def checker(name: str, problem: Callable[[Any], "str | None"], convert: Callable[[Any], Any] = lambda v: v,
            prepare: Callable[[Any], Any] = lambda v: v) -> Callable[[Any], Any]:
    """The ``check_<name>`` of a rule: ``prepare`` the value (e.g. :func:`as_list`), run ``problem`` on it (an
    :class:`~recallk.errors.InputError` naming ``name``), and return it ``convert``-ed. Each rule is written once,
    as its ``*_problem``; its check is derived here."""
    def check(value: Any) -> Any:
        value = prepare(value)
        _raise(name, problem(value))
        return convert(value)

    check.__doc__ = f"``{name}``: :func:`{getattr(problem, '__name__', 'its rule')}`, raised as an InputError."
    return check


# ------------------------------------------------------------------------------------------ numbers, choices


def positive_number_problem(v: Any) -> str | None:
    """A finite number above 0 (bools rejected); a YAML string such as ``1e3`` gets a hint."""
    if not (is_int(v) or isinstance(v, (float, np.floating))) or not v > 0 or math.isinf(v):
        hint = ""
        if isinstance(v, str):
            try:
                number = float(v)
                hint = (f" YAML reads {v} as text: write it with a dot, e.g. {number:.1f}."
                        if math.isfinite(number) and number > 0 else "")
            except ValueError:
                pass
        return f"must be a positive number. Got {quote(v)} instead.{hint}"
    return None


#: The default of ``score.max_memory_mb`` (MiB), written once: the settings and every function's ``None`` use it.
DEFAULT_MEMORY_MB = 512
#: ``max_memory_mb``: :func:`positive_number_problem`, the rule of ``score.max_memory_mb``; returns a float (None:
#: :data:`DEFAULT_MEMORY_MB`).
check_memory = checker("max_memory_mb", positive_number_problem, float,
                       lambda v: DEFAULT_MEMORY_MB if v is None else v)


def choice_problem(v: Any, options: Sequence[str]) -> str | None:
    """One of ``options``, with a suggestion for a near miss."""
    if not isinstance(v, str) or v not in options:
        return f"must be one of {', '.join(options)}. Got {quote(v)} instead.{did_you_mean(v, options)}"
    return None


def integer_problem(v: Any, lo: int | None = None, hi: int | None = None) -> str | None:
    """An integer (not a bool), at least ``lo`` and at most ``hi`` when they are given."""
    if not is_int(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f" between {lo} and {hi}" if hi is not None else (f" >= {lo}" if lo is not None else "")
        return f"must be an integer{rng}. Got {quote(v)} instead."
    return None


def fraction_problem(v: Any) -> str | None:
    """A number (not a bool) from 0 to 1, both included."""
    if not (is_int(v) or isinstance(v, float)) or not (0.0 <= v <= 1.0) or math.isnan(v):
        return f"must be a number between 0 and 1. Got {quote(v)} instead."
    return None


def path_problem(v: Any, optional: bool = False) -> str | None:
    """A path: a string that is not blank (``None`` too when ``optional``)."""
    if v is None and optional:
        return None
    if not isinstance(v, str) or not v.strip():
        return f"must be a non-empty path string{' or null' if optional else ''}. Got {quote(v)} instead."
    return None


def name_problem(v: Any, optional: bool = False) -> str | None:
    """A name: a non-empty string (``None`` too when ``optional``; the message stays the same)."""
    if v is None and optional:
        return None
    if not isinstance(v, str) or not v:
        return f"must be a non-empty string. Got {quote(v)} instead."
    return None


def bool_problem(v: Any) -> str | None:
    """``true`` or ``false`` (a YAML string such as ``"yes"`` is neither)."""
    return None if isinstance(v, bool) else f"must be true or false. Got {quote(v)} instead."


def optional(rule: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    """``rule``, or ``None`` (null): the message of a value ``rule`` refuses says "or null"."""
    def optional_problem(v: Any) -> str | None:
        problem = None if v is None else rule(v)
        return problem and problem.replace(". Got", " or null. Got", 1)

    return optional_problem


def choice(*options: str) -> Callable[[Any], str | None]:
    """The rule "one of ``options``" (:func:`choice_problem`)."""
    return functools.partial(choice_problem, options=options)


def integer(lo: int | None = None, hi: int | None = None) -> Callable[[Any], str | None]:
    """The rule "an integer from ``lo`` to ``hi``" (:func:`integer_problem`)."""
    return functools.partial(integer_problem, lo=lo, hi=hi)


def backend_problem(v: Any) -> str | None:
    """One of :data:`BACKENDS`; the removed ``faiss`` gets its own sentence naming what to use instead."""
    if v == "faiss":
        return ("no longer takes `faiss` (it gave the numpy engine's numbers, only slower): use `numpy` (or `torch` "
                "on a GPU). FAISS's exact search is the index stage's `Flat` kind (`index.kinds`, docs/index.md).")
    return choice_problem(v, BACKENDS)


def ray_address_problem(v: Any) -> str | None:
    """A Ray cluster address (a non-blank string), or ``None``: ``$RAY_ADDRESS``, else a local cluster."""
    if v is None or (isinstance(v, str) and v.strip()):
        return None
    return (f"must be a Ray cluster address such as \"ray://head:10001\" or \"auto\", or null (RAY_ADDRESS, else a "
            f"local cluster). Got {quote(v)} instead.")


# ---------------------------------------------------------------------- ks (the metric names: score.registry)


def ks_problem(v: Any) -> str | None:
    """A non-empty list of distinct positive integers, at most :data:`MAX_K`."""
    if not isinstance(v, list) or not v or not all(is_int(k) and k > 0 for k in v):
        return f"must be positive integers. Got {quote(v)} instead."
    if max(v) > MAX_K:
        return (f"must be at most 2**62 (any K beyond the gallery size counts the whole gallery). "
                f"Got {quote(v)} instead.")
    if len(set(v)) != len(v):
        return f"must not repeat a value. Got {quote(v)} instead."
    return None


# --------------------------------------------------------------------------------------- exclusion columns


def columns_problem(v: Any) -> str | None:
    """A list of distinct non-empty column names (``[]`` for none)."""
    if not isinstance(v, list) or not all(isinstance(c, str) and c for c in v) or len(set(v)) != len(v):
        return f"must be a list of distinct catalog column names (e.g. [camera]) or []. Got {quote(v)} instead."
    return None


def check_exclude_columns(columns: Sequence[str], available: Sequence[str], name: str = "exclude_same") -> None:
    """Exclusion columns: :func:`columns_problem`, none of :data:`RESERVED_COLUMNS`, each one of ``available``
    (the catalog's columns, listed in the message)."""
    _raise(name, columns_problem(list(columns)))
    choices = [c for c in available if c not in RESERVED_COLUMNS]
    reserved = [c for c in columns if c in RESERVED_COLUMNS]
    if reserved:
        raise InputError(f"`{name}` names {reserved}: the label decides the positives and the query's own image "
                         "(image_id) is always excluded, so neither is an exclusion column; name another catalog "
                         f"column ({', '.join(choices)}).")
    missing = [c for c in columns if c not in available]
    if missing:
        raise InputError(f"`{name}` names {missing}, which the catalog does not have."
                         f"{did_you_mean(missing[0], choices)} Catalog columns: {', '.join(available)}.")


def check_exclude_pairs(exclude: Any, n_queries: int, n_gallery: int) -> list[tuple[Any, Any]]:
    """``exclude``: (query values, gallery values) pairs of 1-D sequences with one value per row, or of 2-D
    arrays with one row per item and the same number of columns on both sides (a joint exclusion,
    :mod:`recallk.score.exclusion`)."""
    try:
        pairs = list(exclude)
    except TypeError:
        pairs = [None]
    for pair in pairs:
        try:
            qv, gv = pair
            dims = (np.ndim(qv), np.ndim(gv))
            ok = dims in ((1, 1), (2, 2)) and len(qv) == n_queries and len(gv) == n_gallery
            if ok and dims == (2, 2):
                ok = np.shape(qv)[1] == np.shape(gv)[1] >= 1
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise InputError("each `exclude` entry must be a (query values, gallery values) pair of 1-D sequences, "
                             "with one value per query and one per gallery item (or of 2-D arrays with one row "
                             "per item and the same columns on both sides: a joint exclusion).")
    return pairs


# ------------------------------------------------------------------------------------ embeddings, labels, ids


def as_array(x: Any) -> np.ndarray:
    """``x`` as a numpy array; a torch tensor is detached and moved to the CPU first (one that requires
    grad, the usual training-loop output, cannot be converted otherwise). torch is never imported here."""
    if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
        x = x.detach().cpu()
    return np.asarray(x)


def same_values(a: Any, b: Any) -> bool:
    """``np.array_equal(a, b)``, answered from the first values when they differ (as a batch's queries and
    gallery do) without comparing every value."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or (a.size and a.item(0) != b.item(0)):
        return False
    return bool(np.array_equal(a, b))


def check_matrix(x: Any, name: str) -> np.ndarray:
    """A 2-D array of real, finite numbers with rows of one length (dimension >= 1); a torch tensor
    (requiring grad or not, on any device) is detached and copied to the CPU (:func:`as_array`)."""
    try:
        arr = as_array(x)
    except ValueError:  # ragged rows
        raise InputError(f"`{name}` must be a 2-D array (n, d) with rows of one length; "
                         "its rows differ in length.") from None
    if arr.ndim != 2:
        raise InputError(f"`{name}` must be a 2-D array (n, d). Got shape {arr.shape} instead.")
    if arr.shape[1] == 0 and arr.shape[0]:
        raise InputError(f"`{name}` has dimension 0 (shape {arr.shape}); each row needs at least one value.")
    if arr.dtype.kind not in "iufm":  # numpy's real numbers (not bools, complex, text or objects)
        raise InputError(f"`{name}` must hold real numbers. Got dtype {arr.dtype} instead.")
    if arr.dtype.kind in "fm" and not _all_finite(arr):  # integers are always finite
        rows = np.flatnonzero(~np.isfinite(arr).all(axis=1))
        raise InputError(f"`{name}` has NaN or inf in {rows.size} row(s), first rows {rows[:10].tolist()}; "
                         "fix the encoder or drop those items.")
    return arr


#: Values checked for finiteness at a time: the boolean scratch stays small (4 MiB) whatever the array's size.
_FINITE_CHUNK = 2**22
#: Arrays of at most this many values are checked element by element at once (no sum first).
_SMALL_FINITE = 2**16


def _all_finite(arr: np.ndarray) -> bool:
    """``np.isfinite(arr).all()`` for a 2-D array, in chunks of rows (no array-sized boolean scratch).

    A float array's sum first, one pass with no scratch: a NaN or an inf anywhere makes it NaN or inf, so a finite
    sum proves every value finite; only a non-finite sum (a bad value, or finite values so large that their sum
    overflows) takes the element check. A training loop's batch (at most :data:`_SMALL_FINITE` values) takes the
    element check at once: cheaper there than the sum and its error state."""
    if arr.dtype.kind == "f" and arr.size > _SMALL_FINITE:
        with np.errstate(over="ignore", invalid="ignore"):
            if np.isfinite(np.add.reduce(arr, axis=None)):
                return True
    step = max(1, _FINITE_CHUNK // max(1, arr.shape[1]))
    if arr.shape[0] <= step:  # one chunk (a batch)
        return np.count_nonzero(np.isfinite(arr)) == arr.size
    return all(np.isfinite(arr[s:s + step]).all() for s in range(0, arr.shape[0], step))


def unusable_rows(emb: np.ndarray) -> np.ndarray:
    """Rows that are not usable embeddings: any NaN or inf, or a zero norm (a backbone's or a file's)."""
    return ~np.isfinite(emb).all(axis=1) | ~np.any(emb != 0, axis=1)


def is_missing(v: Any) -> bool:
    """None, any NaN (Python, numpy float16/32/64), pandas NA or an empty string."""
    if v is None:
        return True
    try:
        return bool(v != v) or (isinstance(v, str) and v == "")
    except (TypeError, ValueError):  # pandas NA: its comparisons are NA themselves
        return True


def _unhashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return True
    return False


def check_values(values: Any, name: str, n: int) -> np.ndarray:
    """Per-row values (labels, ids): a 1-D sequence of ``n`` hashable scalars, none missing
    (None, NaN or ""); returned as an array."""
    try:
        arr = np.asarray(values)
    except ValueError:  # ragged nesting
        raise InputError(f"`{name}` must be a 1-D sequence with one value per row; it is nested.") from None
    if arr.ndim != 1:
        raise InputError(f"`{name}` must be a 1-D sequence with one value per row. Got shape {arr.shape} instead.")
    if len(arr) != n:
        raise InputError(f"`{name}` must have one entry per row of the embeddings ({n}). Got {len(arr)} instead.")
    if arr.dtype.kind == "f":
        bad = np.flatnonzero(np.isnan(arr)).tolist()
    elif arr.dtype.kind in "US":
        bad = np.flatnonzero(arr == arr.dtype.type()).tolist()
    elif arr.dtype.kind == "O":
        bad = [i for i, v in enumerate(arr.tolist()) if _unhashable(v) or is_missing(v)]
    else:  # integers, booleans, dates: never missing
        bad = []
    if bad:
        raise InputError(f"`{name}` has missing or unhashable values (None, NaN, \"\", lists) at rows {bad[:10]} "
                         f"({len(bad)} in all); give every row a value or drop those rows.")
    return arr


def integer_ids(*ids: Any) -> bool:
    """Whether every one of ``ids`` is a 1-D numpy integer array, all signed or all unsigned: their values
    compare as their texts do (how ids and labels are compared), without a text per value."""
    return all(isinstance(a, np.ndarray) and a.ndim == 1 for a in ids) and {a.dtype.kind for a in ids} in ({"i"}, {"u"})


def distinct_ids(ids: Sequence[Any]) -> bool:
    """No two of ``ids`` share a text."""
    if integer_ids(ids):
        ordered = np.sort(ids)
        return not np.count_nonzero(ordered[1:] == ordered[:-1])
    return len({str(i) for i in ids}) == len(ids)


def check_inputs(query_emb, gallery_emb, query_labels, gallery_labels, query_ids, gallery_ids):
    """Validate the two embedding sets and their per-row labels and ids; return the two matrices."""
    q = check_matrix(query_emb, "query_emb")
    g = check_matrix(gallery_emb, "gallery_emb")
    if q.shape[0] == 0:
        raise InputError("`query_emb` is empty; pass at least one query.")
    if g.shape[0] == 0:
        raise InputError("`gallery_emb` is empty; a query needs at least one gallery item to retrieve.")
    if q.shape[1] != g.shape[1]:
        raise InputError(f"`query_emb` and `gallery_emb` must have the same dimension. "
                         f"Got {q.shape[1]} and {g.shape[1]} instead.")
    if (query_ids is None) != (gallery_ids is None):
        raise InputError("pass both `query_ids` and `gallery_ids` (to exclude each query's own image), or neither.")
    for name, arr, n in (("query_labels", query_labels, q.shape[0]), ("gallery_labels", gallery_labels, g.shape[0]),
                         ("query_ids", query_ids, q.shape[0]), ("gallery_ids", gallery_ids, g.shape[0])):
        if arr is not None:
            check_values(arr, name, n)
    if gallery_ids is not None and not distinct_ids(gallery_ids):
        raise InputError("`gallery_ids` must be unique (compared as text); a repeated id makes the self-match "
                         "ambiguous.")
    return q, g
