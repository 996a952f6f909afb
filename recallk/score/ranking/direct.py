"""The direct path for small problems: one exact product of every cell, every rank counted from it.

A training loop's call on a batch (64 queries x 64 gallery items x 256-d, say) spent
milliseconds in the tiled engine's fixed costs (a thread pool, threadpoolctl, the
tiling, the positives' products) around a product of microseconds. Up to
:attr:`~recallk.score.ranking.budget.Budget.DIRECT_CELLS` cells, when they fit the
budget (:meth:`~recallk.score.ranking.budget.Budget.direct`), the engine takes this
path instead: no threads, the exact similarity of every cell from one float64
product of the unit rows rounded once to float32
(:func:`recallk.score.similarity.cosine_block`, on one BLAS thread), the positive and
excluded cells masked, and every rank counted exactly with the engine's tie rule.

* First positive (recall@K, MRR): a row's best positive is its largest positive
  similarity; its rank is the number of retrievable cells above it. When no other
  cell equals it, that is its rank under either tie rule; the rows where one does
  are counted with order keys.
* Order keys: each cell's similarity and gallery index as one int64 that orders a row
  as the ranking does. The float32 similarity's bits map to an integer in the same
  order (:func:`value_keys`); times ``m``, plus ``m - 1 - gallery index``, a larger
  key ranks earlier and ties go to the smaller gallery index, and no two cells of a
  row share a key. With ``+ gallery index`` instead the larger index wins a tie: the
  opposite rule of tie sensitivity.
* Every positive (the complete ranking): each row's keys, with the positive flag in
  their lowest bit, sorted; a positive's place from the top is its rank.
"""

from __future__ import annotations

import numpy as np

from recallk.score.passes import Pass
from recallk.score.ranking.problem import Problem, UnitRows
from recallk.score.ranking.scan import exact_pairs
from recallk.score.ranking.schedule import single_threaded_blas
from recallk.score.retrieval_data import RetrievalData
from recallk.score.similarity import cosine_block

#: Below every real key: a cell the query may not retrieve (the complete ranking's sorted rows), and the
#: best positive key of a row without positives.
BELOW = np.iinfo(np.int64).min
#: The first-positive window is re-scored cell by cell while it holds at most 1 in this many cells.
_WINDOW_SHARE = 16
#: Added to the window's half-width: more than the float64 rounding of its ends (scores at most 1 in size).
_ROUNDING = 2.0**-50


def direct_ranks(p: Problem, ranks: Pass, raw: bool = True) -> tuple[np.ndarray, ...]:
    """The pass ``ranks`` (``Pass.every()`` or ``Pass.first(cap)``) for the whole problem from one product
    (exact, or float32 with the near cells re-scored exactly for the first positive): (positives per query,
    offsets, ranks, first ranks under the opposite tie rule). ``raw`` False: the first positive's raw product
    (:func:`_raw_first_ranks`) was tried already and left a doubt (:func:`plain_first_ranks`), so it starts with
    the unit rows."""
    n, m, complete, cap = p.q.shape[0], p.gp.shape[0], not ranks.first_only, ranks.cap
    positive = p.q_label[:, None] == p.g_label
    if p.groups or np.maximum.reduce(p.self_col) >= 0:  # some cells may not be retrieved
        retrievable = ~p.excluded(np.arange(n), 0, m)
        positive &= retrievable
        n_pos = np.add.reduce(positive, axis=1)
    else:
        retrievable, n_pos = None, p.hi - p.lo
    has = n_pos > 0
    found = None if complete or not raw else _raw_first_ranks(p, positive, retrievable, has)
    if found is None:
        q, g = p.q[:], p.gp[:]  # [:]: unit rows held or normalised now
        if not complete:
            found = _window_first_ranks(q, g, positive, retrievable, p.gindex, has, p.tol)
    if found is None:  # the complete ranking, or a first-positive window too wide to re-score cell by cell
        with single_threaded_blas(n * m * q.shape[1]):
            sims = cosine_block(q, g.astype(np.float64).T)
        found = _first_ranks(sims, positive, retrievable, p.gindex, has)
    if not complete:
        return _first_pass(n_pos, has, found, cap)
    first, opposite = found
    offsets = np.empty(n + 1, dtype=np.int64)
    offsets[0] = 0
    np.add.accumulate(n_pos, dtype=np.int64, out=offsets[1:])
    ranked = _every_rank(sims, positive, retrievable, p.gindex)
    return n_pos, offsets, ranked, opposite if has.all() else np.where(has, opposite, -1)


def _first_pass(n_pos: np.ndarray, has: np.ndarray, found: tuple[np.ndarray, np.ndarray],
                cap: int | None) -> tuple[np.ndarray, ...]:
    """:func:`direct_ranks`' result for the first positive from each row's first ranks ``found`` (under the tie
    rule and the opposite one; any value in rows without positives): one entry per query with positives, first
    ranks of ``cap`` or more read ``cap``."""
    first, opposite = found
    if cap is not None:  # without ties both rules share one array
        capped = np.minimum(first, cap)
        first, opposite = capped, capped if opposite is first else np.minimum(opposite, cap)
    if has.all():  # every query has positives (a training loop's batch, usually): one entry each
        return n_pos, np.arange(n_pos.size + 1, dtype=np.int64), first.copy(), opposite
    offsets = np.empty(n_pos.size + 1, dtype=np.int64)
    offsets[0] = 0
    np.add.accumulate(has, dtype=np.int64, out=offsets[1:])
    return n_pos, offsets, first[has], np.where(has, opposite, -1)


def plain_data(data: RetrievalData) -> bool:
    """Whether ``data`` is a plain batch, whose first positives :func:`plain_first_ranks` may rank without a
    :class:`Problem`: float32 embeddings, integer labels of one dtype (held by value, so equal values are equal
    labels), no ids and no exclusions (every cell retrievable)."""
    ql, gl = data.query_labels, data.gallery_labels
    return (data.query_ids is None and not data.exclude and data.query_emb.dtype == np.float32
            and data.gallery_emb.dtype == np.float32 and isinstance(ql, np.ndarray) and isinstance(gl, np.ndarray)
            and ql.dtype == gl.dtype and ql.dtype.kind in "iu")


def plain_first_ranks(data: RetrievalData, cap: int | None) -> tuple[np.ndarray, ...] | None:
    """:func:`direct_ranks` with ``Pass.first(cap)`` for plain data (:func:`plain_data`), straight from the checked
    arrays when the raw product leaves no doubt (:func:`_raw_window`): a training loop's batch. No label codes,
    no gallery sorted by label, no unit rows: the positives are the cells of equal labels, and a first rank is a
    count of the cells above the best positive, whatever the columns' order, so the gallery's own order gives the
    sorted gallery's ranks. None when the raw product leaves a doubt: the caller builds the :class:`Problem` and
    goes on from the unit rows (``direct_ranks(p, ranks, raw=False)``)."""
    positive = data.gallery_labels[:, None] == data.query_labels  # gallery x queries, as _raw_window takes it
    n_pos = np.add.reduce(positive, axis=0)
    has = n_pos > 0
    first = _raw_window(data.query_emb, data.gallery_emb, positive, None, has)
    return None if first is None else _first_pass(n_pos, has, (first, first), cap)


def raw_error_bound(d: int) -> float:
    """Bound on ``|A - s|``, where ``s`` is the exact similarity of two rows of dimension ``d`` (their unit float32
    rows' float64 sum of products, rounded to float32) and ``A`` the float32 product of the raw float32 rows
    scaled in float64 by the reciprocals of their float32 squared norms' square roots (:func:`_raw_first_ranks`),
    while ``d u < 0.01`` and every squared norm lies in ``[2**-40, 2**40]`` (no overflow; what underflows is below
    ``2**-60``).

    With ``g = d u / (1 - d u)``, ``u = 2**-24`` (Higham, Accuracy and Stability, 3.1; any order, FMA too): the raw
    product is within ``g |x| |y|`` of ``x . y``; a squared norm within a factor ``1 +- g``, so each reciprocal
    norm within ``0.51 g`` (plus a few float64 roundings); so ``A`` is within ``g + (1 + g) 1.03 g <= 2.04 g``
    of the cosine. The unit rows' elements are the cosine's within ``1.001 u`` each (one float32 rounding after
    float64 work), so ``s`` is within ``3.01 u`` of the cosine. Taken with room: ``2.5 g + 4 u + 2**-60``.
    """
    u = 2.0**-24
    gamma = d * u / (1 - d * u)
    return 2.5 * gamma + 4 * u + 2.0**-60


def _raw_first_ranks(p: Problem, positive: np.ndarray, retrievable: np.ndarray | None,
                     has: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The first ranks (under either tie rule: they are equal here) without normalising the rows, when the
    float32 product of the raw float32 rows, scaled by their norms (:func:`raw_error_bound`), leaves no doubt:
    each row's window of twice that bound around its best positive holds that positive alone. None (nothing
    decided) when it does not, or when the rows are not float32 rows read lazily, ``d`` is too large, or a squared
    norm leaves ``[2**-40, 2**40]`` (zero rows, huge values)."""
    if not (isinstance(p.q, UnitRows) and isinstance(p.gp, UnitRows)) or p.q.x.dtype != np.float32 \
            or p.gp.x.dtype != np.float32:
        return None
    x, y = (p.q.x if p.q.whole else p.q.x[p.q.order]), p.gp.x[p.gp.order]
    first = _raw_window(x, y, positive.T, None if retrievable is None else retrievable.T, has)
    return None if first is None else (first, first)


def _raw_window(x: np.ndarray, y: np.ndarray, positive: np.ndarray, retrievable: np.ndarray | None,
                has: np.ndarray) -> np.ndarray | None:
    """:func:`_raw_first_ranks` of the caller's rows ``x`` (queries) and ``y`` (gallery), with ``positive`` and
    ``retrievable`` gallery x queries (a query's cells are a column: the product is ``y @ x.T``, whose reductions
    over columns run across the rows at once, twice as fast as along each row): the first ranks, or None when the
    rows are not float32, ``d`` is too large, a squared norm leaves ``[2**-40, 2**40]`` or a window holds more than
    its best positive."""
    n, d = x.shape
    if x.dtype != np.float32 or y.dtype != np.float32 or d * 2.0**-24 >= 0.01:
        return None
    squares = np.empty(n + y.shape[0], dtype=np.float32)
    np.einsum("ij,ij->i", x, x, out=squares[:n])
    np.einsum("ij,ij->i", y, y, out=squares[n:])
    if not 2.0**-40 <= np.minimum.reduce(squares) <= np.maximum.reduce(squares) <= 2.0**40:
        return None
    scale = 1 / np.sqrt(squares.astype(np.float64))
    with single_threaded_blas(n * y.shape[0] * d):
        sims = (y @ x.T).astype(np.float64)  # exact; then scaled in place (no mixed-type loop)
    sims *= scale[n:, None]
    sims *= scale[None, :n]
    first, _, _, alone = _window(sims, positive, retrievable, 2 * raw_error_bound(d) + _ROUNDING, has, axis=0)
    return first if alone else None


def _window(sims: np.ndarray, positive: np.ndarray, retrievable: np.ndarray | None, half: float,
            has: np.ndarray, axis: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Per query of the scores ``sims`` (a row, ``axis`` 1; a column, ``axis`` 0): the retrievable cells more than
    ``half`` above its best positive's score (a boolean mask ``above`` and their count ``first``) and those at or
    above that score less ``half`` (``near``, which holds ``above``); and whether every query with positives
    (``has``) holds one cell in its window, ``near`` less ``above`` (its best positive: the others are above or
    below it for sure). Returns (first, above, near, alone).

    Every such query's best positive lies in its own window, so the windows hold one cell each exactly when they
    hold ``has.sum()`` cells in all: two counts of the whole masks, no count per query. A query without positives
    (its best score -inf) has every retrievable cell above and none in its window."""
    top = np.maximum.reduce(sims, axis=axis, keepdims=True, where=positive, initial=-np.inf)  # best positive's
    top = top.astype(np.float64, copy=False)
    # scores compare exactly against float64 ends; _ROUNDING (in ``half``) covers the ends' own float64 rounding
    above = sims > top + half
    near = sims >= top - half
    if retrievable is not None:
        above &= retrievable
        near &= retrievable
    alone = np.count_nonzero(near) - np.count_nonzero(above) == np.count_nonzero(has)
    return np.add.reduce(above, axis=axis), above, near, alone


def _window_first_ranks(q: np.ndarray, g: np.ndarray, positive: np.ndarray, retrievable: np.ndarray | None,
                        gindex: np.ndarray, has: np.ndarray, tol: float) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_first_ranks` from a float32 product: per row, the cells more than ``2 tol`` above the float32 best
    positive surely beat the exact best one and those more than ``2 tol`` below surely do not (``tol`` bounds a
    float32 score's error, :func:`~recallk.score.similarity.float32_dot_error_bound`); only the cells in between
    (the window, the exact best positive among them) are re-scored exactly (:func:`exact_pairs`, as the tiles'
    undecided cells) and ranked by their order keys. None when the window holds more than
    :data:`_WINDOW_SHARE` of the cells (e.g. all-zero queries tie everything): the exact product is cheaper."""
    n, m = positive.shape
    with single_threaded_blas(n * m * q.shape[1]):
        sims = q @ g.T
    first, above, near, alone = _window(sims, positive, retrievable, 2 * tol + _ROUNDING, has)
    # usually each row's window is its float32 best positive alone: that is its exact best and no other cell
    # comes near it, so its rank is the cells above under either tie rule
    if alone:
        return first, first
    near ^= above  # the window (``above`` lies within ``near``)
    if not has.all():  # rows without positives: no window (their -inf best would take every cell)
        near[~has] = False
    if np.count_nonzero(near) * _WINDOW_SHARE > n * m:
        return None
    line, col = np.nonzero(near)
    value = value_keys(exact_pairs(q, g, line, col), m)
    pos = positive[line, col]
    ranks = []
    for tie in (m - 1 - gindex[col], gindex[col]):  # ties to the smaller gallery index, then the opposite rule
        key = value + tie
        best = np.full(n, BELOW, dtype=np.int64)
        np.maximum.at(best, line[pos], key[pos])
        ranks.append(first + np.bincount(line[key > best[line]], minlength=n))
    return ranks[0], ranks[1]


def _first_ranks(sims: np.ndarray, positive: np.ndarray, retrievable: np.ndarray | None, gindex: np.ndarray,
                 has: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the first positive's rank under the engine's tie rule and under the opposite one (rows
    without positives, ``~has``: any value). Without a tie the two are the retrievable cells above the
    best positive; the rows where another cell equals it are counted by their order keys."""
    masked = np.empty_like(sims)  # the positives' similarities, -inf elsewhere (cheaper than np.where)
    masked.fill(-np.inf)
    np.copyto(masked, sims, where=positive)
    best = np.maximum.reduce(masked, axis=1, keepdims=True)
    above = sims > best
    if retrievable is not None:
        above &= retrievable
    first = np.add.reduce(above, axis=1)
    equal = sims == best  # the best positive itself, and any cell tied with it
    if np.count_nonzero(equal) <= np.count_nonzero(has):  # no ties: one rank under either rule
        return first, first
    opposite = first.copy()
    tied = np.flatnonzero(np.add.reduce(equal, axis=1) > 1)
    m = sims.shape[1]
    value = value_keys(sims[tied])
    part = None if retrievable is None else retrievable[tied]
    opposite[tied] = _above_best(value + gindex, positive[tied], part)  # ties: larger index first
    first[tied] = _above_best(np.add(value, m - 1 - gindex, out=value), positive[tied], part)
    return first, opposite


def value_keys(sims: np.ndarray, m: int | None = None) -> np.ndarray:
    """int64 keys, ``m`` apart (default: the number of columns; at most 2**29), in the order of the float32
    ``sims`` (equal values, 0.0 and -0.0 too, share a key): the bits of a negative float, read as an int32,
    grow as it falls, so all but the sign bit are flipped."""
    bits = (sims + np.float32(0.0)).view(np.int32)  # -0.0 + 0.0 is 0.0: the two zeros tie, as equal floats do
    value = (bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF))).astype(np.int64)
    value *= sims.shape[1] if m is None else m
    return value


def _above_best(key: np.ndarray, positive: np.ndarray, retrievable: np.ndarray | None) -> np.ndarray:
    """Per row, the retrievable cells whose key beats every positive's: the first positive's rank."""
    above = key > np.where(positive, key, BELOW).max(axis=1)[:, None]
    return (above if retrievable is None else above & retrievable).sum(axis=1)


def _every_rank(sims: np.ndarray, positive: np.ndarray, retrievable: np.ndarray | None,
                gindex: np.ndarray) -> np.ndarray:
    """Every positive's rank, row by row in ascending order (CSR): each row's order keys, doubled with the
    positive flag in the low bit (no two keys of a row are equal, so the order holds), sorted in descending
    order; the positives' places are their ranks (cells the query may not retrieve sort last)."""
    key = value_keys(sims)
    key += sims.shape[1] - 1 - gindex
    key *= 2
    key += positive
    if retrievable is not None:
        key[~retrievable] = BELOW
    key.sort(axis=1)
    return np.nonzero(key[:, ::-1] & 1)[1].astype(np.int64)
