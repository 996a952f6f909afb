"""What each query retrieved: its top K gallery items, exactly, in the ranking's tie order.

For each query, the K most similar gallery items it may retrieve (not its own image,
not an item sharing an ``exclude`` value), by the exact similarity of
:func:`recallk.score.similarity.cosine_block`, ties broken by gallery index (smaller
first): the order every metric is computed on. Blocked under ``max_memory_mb``:

* a float32 product per block of queries gives each row's K-th largest value ``t``;
* every item within ``2 tol`` of ``t`` (``tol``: the float32 product's proven error bound)
  is a candidate: the exact top K is among them (each of the K float32 leaders is exactly
  at least ``t - tol``, so the exact K-th value is too, and a true top-K item's float32
  score is at least ``t - 2 tol``);
* the candidates are re-scored exactly and sorted by (-similarity, gallery index).
"""

from __future__ import annotations

import numpy as np

from recallk.checks import check_memory, is_int
from recallk.errors import InputError
from recallk.score.ranking.budget import Budget
from recallk.score.ranking.problem import code_columns
from recallk.score.ranking.scan import exact_pairs
from recallk.score.retrieval_data import RetrievalData
from recallk.score.similarity import float32_dot_error_bound, l2_normalize


def top_k(data: RetrievalData, k: int, max_memory_mb: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` gallery items of every query of ``data``, exactly.

    Parameters
    ----------
    data : RetrievalData
        The embeddings, ids and exclusions (checked; the labels play no part): a gallery item with the
        query's id (compared as text) is never retrieved, nor one sharing the query's value in any
        exclusion pair (missing values never match).
    k : int
        Items per query; fewer when a query may retrieve fewer items.
    max_memory_mb : float, optional
        Bound on the scratch of one block of queries; None: the ``score.max_memory_mb`` default.

    Returns
    -------
    (columns, scores)
        int64 ``(n_queries, k)`` gallery indices in rank order (-1 pads a query that may retrieve
        fewer than ``k`` items) and their float32 exact similarities (NaN where padded).
    """
    if not is_int(k) or k < 1:
        raise InputError(f"`k` must be a positive integer. Got {k!r} instead.")
    max_memory_mb = check_memory(max_memory_mb)
    query_ids, gallery_ids = data.query_ids, data.gallery_ids
    qu, gu = l2_normalize(data.query_emb), l2_normalize(data.gallery_emb)
    n, m = qu.shape[0], gu.shape[0]
    k = min(int(k), m)
    own = np.full(n, -1, dtype=np.int64)
    if query_ids is not None:
        where = {str(i): j for j, i in enumerate(gallery_ids)}
        own = np.array([where.get(str(i), -1) for i in query_ids], dtype=np.int64)
    codes = [code_columns(qv, gv, missing=True) for qv, gv in data.exclude]
    tol = float32_dot_error_bound(qu.shape[1])
    cols = np.full((n, k), -1, dtype=np.int64)
    scores = np.full((n, k), np.nan, dtype=np.float32)
    held = qu.nbytes + gu.nbytes + cols.nbytes + scores.nbytes  # the budget pays for these first
    rows_per_block = Budget(max_memory_mb).neighbor_rows(held, m)
    for r0 in range(0, n, rows_per_block):
        rows = np.arange(r0, min(r0 + rows_per_block, n))
        sims = qu[rows] @ gu.T
        inside = own[rows] >= 0
        sims[np.flatnonzero(inside), own[rows][inside]] = -np.inf
        for qc, gc in codes:
            for code in np.unique(qc[rows][qc[rows] >= 0]):  # one label-sized mask per exclusion value
                sims[np.ix_(np.flatnonzero(qc[rows] == code), np.flatnonzero(gc == code))] = -np.inf
        cols[rows], scores[rows] = _block_top(qu, gu, rows, sims, k, tol)
    return cols, scores


def _block_top(qu: np.ndarray, gu: np.ndarray, rows: np.ndarray, sims: np.ndarray, k: int,
               tol: float) -> tuple[np.ndarray, np.ndarray]:
    """The exact top ``k`` of each row of the float32 block ``sims`` (-inf: not retrievable), padded
    with -1 / NaN where a row may retrieve fewer items."""
    m = sims.shape[1]
    kth = np.partition(sims, m - k, axis=1)[:, m - k].astype(np.float64)  # each row's k-th largest float32
    low = np.where(np.isfinite(kth), kth - 2 * tol, -np.inf)  # fewer than k retrievable: all of them
    line, col = np.nonzero(sims >= _round_down(low)[:, None])
    keep = np.isfinite(sims[line, col])
    line, col = line[keep], col[keep]
    exact = exact_pairs(qu, gu, rows[line], col)
    order = np.lexsort((col, -exact, line))  # by row, then -similarity, then gallery index
    line, col, exact = line[order], col[order], exact[order]
    starts = np.searchsorted(line, np.arange(rows.size))
    rank = np.arange(line.size) - starts[line]
    first = rank < k
    cols = np.full((rows.size, k), -1, dtype=np.int64)
    out = np.full((rows.size, k), np.nan, dtype=np.float32)
    cols[line[first], rank[first]], out[line[first], rank[first]] = col[first], exact[first]
    return cols, out


def _round_down(x: np.ndarray) -> np.ndarray:
    """float64 -> the float32 at or below it, so a float32 compare keeps every cell at or above ``x``."""
    y = x.astype(np.float32)
    return np.where(y > x, np.nextafter(y, np.float32(-np.inf)), y)
