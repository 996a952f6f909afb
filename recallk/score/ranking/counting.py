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

    def exact_tile(self, sims: np.ndarray, rows: np.ndarray, c0: int, c1: int, exact_row) -> None:
        """Count exact tile ``sims`` (rows x gallery columns [c0, c1); the float64 product rounded to
        float32) against every threshold of its rows. The tile is masked and its rows sorted in place;
        ``exact_row(k)`` gives row ``k`` again (unmasked, in column order) for the rare exact ties."""
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
        eq_lt, eq_gt = np.zeros(tied.size, dtype=np.int64), np.zeros(tied.size, dtype=np.int64)
        for k, j in enumerate(tied):
            row = exact_row(line[j])[None, :]
            self.p.mask(row, rows[line[j]:line[j] + 1], c0, c1)
            index = self.p.gindex[np.flatnonzero(row[0] == self.val[t[j]]) + c0]
            own = self.p.gindex[self.col[t[j]]]
            eq_lt[k], eq_gt[k] = np.count_nonzero(index < own), np.count_nonzero(index > own)
        with self.lock:  # leave-one-out: another thread's tile may hold the same queries as columns
            self.gt[t] += (c1 - c0) - below
            self.eq_lt[t[tied]] += eq_lt
            self.eq_gt[t[tied]] += eq_gt

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
            with self.lock:
                np.add.at(self.gt, t, exact[use] > mine[use])
                np.add.at(self.eq_lt, t, tied[use] & (index[use] < own))
                np.add.at(self.eq_gt, t, tied[use] & (index[use] > own))


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
            piece = max(1, _WINDOW_CELLS)
            for s in range(0, wk.size, piece):  # a degenerate tile (every cell undecided) in pieces
                q, c = queries[wk[s:s + piece]], wc[s:s + piece] + c0
                self.parts.append((q, c, n_thr[wk[s:s + piece]], exact_pairs(p.q, p.gp, q, c)))
                self.size += q.size
                if self.size > _WINDOW_CELLS:
                    self.flush()
        return take

    def flush(self) -> None:
        if self.parts:
            merged = [np.concatenate(x) for x in zip(*self.parts)]
            self.parts, self.size = [], 0
            self.counter.decide(*merged)
