"""Per-threshold counts: how many retrievable non-positives beat each positive, and the exact ties.

A query's positives sorted by (-similarity, gallery index) are its *thresholds*;
each counts the cells strictly above it and, for ties, those tied below and above
it in gallery index (tie sensitivity). The fast path hands its undecided cells
(:mod:`recallk.score.ranking.scan`) to :class:`Undecided`, which re-scores them
and has them decided exactly (:meth:`RankCounter.decide`).
"""

from __future__ import annotations

import threading

import numpy as np

from recallk.score.ranking.problem import Problem
from recallk.score.ranking.scan import exact_pairs, round_outward

#: Undecided cells a scan holds before it hands them on to be re-decided (about 60 B each, 4 MiB in all):
#: bounds memory when most cells tie with the best positive (e.g. many all-zero query vectors).
_WINDOW_CELLS = 2**16
#: Undecided cells past which a query leaves the first-positive path (:class:`Undecided`): re-scoring a cell
#: alone costs about 3 ns per dimension (two float64 row copies and a dot), more than the complete ranking's
#: exact tile pays per cell, so a query whose similarities mostly tie with its best positive (collapsed
#: embeddings: every row one direction) is ranked by the exact pass instead (:attr:`RankCounter.handed`).
HAND_OVER = 256
#: Cells of the rows made again at a time to split exact ties by gallery index (:meth:`RankCounter._tie_splits`).
_TIE_CELLS = 2**16


class RankCounter:
    """Per-threshold counts of retrievable non-positives beating it: strictly, and tied below/above in index."""

    def __init__(self, p: Problem, t_off: np.ndarray, t_val: np.ndarray, t_col: np.ndarray):
        self.p, self.off, self.val, self.col = p, t_off, t_val, t_col
        v64 = t_val.astype(np.float64)
        self.hi = round_outward(v64 + p.tol, up=True)
        self.lo = round_outward(v64 - p.tol, up=False)
        self.gt = np.zeros(t_val.size, dtype=np.int64)
        self.eq_lt = np.zeros(t_val.size, dtype=np.int64)
        self.eq_gt = np.zeros(t_val.size, dtype=np.int64)
        self.lock = threading.Lock()  # threads' tiles may hold the same queries (leave-one-out mirror tiles)
        n = t_off.size - 1
        #: Per query: undecided cells seen (first-positive path), and whether it left that path for the exact
        #: pass (more than :data:`HAND_OVER`; its counts here are then partial and replaced).
        self.n_undecided, self.handed = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)

    def exact_tile(self, sims: np.ndarray, rows: np.ndarray, c0: int, c1: int, exact_rows) -> None:
        """Count exact tile ``sims`` (rows x gallery columns [c0, c1); the float64 product rounded to
        float32) against every threshold of its rows. The tile is masked and its rows sorted in place;
        ``exact_rows(k)`` gives rows ``k`` (an index array) again, unmasked, in column order, for the exact ties."""
        self.p.mask(sims, rows, c0, c1)
        sims.sort(axis=1)  # each threshold's count is now one binary search in its row
        off = self.off
        n_thr, start = off[rows + 1] - off[rows], off[rows]
        line = np.repeat(np.arange(rows.size), n_thr)  # tile row of each threshold
        t = np.repeat(start, n_thr) + (np.arange(line.size) - np.repeat(np.cumsum(n_thr) - n_thr, n_thr))
        below = np.empty(line.size, dtype=np.int64)  # cells at or below each threshold in its row
        done = 0
        for k in np.flatnonzero(n_thr):
            below[done:done + n_thr[k]] = sims[k].searchsorted(self.val[start[k]:start[k] + n_thr[k]], "right")
            done += n_thr[k]
        # exact ties with non-positives (positives are -inf here) sit just below: split them by gallery index
        tied = np.flatnonzero((below > 0) & (sims[line, np.maximum(below - 1, 0)] == self.val[t]))
        eq_lt, eq_gt = self._tie_splits(rows, c0, c1, line[tied], t[tied], exact_rows)
        with self.lock:  # leave-one-out: another thread's tile may hold the same queries as columns
            self.gt[t] += (c1 - c0) - below
            self.eq_lt[t[tied]] += eq_lt
            self.eq_gt[t[tied]] += eq_gt

    def _tie_splits(self, rows: np.ndarray, c0: int, c1: int, lines: np.ndarray, t: np.ndarray, exact_rows):
        """For :meth:`exact_tile`: per tied threshold ``t[j]`` (of tile row ``lines[j]``), the retrievable
        non-positives of columns [c0, c1) equal to it below and above its own gallery index.

        Vectorised over (row, value) groups, at most ``_TIE_CELLS`` cells at a time: each group's row made
        again (``exact_rows``) and masked, its columns put in gallery-index order, and the cells equal to its
        value counted by a cumulative sum, so a threshold's share below its own index is one look-up. A tile
        whose every cell ties (collapsed embeddings: every similarity one float32 value) costs a few passes
        over its cells, not one pass per positive."""
        p, eq_lt, eq_gt = self.p, np.zeros(t.size, dtype=np.int64), np.zeros(t.size, dtype=np.int64)
        if not t.size:
            return eq_lt, eq_gt
        own, value = p.gindex[self.col[t]], self.val[t]
        # thresholds come by row, each row's by falling value: a (row, value) group is a run
        new = np.r_[True, (lines[1:] != lines[:-1]) | (value[1:] != value[:-1])]
        group = np.cumsum(new) - 1
        g_line, g_value = lines[new], value[new]
        index = p.gindex[c0:c1]
        by_index = np.argsort(index, kind="stable")
        below = np.searchsorted(index[by_index], own)  # columns before own in gallery-index order
        step = max(1, _TIE_CELLS // max(1, c1 - c0))
        for g0 in range(0, g_line.size, step):
            g1 = min(g0 + step, g_line.size)
            made, which = np.unique(g_line[g0:g1], return_inverse=True)
            block = exact_rows(made)
            p.mask(block, rows[made], c0, c1)  # positives and excluded cells are -inf: never equal to a value
            equal = block[which.reshape(-1)][:, by_index] == g_value[g0:g1, None]
            upto = np.cumsum(equal, axis=1, dtype=np.int64)
            k0, k1 = np.searchsorted(group, [g0, g1])  # the groups' thresholds
            rg, at = group[k0:k1] - g0, below[k0:k1]
            lt = np.where(at > 0, upto[rg, np.maximum(at - 1, 0)], 0)
            eq_lt[k0:k1], eq_gt[k0:k1] = lt, upto[rg, -1] - lt  # own is a positive: not among the equal
        return eq_lt, eq_gt

    def first_window(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per query: its number of thresholds, and the float32 window [lo, hi] around its first
        one (the first positive's; its tie twin has the same value); [inf, inf] when it has none."""
        n_thr = self.off[queries + 1] - self.off[queries]
        first = self.off[queries[n_thr > 0]]
        lo, hi = np.full(queries.size, np.inf, dtype=np.float32), np.full(queries.size, np.inf, dtype=np.float32)
        lo[n_thr > 0], hi[n_thr > 0] = self.lo[first], self.hi[first]
        return n_thr, lo, hi

    def add_above(self, queries: np.ndarray, n_thr: np.ndarray, above: np.ndarray) -> None:
        """Add ``above[k]``, cells surely above query ``queries[k]``'s first threshold, to it and its tie twin."""
        with self.lock:  # two threads' tiles may hold the same queries (leave-one-out rows and columns)
            for slot in (0, 1):  # the first positive, and its tie twin (same value, larger index)
                use = n_thr > slot
                self.gt[self.off[queries[use]] + slot] += above[use]

    def decide(self, queries: np.ndarray, cols: np.ndarray, n_thr: np.ndarray, exact: np.ndarray) -> None:
        """Count undecided (query, column) cells, with exact similarities ``exact``, against the query's
        first threshold(s), exactly; ties are counted by gallery index. Fast path only: its thresholds
        come from :func:`exact_pairs` too (:func:`_best_positives`), so exact ties are seen as ties."""
        p, first = self.p, self.off[queries]
        mine = self.val[first]
        index, tied = p.gindex[cols], exact == mine
        for slot in (0, 1):
            use = n_thr > slot
            t = first[use] + slot
            own = p.gindex[self.col[t]]
            with self.lock:  # int64 terms: np.add.at of booleans into int64 takes numpy's slow path (30x)
                np.add.at(self.gt, t, (exact[use] > mine[use]).astype(np.int64))
                np.add.at(self.eq_lt, t, (tied[use] & (index[use] < own)).astype(np.int64))
                np.add.at(self.eq_gt, t, (tied[use] & (index[use] > own)).astype(np.int64))


class Undecided:
    """One thread's undecided cells: each tile's are re-scored at once (while its rows are in the cache),
    then counted (:meth:`RankCounter.decide`) once more than ``_WINDOW_CELLS`` have gathered, and at the
    end (:meth:`flush`): few calls, bounded memory (28 B per cell held)."""

    def __init__(self, counter: RankCounter) -> None:
        self.counter, self.parts, self.size = counter, [], 0

    def sink(self, queries: np.ndarray, n_thr: np.ndarray, c0: int):
        """``take(wk, wc)`` for one tile: the cells (query ``queries[wk]``, column ``wc + c0``)."""
        p = self.counter.p

        def take(wk: np.ndarray, wc: np.ndarray) -> None:
            wk, wc = self._keep(queries, wk, wc)
            piece = max(1, _WINDOW_CELLS)
            for s in range(0, wk.size, piece):  # a degenerate tile (every cell undecided) in pieces
                q, c = queries[wk[s:s + piece]], wc[s:s + piece] + c0
                self.parts.append((q, c, n_thr[wk[s:s + piece]], exact_pairs(p.q, p.gp, q, c)))
                self.size += q.size
                if self.size > _WINDOW_CELLS:
                    self.flush()
        return take

    def _keep(self, queries: np.ndarray, wk: np.ndarray, wc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The cells of queries still on the path: each query's undecided cells are counted, and one past
        :data:`HAND_OVER` is handed over (:attr:`RankCounter.handed`), its cells dropped unscored."""
        counter = self.counter
        if not wk.size:
            return wk, wc
        local = np.bincount(wk, minlength=queries.size)
        seen = np.flatnonzero(local)
        with counter.lock:
            counter.n_undecided[queries[seen]] += local[seen]
            counter.handed[queries[seen]] |= counter.n_undecided[queries[seen]] > HAND_OVER
            gone = counter.handed[queries[seen]]
        if not gone.any():
            return wk, wc
        stay = np.ones(queries.size, dtype=bool)
        stay[seen[gone]] = False
        keep = stay[wk]
        return wk[keep], wc[keep]

    def flush(self) -> None:
        if self.parts:
            merged = [np.concatenate(x) for x in zip(*self.parts)]
            self.parts, self.size = [], 0
            self.counter.decide(*merged)
