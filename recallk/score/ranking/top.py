"""The top-L pass: exact ranks within each query's first L ranks, at about the cost of a top-k search.

recall@K, precision@K, r_precision, map@r and mrr read only the top of a query's ranking:
its first ``L = max(R, depth)`` ranks (``R``: its positives; ``depth``: the largest K),
capped at the items it may retrieve. Only full ``map`` needs every positive's rank
(:mod:`~recallk.score.ranking.exact`). This pass finds, for each query, the exact ranks
of the positives among its first L, its first positive's rank and that rank under the
opposite tie rule, with the float32 product of the fast path:

* **Candidates.** Each thread takes runs of queries over every gallery tile. A row keeps
  the cells whose float32 score is at least its threshold ``theta``: the L-th largest
  float32 score it has kept so far minus ``2 tol``. Thresholds only rise, so every cell
  dropped has a float32 score below the final L-th largest minus ``2 tol``; its exact
  similarity is then strictly below the exact L-th largest (the top L float32 cells all
  have exact similarities within ``tol`` of theirs), so it is not among the first L under
  any tie rule. The first tile sets the thresholds (a partition of its rows); a row whose
  kept cells outgrow their room is pruned to its new threshold.
* **Order.** Each row's candidates are sorted by float32 score; two candidates closer than
  ``2 tol`` may be out of order, so those (and only those) are re-scored exactly
  (:func:`~recallk.score.ranking.scan.exact_pairs`). A candidate not re-scored is more
  than ``2 tol`` from every other, so its float32 score orders it against exact ones
  too. Ranked by order keys (:func:`~recallk.score.ranking.direct.value_keys`: value,
  then gallery index), the first L candidates are the query's first L items, exactly.
* **What falls back.** A row whose candidates cannot fit its share of the budget (e.g. an
  all-zero query, whose every cell ties), or that holds more than
  :data:`~recallk.score.ranking.counting.HAND_OVER` candidates beyond its L (collapsed embeddings: they
  would be re-scored one pair at a time), is marked; :mod:`~recallk.score.ranking.engine`
  ranks those queries with the complete ranking, like queries whose L is too deep for this
  pass (:meth:`~recallk.score.ranking.budget.Budget.top_depth`), and takes the first
  positive of queries with none in their first L from the fast path.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from recallk.score.ranking.budget import Budget
from recallk.score.ranking.counting import HAND_OVER
from recallk.score.ranking.direct import BELOW, value_keys
from recallk.score.ranking.fast import READ_BLOCKS
from recallk.score.ranking.problem import Problem, UnitRows
from recallk.score.ranking.scan import Buffers, exact_pairs, round_outward, sparse_cells, word_mask
from recallk.score.ranking.schedule import TILE_WIDTH, TileWorker, each_core, rows_to_csr, worker_count

#: Below every similarity (cosines lie in [-1 - tol, 1 + tol]): a row's threshold before it has one, which
#: still drops the excluded cells (-inf).
_FLOOR = np.float32(-2.0)


@dataclass
class TopRanks:
    """:func:`top_ranks`' result, one entry per query of the problem.

    ``ranks[offsets[i]:offsets[i + 1]]``: query ``i``'s positive ranks below ``depth[i]``, ascending.
    ``first``: its first positive's rank where ``found`` (the first positive is among its first
    ``depth[i]``), else -1. ``opposite``: that rank under the opposite tie rule, exact where ``found`` and
    else exact or at least ``depth[i]`` when a positive is among the candidates, else -1 (it is at least
    ``depth[i]``). ``overflow``: queries this pass could not rank (their candidates outgrew the budget);
    their entries are empty.
    """

    offsets: np.ndarray
    ranks: np.ndarray
    first: np.ndarray
    opposite: np.ndarray
    found: np.ndarray
    overflow: np.ndarray
    jobs: int
    tiles: int


def top_ranks(p: Problem, budget: Budget, depth: np.ndarray, queries: np.ndarray) -> TopRanks:
    """Exact ranks within the first ``depth[i]`` of each query in ``queries`` (positions in ``p``).

    Parameters
    ----------
    p : Problem
        Ranked as query x gallery (a leave-one-out problem too: its own images are excluded by id).
    budget : Budget
        The tiles' budget (what is left once the unit copies are held).
    depth : ndarray
        (n,) int64, L per query: at least 1 and at most the items it may retrieve, for ``queries``.
    queries : ndarray
        The queries to rank (with positives); the others' entries stay empty.

    Returns
    -------
    TopRanks
    """
    n, m = p.q.shape[0], p.gp.shape[0]
    workers = worker_count()
    width = tile_width(p, budget, workers)
    per_core = budget.bytes / workers
    tall = READ_BLOCKS if isinstance(p.gp, UnitRows) else 1
    most = min(Budget.TOP_MAX_ROWS * tall, budget.fast_tile_side(workers, p.gp.shape[1]))  # the run's rows' copy
    jobs = _runs(queries, depth, budget, per_core, width, most, workers)
    made: list[TopWorker] = []
    lock = threading.Lock()

    def new_worker() -> TopWorker:
        worker = TopWorker(p, width, depth, per_core)
        with lock:
            made.append(worker)
        return worker

    tiles_per_job = -(-m // width)
    each_core(jobs, new_worker, tiles_per_job, "rank (top of each ranking)")
    first, opposite = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    found, overflow = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    parts = [part for worker in made for part in worker.results]
    for rows, _, _, f, o, fd, ov in parts:
        first[rows], opposite[rows], found[rows], overflow[rows] = f, o, fd, ov
    offsets, outs = rows_to_csr(n, [(rows, n_ranks, r) for rows, n_ranks, r, *_ in parts])
    ranks = outs[0] if outs else np.empty(0, dtype=np.int64)
    return TopRanks(offsets, ranks, first, opposite, found, overflow, len(jobs), len(jobs) * tiles_per_job)


def deepest(p: Problem, budget: Budget) -> int:
    """The deepest L :func:`top_ranks` serves under the tiles' ``budget`` (:meth:`Budget.top_depth`, with this
    pass's tile width and each core's share)."""
    workers = worker_count()
    return budget.top_depth(budget.bytes / workers, tile_width(p, budget, workers), p.gp.shape[0])


def tile_width(p: Problem, budget: Budget, workers: int) -> int:
    """Gallery columns of one tile of the top pass: at most 2,048, and (as the fast tiles') their float32 unit
    rows and the run's within :attr:`Budget.VECTOR_SHARE` of each core's share (:meth:`Budget.fast_tile_side`:
    a gallery normalised when read is read tile by tile)."""
    return max(1, min(p.gp.shape[0], TILE_WIDTH, budget.fast_tile_side(workers, p.gp.shape[1])))


def _runs(queries: np.ndarray, depth: np.ndarray, budget: Budget, per_core: float, width: int, most: int,
          workers: int) -> list[np.ndarray]:
    """The jobs of :func:`top_ranks`: runs of ``queries`` sorted by depth (so a run's buffers, sized by its
    deepest query, fit its rows), each as many rows as :meth:`Budget.top_rows` allows, at most ``most`` (a
    gallery normalised when read: up to ``READ_BLOCKS`` blocks of rows, each gallery tile normalised once for
    all); at least two runs per core."""
    order = queries[np.argsort(depth[queries], kind="stable")]
    jobs, start = [], 0
    while start < order.size:
        rows = budget.top_rows(per_core, width, int(depth[order[start]]), most)
        while True:  # the run's deepest query sizes its buffers: shrink until it fits
            stop = min(order.size, start + rows)
            fit = budget.top_rows(per_core, width, int(depth[order[stop - 1]]), most)
            if fit >= stop - start:
                break
            rows = fit
        jobs.append(order[start:stop])
        start = stop
    if workers > 1 and 0 < len(jobs) < 2 * workers:  # every core busy: cut the runs finer
        jobs = [part for job in jobs for part in np.array_split(job, -(-2 * workers // len(jobs))) if part.size]
    return jobs


class TopWorker(TileWorker):
    """One thread's runs of queries for :func:`top_ranks`; each run's results are kept in :attr:`results`.

    Parameters
    ----------
    p, width
        The problem and the gallery tiles' width.
    depth : ndarray
        (n,) each query's L.
    per_core : float
        Bytes this thread's buffers may take (:meth:`Budget.top_rows`).
    """

    def __init__(self, p: Problem, width: int, depth: np.ndarray, per_core: float) -> None:
        super().__init__(p, None, width)
        self.depth, self.per_core, self.results = depth, per_core, []
        self.slack = 2 * p.tol  # float32 scores this close may be out of order

    def run(self, job: np.ndarray) -> None:
        """Every job is a run of query rows against the whole gallery (leave-one-out too)."""
        self.query_run(job)

    def query_run(self, rows: np.ndarray) -> None:
        """The candidates of queries ``rows`` over every gallery tile, then their exact order; a run taller
        than :attr:`Budget.TOP_MAX_ROWS` (a gallery normalised when read) is multiplied in blocks of that
        many rows, each gallery tile read once for all of them."""
        p, m, width, height = self.p, self.p.gp.shape[0], self.width, Budget.TOP_MAX_ROWS
        run = _Run(rows, self.depth[rows], width, self.per_core, self.slack)
        vectors = p.q[rows]
        for c0 in range(0, m, width):
            c1 = min(c0 + width, m)
            columns = p.gp[c0:c1]  # held, or normalised now (UnitRows)
            for r0 in range(0, rows.size, height):
                block = rows[r0:r0 + height]
                tile = np.matmul(vectors[r0:r0 + height], columns.T,
                                 out=self.scratch.get("tile", (block.size, c1 - c0), np.float32))
                p.mask_excluded(tile, block, c0, c1)
                run.take(tile, c0, r0, self.scratch)
            self.tiles_done()
        self.results.append(run.finish(p, vectors))


class _Run:
    """The candidate buffers of one run of queries: per row, the float32 scores and sorted columns kept."""

    def __init__(self, rows: np.ndarray, depth: np.ndarray, width: int, per_core: float, slack: float) -> None:
        self.rows, self.depth, self.slack, self.per_core = rows, depth, slack, per_core
        r = rows.size
        self.room = int(2 * depth.max(initial=1) + width)  # a tile's hits always fit once pruned to 2 L
        self.vals = np.full((r, self.room), -np.inf, dtype=np.float32)
        self.cols = np.zeros((r, self.room), dtype=np.int64)
        self.fill = np.zeros(r, dtype=np.int64)
        self.theta = np.full(r, _FLOOR, dtype=np.float32)
        self.overflow = np.zeros(r, dtype=bool)
        self.prune_at = 2 * depth + _PRUNE_SLACK  # a row holding more is pruned after the tile

    def take(self, tile: np.ndarray, c0: int, r0: int, scratch: Buffers) -> None:
        """Keep the cells of ``tile`` (the run's rows from ``r0`` x columns from ``c0``, excluded cells -inf)
        at or above each row's threshold."""
        h, w = tile.shape
        if c0 == 0:  # the first tile sets the thresholds of the rows it can
            fits = np.flatnonzero(self.depth[r0:r0 + h] <= w)
            if fits.size:
                self._raise(fits + r0, _kth_largest(tile[fits], self.depth[fits + r0]))
        words, hit = word_mask(scratch, "hit", tile.shape)
        np.greater_equal(tile, self.theta[r0:r0 + h, None], out=hit)
        line, col = sparse_cells(words, w)
        if not line.size:
            return
        val = tile[line, col]
        line += r0
        count = np.bincount(line, minlength=self.rows.size)
        full = np.flatnonzero(self.fill + count > self.room)
        if full.size:  # prune those rows to their new thresholds, and drop the hits below them
            self._prune(full)
            keep = val >= self.theta[line]
            line, col, val = line[keep], col[keep], val[keep]
            count = np.bincount(line, minlength=self.rows.size)
            full = np.flatnonzero(self.fill + count > self.room)
            if full.size:
                self._grow(int((self.fill + count).max()), full)
                keep = ~self.overflow[line]
                line, col, val = line[keep], col[keep], val[keep]
                count = np.bincount(line, minlength=self.rows.size)
        at = self.fill[line] + np.arange(line.size) - np.repeat(np.cumsum(count) - count, count)
        self.vals[line, at], self.cols[line, at] = val, col + c0
        self.fill += count
        grown = np.flatnonzero(self.fill > self.prune_at)
        if grown.size:  # raise those rows' thresholds now: later tiles then hand on fewer cells
            self._prune(grown)

    def _raise(self, lines: np.ndarray, kth: np.ndarray) -> None:
        """Raise the thresholds of ``lines`` to their L-th largest float32 score ``kth`` minus ``2 tol``."""
        floor = round_outward(kth.astype(np.float64) - self.slack, up=False)
        self.theta[lines] = np.maximum(self.theta[lines], np.where(np.isfinite(floor), floor, _FLOOR))

    def _prune(self, lines: np.ndarray) -> None:
        """Raise the thresholds of ``lines`` from what they hold, and drop the cells below them."""
        used = int(self.fill[lines].max(initial=0))
        vals, cols = self.vals[lines, :used], self.cols[lines, :used]
        self._raise(lines, _kth_largest(vals, self.depth[lines]))
        line, at = np.nonzero(vals >= self.theta[lines][:, None])
        kept = np.bincount(line, minlength=lines.size)
        self.vals[lines, :used] = -np.inf
        dest = np.arange(line.size) - np.repeat(np.cumsum(kept) - kept, kept)
        self.vals[lines[line], dest], self.cols[lines[line], dest] = vals[line, at], cols[line, at]
        self.fill[lines] = kept
        # rows left holding many cells (ties within 2 tol of their L-th) wait until they double
        self.prune_at[lines] = np.maximum(self.prune_at[lines], 2 * kept)
        crowded = kept > self.depth[lines] + HAND_OVER  # that many ties would be re-scored one pair at a time
        if crowded.any():  # (collapsed embeddings): the complete ranking's exact tiles rank them instead
            self._leave(lines[crowded])

    def _leave(self, lines: np.ndarray) -> None:
        """Rows ``lines`` overflow: they take nothing more, and the engine ranks them with the complete ranking."""
        self.overflow[lines] = True
        self.theta[lines] = np.inf  # no cell reaches it
        self.vals[lines] = -np.inf
        self.fill[lines] = 0

    def _grow(self, need: int, full: np.ndarray) -> None:
        """More room for every row when the budget allows it; else rows ``full`` overflow (they leave)."""
        room = max(2 * self.room, need)
        if self.rows.size * room * Budget.TOP_BYTES_PER_SLOT <= self.per_core:
            grown = np.full((self.rows.size, room), -np.inf, dtype=np.float32)
            grown[:, :self.room] = self.vals
            cols = np.zeros((self.rows.size, room), dtype=np.int64)
            cols[:, :self.room] = self.cols
            self.vals, self.cols, self.room = grown, cols, room
            return
        self._leave(full)

    def finish(self, p: Problem, vectors: np.ndarray) -> tuple:
        """Each row's exact first L: ``(rows, ranks per row, ranks, first, opposite, found, overflow)``."""
        r = self.rows.size
        live = np.flatnonzero(~self.overflow & (self.fill > 0))
        if live.size:
            self._prune(live)
        used = int(self.fill.max(initial=0))
        vals, cols = self.vals[:, :used], self.cols[:, :used]
        order = np.argsort(-vals, axis=1, kind="stable")  # by float32 score, highest first
        vals, cols = np.take_along_axis(vals, order, axis=1), np.take_along_axis(cols, order, axis=1)
        valid = np.arange(used)[None, :] < self.fill[:, None]
        close = np.zeros_like(valid)
        if used > 1:  # neighbours closer than 2 tol may be out of order: re-score both exactly
            with np.errstate(invalid="ignore"):  # -inf - -inf past a row's end: NaN, never near
                near = (vals[:, :-1].astype(np.float64) - vals[:, 1:]) <= self.slack
            close[:, :-1] |= near
            close[:, 1:] |= near
            close &= valid
        line, at = np.nonzero(close)
        if line.size:
            vals[line, at] = exact_pairs(vectors, p.gp, line, cols[line, at])
        m = p.gp.shape[0]
        value = value_keys(np.where(valid, vals, np.float32(0)), m)
        index = p.gindex[cols]
        positive = valid & (cols >= p.lo[self.rows][:, None]) & (cols < p.hi[self.rows][:, None])
        key = (value + (m - 1 - index)) * 2 + positive
        key[~valid] = BELOW
        key.sort(axis=1)
        flag = (key[:, ::-1] & 1).astype(bool)  # highest key (first rank) first; BELOW's low bit is 0
        top = flag & (np.arange(used)[None, :] < self.depth[:, None])
        line, rank = np.nonzero(top)
        n_ranks = np.bincount(line, minlength=r)
        found = n_ranks > 0
        first = np.where(found, top.argmax(axis=1) if used else 0, -1)
        # opposite rule: ties go to the larger gallery index; the cells whose key beats every positive's
        other = np.where(valid, value + index, BELOW)
        best = np.where(positive, other, BELOW).max(axis=1, initial=BELOW)
        # exact when the best positive is a candidate; else L or more, as is any count from a lesser positive
        opposite = np.where(positive.any(axis=1), (other > best[:, None]).sum(axis=1), -1)
        return self.rows, n_ranks, rank.astype(np.int64), first, opposite, found, self.overflow.copy()


#: A row is pruned once it holds more than 2 L plus this many cells: thresholds rise as the tiles go by (so
#: each tile hands on about L / (tiles so far) cells per row), and small L are not pruned at every tile.
_PRUNE_SLACK = 64


def _kth_largest(values: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Per row of ``values`` (rows x c, -inf padding allowed), its ``k[i]``-th largest value (``k[i] <= c``),
    or -inf where ``k[i] > c``: one partition per distinct k."""
    out = np.full(values.shape[0], -np.inf, dtype=np.float32)
    c = values.shape[1]
    for kk in np.unique(k):
        if kk > c or kk < 1:
            continue
        sel = np.flatnonzero(k == kk)
        out[sel] = np.partition(values[sel], c - kk, axis=1)[:, c - kk]
    return out
