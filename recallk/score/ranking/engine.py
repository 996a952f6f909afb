"""The exact ranking engine under every metric: where each query's positives rank.

For each query it finds the 0-based rank of every positive (gallery items of the
query's label that the query may retrieve) among all the items the query may
retrieve, by the exact similarities of :func:`recallk.score.similarity.cosine_block`,
with ties broken by gallery index (smaller first). It also finds where the first
positive would rank with ties broken the other way (tie sensitivity).

How (FAISS-contrib style, flat numpy, blocked under a memory bound), module by module:

* :mod:`~recallk.score.ranking.problem`: the checked :class:`~recallk.score.retrieval_data.RetrievalData`
  prepared once (unit vectors, the gallery sorted by label, exclusions, the leave-one-out flag).
* :class:`~recallk.score.passes.Pass`: which ranks to compute (the first positive's, the top
  max(R, depth), or every one), one explicit value.
* :mod:`~recallk.score.ranking.positives`: the exact similarity of every
  (query, positive) pair comes from one float64 product per label; a query's
  positives sorted by (-similarity, gallery index) are its *thresholds*.
* :mod:`~recallk.score.ranking.schedule`: positive and excluded cells are set to
  -inf; then each threshold counts the cells above it. Each core takes tiles from
  a shared list and multiplies each with single-threaded BLAS.
* :mod:`~recallk.score.ranking.fast`: only the first threshold is needed for
  recall@K and MRR: float32 tiles (4 MiB) are scanned while still in the cache,
  one compare for the cells surely above and one for the error window
  (:mod:`~recallk.score.ranking.scan`). With a cap (``Pass.first(cap)``, recall@K
  alone: ranks beyond the largest K change nothing) a query stops counting once ``cap``
  cells surely beat its first positive.
* :mod:`~recallk.score.ranking.top`: with ``Pass.top(depth)`` (precision@K, r_precision,
  map@r, recall and mrr: no full map) only each query's first max(R, depth) ranks are
  needed: float32 tiles, each row's candidates above its L-th score less ``2 tol``,
  and an exact order of the candidates, at about the cost of the fast path.
* :mod:`~recallk.score.ranking.exact`: full map needs every positive's rank: exact
  tiles (float64 product rounded to float32), their rows sorted, every threshold's
  count read with a binary search.
* :mod:`~recallk.score.ranking.counting`: a float32 score differs from the exact
  one by at most ``tol`` (Higham's gamma_d bound), so only cells within ``tol`` of a
  threshold are undecided; those cells are re-scored and re-decided exactly,
  including exact ties, which are counted by gallery index on both sides (tie
  sensitivity).
* Leave-one-out (the gallery *is* the query set) multiplies only the tiles on
  and above the diagonal: each serves its rows and its columns, counted in one
  read (fast path) or through a transposed copy (sorting).
* :mod:`~recallk.score.ranking.budget`: every size above follows from
  ``max_memory_mb`` by the rules of one :class:`~recallk.score.ranking.budget.Budget`.

The counts are integers, so the result does not depend on tile sizes or thread
counts. The one caveat is the similarity itself: two float64 products of different
shapes may differ in the last float64 bit, which changes the float32 value only at
a rounding boundary (about 2**-29 of values), so an exact tie may, that rarely, not be one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from recallk.checks import check_memory, same_values
from recallk.score.passes import Pass, Ranks
from recallk.score.ranking.budget import Budget
from recallk.score.ranking.counting import HAND_OVER, RankCounter
from recallk.score.ranking.direct import direct_ranks, plain_data, plain_first_ranks
from recallk.score.ranking.exact import exact_tiles
from recallk.score.ranking.fast import fast_tiles
from recallk.score.ranking.positives import find_positives, positive_counts
from recallk.score.ranking.problem import Problem
from recallk.score.ranking.schedule import Select, query_chunks, rows_to_csr, spans
from recallk.score.ranking.top import deepest, top_ranks
from recallk.score.retrieval_data import RetrievalData

__all__ = ["Ranking", "rank_data", "rank_positives"]

log = logging.getLogger(__name__)

#: The default pass of :func:`rank_positives`: every positive's rank.
EVERY = Pass.every()


@dataclass(frozen=True)
class Ranking:
    """Ranks of the positives of each query (all of them, or only the first).

    ``ranks[offsets[i]:offsets[i + 1]]`` are query ``i``'s positive ranks in
    ascending order (0-based, among the ``n_retrievable[i]`` items it may retrieve).
    From the first-positive pass (``Pass.first()``, ``complete`` False) each query with positives has one
    entry, its first positive's rank (``first_rank``); ``n_positives`` still counts all of them.
    With a cap, first ranks (and ``first_rank_opposite``) of ``cap`` or more read ``cap``.

    Attributes
    ----------
    n_positives, n_retrievable : ndarray
        (n,) positives, and items it may retrieve, per query.
    offsets, ranks : ndarray
        CSR layout of the ranks, as above.
    first_rank_opposite : ndarray
        (n,) first positive's rank with ties broken the other way; -1 without positives.
    complete : bool
        Every positive's rank, or only the first.
    cap : int or None
        The cap on first ranks, if any.
    depth : ndarray or None
        (n,) with ``complete``, from the top-L pass: query ``i``'s ranks are those of its positives
        within its first ``depth[i]`` ranks only (``depth[i] = min(max(R_i, depth), M_i)``, so
        precision@K for K <= ``depth``, r_precision and map@r are exact; full map is not). None: all.
    first : ndarray or None
        (n,) each query's first positive's rank (-1 without positives) when ``ranks`` may not hold it
        (the top-L pass); None: read from ``ranks``.
    """

    n_positives: np.ndarray
    n_retrievable: np.ndarray
    offsets: np.ndarray
    ranks: np.ndarray
    first_rank_opposite: np.ndarray
    complete: bool
    cap: int | None = None
    depth: np.ndarray | None = None
    first: np.ndarray | None = None

    @cached_property
    def first_rank(self) -> np.ndarray:
        """Rank of each query's best positive, -1 when it has none (computed once)."""
        if self.first is not None:
            return self.first
        has = self.offsets[1:] > self.offsets[:-1]
        if not self.ranks.size:
            return np.full(has.size, -1, dtype=np.int64)
        return np.where(has, self.ranks[np.minimum(self.offsets[:-1], self.ranks.size - 1)], -1)


def rank_positives(query_emb: np.ndarray, gallery_emb: np.ndarray, query_labels: Sequence[Any],
                   gallery_labels: Sequence[Any], *, query_ids: Sequence[Any] | None = None,
                   gallery_ids: Sequence[Any] | None = None, exclude: Sequence[tuple[Any, Any]] = (),
                   same_set: bool | None = None, ranks: Pass = EVERY, max_memory_mb: float | None = None,
                   count_tiles: CountTiles | None = None) -> Ranking:
    """Exact ranks of every query's positives (or those ``ranks`` asks for): :func:`rank_data` of the
    :class:`~recallk.score.retrieval_data.RetrievalData` of the arguments, checked.

    Parameters
    ----------
    query_emb, gallery_emb, query_labels, gallery_labels, query_ids, gallery_ids, exclude, same_set
        As for :class:`~recallk.score.retrieval_data.RetrievalData`.
    ranks : Pass, default Pass.every()
        The pass (:class:`~recallk.score.passes.Pass`): every positive's rank, each query's first positive
        only (``Pass.first(cap=None)``: recall@K, MRR), or the positives within its first ``max(R, depth)``
        ranks (``Pass.top(depth, cap=None)``).
    max_memory_mb : float, optional
        The memory bound (:class:`~recallk.score.ranking.budget.Budget`, see :func:`rank_data`); None: the
        ``score.max_memory_mb`` default.
    count_tiles : callable, optional
        Runs the tile jobs elsewhere (:data:`CountTiles`; e.g. :class:`~recallk.score.ranking.ray_tiles.RayTiles`).

    Returns
    -------
    Ranking
    """
    data = RetrievalData(query_emb, gallery_emb, query_labels, gallery_labels, query_ids=query_ids,
                         gallery_ids=gallery_ids, exclude=exclude, same_set=same_set)
    return rank_data(data, ranks, check_memory(max_memory_mb), count_tiles)


def rank_data(data: RetrievalData, ranks: Pass, max_memory_mb: float,
              count_tiles: CountTiles | None = None) -> Ranking:
    """Exact ranks of the positives of ``data``'s queries that the pass ``ranks`` computes.

    Parameters
    ----------
    data : RetrievalData
        The queries, the gallery, their labels, ids and exclusions, checked; ``data.same_set`` (leave-one-out)
        multiplies only the tiles on and above the diagonal (None: detected from the arrays).
    ranks : Pass
        ``Pass.every()``: every positive's rank. ``Pass.first(cap)``: each query's first positive only
        (recall@K, MRR); with ``cap``, a first rank of ``cap`` or more reads ``cap``, which lets a query stop
        counting as soon as ``cap`` items surely beat its best positive (much less work when many queries
        miss). ``Pass.top(depth, cap)``: only each query's positives within its first ``max(R, depth)`` ranks
        (``R``: its positives; recall@K and precision@K for K <= ``depth``, r_precision, map@r, mrr, not full
        map), which the top-L pass (:mod:`~recallk.score.ranking.top`) finds at about the cost of the fast
        path; the :class:`Ranking` then has ``depth`` and ``first``. Small problems (direct path) and
        ``count_tiles`` give every positive's rank for it.
    max_memory_mb : float
        The memory bound, checked (:class:`~recallk.score.ranking.budget.Budget`, see Notes).
    count_tiles : callable, optional
        Runs the tile jobs of each pass (:data:`CountTiles`) elsewhere, e.g. on Ray tasks
        (:mod:`~recallk.score.ranking.ray_tiles`); None: on this machine's cores. With it, a small
        problem takes the tiles too (no direct path).

    Returns
    -------
    Ranking

    Notes
    -----
    ``max_memory_mb`` first pays for the unit copies of both sets (those that fit a quarter
    of it; a set that does not is normalised tile by tile as the tiles read it, with the
    same bits) and the positive lists and counters (52 bytes per positive, or per query for the first
    positive only); tiles get 80% of the rest, and never less than a quarter of ``max_memory_mb``. When
    every positive's lists would take more than a quarter of the budget (few, large
    labels), the complete ranking takes runs of queries whose lists fit there
    (leave-one-out then multiplies every tile: runs of queries are not symmetric). The
    result itself holds 8 bytes per positive (per query for the first positive only).
    """
    started = time.perf_counter()
    budget = Budget(float(max_memory_mb))
    n, (m, d) = data.n_queries, data.gallery_emb.shape
    # the direct path and the tile passes compute every rank, or the first positive's
    tiles_pass = ranks if ranks.first_only else Pass.every()
    # small: one product, no tiles, no threads (unless the tiles run elsewhere)
    direct = count_tiles is None and budget.direct(n, m, 4 * d * (n + m))
    raw = True  # the direct path's first positive: its raw product not tried yet
    if direct and tiles_pass.first_only and plain_data(data):  # a training loop's batch: no Problem when it decides
        found = plain_first_ranks(data, tiles_pass.cap)
        if found is not None:
            n_pos, offsets, ranked, opposite = found
            if log.isEnabledFor(logging.DEBUG):
                path = "leave-one-out" if _plain_same_set(data) else "query x gallery"
                log.debug("ranked %d queries x %d gallery items: direct path (raw product of the plain data), %s, "
                          "%s, %.3f s", n, m, _kind(ranks), path, time.perf_counter() - started)
            return Ranking(n_pos, np.full(n, m, dtype=np.int64), offsets, ranked, opposite, False, tiles_pass.cap)
        raw = False
    # the direct path's first positive normalises the rows only when its raw product leaves a doubt
    p = Problem.build(data, unit_bytes=0 if direct and tiles_pass.first_only else budget.unit_bytes())
    kind = _kind(ranks)
    if direct:
        n_pos, offsets, ranked, opposite = direct_ranks(p, tiles_pass, raw)
        log.debug("ranked %d queries x %d gallery items: direct path (one exact product), %s, %s, %.3f s", n, m,
                  kind, "leave-one-out" if p.same_set else "query x gallery", time.perf_counter() - started)
        return Ranking(n_pos, m - p.n_excluded(), offsets, ranked, opposite, not tiles_pass.first_only, tiles_pass.cap)
    if ranks.ranks is Ranks.TOP and count_tiles is None:
        result, jobs, tiles, note = _top_ranking(p, budget, ranks)
        log.debug("ranked %d queries x %d gallery items: top-L pass (depth %d), %s, %d jobs, %d tiles, %.3f s", n,
                  m, ranks.depth, note, jobs, tiles, time.perf_counter() - started)
        return result
    part = _rank_part(p, p.q.nbytes, budget, tiles_pass, count_tiles) if tiles_pass.first_only \
        else _complete(p, budget, count_tiles)
    result = Ranking(part.n_pos, m - p.n_excluded(), part.offsets, part.ranks, part.opposite,
                     not tiles_pass.first_only, tiles_pass.cap)
    path = "leave-one-out" if p.same_set and part.chunks == 1 else "query x gallery"
    log.debug("ranked %d queries x %d gallery items: %s, %s, %d chunk(s), %d jobs, %d tiles, %.3f s", n, m, kind,
              path, part.chunks, part.jobs, part.tiles, time.perf_counter() - started)
    return result


def _kind(ranks: Pass) -> str:
    """The pass as the engine's debug line names it."""
    if not ranks.first_only:
        return "exact pass (every positive)"
    return "fast pass (first positive)" if ranks.cap is None else f"fast pass (first positive, cap {ranks.cap})"


def _plain_same_set(data: RetrievalData) -> bool:
    """For the log: whether plain data (:func:`~recallk.score.ranking.direct.plain_data`) is leave-one-out, as
    :meth:`Problem.build` detects it (the same rows and labels; no ids and no exclusions to compare)."""
    if data.same_set is not None:
        return bool(data.same_set)
    q, g = data.query_emb, data.gallery_emb
    return (q is g or same_values(q, g)) and bool(np.array_equal(data.query_labels, data.gallery_labels))


def rank_problem(p: Problem, budget: Budget, ranks: Pass) -> Ranking:
    """The tile passes of :func:`rank_data` for a built problem ``p`` (say, the queries a backend hands back):
    the top-L pass for ``Pass.top``, the first positive's for ``Pass.first``, else every positive's."""
    if ranks.ranks is Ranks.TOP:
        return _top_ranking(p, budget, ranks)[0]
    part = _rank_part(p, p.q.nbytes, budget, ranks) if ranks.first_only else _complete(p, budget)
    return Ranking(part.n_pos, p.gp.shape[0] - p.n_excluded(), part.offsets, part.ranks, part.opposite,
                   not ranks.first_only, ranks.cap)


def _complete(p: Problem, budget: Budget, count_tiles: CountTiles | None = None) -> Part:
    """Every positive's rank, in chunks of queries whose positive lists fit the budget
    (:func:`~recallk.score.ranking.schedule.query_chunks`); the part's ``chunks`` says how many."""
    chunks = query_chunks(p, budget)
    if len(chunks) == 1:
        return _rank_part(p, p.q.nbytes, budget, Pass.every(), count_tiles)
    n = p.q.shape[0]  # every positive's lists, a chunk of queries at a time; their ranks follow one another
    n_pos, opposite = np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    ranks, filled = np.empty(int((p.hi - p.lo).sum()), dtype=np.int64), 0  # room for every possible positive
    jobs = tiles = 0
    for rows in chunks:
        part = _rank_part(p.queries(rows), p.q.nbytes, budget, Pass.every(), count_tiles)
        n_pos[rows], opposite[rows] = part.n_pos, part.opposite
        ranks[filled:filled + part.ranks.size] = part.ranks
        filled += part.ranks.size
        jobs, tiles = jobs + part.jobs, tiles + part.tiles
    return Part(n_pos, np.r_[0, np.cumsum(n_pos)], ranks[:filled], opposite, jobs, tiles, len(chunks))


def _top_ranking(p: Problem, budget: Budget, ranks: Pass) -> tuple[Ranking, int, int, str]:
    """:func:`rank_data` with ``Pass.top(depth, cap)``: the top-L pass for the queries it serves, the complete
    ranking (cut at L) for those too deep or whose candidates overflow, and the fast path's first rank for those whose
    first positive lies beyond L (with ``cap``, none: their first ranks read ``cap``, as do all of ``cap`` or
    more). Returns the ranking, the jobs and tiles done, and a note for the log."""
    n, m, depth, cap = p.q.shape[0], p.gp.shape[0], int(ranks.depth), ranks.cap
    n_pos, n_ret = positive_counts(p, budget), m - p.n_excluded()
    limit = np.minimum(np.maximum(n_pos, depth), n_ret)  # L per query
    tiles = budget.tiles(p.q.nbytes + p.gp.nbytes, 0)
    served = (n_pos > 0) & (limit <= deepest(p, tiles))
    top = top_ranks(p, tiles, limit, np.flatnonzero(served))
    first, opposite, ok = top.first, top.opposite, served & ~top.overflow
    rows = np.flatnonzero(ok)
    sizes = np.diff(top.offsets)[rows]
    pieces = [(rows, sizes, top.ranks[spans(top.offsets[rows], sizes)])]  # (rows, sizes, their ranks)
    deep = np.flatnonzero((n_pos > 0) & ~ok)
    jobs, n_tiles = top.jobs, top.tiles
    if deep.size:  # the complete ranking, cut at each query's L
        part = _complete(p.queries(deep), budget)
        keep = part.ranks < np.repeat(limit[deep], part.n_pos)
        kept = np.bincount(np.repeat(np.arange(deep.size), part.n_pos)[keep], minlength=deep.size)
        first[deep] = part.ranks[part.offsets[:-1]]  # every one of them has positives
        opposite[deep] = part.opposite
        pieces.append((deep, kept, part.ranks[keep]))
        jobs, n_tiles = jobs + part.jobs, n_tiles + part.tiles
    beyond = np.flatnonzero(ok & ~top.found)
    if cap is not None:  # beyond L the first positive ranks at L or more (>= depth >= cap); the opposite
        first[beyond] = cap  # rule's rank is exact or at least L where a positive is a candidate, else >= L
        opposite[beyond] = np.where(opposite[beyond] >= 0, np.minimum(opposite[beyond], cap), cap)
        has = n_pos > 0
        first[has], opposite[has] = np.minimum(first[has], cap), np.minimum(opposite[has], cap)
    elif beyond.size:  # every positive lies beyond L: the fast path's exact first rank
        part = _rank_part(p.queries(beyond), p.q.nbytes, budget, Pass.first())
        first[beyond], opposite[beyond] = part.ranks, part.opposite
        jobs, n_tiles = jobs + part.jobs, n_tiles + part.tiles
    offsets, (ranks,) = rows_to_csr(n, pieces)
    note = f"{np.count_nonzero(ok)} served, {deep.size} by the complete ranking " \
           f"({np.count_nonzero(top.overflow)} overflowed), " \
           f"{beyond.size} first ranks beyond L{' (capped)' if cap is not None else ''}"
    return Ranking(n_pos, n_ret, offsets, ranks, opposite, True, cap, limit, first), jobs, n_tiles, note


class Part(NamedTuple):
    """:func:`_rank_part`'s result for one chunk of queries, or :func:`_complete`'s for all of them."""

    n_pos: np.ndarray     # positives per query
    offsets: np.ndarray   # each query's ranks are ranks[offsets[i]:offsets[i + 1]]
    ranks: np.ndarray
    opposite: np.ndarray  # first ranks under the opposite tie rule
    jobs: int             # jobs and tiles the pass did
    tiles: int
    chunks: int = 1       # chunks of queries it took (the complete ranking under a tight budget)


def count_tiles_here(p: Problem, counter: RankCounter, tiles: Budget, ranks: Pass,
                     select: Select = None) -> tuple[int, int]:
    """The tiles of one pass on this machine's cores: every positive's (``Pass.every()``) or the first's
    (``Pass.first(cap)``); ``select`` keeps a share of the jobs (a Ray task's)."""
    if ranks.first_only:
        return fast_tiles(p, counter, tiles, ranks.cap, select)
    return exact_tiles(p, counter, tiles, select)


#: ``count_tiles(p, counter, tiles, ranks) -> (jobs, tiles)``: adds every tile's counts of one pass
#: (``Pass.every()`` or ``Pass.first(cap)``) into ``counter`` (the positive lists of ``p``) under the tiles'
#: budget; :func:`count_tiles_here`.
CountTiles = Callable[[Problem, RankCounter, Budget, Pass], tuple[int, int]]


def _rank_part(p: Problem, query_bytes: int, budget: Budget, ranks: Pass,
               count_tiles: CountTiles | None = None) -> Part:
    """:func:`rank_data` for the queries of ``p`` (leave-one-out when ``p.same_set``), with the pass
    ``ranks`` (``Pass.every()`` or ``Pass.first(cap)``). ``query_bytes``: the unit copy of every query,
    held by the caller."""
    n, complete, cap = p.q.shape[0], not ranks.first_only, ranks.cap
    # complete: every positive; else the best one and the last one tied with it (opposite tie rule)
    crowded = np.zeros(n, dtype=bool)  # first positive: queries whose positives mostly tie with the best
    pos_off, pos_val, pos_col, n_pos, top_tie = find_positives(p, budget, first_only=not complete, crowded=crowded)
    counter = RankCounter(p, pos_off, pos_val, pos_col)
    counter.handed |= crowded
    # the budget covers everything this call holds: unit copies, positive lists, counters, then the tiles
    tiles = budget.tiles(query_bytes + p.gp.nbytes, pos_val.size)
    jobs, n_tiles = (count_tiles or count_tiles_here)(p, counter, tiles, ranks)
    base = counter.gt + counter.eq_lt
    has = n_pos > 0
    if complete:
        ranked, offsets = base + (np.arange(pos_val.size) - np.repeat(pos_off[:-1], n_pos)), pos_off
        opp_t = pos_off[:-1] + top_tie
    else:  # one entry per query with positives: its first positive's rank
        ranked, offsets = base[pos_off[:-1][has]], np.r_[0, np.cumsum(has)]
        opp_t = pos_off[:-1] + (top_tie > 0)
    opposite = np.full(n, -1, dtype=np.int64)
    opposite[has] = counter.gt[opp_t[has]] + counter.eq_gt[opp_t[has]]
    handed = np.flatnonzero(counter.handed)
    if handed.size:  # first-positive path: queries whose similarities mostly tie, ranked by the exact pass
        exact = _complete(p.queries(handed), budget, count_tiles)
        at = np.searchsorted(np.flatnonzero(has), handed)  # every handed query has positives
        ranked[at], opposite[handed] = exact.ranks[exact.offsets[:-1]], exact.opposite
        jobs, n_tiles = jobs + exact.jobs, n_tiles + exact.tiles
        log.debug("%d queries left the fast pass for the exact pass (more than %d undecided cells each: their "
                  "similarities mostly tie)", handed.size, HAND_OVER)
    if cap is not None:  # a query that stopped counting holds a partial count of at least cap
        ranked, opposite[has] = np.minimum(ranked, cap), np.minimum(opposite[has], cap)
    return Part(n_pos, offsets, ranked, opposite, jobs, n_tiles)
