"""Every query's positives, exactly: the thresholds the tiles are counted against.

The exact similarity of every (query, positive) pair comes from one float64
product per label; a query's positives sorted by (-similarity, gallery index)
are its thresholds. The first-positive path needs only the best one and, when
others tie with it, the last of them: small labels (most of them, in retrieval data) all at
once in stacked products (:func:`_stacked_best`), each large label alone (:func:`_best_positives`).
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from recallk.score.ranking.budget import Budget
from recallk.score.ranking.counting import HAND_OVER
from recallk.score.ranking.problem import Problem, UnitRows
from recallk.score.ranking.scan import Buffers, exact_pairs, round_outward
from recallk.score.ranking.schedule import rows_to_csr, single_threaded_blas, worker_count
from recallk.threads import run_all

#: Positive cells per product of several small labels' queries x their gallery slices; on the first-positive
#: path, the most cells (queries x gallery items) of a label the stacked products take (:func:`_stacked_best`).
_POSITIVE_CELLS = 2**14
#: Stacked products (:func:`_stacked_best`): most cells of one stack (its float32 scores and boolean masks,
#: about 2 MiB) and most unit rows gathered for it (4 MiB at d = 512), fewer under a tight budget
#: (:meth:`~recallk.score.ranking.budget.Budget.stacked_labels`).
_STACK_CELLS = 2**18
_STACK_ROWS = 2**11


def find_positives(p: Problem, budget: Budget, first_only: bool = False, crowded: np.ndarray | None = None):
    """Exact similarities of every query's positives, sorted by (-similarity, gallery index), as CSR
    (offsets, values, columns), plus each query's number of positives and of positives tied
    exactly with its best one, minus one.

    One float64 product per run of queries sorted by label, against the gallery slice of
    their labels: several small labels share one product (up to ``_POSITIVE_CELLS`` cells,
    each row keeping only its own label's columns), a large label is split into chunks of
    rows under the budget. Within a slice, columns are in gallery-index order, so a stable
    sort on -similarity breaks ties by gallery index. With ``first_only`` the lists hold
    only the best positive and, if others tie with it, the last of them (the first under
    the opposite tie rule): memory in queries, not in (query, positive) pairs. There, a query with
    more than :data:`~recallk.score.ranking.counting.HAND_OVER` positives within the float32 error of its
    best (collapsed embeddings) is marked in ``crowded`` (bool, (n,)) instead of re-scored pair by pair: its
    entries are placeholders, and the exact pass ranks it (:attr:`RankCounter.handed`).
    """
    n = p.q.shape[0]
    parts = []
    n_pos, top_tie = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    crowded = np.zeros(n, dtype=bool) if crowded is None else crowded
    stacked = _small_labels(p) if first_only else None
    if stacked is not None and stacked.any():
        parts.append(_stacked_best(p, budget, np.flatnonzero(stacked), n_pos, top_tie, crowded))
    for rows, a, keep in _label_slices(p, budget, skip=stacked):
        b = a + keep.shape[1]
        n_pos[rows] = keep.sum(axis=1)
        if first_only:
            parts.append(_best_positives(p, rows, a, keep, n_pos, top_tie, crowded))
            continue
        sims = (p.q[rows].astype(np.float64) @ p.gp[a:b].astype(np.float64).T).astype(np.float32)
        best = np.where(keep, sims, -np.inf).max(axis=1)
        top_tie[rows] = np.maximum((keep & (sims == best[:, None])).sum(axis=1) - 1, 0)
        order = np.argsort(np.where(keep, -sims, np.inf), axis=1, kind="stable")
        used = np.arange(b - a)[None, :] < n_pos[rows][:, None]
        parts.append((rows, n_pos[rows], np.take_along_axis(sims, order, axis=1)[used], (order + a)[used]))
    if not parts:
        return np.zeros(n + 1, dtype=np.int64), np.empty(0, np.float32), np.empty(0, np.int64), n_pos, top_tie
    offsets, (vals, cols) = rows_to_csr(n, parts)
    return offsets, vals, cols, n_pos, top_tie


def positive_counts(p: Problem, budget: Budget) -> np.ndarray:
    """(n,) int64: the positives each query may retrieve (its label's gallery items, less its own image and
    the excluded ones), counted by label runs as :func:`find_positives` does, without products."""
    n_pos = (p.hi - p.lo).astype(np.int64)
    if not p.groups:  # only the own images
        return n_pos - ((p.self_col >= p.lo) & (p.self_col < p.hi))
    for rows, _, keep in _label_slices(p, budget):
        n_pos[rows] = keep.sum(axis=1)
    return n_pos


def _label_slices(p: Problem, budget: Budget, skip: np.ndarray | None = None):
    """Per run of :func:`_label_runs` (queries sorted by label, those whose label has gallery items, less those
    ``skip`` marks): the rows, the run's first sorted column ``a``, and which cells of columns ``[a, a + width)``
    are each row's positives it may retrieve."""
    by_label = np.argsort(_label_key(p), kind="stable")
    use = p.lo[by_label] < p.hi[by_label]
    if skip is not None:
        use &= ~skip[by_label]
    for rows in _label_runs(p, by_label[use], budget):
        a, b = p.lo[rows[0]], p.hi[rows[-1]]
        columns = np.arange(a, b)
        yield rows, a, (columns >= p.lo[rows][:, None]) & (columns < p.hi[rows][:, None]) & ~p.excluded(rows, a, b)


def _best_positives(p: Problem, rows: np.ndarray, a: int, keep: np.ndarray, n_pos: np.ndarray,
                    top_tie: np.ndarray, crowded: np.ndarray) -> tuple:
    """:func:`find_positives` with ``first_only`` for one run: each row's best positive among the ``keep``
    cells of columns from ``a``, and the last one tied with it; sets ``top_tie[rows]``.

    A float32 product finds them: only cells within ``2 tol`` of a row's float32 best can be
    exactly best, and those few are re-scored by :func:`exact_pairs`, the kernel that re-scores
    the fast path's undecided cells, so exact ties with them are seen as ties.
    """
    q_rows, g_rows = p.q[rows], p.gp[a:a + keep.shape[1]]
    # a run of small labels on one BLAS thread: two threads' hand-offs cost more than such a product, and far
    # more when another process holds the cores (measured: 1.5 s of a 3.3 s call at 2,000 x 10,000 x 512 with
    # 200 labels on a busy 2-core machine); a large label's chunks keep every thread. The float32 scores only
    # choose which cells exact_pairs re-scores, so the thread count changes no result.
    small = keep.size <= _POSITIVE_CELLS
    with single_threaded_blas(keep.size * q_rows.shape[1]) if small else nullcontext():
        sims = q_rows @ g_rows.T
    top = np.where(keep, sims, -np.inf).max(axis=1)
    near = keep & (sims >= round_outward(top.astype(np.float64) - 2 * p.tol, up=False)[:, None])
    line, col = np.nonzero(near)  # by row, then column (gallery-index order within a label)
    line, col = _uncrowded(line, col, rows, crowded)
    exact = exact_pairs(p.q, p.gp, rows[line], col + a)
    best = np.full(rows.size, -np.inf, dtype=np.float32)
    np.maximum.at(best, line, exact)
    at = exact == best[line]
    line, col = line[at], col[at]
    ties = np.bincount(line, minlength=rows.size)
    top_tie[rows] = np.maximum(ties - 1, 0)
    n_entries = np.where(n_pos[rows] > 0, 1 + (top_tie[rows] > 0), 0)
    first = np.searchsorted(line, np.arange(rows.size))  # each row's first tied cell; the last is before the next row's
    ends = np.zeros((rows.size, 2), dtype=np.int64)
    if col.size:  # none when every positive of the run is excluded
        ends = np.stack([col[np.minimum(first, col.size - 1)], col[np.maximum(first + ties - 1, 0)]], axis=1) + a
    used = np.arange(2)[None, :] < n_entries[:, None]
    return rows, n_entries, np.repeat(best, n_entries), ends[used]


def _label_key(p: Problem) -> np.ndarray:
    """(n,) int64: one key per query's label slice [lo, hi) (absent labels share lo with the next label, never hi)."""
    return p.lo * (p.gp.shape[0] + 1) + p.hi


def _small_labels(p: Problem) -> np.ndarray:
    """(n,) bool: the queries whose label has gallery items and at most ``_POSITIVE_CELLS`` cells (its queries x
    its gallery items), which :func:`_stacked_best` serves."""
    width = p.hi - p.lo
    _, label, n_queries = np.unique(_label_key(p), return_inverse=True, return_counts=True)
    return (width > 0) & (n_queries[label.reshape(-1)] * width <= _POSITIVE_CELLS)


def _stacked_best(p: Problem, budget: Budget, rows: np.ndarray, n_pos: np.ndarray, top_tie: np.ndarray,
                  crowded: np.ndarray) -> tuple:
    """:func:`find_positives` with ``first_only`` for the queries ``rows`` of small labels (:func:`_small_labels`),
    all at once: a part for :func:`~recallk.score.ranking.schedule.rows_to_csr`, as :func:`_best_positives` gives
    for one run; sets ``n_pos[rows]`` and ``top_tie[rows]``.

    Labels of about the same size (their queries and gallery items, each rounded up to a power of two) are
    stacked: each label's queries x its gallery slice is one slice of a stacked float32 product (padded rows
    and columns masked out), so a thousand small labels cost a few calls, not a thousand. Only cells within
    ``2 tol`` of a row's float32 best can be exactly best; those few are re-scored once, all together, by
    :func:`exact_pairs`, as in :func:`_best_positives`, so the thresholds are the same bits.
    """
    n, m, d = p.q.shape[0], p.gp.shape[0], p.q.shape[1]
    key = _label_key(p)[rows]
    by_label = np.argsort(key, kind="stable")
    order, key = rows[by_label], key[by_label]  # by label, then query index
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    counts = np.diff(np.r_[starts, order.size])
    lo = p.lo[order[starts]]
    width = p.hi[order[starts]] - lo
    q_side, g_side = _pow2(counts), _pow2(width)
    stacks = []  # (queries side, gallery side, its labels)
    # the cores share the stacks; under a budget too tight to hold the unit rows, one thread (each thread's
    # re-scoring scratch and rows normalised when read would double what the budget has to pay for)
    workers = 1 if isinstance(p.q, UnitRows) or isinstance(p.gp, UnitRows) else worker_count()
    for qs, gs in sorted(set(zip(q_side.tolist(), g_side.tolist()))):
        labels = np.flatnonzero((q_side == qs) & (g_side == gs))
        per = budget.stacked_labels(qs, gs, d, _STACK_CELLS, _STACK_ROWS, workers)
        stacks += [(qs, gs, labels[s:s + per]) for s in range(0, labels.size, per)]

    def near_cells(share: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One thread's stacks: the (query, column) cells near each row's float32 best, and their exact scores."""
        near_rows, near_cols, scratch = [np.empty(0, np.int64)], [np.empty(0, np.int64)], Buffers()
        for qs, gs, chunk in share:
            q_ok = np.arange(qs) < counts[chunk][:, None]  # (labels, qs): real queries, not padding
            g_ok = np.arange(gs) < width[chunk][:, None]   # (labels, gs): the label's own columns
            q_row = order[np.where(q_ok, starts[chunk][:, None] + np.arange(qs), starts[chunk][:, None])]
            g_col = np.where(g_ok, lo[chunk][:, None] + np.arange(gs), lo[chunk][:, None])
            q_vec = _gather(p.q, q_row, scratch, "q").reshape(chunk.size, qs, d)
            g_vec = _gather(p.gp, g_col, scratch, "g").reshape(chunk.size, gs, d)
            sims = np.matmul(q_vec, g_vec.transpose(0, 2, 1), out=scratch.get("sims", (chunk.size, qs, gs), np.float32))
            keep = q_ok[:, :, None] & g_ok[:, None, :] & ~p.excluded_cells(q_row[:, :, None], g_col[:, None, :])
            n_pos[q_row[q_ok]] = keep.sum(axis=2)[q_ok]  # each label's queries are one thread's
            np.putmask(sims, ~keep, -np.inf)
            top = sims.max(axis=2)
            near = keep & (sims >= round_outward(top.astype(np.float64) - 2 * p.tol, up=False)[:, :, None])
            b, i, j = np.nonzero(near)
            near_rows.append(q_row[b, i])
            near_cols.append(g_col[b, j])
        line, col = np.concatenate(near_rows), np.concatenate(near_cols)
        if line.size > HAND_OVER:  # only then can a query have more (each label's queries are one thread's)
            line, col = _uncrowded(line, col, np.arange(n), crowded)
        return line, col, exact_pairs(p.q, p.gp, line, col)

    shares = [stacks[k::workers] for k in range(min(workers, len(stacks)))]
    largest = max((qs * gs * d for qs, gs, _ in stacks), default=0)  # the largest product of one label
    with single_threaded_blas(largest):  # many small products: one BLAS thread each, no hand-offs
        found = run_all(near_cells, shares) if shares else [near_cells([])]  # each thread its own scratch
    line, col, exact = (np.concatenate(x) for x in zip(*found))
    best = np.full(n, -np.inf, dtype=np.float32)
    np.maximum.at(best, line, exact)
    at = exact == best[line]
    line, col = line[at], col[at]
    ties = np.bincount(line, minlength=n)[rows]
    first, last = np.full(n, m, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    np.minimum.at(first, line, col)  # within a label, sorted columns are in gallery-index order
    np.maximum.at(last, line, col)
    first[crowded], last[crowded] = p.lo[crowded], p.lo[crowded]  # placeholders, in range (no re-scored cells)
    top_tie[rows] = np.maximum(ties - 1, 0)
    n_entries = np.where(n_pos[rows] > 0, 1 + (ties > 1), 0)
    used = np.arange(2)[None, :] < n_entries[:, None]
    return rows, n_entries, np.repeat(best[rows], n_entries), np.stack([first[rows], last[rows]], axis=1)[used]


def _uncrowded(line: np.ndarray, col: np.ndarray, rows: np.ndarray, crowded: np.ndarray) -> tuple:
    """The near-best cells (``line`` indexes ``rows``) less those of rows with more than
    :data:`~recallk.score.ranking.counting.HAND_OVER` of them, which are marked in ``crowded`` instead."""
    many = np.bincount(line, minlength=rows.size) > HAND_OVER
    if not many.any():
        return line, col
    crowded[rows[many]] = True
    keep = ~many[line]
    return line[keep], col[keep]


def _gather(rows: np.ndarray | UnitRows, which: np.ndarray, scratch: Buffers, name: str) -> np.ndarray:
    """``rows[which.ravel()]``, held unit rows gathered into a reused scratch (fresh pages cost more than the copy)."""
    which = which.reshape(-1)
    if isinstance(rows, UnitRows):
        return rows[which]
    return np.take(rows, which, axis=0, mode="clip", out=scratch.get(name, (which.size, rows.shape[1]), rows.dtype))


def _pow2(x: np.ndarray) -> np.ndarray:
    """The smallest power of two at or above each of ``x`` (all positive)."""
    return 1 << np.ceil(np.log2(x)).astype(np.int64)


def _label_runs(p: Problem, by_label: np.ndarray, budget: Budget):
    """Runs of ``by_label`` (queries sorted by their label's gallery slice [lo, hi)) for :func:`find_positives`:
    consecutive labels together while run rows x slice width stays within ``_POSITIVE_CELLS``; a label
    wider than that alone, in chunks of rows under the budget (:meth:`Budget.label_rows`)."""
    if not by_label.size:
        return
    lo, hi = p.lo[by_label], p.hi[by_label]
    starts = np.flatnonzero(np.r_[True, lo[1:] != lo[:-1]])
    ends = np.r_[starts[1:], by_label.size]
    s = None  # the run being gathered: by_label[s:e] over columns [lo[s], hi[e - 1])
    for k0, k1 in zip(starts, ends):
        if s is not None and (k1 - s) * (hi[k1 - 1] - lo[s]) <= _POSITIVE_CELLS:
            e = k1
            continue
        if s is not None:
            yield by_label[s:e]
        s, e = k0, k1
        width = hi[k0] - lo[k0]
        if (k1 - k0) * width > _POSITIVE_CELLS:  # a large label: alone, in chunks under the budget
            step = budget.label_rows(width)
            for c in range(k0, k1, step):
                yield by_label[c:min(c + step, k1)]
            s = None
    if s is not None:
        yield by_label[s:e]
