"""The exact ranking engine under every metric: where each query's positives rank.

For each query it finds the 0-based rank of every positive (gallery items of the
query's label that the query may retrieve) among all the items the query may
retrieve, by the exact similarities of :func:`recallk.score.similarity.cosine_block`,
with ties broken by gallery index (smaller first). It also finds where the first
positive would rank with ties broken the other way (tie sensitivity).

How (FAISS-contrib style, flat numpy, blocked under a memory bound):

* The exact similarity of every (query, positive) pair comes from one float64
  product per label; a query's positives sorted by (-similarity, gallery index)
  are its *thresholds*.
* Positive and excluded cells are set to -inf; then each threshold counts the
  cells above it. Each core takes tiles from a shared list and multiplies each
  with single-threaded BLAS. Only the first threshold is needed for recall@K and
  MRR: float32 tiles (4 MiB) are scanned while still in the cache, one compare
  for the cells surely above and one for the error window. Every metric that
  needs all positives takes exact tiles instead (float64 product rounded to
  float32), sorts their rows and reads every threshold's count with a binary
  search.
* A float32 score differs from the exact one by at most ``tol`` (Higham's
  gamma_d bound), so only cells within ``tol`` of a threshold are undecided;
  those cells are re-scored and re-decided exactly, including exact ties, which
  are counted by gallery index on both sides (tie sensitivity).
* With ``cap`` (recall@K alone: ranks beyond the largest K change nothing) a
  query stops counting once ``cap`` cells surely beat its first positive.
* Leave-one-out (the gallery *is* the query set) multiplies only the tiles on
  and above the diagonal: each serves its rows and its columns, counted in one
  read (fast path) or through a transposed copy (sorting).

The counts are integers, so the result does not depend on tile sizes or thread
counts. The one caveat is the similarity itself: two float64 products of different
shapes may differ in the last float64 bit, which changes the float32 value only at
a rounding boundary (about 2**-29 of values), so an exact tie may, that rarely, not be one.
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from recallk.score.ranking.budget import Budget
from recallk.score.ranking.counting import _Counter, _Undecided
from recallk.score.ranking.positives import _positives
from recallk.score.ranking.problem import Problem
from recallk.score.ranking.scan import _Buffers, _exact_product, _scan

#: Fast path: cells of one thread's tile (4 MiB of float32). Each thread multiplies its own tiles with
#: single-threaded BLAS and scans each tile while it is still in the cache: as fast a product as big
#: blocks, without writing and re-reading every block through memory (or BLAS threads spinning meanwhile).
_TILE_CELLS = 2**20
#: Exact tiles' cells: the float64 product needs no cache residence (the sort reads one row at a time),
#: and taller tiles multiply faster.
_EXACT_TILE_CELLS = 2**21
#: Fast tiles' gallery width (query x gallery); leave-one-out tiles are square.
_TILE_WIDTH = 2048


@dataclass(frozen=True)
class Ranking:
    """Ranks of the positives of each query (all of them, or only the first).

    ``ranks[offsets[i]:offsets[i + 1]]`` are query ``i``'s positive ranks in
    ascending order (0-based, among the ``n_retrievable[i]`` items it may retrieve).
    With ``complete=False`` each query with positives has one entry, its first
    positive's rank (``first_rank``); ``n_positives`` still counts all of them.
    With ``cap``, first ranks (and ``first_rank_opposite``) of ``cap`` or more read ``cap``.
    """

    n_positives: np.ndarray
    n_retrievable: np.ndarray
    offsets: np.ndarray
    ranks: np.ndarray
    first_rank_opposite: np.ndarray
    complete: bool
    cap: int | None = None

    @property
    def first_rank(self) -> np.ndarray:
        """Rank of each query's best positive, -1 when it has none."""
        has = self.offsets[1:] > self.offsets[:-1]
        if not self.ranks.size:
            return np.full(has.size, -1, dtype=np.int64)
        return np.where(has, self.ranks[np.minimum(self.offsets[:-1], self.ranks.size - 1)], -1)


def _n_workers() -> int:
    """Threads for the fast path: every core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def rank_positives(query_emb: np.ndarray, gallery_emb: np.ndarray, query_labels: Sequence[Any],
                   gallery_labels: Sequence[Any], query_ids: Sequence[Any] | None = None,
                   gallery_ids: Sequence[Any] | None = None, exclude: Sequence[tuple[Any, Any]] = (),
                   max_memory_mb: float = 512, complete: bool = True, cap: int | None = None,
                   same_set: bool | None = None) -> Ranking:
    """Exact ranks of every query's positives (or only the first one when ``complete`` is False).

    ``cap`` (first positive only, for recall@K with K <= ``cap``): a first rank of
    ``cap`` or more is reported as ``cap``, which lets a query stop counting as soon as
    ``cap`` items surely beat its best positive (much less work when many queries miss).

    ``same_set`` (leave-one-out): the queries are the gallery, row for row, with the same ids
    and exclusion values; only the tiles on and above the diagonal are multiplied. ``None``
    detects it by comparing the arrays (for API callers); the score stage passes it from
    the split protocol.

    Inputs must already be validated (:func:`recallk.checks.check_inputs`).
    ``exclude`` holds (query values, gallery values) pairs: a gallery item sharing
    the query's value in any of them is not retrievable (missing values never match).
    Memory: ``max_memory_mb`` first pays for the unit copies of both sets and the
    positive lists and counters (52 bytes per positive, or per query when not ``complete``);
    tiles get 80% of the rest, and never less than a quarter of ``max_memory_mb``. When
    every positive's lists would take more than a quarter of the budget (few, large
    labels), the complete ranking takes runs of queries whose lists fit there (leave-one-out
    then multiplies every tile: runs of queries are not symmetric). The result itself holds
    8 bytes per positive (per query when not ``complete``).
    """
    if cap is not None and (complete or isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 1):
        raise ValueError(f"`cap` must be a positive integer, with complete=False. Got {cap!r} instead.")
    p = Problem.build(query_emb, gallery_emb, query_labels, gallery_labels, query_ids, gallery_ids, exclude,
                      same_set)
    n, m = p.q.shape[0], p.gp.shape[0]
    symmetric = p.same_set
    budget = Budget(max_memory_mb)
    chunks = _query_chunks(p, budget) if complete else [np.arange(n)]
    if len(chunks) == 1:
        n_pos, offsets, ranks, opposite = _rank_part(p, p.q.nbytes, budget, complete, symmetric, cap)
    else:  # every positive's lists, a chunk of queries at a time; their ranks follow one another
        n_pos, opposite = np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        ranks, filled = np.empty(int((p.hi - p.lo).sum()), dtype=np.int64), 0  # room for every possible positive
        for rows in chunks:
            sub = p.queries(rows)
            n_pos[rows], _, part, opposite[rows] = _rank_part(sub, p.q.nbytes, budget, True, False, None)
            ranks[filled:filled + part.size] = part
            filled += part.size
        ranks, offsets = ranks[:filled], np.r_[0, np.cumsum(n_pos)]
    return Ranking(n_pos, m - p.n_excluded(), offsets, ranks, opposite, complete, cap)


def _query_chunks(p: Problem, budget: Budget) -> list[np.ndarray]:
    """Consecutive runs of queries whose positive lists and counters take about a quarter of the budget
    at most each; one run when all of them fit."""
    return [np.arange(a, b) for a, b in consecutive_runs(p.hi - p.lo, budget.chunk_positives())]  # hi - lo: positives, at most


def consecutive_runs(counts: np.ndarray, most: int) -> list[tuple[int, int]]:
    """Split ``range(len(counts))`` into consecutive runs ``(a, b)`` holding about ``most`` of ``counts``
    each: a run starts wherever the total before an entry crosses a multiple of ``most``, so a run holds
    less than ``most`` plus its last entry's count. One run when the total fits."""
    counts = np.asarray(counts, dtype=np.int64)
    if counts.sum() <= most:
        return [(0, counts.size)]
    before = np.cumsum(counts) - counts
    starts = np.r_[0, np.flatnonzero(np.diff(before // most)) + 1]
    return list(zip(starts.tolist(), np.r_[starts[1:], counts.size].tolist()))


def _rank_part(p: Problem, query_bytes: int, budget: Budget, complete: bool, symmetric: bool,
               cap: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`rank_positives` for the queries of ``p``: (positives per query, offsets, ranks, opposite first ranks).
    ``query_bytes``: the unit copy of every query, held by the caller."""
    n = p.q.shape[0]
    # complete: every positive; else the best one and the last one tied with it (opposite tie rule)
    pos_off, pos_val, pos_col, n_pos, top_tie = _positives(p, budget, first_only=not complete)
    counter = _Counter(p, pos_off, pos_val, pos_col)
    # the budget covers everything this call holds: unit copies, positive lists, counters, then the tiles
    tiles = budget.tiles(query_bytes + p.gp.nbytes, pos_val.size)
    (_fast_tiles(p, counter, tiles, symmetric, cap) if not complete else _exact_tiles(p, counter, tiles, symmetric))
    base = counter.gt + counter.eq_lt
    has = n_pos > 0
    if complete:
        ranks, offsets = base + (np.arange(pos_val.size) - np.repeat(pos_off[:-1], n_pos)), pos_off
        opp_t = pos_off[:-1] + top_tie
    else:  # one entry per query with positives: its first positive's rank
        ranks, offsets = base[pos_off[:-1][has]], np.r_[0, np.cumsum(has)]
        opp_t = pos_off[:-1] + (top_tie > 0)
    opposite = np.full(n, -1, dtype=np.int64)
    opposite[has] = counter.gt[opp_t[has]] + counter.eq_gt[opp_t[has]]
    if cap is not None:  # a query that stopped counting holds a partial count of at least cap
        ranks, opposite[has] = np.minimum(ranks, cap), np.minimum(opposite[has], cap)
    return n_pos, offsets, ranks, opposite


def _fast_tiles(p: Problem, counter: _Counter, budget: Budget, symmetric: bool,
                cap: int | None = None) -> None:
    """First-positive counts (recall@K, MRR): each thread takes jobs from a shared list, multiplies
    each tile with single-threaded BLAS, masks it and scans it while it is in the cache.

    Query x gallery: a job is a run of query rows (sorted by label, so a tile's masked positives
    are a few runs) over every gallery tile. Leave-one-out: a job is one square tile on or above
    the diagonal, counted for its rows and (off the diagonal) its columns in the same read.
    Queries without positives are never multiplied. With ``cap``, a query stops counting once
    ``cap`` cells are surely above its first positive (its rank is then at least ``cap``): it
    leaves its run's later tiles, and a leave-one-out tile whose rows or columns have mostly
    stopped is multiplied only for the queries still counting (rows x its columns, columns x its rows).
    """
    m = p.gp.shape[0]
    cells = budget.fast_tile_cells(_n_workers(), _TILE_CELLS)
    jobs, width = _tiling(p, cells, symmetric)
    side = width

    def counting(queries: np.ndarray, n_thr: np.ndarray) -> np.ndarray:
        """Positions of the queries still counting: with positives and, under a cap, below it."""
        live = n_thr > 0
        if cap is not None:  # read without the lock: counts only grow, a stale one costs work, not correctness
            live[live] = counter.gt[counter.off[queries[live]]] < cap
        return np.flatnonzero(live)

    def start() -> tuple:
        scratch, undecided = _Buffers(), _Undecided(counter)

        def row_tile(queries, vectors, c0, c1, window) -> np.ndarray:
            """Cells surely above each query's first positive among columns [c0, c1) (undecided ones handed on)."""
            n_thr, lo, hi = window
            tile = np.matmul(vectors, p.gp[c0:c1].T, out=scratch.get("tile", (queries.size, c1 - c0), np.float32))
            p.mask(tile, queries, c0, c1)
            return _scan(tile, [(1, lo, hi, undecided.sink(queries, n_thr, c0))], scratch)[0]

        def query_run(rows: np.ndarray) -> None:
            """Query x gallery: a run of queries over every gallery tile, the stopped ones leaving."""
            window = counter.first_window(rows)
            live = counting(rows, window[0])
            above = np.zeros(rows.size, dtype=np.int64)
            vectors = p.q[rows[live]]
            for c0 in range(0, m, width):
                if not live.size:
                    break
                above[live] += row_tile(rows[live], vectors, c0, min(c0 + width, m), [w[live] for w in window])
                if cap is not None:  # those at the cap stop: their rank is at least cap
                    still = above[live] < cap
                    if not still.all():
                        live, vectors = live[still], vectors[still]
            counter.add_above(rows, window[0], above)

        def symmetric_tile(r0: int, c0: int) -> None:
            """Leave-one-out: one tile on or above the diagonal, for its rows and (off it) its columns."""
            r1, c1 = min(r0 + side, m), min(c0 + side, m)
            rows, cols = p.gindex[r0:r1], p.gindex[c0:c1]  # sorted position j is gallery (= query) gindex[j]
            sides = [(rows, r0, (c0, c1), counter.first_window(rows))]
            if c0 > r0:
                sides.append((cols, c0, (r0, r1), counter.first_window(cols)))
            live = [counting(queries, win[0]) for queries, _, _, win in sides]
            if sum(lv.size * (b - a) for lv, (_, _, (a, b), _) in zip(live, sides)) < (r1 - r0) * (c1 - c0):
                for lv, (queries, first, (a, b), win) in zip(live, sides):  # multiply the live parts only
                    if lv.size:
                        counter.add_above(queries[lv], win[0][lv],
                                          row_tile(queries[lv], p.gp[first + lv], a, b, [w[lv] for w in win]))
                return
            tile = np.matmul(p.gp[r0:r1], p.gp[c0:c1].T, out=scratch.get("tile", (r1 - r0, c1 - c0), np.float32))
            p.mask(tile, rows, c0, c1)  # positives and exclusions are symmetric: the mirror's cells too
            counts = _scan(tile, [(axis, lo, hi, undecided.sink(queries, n_thr, a))
                                  for axis, (queries, _, (a, _), (n_thr, lo, hi)) in zip((1, 0), sides)], scratch)
            for (queries, _, _, (n_thr, _, _)), above in zip(sides, counts):
                counter.add_above(queries, n_thr, above)

        return (lambda job: symmetric_tile(*job)) if symmetric else query_run, undecided.flush

    _each_core(jobs, start)


def _exact_tiles(p: Problem, counter: _Counter, budget: Budget, symmetric: bool) -> None:
    """Every positive (precision@K, R-precision, MAP@R, MAP): the jobs of :func:`_fast_tiles`, but
    each tile is the exact product (float64, rounded once to float32: :func:`_exact_product`) and
    its rows are sorted, so that each threshold's count is one binary search
    (:meth:`_Counter.exact_tile`). A leave-one-out tile counts its columns from a transposed copy,
    made before masking. Queries without positives are never multiplied (query x gallery).
    """
    m, d = p.gp.shape
    workers = _n_workers()
    # a share of each core's budget for the float64 copies of its tile's rows and columns, the rest for cells
    most, cells = budget.exact_tile_side(workers, d), budget.exact_tile_cells(workers, _EXACT_TILE_CELLS)
    jobs, width = _tiling(p, cells, symmetric, most)
    if not symmetric:
        n_thr = counter.off[1:] - counter.off[:-1]
        jobs = [rows for rows in (rows[n_thr[rows] > 0] for rows in jobs) if rows.size]

    def start() -> tuple:
        scratch = _Buffers()

        def float64(name: str, vectors: np.ndarray) -> np.ndarray:
            out = scratch.get(name, vectors.shape, np.float64)
            out[...] = vectors
            return out

        def query_run(rows: np.ndarray) -> None:
            left = float64("left", p.q[rows])
            for c0 in range(0, m, width):
                c1 = min(c0 + width, m)
                sims, product = _exact_product(left, float64("right", p.gp[c0:c1]), scratch)
                counter.exact_tile(sims, rows, c0, c1, lambda k: product[k].astype(np.float32))

        def symmetric_tile(job: tuple[int, int]) -> None:
            r0, c0 = job
            r1, c1 = min(r0 + width, m), min(c0 + width, m)
            left = float64("left", p.gp[r0:r1])
            sims, product = _exact_product(left, left if c0 == r0 else float64("right", p.gp[c0:c1]), scratch)
            if c0 > r0:  # the columns, from a transposed copy made before the tile is masked and sorted
                mirror = scratch.get("mirror", (c1 - c0, r1 - r0), np.float32)
                np.copyto(mirror, sims.T)
                counter.exact_tile(mirror, p.gindex[c0:c1], r0, r1, lambda k: product[:, k].astype(np.float32))
            # sorted position j is query gindex[j]
            counter.exact_tile(sims, p.gindex[r0:r1], c0, c1, lambda k: product[k].astype(np.float32))

        return (symmetric_tile if symmetric else query_run), lambda: None

    _each_core(jobs, start)


def _tiling(p: Problem, cells: int, symmetric: bool, most: int | None = None) -> tuple[list, int]:
    """Jobs of about ``cells`` cells per tile for :func:`_each_core`, and their tiles' side (leave-one-out:
    square tiles (r0, c0) on and above the diagonal) or gallery width (query x gallery: runs of query
    rows sorted by label, so that a tile's masked positives are a few runs, each over every gallery
    tile); no side, width or run longer than ``most``."""
    n, m = p.q.shape[0], p.gp.shape[0]
    most = m if most is None else most
    if symmetric:
        side = max(1, min(m, math.isqrt(cells), most))
        return [(r0, c0) for r0 in range(0, m, side) for c0 in range(r0, m, side)], side
    width = max(1, min(m, _TILE_WIDTH, cells, most))
    height = max(1, min(cells // width, most))
    q_order = np.argsort(p.lo, kind="stable")
    return [q_order[r0:r0 + height] for r0 in range(0, n, height)], width


def _each_core(jobs: list, start) -> None:
    """Do ``jobs`` on every core: each thread gets its ``(do, finish)`` from ``start()``, calls ``do(job)``
    for jobs taken in turn from the shared list, then ``finish()``. BLAS runs single-threaded meanwhile:
    one product per core, with no BLAS threads spinning beside the numpy work."""
    from threadpoolctl import threadpool_limits

    pending, lock = iter(jobs), threading.Lock()

    def work() -> None:
        do, finish = start()
        while True:
            with lock:
                job = next(pending, None)
            if job is None:
                return finish()
            do(job)

    threads = max(1, min(_n_workers(), len(jobs)))
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(work) for _ in range(threads)]:
            future.result()

