"""Labels compared by value: what :class:`~recallk.score.retrieval_data.RetrievalData` does with ``query_labels`` and
``gallery_labels`` before anything is ranked.

Ids that are numbers on both sides compare by value too (:func:`ids_by_value`), and so do the values of an
``exclude`` pair (:func:`exclusion_by_value`: missing values never match). Numbers compare by value on
both sides: ``1.0`` (a float gallery label) is the label ``1`` of an integer query,
as in pytorch-metric-learning's own tests, and ``True`` is ``1``. Text compares as text. Numbers on one side
and text on the other can never match, so they are an InputError, and so is a query side none of whose labels
occurs in the gallery (every metric would be undefined), whatever the kinds.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from recallk.checks import is_missing
from recallk.errors import InputError, quote

#: The largest integer a float64 holds exactly: integral floats at most this large become int64 labels.
_EXACT = 2**53


def kind(values: np.ndarray) -> str:
    """``"number"``, ``"text"`` or ``"mixed"`` (an object array holding both, or other objects)."""
    if values.dtype.kind in "biuf":
        return "number"
    if values.dtype.kind in "US":
        return "text"
    items = values.tolist()
    if all(isinstance(v, numbers.Number) and not isinstance(v, complex) for v in items):
        return "number"
    if all(isinstance(v, (str, bytes)) for v in items):
        return "text"
    return "mixed"


def as_numbers(values: np.ndarray) -> np.ndarray:
    """Numeric labels as one comparable array: int64 when every value is a whole number (floats too), else float64."""
    arr = np.asarray(values.tolist() if values.dtype.kind == "O" else values)
    if arr.dtype.kind in "biu":  # uint64 above int64's range stays as it is
        huge = arr.dtype == np.uint64 and arr.size and int(arr.max()) > np.iinfo(np.int64).max
        return arr if huge else arr.astype(np.int64, copy=False)
    as_float = arr.astype(np.float64)
    if np.all(np.isfinite(as_float)) and np.all(as_float == np.round(as_float)) and np.all(np.abs(as_float) <= _EXACT):
        return as_float.astype(np.int64)
    return as_float


def numbers_alike(q: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two numeric sides (:func:`kind` ``"number"``) as arrays of one dtype that compare by value: int64 when
    every value on both sides is whole (:func:`as_numbers`), else both float64."""
    q, g = as_numbers(q), as_numbers(g)
    if q.dtype != g.dtype:  # one side has a fraction: compare both as floats
        q, g = q.astype(np.float64), g.astype(np.float64)
    return q, g


def cannot_match(kinds: tuple[str | None, str | None], q: np.ndarray, g: np.ndarray, names: tuple[str, str],
                 fix: str) -> None:
    """Raise an InputError when one side's values are numbers and the other's text (they never match); ``names``
    say what the two sides are (``"`query_labels`"``)."""
    if set(kinds) == {"number", "text"}:
        (side, num), (other, text) = tuple(zip(names, (q, g)))[::1 if kinds[0] == "number" else -1]
        raise InputError(f"{side} are numbers and {other} are text ({quote(_first(num))} vs "
                         f"{quote(_first(text))}), which never match: give both sides values of one kind ({fix}).")


def by_value(query_labels: Any, gallery_labels: Any) -> tuple[np.ndarray | Any, np.ndarray | Any]:
    """``query_labels`` and ``gallery_labels`` made comparable by value (see the module docstring).

    Returns
    -------
    (query_labels, gallery_labels)
        Numbers on both sides: two int64 arrays (whole numbers, e.g. ``1.0`` -> ``1``) or, when a value is not
        whole, two float64 arrays. Otherwise the labels as given (text, or a side mixing kinds: compared as
        text, as before).

    Raises
    ------
    InputError
        Numbers on one side and text on the other, or no query label in the gallery.
    """
    q, g = np.asarray(query_labels), np.asarray(gallery_labels)
    kinds = (kind(q), kind(g))
    cannot_match(kinds, q, g, ("`query_labels`", "`gallery_labels`"),
                 "e.g. `gallery_labels.astype(int)` or `[str(x) for x in labels]`")
    if kinds == ("number", "number"):
        q, g = numbers_alike(q, g)
        shared = _share_a_value(q, g)
        query_labels, gallery_labels = q, g
    else:
        shared = not {str(v) for v in q.tolist()}.isdisjoint(str(v) for v in g.tolist())
    if not shared:
        raise InputError(f"no query label occurs in `gallery_labels` (queries: {_sample(q)}; gallery: {_sample(g)}), "
                         "so no query has a positive and every metric is undefined: pass a gallery that holds the "
                         "queries' labels (or the labels of the same encoding on both sides).")
    return query_labels, gallery_labels


#: Non-negative integer labels below this are looked up in a table of the gallery's (no sort).
_TABLE_SPAN = 2**16


def _share_a_value(q: np.ndarray, g: np.ndarray) -> bool:
    """Whether the number arrays ``q`` and ``g`` (one dtype) share a value: through a table of the gallery's
    values for int64 labels in ``[0, _TABLE_SPAN)`` (a training loop's class indices), else ``np.intersect1d``."""
    if q.dtype == np.int64 and q.size and g.size:
        # every value in [0, _TABLE_SPAN) exactly when their bits' union is (a negative value has the sign bit);
        # the union is at least the largest value, so it sizes the table
        span = int(np.bitwise_or.reduce(q)) | int(np.bitwise_or.reduce(g))
        if 0 <= span < _TABLE_SPAN:
            seen = np.zeros(span + 1, dtype=bool)
            seen[g] = True
            return bool(np.logical_or.reduce(seen[q]))
    return np.intersect1d(q, g).size > 0


def _first(values: np.ndarray) -> Any:
    return values.tolist()[0]


def _sample(values: np.ndarray, n: int = 3) -> str:
    distinct = list(dict.fromkeys(values.tolist()))
    more = f", ... {len(distinct) - n} more" if len(distinct) > n else ""
    return ", ".join(quote(v) for v in distinct[:n]) + more


def ids_by_value(query_ids: Any, gallery_ids: Any) -> tuple[Any, Any]:
    """Numeric ids on both sides made comparable by value (``1.0`` is the id ``1``, so a query's own image is
    found however its id was typed), as two int64 (or float64) arrays; other ids as given (compared as text).
    ``gallery_ids`` that become equal (``1`` and ``1.0``) are an InputError."""
    q, g = np.asarray(query_ids), np.asarray(gallery_ids)
    if (kind(q), kind(g)) != ("number", "number"):
        return query_ids, gallery_ids
    q, g = numbers_alike(q, g)
    if np.unique(g).size != g.size:
        raise InputError("`gallery_ids` must be unique (numbers compared by value: 1 and 1.0 are one id); a repeated "
                         "id makes the self-match ambiguous.")
    return q, g


def exclusion_by_value(query_values: Any, gallery_values: Any, name: str) -> tuple[Any, Any]:
    """One 1-D ``exclude`` pair (the ``name`` of its entry in messages) made comparable by value, as the labels
    are (:func:`by_value`): numbers on both sides (missing values aside) become two object arrays of int64 (or,
    when a value is not whole, float64) values, so ``1.0`` excludes the items of ``1``; each missing value (None,
    NaN, ``""``: :func:`recallk.checks.is_missing`) becomes None, which never matches. Other values are returned
    as given (text, or a side mixing kinds: compared as text). Numbers on one side and text on the other can
    never match: an InputError (an ``exclude`` pair that could exclude nothing is a mistake, never a rule)."""
    q, g = np.asarray(query_values, dtype=object), np.asarray(gallery_values, dtype=object)
    q_gone = np.fromiter((is_missing(v) for v in q.tolist()), dtype=bool, count=q.size)
    g_gone = np.fromiter((is_missing(v) for v in g.tolist()), dtype=bool, count=g.size)
    kinds = tuple(kind(side[~gone]) if (~gone).any() else None for side, gone in ((q, q_gone), (g, g_gone)))
    cannot_match(kinds, q[~q_gone], g[~g_gone], (f"the query values of {name}", f"the gallery values of {name}"),
                 "e.g. `values.astype(str)` on both sides")
    if kinds != ("number", "number"):
        return query_values, gallery_values
    out = []
    for side, gone, numbers_ in zip((q, g), (q_gone, g_gone), numbers_alike(q[~q_gone], g[~g_gone])):
        values = np.full(side.size, None, dtype=object)
        values[~gone] = numbers_
        out.append(values)
    return out[0], out[1]
