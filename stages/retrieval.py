"""Exact cosine retrieval metrics, computed in blocks of queries under a memory bound.

The public functions are :func:`recall_at_k`, :func:`retrieval_summary` and
:func:`first_positive_ranks`; :mod:`stages.score` re-exports them.

Conventions shared by every function here
-----------------------------------------
* Similarity is the cosine: rows are L2-normalised (a zero vector stays zero and
  so has similarity 0 to everything); inner products of the float32 unit rows are
  accumulated in float64 and rounded to float32 (see :func:`cosine_block`).
* Speed: blocks are scored with the fast float32 product (both cores), and only
  the comparisons that product could get wrong (scores within its proven error
  bound of a query's best positive) are re-decided in float64, so the ranks equal
  those of the exact similarities. Blocks are ranked on a worker thread while
  BLAS multiplies the next block.
* Ranking is by descending similarity; **ties are broken by gallery order**: of
  two gallery items with equal similarity, the one with the smaller gallery
  index ranks first. The stage orders the gallery by ``image_id``.
* **Self-match**: when ``query_ids`` and ``gallery_ids`` are given, a query never
  retrieves the gallery item with its own id; that query may retrieve
  ``n_gallery - 1`` items, and K is capped there.
* **Exclusion**: a query with no gallery item of its label other than itself
  cannot be hit at any K; it is excluded from the mean and counted.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable, Sequence

import numpy as np

#: Bytes of scratch memory per (query, gallery) pair while scoring a block.
_BYTES_PER_PAIR = 16
#: Pairs whose similarity is recomputed exactly at a time.
_EXACT_CHUNK = 1024  # float64 scratch of 2 x 1024 x d x 8 bytes (8 MiB at d = 512)
#: Rows normalised at a time (float64 scratch of at most 4096 x d x 8 bytes).
_NORMALIZE_ROWS = 4096


def _as_matrix(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"`{name}` must be a 2-D array (n, d). Got shape {arr.shape} instead.")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"`{name}` must hold real numbers. Got dtype {arr.dtype} instead.")
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise ValueError(f"`{name}` has NaN or inf in {rows.size} row(s), first rows {rows[:10].tolist()}; "
                         "fix the encoder or drop those items.")
    return arr


def check_ks(ks: Iterable[Any]) -> list[int]:
    """Validate ``ks``: a non-empty sequence of positive integers (bools rejected)."""
    ks = list(ks) if not isinstance(ks, (str, bytes)) else [ks]
    if not ks or not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k > 0 for k in ks):
        raise ValueError(f"`ks` must be positive integers. Got {ks!r} instead.")
    return [int(k) for k in ks]


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Return rows scaled to unit L2 norm, as float32; all-zero rows stay zero.

    Computed in float64 after dividing each row by its largest magnitude, so any
    finite scale (1e-60 or 1e60) gives the same direction; in chunks of rows, so
    the float64 scratch stays small whatever the number of rows.
    """
    x = np.asarray(x)
    out = np.empty(x.shape, dtype=np.float32)
    for start in range(0, x.shape[0], _NORMALIZE_ROWS):
        chunk = x[start:start + _NORMALIZE_ROWS].astype(np.float64)
        peak = np.abs(chunk).max(axis=1, keepdims=True) if chunk.size else np.ones((chunk.shape[0], 1))
        chunk /= np.where(peak > 0, peak, 1.0)
        norms = np.sqrt(np.einsum("ij,ij->i", chunk, chunk))[:, None]
        out[start:start + _NORMALIZE_ROWS] = chunk / np.where(norms > 0, norms, 1.0)
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


def _label_codes(query_labels: Sequence[Any], gallery_labels: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    q = np.asarray(query_labels)
    g = np.asarray(gallery_labels)
    _, codes = np.unique(np.concatenate([q.astype(str), g.astype(str)]), return_inverse=True)
    return codes[: len(q)], codes[len(q):]


def _self_columns(query_ids: Sequence[Any] | None, gallery_ids: Sequence[Any] | None, n_query: int) -> np.ndarray:
    """Gallery column holding each query's own image, or -1."""
    if query_ids is None or gallery_ids is None:
        return np.full(n_query, -1, dtype=np.int64)
    gallery_ids = list(gallery_ids)
    column = {gid: j for j, gid in enumerate(gallery_ids)}
    if len(column) != len(gallery_ids):
        raise ValueError("`gallery_ids` must be unique; a repeated id makes the self-match ambiguous.")
    return np.array([column.get(qid, -1) for qid in query_ids], dtype=np.int64)


def _check_inputs(query_emb, gallery_emb, query_labels, gallery_labels, query_ids, gallery_ids):
    q = _as_matrix(query_emb, "query_emb")
    g = _as_matrix(gallery_emb, "gallery_emb")
    if q.shape[0] == 0:
        raise ValueError("`query_emb` is empty; pass at least one query.")
    if g.shape[0] == 0:
        raise ValueError("`gallery_emb` is empty; a query needs at least one gallery item to retrieve.")
    if q.shape[1] != g.shape[1]:
        raise ValueError(f"`query_emb` and `gallery_emb` must have the same dimension. "
                         f"Got {q.shape[1]} and {g.shape[1]} instead.")
    for name, arr, n in (("query_labels", query_labels, q.shape[0]), ("gallery_labels", gallery_labels, g.shape[0]),
                         ("query_ids", query_ids, q.shape[0]), ("gallery_ids", gallery_ids, g.shape[0])):
        if arr is not None and len(arr) != n:
            raise ValueError(f"`{name}` must have one entry per row of the embeddings ({n}). Got {len(arr)} instead.")
    return q, g


def first_positive_ranks(query_emb: np.ndarray, gallery_emb: np.ndarray, query_labels: Sequence[Any],
                         gallery_labels: Sequence[Any], query_ids: Sequence[Any] | None = None,
                         gallery_ids: Sequence[Any] | None = None, max_memory_mb: float = 512,
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Rank of each query's first correct gallery item, and its number of positives.

    Parameters
    ----------
    query_emb : array of shape (n_queries, d)
    gallery_emb : array of shape (n_gallery, d)
    query_labels : sequence of length n_queries
    gallery_labels : sequence of length n_gallery
    query_ids, gallery_ids : sequences of ids, optional
        Where a query id equals a gallery id, that gallery item is the query
        itself and is never retrieved nor counted as a positive.
    max_memory_mb : float, default 512
        Bound on scratch memory; queries are scored in blocks sized to fit it.

    Returns
    -------
    rank : int64 array of shape (n_queries,)
        0-based position of the best-ranked positive among the items the query
        may retrieve (ties broken by gallery index), or -1 when it has none.
    n_positives : int64 array of shape (n_queries,)
        Gallery items with the query's label, other than the query itself.
    """
    q, g = _check_inputs(query_emb, gallery_emb, query_labels, gallery_labels, query_ids, gallery_ids)
    q, g = l2_normalize(q), l2_normalize(g)
    q_codes, g_codes = _label_codes(query_labels, gallery_labels)
    self_col = _self_columns(query_ids, gallery_ids, q.shape[0])
    n_query, n_gallery = q.shape[0], g.shape[0]

    per_label = np.bincount(g_codes, minlength=int(max(q_codes.max(initial=0), g_codes.max()) + 1))
    self_is_positive = (self_col >= 0) & (g_codes[np.maximum(self_col, 0)] == q_codes)
    n_pos = per_label[q_codes] - self_is_positive
    rank = np.full(n_query, -1, dtype=np.int64)

    order = np.argsort(g_codes, kind="stable")  # gallery by label: a query's positives are one slice
    gp, gp_codes = g[order], g_codes[order]
    column = np.empty(n_gallery, dtype=np.int64)
    column[order] = np.arange(n_gallery)
    lo, hi = np.searchsorted(gp_codes, q_codes, "left"), np.searchsorted(gp_codes, q_codes, "right")
    own = np.where(self_col >= 0, column[np.maximum(self_col, 0)], -1)
    tol = _float32_dot_error_bound(q.shape[1])
    # Two blocks in flight: BLAS multiplies the next block on its threads while a
    # worker thread ranks the previous one, so each gets half the memory budget.
    block = block_rows(n_gallery, max_memory_mb / 2)
    pending: list[tuple[slice, Future]] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        for start in range(0, n_query, block):
            sl = slice(start, min(start + block, n_query))
            sims = q[sl] @ gp.T
            for done_sl, future in pending:
                rank[done_sl] = np.where(n_pos[done_sl] > 0, future.result(), -1)
            pending = [(sl, pool.submit(_block_ranks, sims, q[sl], gp, q_codes[sl], gp_codes, lo[sl], hi[sl],
                                        own[sl], order, tol))]
            del sims
        for done_sl, future in pending:
            rank[done_sl] = np.where(n_pos[done_sl] > 0, future.result(), -1)
    return rank, n_pos


def _float32_dot_error_bound(d: int) -> float:
    """Bound on |float32 BLAS dot - exact dot| for unit vectors of dimension ``d``, plus the final rounding.

    Any summation order gives at most gamma_d * sum|q_i g_i| <= gamma_d with
    gamma_d = d u / (1 - d u), u = 2**-24 (Higham, Accuracy and Stability, 3.1).
    """
    u = 2.0**-24
    return d * u / (1 - d * u) + 2 * u


def _exact_pairs(q_unit: np.ndarray, g_unit: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """:func:`cosine_block` values for the given (row, col) pairs only."""
    out = np.empty(rows.size, dtype=np.float32)
    for s in range(0, rows.size, _EXACT_CHUNK):
        r, c = rows[s:s + _EXACT_CHUNK], cols[s:s + _EXACT_CHUNK]
        out[s:s + _EXACT_CHUNK] = np.einsum("ij,ij->i", q_unit[r].astype(np.float64), g_unit[c].astype(np.float64))
    return out


def _block_ranks(sims: np.ndarray, qb: np.ndarray, gp: np.ndarray, qb_codes: np.ndarray, gp_codes: np.ndarray,
                 lo: np.ndarray, hi: np.ndarray, own: np.ndarray, gallery_index: np.ndarray, tol: float) -> np.ndarray:
    """Items ranked ahead of each query's best positive, by the exact similarities of :func:`cosine_block`.

    ``sims = qb @ gp.T`` (float32, overwritten). ``gp`` is the gallery sorted by label, so query ``r``'s positives are the
    columns ``lo[r]:hi[r]``; ``own`` is the column of the query itself (or -1)
    and ``gallery_index`` maps a column back to its gallery index (tie rule).
    The block is scored with the fast float32 product; every decision it could
    get wrong (a score within ``2 tol`` of the rough best positive) is re-decided
    with exact similarities, so the result equals scoring the block exactly.
    """
    b, m = qb.shape[0], gp.shape[0]
    rows = np.arange(b)
    has_self = own >= 0
    sims[rows[has_self], own[has_self]] = -np.inf
    rough = np.full(b, -np.inf, dtype=np.float32)  # best float32 score among each row's positives
    ok = hi > lo
    if ok.any():
        bounds = np.empty(2 * int(ok.sum()), dtype=np.int64)
        bounds[0::2], bounds[1::2] = rows[ok] * m + lo[ok], rows[ok] * m + hi[ok]
        rough[ok] = np.maximum.reduceat(sims.ravel(), bounds[:-1] if bounds[-1] == b * m else bounds)[0::2]
    live = np.isfinite(rough)
    low = np.where(live, rough - 2 * tol, np.inf)[:, None]
    high = np.where(live, rough + 2 * tol, np.inf)[:, None]
    ahead = np.count_nonzero(sims > high, axis=1)  # surely ahead of the exact best positive
    win_r, win_c = np.nonzero((sims >= low) & (sims <= high))  # undecided: re-decide exactly
    del sims
    exact = _exact_pairs(qb, gp, win_r, win_c)
    index = gallery_index[win_c]
    pos = gp_codes[win_c] == qb_codes[win_r]
    pos[has_self[win_r] & (win_c == own[win_r])] = False
    best = np.full(b, -np.inf, dtype=np.float32)
    np.maximum.at(best, win_r[pos], exact[pos])
    first = np.full(b, m, dtype=np.int64)
    at_best = pos & (exact == best[win_r])
    np.minimum.at(first, win_r[at_best], index[at_best])
    wins = (exact > best[win_r]) | ((exact == best[win_r]) & (index < first[win_r]))
    return ahead + np.bincount(win_r[wins], minlength=b)


def retrieval_summary(query_emb: np.ndarray, gallery_emb: np.ndarray, query_labels: Sequence[Any],
                      gallery_labels: Sequence[Any], ks: Iterable[int] = (1, 5, 10),
                      query_ids: Sequence[Any] | None = None, gallery_ids: Sequence[Any] | None = None,
                      max_memory_mb: float = 512) -> dict[str, float | int]:
    """recall@K for every K plus the counts the report needs.

    Parameters
    ----------
    query_emb : array-like of shape (n_queries, d)
    gallery_emb : array-like of shape (n_gallery, d)
    query_labels : sequence of length n_queries
    gallery_labels : sequence of length n_gallery
    ks : iterable of positive int, default (1, 5, 10)
    query_ids, gallery_ids : sequences, optional
        Ids that identify the same image in both sets (self-match exclusion).
    max_memory_mb : float, default 512
        Bound on scratch memory (see :func:`first_positive_ranks`).

    Returns
    -------
    dict
        ``recall@K`` for each K in ``ks`` (in the given order), ``num_queries``
        (queries in the mean), ``num_excluded_queries``, ``num_gallery`` and
        ``embedding_dim``. Formula, ties and self-matches: see :func:`recall_at_k`.

    Raises
    ------
    ValueError
        On bad inputs, or when every query is excluded (recall would be 0/0).
    """
    ks = check_ks(ks)
    rank, n_pos = first_positive_ranks(query_emb, gallery_emb, query_labels, gallery_labels,
                                       query_ids, gallery_ids, max_memory_mb)
    included = rank >= 0
    n_included = int(included.sum())
    if n_included == 0:
        raise ValueError(f"every one of the {rank.size} queries is excluded: none has a gallery item of its "
                         "label other than itself, so recall is undefined. Put same-label images in the gallery.")
    out: dict[str, float | int] = {}
    for k in ks:
        out[f"recall@{k}"] = float(np.count_nonzero(rank[included] < k) / n_included)
    out.update(num_queries=n_included, num_excluded_queries=int(rank.size - n_included),
               num_gallery=int(np.asarray(gallery_emb).shape[0]), embedding_dim=int(np.asarray(gallery_emb).shape[1]))
    return out


def recall_at_k(query_emb: np.ndarray, gallery_emb: np.ndarray, query_labels: Sequence[Any],
                gallery_labels: Sequence[Any], ks: Iterable[int] = (1, 5, 10),
                query_ids: Sequence[Any] | None = None, gallery_ids: Sequence[Any] | None = None,
                ) -> dict[str, float]:
    """Recall@K (hit rate) of cosine retrieval.

    .. math::

        \\mathrm{recall@}K = \\frac{1}{|Q'|} \\sum_{q \\in Q'}
            \\mathbb{1}[\\exists\\, g \\in \\mathrm{top}_K(q) : y_g = y_q]

    where :math:`Q'` is the set of queries that have at least one gallery item of
    their label other than themselves, and :math:`\\mathrm{top}_K(q)` holds the
    :math:`\\min(K, M_q)` most similar gallery items the query may retrieve
    (:math:`M_q` is the gallery size, minus one when the query's own image is in it).

    Parameters
    ----------
    query_emb : array-like of shape (n_queries, d)
    gallery_emb : array-like of shape (n_gallery, d)
        Any scale; rows are L2-normalised here. NaN or inf raises ValueError.
    query_labels : sequence of length n_queries
    gallery_labels : sequence of length n_gallery
        Compared as strings, so ``1`` and ``"1"`` are the same label.
    ks : iterable of positive int, default (1, 5, 10)
    query_ids, gallery_ids : sequences, optional
        Ids that identify the same image in both sets (self-match exclusion).

    Returns
    -------
    dict
        ``{"recall@K": float}`` for each K, in the order of ``ks``.

    Notes
    -----
    Ties: equal similarities are ranked by gallery index (earlier first), which
    is deterministic. Self-matches: a query never retrieves its own image, even
    when ``K >= n_gallery``. Excluded queries: see :func:`retrieval_summary`.
    """
    summary = retrieval_summary(query_emb, gallery_emb, query_labels, gallery_labels, ks, query_ids, gallery_ids)
    return {key: value for key, value in summary.items() if key.startswith("recall@")}


def block_rows(n_gallery: int, max_memory_mb: float) -> int:
    """Queries per block for a gallery of ``n_gallery`` items under ``max_memory_mb``."""
    return max(1, int(max_memory_mb * 2**20 // (_BYTES_PER_PAIR * max(n_gallery, 1))))
