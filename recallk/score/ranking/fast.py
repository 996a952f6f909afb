"""The first-positive path (recall@K, MRR): float32 tiles scanned while they are in the cache.

Only each query's first threshold is needed: each thread multiplies its tiles
(4 MiB of float32) with single-threaded BLAS, masks them and scans them at once,
one compare for the cells surely above and one for the error window
(:func:`~recallk.score.ranking.scan.scan_block`); the few undecided cells are re-scored
exactly. With ``cap`` (recall@K alone: ranks beyond the largest K change nothing)
a query stops counting once ``cap`` cells surely beat its first positive.
A leave-one-out tile is counted for its rows and its columns in one read.
"""

from __future__ import annotations

import numpy as np

from recallk.score.ranking.budget import Budget
from recallk.score.ranking.counting import RankCounter, Undecided
from recallk.score.ranking.problem import Problem, UnitRows
from recallk.score.ranking.scan import scan_block
from recallk.score.ranking.schedule import Select, TileWorker, each_core, job_tiles, tile_count, tiling, worker_count

#: Cells of one thread's tile (4 MiB of float32). Each thread multiplies its own tiles with
#: single-threaded BLAS and scans each tile while it is still in the cache: as fast a product as big
#: blocks, without writing and re-reading every block through memory (or BLAS threads spinning meanwhile).
_TILE_CELLS = 2**20
#: A gallery normalised when read (not held) costs about as much per tile as the product of a 512-row
#: tile: a query run then holds up to this many tiles' rows and reads each gallery tile once for all of
#: them (as many runs for every thread).
READ_BLOCKS = 8


def fast_tiles(p: Problem, counter: RankCounter, budget: Budget, cap: int | None = None,
                select: Select = None) -> tuple[int, int]:
    """First-positive counts (recall@K, MRR): each thread takes jobs from a shared list, multiplies
    each tile with single-threaded BLAS, masks it and scans it while it is in the cache.

    Query x gallery: a job is a run of query rows (sorted by label, so a tile's masked positives
    are a few runs) over every gallery tile. Leave-one-out: a job is one square tile on or above
    the diagonal, counted for its rows and (off the diagonal) its columns in the same read.
    Queries without positives are never multiplied. With ``cap``, a query stops counting once
    ``cap`` cells are surely above its first positive (its rank is then at least ``cap``): it
    leaves its run's later tiles, and a leave-one-out tile whose rows or columns have mostly
    stopped is multiplied only for the queries still counting (rows x its columns, columns x its rows).
    ``select`` keeps a share of the jobs (a Ray task's; the counts of every share add up).
    Returns the number of jobs and of tiles they cover.
    """
    workers = worker_count()
    most = budget.fast_tile_side(workers, p.gp.shape[1])  # the rows' and columns' unit copies, read per tile
    cells = budget.fast_tile_cells(workers, _TILE_CELLS)
    jobs, width = tiling(p, cells, most)
    height = max(1, min(cells // width, most))  # one tile's rows
    if isinstance(p.gp, UnitRows) and not p.same_set:  # taller runs: each gallery tile normalised once for several
        runs = workers * -(-p.q.shape[0] // (workers * height * READ_BLOCKS))  # a multiple of the threads
        jobs, width = tiling(p, cells, most, run_rows=max(height, -(-p.q.shape[0] // runs)))
    jobs = jobs if select is None else select(jobs)
    each_core(jobs, lambda: FastWorker(p, counter, width, cap, height), job_tiles(p, width),
               "rank (first positive)")
    return len(jobs), tile_count(p, jobs, width)


class FastWorker(TileWorker):
    """One thread's first-positive tiles; its undecided cells are decided at :meth:`finish`.

    Parameters
    ----------
    p, counter, width
        As for :class:`~recallk.score.ranking.schedule.TileWorker`.
    cap : int or None
        A query stops counting once this many cells surely beat its first positive.
    height : int, optional
        Rows of one tile: a taller query run is multiplied in blocks of ``height`` rows (None: a run at once).
    """

    def __init__(self, p: Problem, counter: RankCounter, width: int, cap: int | None,
                 height: int | None = None) -> None:
        super().__init__(p, counter, width)
        self.cap, self.height, self.undecided = cap, height or p.q.shape[0] or 1, Undecided(counter)

    def finish(self) -> None:
        """Decide the undecided cells still held."""
        self.undecided.flush()

    def _counting(self, queries: np.ndarray, n_thr: np.ndarray) -> np.ndarray:
        """Positions of the queries still counting: with positives, not handed over to the exact pass
        (:attr:`~recallk.score.ranking.counting.RankCounter.handed`) and, under a cap, below it."""
        live, counter = (n_thr > 0) & ~self.counter.handed[queries], self.counter
        if self.cap is not None:  # read without the lock: counts only grow, a stale one costs work, not correctness
            live[live] = counter.gt[counter.off[queries[live]]] < self.cap
        return np.flatnonzero(live)

    def _row_tile(self, queries: np.ndarray, vectors: np.ndarray, columns: np.ndarray, c0: int, window) -> np.ndarray:
        """Cells surely above each query's first positive among the unit rows ``columns`` of sorted columns
        from ``c0`` (undecided ones handed on)."""
        p, (n_thr, lo, hi), c1 = self.p, window, c0 + columns.shape[0]
        tile = np.matmul(vectors, columns.T, out=self.scratch.get("tile", (queries.size, c1 - c0), np.float32))
        p.mask(tile, queries, c0, c1)
        return scan_block(tile, [(1, lo, hi, self.undecided.sink(queries, n_thr, c0))], self.scratch)[0]

    def query_run(self, rows: np.ndarray) -> None:
        """Query x gallery: a run of queries over every gallery tile, the stopped ones leaving; a run taller
        than a tile is multiplied in blocks of tile rows, each gallery tile read once for all of them."""
        p, m, width, cap, height = self.p, self.p.gp.shape[0], self.width, self.cap, self.height
        window = self.counter.first_window(rows)
        live = self._counting(rows, window[0])
        above = np.zeros(rows.size, dtype=np.int64)
        vectors = p.q[rows[live]]
        for c0 in range(0, m, width):
            if not live.size:
                break
            columns = p.gp[c0:min(c0 + width, m)]  # held, or normalised now (UnitRows)
            for b0 in range(0, live.size, height):
                part = live[b0:b0 + height]
                above[part] += self._row_tile(rows[part], vectors[b0:b0 + height], columns, c0,
                                              [w[part] for w in window])
            self.tiles_done()
            still = ~self.counter.handed[rows[live]]  # those handed to the exact pass leave
            if cap is not None:  # those at the cap stop: their rank is at least cap
                still &= above[live] < cap
            if not still.all():
                live, vectors = live[still], vectors[still]
        self.counter.add_above(rows, window[0], above)

    def symmetric_tile(self, r0: int, c0: int) -> None:
        """Leave-one-out: one tile on or above the diagonal, for its rows and (off it) its columns."""
        p, counter, m, side = self.p, self.counter, self.p.gp.shape[0], self.width
        r1, c1 = min(r0 + side, m), min(c0 + side, m)
        rows, cols = p.gindex[r0:r1], p.gindex[c0:c1]  # sorted position j is gallery (= query) gindex[j]
        sides = [(rows, r0, (c0, c1), counter.first_window(rows))]
        if c0 > r0:
            sides.append((cols, c0, (r0, r1), counter.first_window(cols)))
        live = [self._counting(queries, win[0]) for queries, _, _, win in sides]
        if sum(lv.size * (b - a) for lv, (_, _, (a, b), _) in zip(live, sides)) < (r1 - r0) * (c1 - c0):
            for lv, (queries, first, (a, b), win) in zip(live, sides):  # multiply the live parts only
                if lv.size:
                    counter.add_above(queries[lv], win[0][lv], self._row_tile(queries[lv], p.gp[first + lv], p.gp[a:b],
                                                                              a, [w[lv] for w in win]))
            return
        tile = np.matmul(p.gp[r0:r1], p.gp[c0:c1].T, out=self.scratch.get("tile", (r1 - r0, c1 - c0), np.float32))
        p.mask(tile, rows, c0, c1)  # positives and exclusions are symmetric: the mirror's cells too
        for lv, (_, _, _, (_, lo, hi)) in zip(live, sides):  # the stopped ones reach no window: the scan skips them
            stopped = np.ones(lo.size, dtype=bool)
            stopped[lv] = False
            lo[stopped], hi[stopped] = np.inf, np.inf
        counts = scan_block(tile, [(axis, lo, hi, self.undecided.sink(queries, n_thr, a))
                              for axis, (queries, _, (a, _), (n_thr, lo, hi)) in zip((1, 0), sides)], self.scratch)
        for (queries, _, _, (n_thr, _, _)), above in zip(sides, counts):
            counter.add_above(queries, n_thr, above)
