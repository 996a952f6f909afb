"""Similarity primitives and input checks shared by the ranking engine and the metrics.

* Similarity is the cosine: rows are L2-normalised (a zero vector stays zero and
  so has similarity 0 to everything); inner products of the float32 unit rows are
  accumulated in float64 and rounded to float32 (see :func:`cosine_block`).
* :func:`float32_dot_error_bound` bounds how far a fast float32 product can be
  from that value, which lets the engine (:mod:`stages.ranking`) use the fast
  product and re-decide only the comparisons it could get wrong.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable

import numpy as np

from stages.params import check_ks as _ks_problem
from stages.params import positive_number

#: Rows normalised at a time (float64 scratch of at most 2 threads x 2 x 512 x d x 8 bytes).
_NORMALIZE_ROWS = 512


def _as_matrix(x: Any, name: str) -> np.ndarray:
    try:
        arr = np.asarray(x)
    except ValueError:  # ragged rows
        raise ValueError(f"`{name}` must be a 2-D array (n, d) with rows of one length; "
                         "its rows differ in length.") from None
    if arr.ndim != 2:
        raise ValueError(f"`{name}` must be a 2-D array (n, d). Got shape {arr.shape} instead.")
    if arr.shape[1] == 0 and arr.shape[0]:
        raise ValueError(f"`{name}` has dimension 0 (shape {arr.shape}); each row needs at least one value.")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"`{name}` must hold real numbers. Got dtype {arr.dtype} instead.")
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise ValueError(f"`{name}` has NaN or inf in {rows.size} row(s), first rows {rows[:10].tolist()}; "
                         "fix the encoder or drop those items.")
    return arr


def check_ks(ks: Iterable[Any]) -> list[int]:
    """Validate ``ks``: distinct positive integers (bools rejected), the rule of ``score.ks``."""
    try:
        given = list(ks) if not isinstance(ks, (str, bytes)) else [ks]
    except TypeError:  # a bare number or None
        given = ks
    why = _ks_problem(given)
    if why:
        raise ValueError(f"`ks` {why}")
    return [int(k) for k in given]


def check_memory(max_memory_mb: Any) -> float:
    """Validate ``max_memory_mb``: a finite number above 0, the rule of ``score.max_memory_mb``."""
    why = positive_number(max_memory_mb)
    if why:
        raise ValueError(f"`max_memory_mb` {why}")
    return float(max_memory_mb)


def l2_normalize(x: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Return rows scaled to unit L2 norm, as float32; all-zero rows stay zero.

    Computed in float64 after dividing each row by its largest magnitude, so any
    finite scale (1e-60 or 1e60) gives the same direction; in chunks of rows, so
    the float64 scratch stays small whatever the number of rows. With ``rows``,
    returns ``l2_normalize(x)[rows]`` without the intermediate copy.
    """
    x = np.asarray(x)
    n = x.shape[0] if rows is None else len(rows)
    out = np.empty((n,) + x.shape[1:], dtype=np.float32)

    def chunk_at(start: int) -> None:  # each chunk is independent: two threads share the work
        pick = slice(start, start + _NORMALIZE_ROWS) if rows is None else rows[start:start + _NORMALIZE_ROWS]
        chunk = x[pick].astype(np.float64)  # in place from here: small scratch, no fresh pages per chunk
        peak = np.abs(chunk).max(axis=1, keepdims=True) if chunk.size else np.ones((chunk.shape[0], 1))
        chunk /= np.where(peak > 0, peak, 1.0)
        norms = np.sqrt(np.einsum("ij,ij->i", chunk, chunk))[:, None]
        chunk /= np.where(norms > 0, norms, 1.0)
        out[start:start + _NORMALIZE_ROWS] = chunk

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(chunk_at, range(0, n, _NORMALIZE_ROWS)))
    return out


def cosine_block(q_unit: np.ndarray, g_unit_t: np.ndarray) -> np.ndarray:
    """Similarities of unit rows ``q_unit`` (b, d) to the columns of ``g_unit_t`` (d, m), as float32.

    Products of float32 values are exact in float64, so accumulating in float64
    and rounding once to float32 makes the result practically independent of the
    BLAS kernel and so of the block size: exactly cancelling terms give exactly 0,
    and a float64 summation-order difference (about 1e-16) changes the float32
    value only when it straddles a rounding boundary, which is vanishingly rare.
    """
    return (q_unit.astype(np.float64) @ g_unit_t).astype(np.float32)


def check_inputs(query_emb, gallery_emb, query_labels, gallery_labels, query_ids, gallery_ids):
    """Validate the arrays and their per-row sequences once, at the edge; return the two matrices."""
    q = _as_matrix(query_emb, "query_emb")
    g = _as_matrix(gallery_emb, "gallery_emb")
    if q.shape[0] == 0:
        raise ValueError("`query_emb` is empty; pass at least one query.")
    if g.shape[0] == 0:
        raise ValueError("`gallery_emb` is empty; a query needs at least one gallery item to retrieve.")
    if q.shape[1] != g.shape[1]:
        raise ValueError(f"`query_emb` and `gallery_emb` must have the same dimension. "
                         f"Got {q.shape[1]} and {g.shape[1]} instead.")
    if (query_ids is None) != (gallery_ids is None):
        raise ValueError("pass both `query_ids` and `gallery_ids` (to exclude each query's own image), or neither.")
    for name, arr, n in (("query_labels", query_labels, q.shape[0]), ("gallery_labels", gallery_labels, g.shape[0]),
                         ("query_ids", query_ids, q.shape[0]), ("gallery_ids", gallery_ids, g.shape[0])):
        if arr is not None:
            check_values(arr, name, n)
    return q, g


def check_values(values: Any, name: str, n: int) -> np.ndarray:
    """Validate per-row values (labels, ids): a 1-D sequence of ``n`` hashable scalars, none missing
    (None, NaN or ""); return them as an array."""
    try:
        arr = np.asarray(values)
    except ValueError:  # ragged nesting
        raise ValueError(f"`{name}` must be a 1-D sequence with one value per row; it is nested.") from None
    if arr.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D sequence with one value per row. Got shape {arr.shape} instead.")
    if len(arr) != n:
        raise ValueError(f"`{name}` must have one entry per row of the embeddings ({n}). Got {len(arr)} instead.")
    if arr.dtype.kind == "f":
        bad = np.flatnonzero(np.isnan(arr)).tolist()
    elif arr.dtype.kind in "US":
        bad = np.flatnonzero(arr == arr.dtype.type()).tolist()
    elif arr.dtype.kind == "O":
        bad = [i for i, v in enumerate(arr.tolist()) if _unhashable(v) or is_missing(v)]
    else:  # integers, booleans, dates: never missing
        bad = []
    if bad:
        raise ValueError(f"`{name}` has missing or unhashable values (None, NaN, \"\", lists) at rows {bad[:10]} "
                         f"({len(bad)} in all); give every row a value or drop those rows.")
    return arr


def _unhashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return True
    return False


def is_missing(v: Any) -> bool:
    """None, any NaN (Python, numpy float16/32/64), pandas NA or an empty string."""
    if v is None:
        return True
    try:
        return bool(v != v) or (isinstance(v, str) and v == "")
    except (TypeError, ValueError):  # pandas NA: its comparisons are NA themselves
        return True




def float32_dot_error_bound(d: int) -> float:
    """Bound on |float32 dot - exact similarity| for unit float32 rows of dimension ``d``.

    Any summation order gives at most gamma_d * sum|q_i g_i| with gamma_d = d u / (1 - d u),
    u = 2**-24 (Higham, Accuracy and Stability, 3.1), and sum|q_i g_i| <= |q| |g|, which is
    1 up to the rows' own rounding. The extra 2u covers that, the exact value's final
    rounding to float32 and its float64 accumulation error (for d up to millions).
    """
    u = 2.0**-24
    return d * u / (1 - d * u) + 2 * u
