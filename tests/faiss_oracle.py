"""A test oracle: the exact ranking searched with ``faiss.IndexFlatIP`` (once ``score.backend: faiss``; the user's
FAISS is the index stage, whose ``Flat`` kind is the exact control).

FAISS returns each query's full ranking by its float32 inner products, with its
own order among equal scores. Neighbouring scores closer than the float32 error
window may be in the wrong order, so every such run of items that holds a
positive is re-sorted by the exact similarity and gallery index, which is the
numpy engine's rule (:mod:`recallk.score.ranking`). The result is the same
:class:`~recallk.score.ranking.Ranking`, so every metric is identical. FAISS needs the
whole ranking (k = gallery size) here: a cross-check, not a fast path.
"""

from __future__ import annotations

import numpy as np

from extras import extra
from recallk.score.ranking.budget import Budget
from recallk.score.ranking.engine import Ranking
from recallk.score.ranking.problem import Problem
from recallk.score.retrieval_data import RetrievalData


def rank_data_faiss(data: RetrievalData, max_memory_mb: float = 512) -> Ranking:
    """:func:`recallk.score.ranking.engine.rank_data` with ``Pass.every()`` (the complete ranking), computed
    with FAISS, for the checked ``data``.

    The faiss extra is required (:func:`extras.extra`: skipped without it, an error under ``make test``).
    """
    faiss = extra("faiss", "faiss")

    p = Problem.build(data)
    n, m = p.q.shape[0], p.gp.shape[0]
    index = faiss.IndexFlatIP(p.gp.shape[1])
    index.add(np.ascontiguousarray(p.gp))
    per_block = Budget(float(max_memory_mb)).search_rows(m)
    ranks: list[np.ndarray] = []
    n_pos = np.zeros(n, dtype=np.int64)
    n_ret = np.zeros(n, dtype=np.int64)
    opposite = np.full(n, -1, dtype=np.int64)
    for start in range(0, n, per_block):
        scores, cols = index.search(p.q[start:start + per_block], m)
        for k in range(scores.shape[0]):
            i = start + k
            r, opp, n_ret[i] = _query_ranks(p, i, scores[k], cols[k])
            ranks.append(r)
            n_pos[i], opposite[i] = r.size, opp
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_pos, out=offsets[1:])
    flat = np.concatenate(ranks) if ranks else np.empty(0, np.int64)
    return Ranking(n_pos, n_ret, offsets, flat.astype(np.int64), opposite, complete=True)


def _query_ranks(p: Problem, i: int, scores: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, int, int]:
    """Ranks of query ``i``'s positives from FAISS's order, runs of near-equal scores re-sorted exactly."""
    m = p.gp.shape[0]
    keep = ~p.excluded(np.array([i]), 0, m)[0][cols]
    cols, scores = cols[keep], scores[keep]
    positive = (cols >= p.lo[i]) & (cols < p.hi[i])
    run = np.concatenate([[0], np.cumsum(scores[:-1] - scores[1:] > 2 * p.tol)])  # each score is off by <= tol
    exact = np.full(cols.size, np.nan, dtype=np.float32)
    q64 = p.q[i].astype(np.float64)
    for r in np.unique(run[positive]):
        a, b = np.searchsorted(run, r, "left"), np.searchsorted(run, r, "right")
        if b - a == 1:
            continue
        e = (p.gp[cols[a:b]].astype(np.float64) @ q64).astype(np.float32)
        order = np.lexsort((p.gindex[cols[a:b]], -e))
        cols[a:b], positive[a:b], exact[a:b] = cols[a:b][order], positive[a:b][order], e[order]
    ranks = np.flatnonzero(positive)
    if not ranks.size:
        return ranks, -1, cols.size
    first = ranks[0]
    if np.isnan(exact[first]):  # alone in its run: no exact tie possible
        return ranks, int(first), cols.size
    group = np.flatnonzero(exact == exact[first])  # contiguous: its run is sorted by exact value
    index = p.gindex[cols[group]]
    last = index[positive[group]].max()
    return ranks, int(group[0] + np.count_nonzero(~positive[group] & (index > last))), cols.size
