"""The complete ranking (precision@K, R-precision, MAP@R, MAP): exact tiles, sorted rows, binary searches.

Every metric that needs all positives takes exact tiles (the float64 product
rounded once to float32), sorts their rows and reads every threshold's count with
one binary search (:meth:`~recallk.score.ranking.counting.RankCounter.exact_tile`).
A leave-one-out tile counts its columns through a transposed copy.
"""

from __future__ import annotations

import numpy as np

from recallk.score.ranking.budget import Budget
from recallk.score.ranking.counting import RankCounter
from recallk.score.ranking.problem import Problem
from recallk.score.ranking.scan import exact_product
from recallk.score.ranking.schedule import Select, TileWorker, each_core, job_tiles, tile_count, tiling, worker_count

#: Exact tiles' cells: the float64 product needs no cache residence (the sort reads one row at a time),
#: and taller tiles multiply faster.
_EXACT_TILE_CELLS = 2**21


def exact_tiles(p: Problem, counter: RankCounter, budget: Budget, select: Select = None) -> tuple[int, int]:
    """Every positive (precision@K, R-precision, MAP@R, MAP): the jobs of the fast path, but
    each tile is the exact product (float64, rounded once to float32: :func:`exact_product`) and
    its rows are sorted, so that each threshold's count is one binary search
    (:meth:`RankCounter.exact_tile`). A leave-one-out tile counts its columns from a transposed copy,
    made before masking. Queries without positives are never multiplied (query x gallery).
    ``select`` keeps a share of the jobs (a Ray task's; the counts of every share add up).
    Returns the number of jobs and of tiles they cover.
    """
    workers = worker_count()
    # a share of each core's budget for the float64 copies of its tile's rows and columns, the rest for cells
    most, cells = budget.exact_tile_side(workers, p.gp.shape[1]), budget.exact_tile_cells(workers, _EXACT_TILE_CELLS)
    jobs, width = tiling(p, cells, most)
    if not p.same_set:
        n_thr = counter.off[1:] - counter.off[:-1]
        jobs = [rows for rows in (rows[n_thr[rows] > 0] for rows in jobs) if rows.size]
    jobs = jobs if select is None else select(jobs)
    each_core(jobs, lambda: ExactWorker(p, counter, width), job_tiles(p, width), "rank (every positive)")
    return len(jobs), tile_count(p, jobs, width)


class ExactWorker(TileWorker):
    """One thread's exact tiles (made as a :class:`~recallk.score.ranking.schedule.TileWorker`), with
    float64 copies of their rows and columns in its scratch."""

    def _float64(self, name: str, vectors: np.ndarray) -> np.ndarray:
        """``vectors`` copied into the float64 scratch ``name``."""
        out = self.scratch.get(name, vectors.shape, np.float64)
        out[...] = vectors
        return out

    def query_run(self, rows: np.ndarray) -> None:
        """Query x gallery: a run of queries over every gallery tile."""
        p, m, width = self.p, self.p.gp.shape[0], self.width
        left = self._float64("left", p.q[rows])
        for c0 in range(0, m, width):
            c1 = min(c0 + width, m)
            sims, product = exact_product(left, self._float64("right", p.gp[c0:c1]), self.scratch)
            self.counter.exact_tile(sims, rows, c0, c1, lambda k, product=product: product[k].astype(np.float32))
            self.tiles_done()

    def symmetric_tile(self, r0: int, c0: int) -> None:
        """Leave-one-out: one tile on or above the diagonal, for its rows and (off it) its columns."""
        p, m, width = self.p, self.p.gp.shape[0], self.width
        r1, c1 = min(r0 + width, m), min(c0 + width, m)
        left = self._float64("left", p.gp[r0:r1])
        right = left if c0 == r0 else self._float64("right", p.gp[c0:c1])
        sims, product = exact_product(left, right, self.scratch)
        if c0 > r0:  # the columns, from a transposed copy made before the tile is masked and sorted
            mirror = self.scratch.get("mirror", (c1 - c0, r1 - r0), np.float32)
            np.copyto(mirror, sims.T)
            self.counter.exact_tile(mirror, p.gindex[c0:c1], r0, r1, lambda k: product[:, k].T.astype(np.float32))
        # sorted position j is query gindex[j]
        self.counter.exact_tile(sims, p.gindex[r0:r1], c0, c1, lambda k: product[k].astype(np.float32))
