"""Family-wise statistics of many systems scored on the same units (queries, or runs).

- :func:`randomized_tukey_hsd`: all-pairs randomized Tukey HSD in Sakai's form (Carterette 2012;
  Sakai 2014): under the null that the systems are interchangeable, the system labels are permuted
  independently within every unit; the statistic of a draw is the largest difference of two
  systems' means, ``max_ij |mean*_i - mean*_j|`` (the range of the permuted means), and the p-value
  of a pair is the share of draws whose range reaches that pair's observed ``|mean_i - mean_j|``.
  One null distribution serves every pair, so the p-values control the family-wise error over all
  pairs (strongly, as Tukey's HSD does).
- :func:`compact_letters`: the compact letter display of the pairs that cannot be told apart
  (Piepho's insert-and-absorb algorithm): two systems share a letter exactly when their difference
  is not significant.
- :func:`adjust`: Holm's step-down (family-wise error) or Benjamini-Hochberg's step-up (false
  discovery rate) adjustment of a family of p-values.

The bootstrap and the sign flips of many columns at once are :mod:`recallk.stats.inference`'
(``bootstrap_deltas``, ``sign_flip_pvalues``), shared with ``recallk compare``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

from recallk.stats import inference as stats

#: Permuted positions drawn per chunk (their indices and one metric's float32 values gathered at them: about
#: 24 MB of scratch per thread).
CELLS = 1 << 21
#: Draws closer than this (relative to the largest column sum) to an observed difference count as reaching it: the
#: values are tested as float32, whose rounding (at most 6e-8 of a sum, even summed over every unit) must never
#: break a tie such as 0.2 + 0.4 = 0.1 + 0.5; a difference of means below a millionth of the largest is no finding.
TIE_TOL = 1e-6
#: The most systems the split permutation tables serve (C(12, 6) * 6! rows); more are drawn by sorting keys.
TABLE_MAX_SYSTEMS = 12


@lru_cache(maxsize=8)
def split_tables(k: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Tables that draw a uniform permutation of ``k`` systems from three small uniform integers.

    A permutation is (which ``a = k // 2`` systems fill the first ``a`` positions: one of C(k, a)
    subsets) then an order of those (one of ``a!``) and an order of the other ``k - a`` (one of
    ``(k - a)!``): every permutation arises from exactly one triple, so independent uniform choices
    give a uniform permutation. Returns ``left`` (C(k, a) * a!, a) and ``right`` (C(k, a) *
    (k - a)!, k - a), the systems at the first and at the last positions, indexed by
    ``subset * a! + order``, and ``a!``, ``(k - a)!``.
    """
    a = k // 2
    left_orders = np.array(list(itertools.permutations(range(a))), dtype=np.int8).reshape(-1, a)
    right_orders = np.array(list(itertools.permutations(range(k - a))), dtype=np.int8).reshape(-1, k - a)
    subsets = [(np.array(s, dtype=np.int8), np.array([x for x in range(k) if x not in s], dtype=np.int8))
               for s in itertools.combinations(range(k), a)]
    left = np.concatenate([inside[left_orders] for inside, _ in subsets]).reshape(-1, a)
    right = np.concatenate([outside[right_orders] for _, outside in subsets]).reshape(-1, k - a)
    return left, right, len(left_orders), len(right_orders)


def _packed(table: np.ndarray) -> np.ndarray:
    """Each row of int8 positions (at most 8) as one uint64, so drawing rows is a 1-D take."""
    packed = np.zeros((table.shape[0], 8), dtype=np.int8)
    packed[:, :table.shape[1]] = table
    return packed.view(np.uint64).ravel()


def permuted_column_sums(values: np.ndarray, draws: int, seed: int,
                         tick: Callable[[int], None] | None = None) -> np.ndarray:
    """Column sums of ``values`` (units x systems, or units x systems x metrics) after permuting the
    systems of every unit at random, ``draws`` times (one permutation per unit and draw serves every metric).

    Draws come in fixed chunks, each from its own child of ``numpy.random.SeedSequence(seed)``, so
    the result depends on the seed alone (not on the threads that compute the chunks, nor on the
    number of metrics). Units are permuted through :func:`split_tables` (up to
    :data:`TABLE_MAX_SYSTEMS` systems; beyond, by sorting random keys); the permuted positions are
    drawn once per chunk and each metric's float32 values gathered at them. ``tick`` (progress) is called
    with each chunk's draws, in the chunks' order, from the calling thread. Returns
    (draws, systems[, metrics]) float64.
    """
    values = np.asarray(values, dtype=np.float32)
    n, k = values.shape[:2]
    stacked = values[:, :, None] if values.ndim == 2 else values
    flats = [np.ascontiguousarray(stacked[:, :, m]).ravel() for m in range(stacked.shape[2])]
    per_chunk = max(1, CELLS // max(n * k, 1))
    starts = list(range(0, draws, per_chunk))
    children = np.random.SeedSequence(seed).spawn(len(starts))
    offsets = np.arange(n, dtype=np.intp) * k
    out = np.empty((draws, k, len(flats)))
    if k <= TABLE_MAX_SYSTEMS:
        left, right, n_left, n_right = split_tables(k)
        halves = ((_packed(left), n_left, left.shape[1], slice(0, left.shape[1])),
                  (_packed(right), n_right, right.shape[1], slice(left.shape[1], k)))

    def chunk(i: int) -> int:
        rng, size = np.random.default_rng(children[i]), min(per_chunk, draws - starts[i])
        rows = out[starts[i]:starts[i] + size]
        if k > TABLE_MAX_SYSTEMS:
            index = np.argsort(rng.random((size, n, k)), axis=2).transpose(0, 2, 1) + offsets
            for m, flat in enumerate(flats):
                rows[:, :, m] = np.take(flat, index).sum(axis=2, dtype=np.float64)
            return size
        subset = rng.integers(0, len(left) // n_left, size=(size, n), dtype=np.int32)
        index = np.empty((size, max(left.shape[1], right.shape[1]), n), dtype=np.intp)
        for packed, n_orders, width, columns in halves:
            row = subset * n_orders
            row += rng.integers(0, n_orders, size=(size, n), dtype=np.int32)
            positions = np.take(packed, row).view(np.int8).reshape(size, n, 8)[:, :, :width].transpose(0, 2, 1)
            np.add(positions, offsets, out=index[:, :width], casting="unsafe")
            for m, flat in enumerate(flats):  # the units' axis last: contiguous sums
                rows[:, columns, m] = np.take(flat, index[:, :width]).sum(axis=2, dtype=np.float64)
        return size

    workers = max(1, min(len(starts), os.cpu_count() or 1))
    with contextlib.ExitStack() as stack:
        if workers == 1:
            sizes = map(chunk, range(len(starts)))
        else:  # numpy's takes, adds and sums release the GIL
            sizes = stack.enter_context(ThreadPoolExecutor(workers)).map(chunk, range(len(starts)))
        for size in sizes:  # in order, in this thread
            if tick:
                tick(size)
    return out[:, :, 0] if values.ndim == 2 else out


def randomized_tukey_hsd(values: np.ndarray, permutations: int = 10_000, seed: int = 0) -> dict[str, np.ndarray]:
    """All-pairs randomized Tukey HSD of ``k`` systems measured on the same ``n`` units.

    Parameters
    ----------
    values : array of shape (n, k)
        One row per unit (a query, or a run), one column per system; no NaN. The values are
        tested as float32 (the observed statistic too, so the identity permutation reproduces it).
    permutations : int
        Random draws ``B``: each permutes every row independently and uniformly.
    seed : int

    Returns
    -------
    dict
        ``means`` (k,), ``diff`` (k, k) with ``diff[i, j] = mean_j - mean_i``, ``p`` (k, k)
        symmetric with ones on the diagonal: ``p_ij = (1 + #{b: range_b >= |diff_ij|}) / (B + 1)``
        where ``range_b = max_j mean*_j - min_j mean*_j`` of draw ``b`` (the +1 counts the
        observed labelling, so p is never 0); and ``ranges`` (B,), the null distribution.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[1] < 2 or values.shape[0] < 1:
        raise ValueError(f"values must be (units, systems >= 2); got shape {values.shape}")
    return randomized_tukey_hsd_many(values[:, :, None], permutations, seed)[0]


def randomized_tukey_hsd_many(values: np.ndarray, permutations: int = 10_000, seed: int = 0,
                               tick: Callable[[int], None] | None = None) -> list[dict]:
    """:func:`randomized_tukey_hsd` of every metric of ``values`` (units x systems x metrics) at once: each
    draw permutes a unit's systems the same way for every metric (each metric's test is the same as
    alone; the gathers are shared). Returns one result per metric; ``tick``: progress, as in
    :func:`permuted_column_sums`."""
    rounded = np.asarray(values, dtype=np.float64).astype(np.float32)
    n = rounded.shape[0]
    sums = rounded.sum(axis=0, dtype=np.float64)
    draws = permuted_column_sums(rounded, permutations, seed, tick)
    results = []
    for m in range(rounded.shape[2]):
        ranges = np.sort(draws[:, :, m].max(axis=1) - draws[:, :, m].min(axis=1))
        tol = TIE_TOL * max(float(np.abs(sums[:, m]).max()), 1e-300)
        observed = np.abs(sums[None, :, m] - sums[:, None, m])
        reached = ranges.size - np.searchsorted(ranges, observed - tol, side="left")
        p = (1.0 + reached) / (ranges.size + 1.0)
        np.fill_diagonal(p, 1.0)
        means = sums[:, m] / n
        results.append({"means": means, "diff": means[None, :] - means[:, None], "p": p, "ranges": ranges / n,
                        "tol": tol / n})
    return results


def tukey_half_width(tukey: dict[str, np.ndarray], alpha: float) -> float:
    """The half-width ``h`` of the Tukey HSD simultaneous intervals ``diff ± h`` at level ``alpha``: the
    critical range of the randomization null, such that a pair's p (``(1 + #{range >= |diff| - tol}) / (B + 1)``)
    is below ``alpha`` exactly when ``|diff| > h`` (up to the float rounding of the difference); infinite when
    no p can be below ``alpha`` with these draws."""
    ranges = np.asarray(tukey["ranges"])
    counts = np.arange(ranges.size + 1)
    allowed = counts[(1.0 + counts) / (ranges.size + 1.0) < alpha]  # the draws reaching |diff| a finding allows
    if not allowed.size:
        return math.inf
    most = int(allowed.max())
    return 0.0 if most >= ranges.size else float(ranges[ranges.size - most - 1]) + float(tukey.get("tol", 0.0))


def compact_letters(order: Sequence[int], significant: np.ndarray) -> list[str]:
    """Compact letter display: letters per system such that two systems share one exactly when
    ``significant[i, j]`` is False.

    Piepho's (2004) insert-and-absorb algorithm: start from one letter held by every system; for
    each significant pair, split every letter held by both into two (one without each), then drop
    letters whose holders are a subset of another letter's. Letters are named ``a``, ``b``, ...
    in the order of their best-placed holder in ``order`` (systems best first), so ``a`` marks the
    group of the best system.
    """
    k = significant.shape[0]
    columns: list[frozenset[int]] = [frozenset(range(k))]
    for i, j in itertools.combinations(range(k), 2):
        if not significant[i, j]:
            continue
        split: list[frozenset[int]] = []
        for column in columns:
            split += [column - {i}, column - {j}] if i in column and j in column else [column]
        unique = list(dict.fromkeys(split))
        columns = [c for c in unique if c and not any(c < other for other in unique)]
    rank = {system: position for position, system in enumerate(order)}
    columns.sort(key=lambda c: sorted(rank[s] for s in c))
    names = [_letter(i) for i in range(len(columns))]
    return ["".join(name for name, column in zip(names, columns) if system in column) for system in range(k)]


def _letter(i: int) -> str:
    """a .. z, then aa, ab, ..."""
    return chr(ord("a") + i) if i < 26 else _letter(i // 26 - 1) + chr(ord("a") + i % 26)


def benjamini_hochberg(pvalues: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg step-up adjustment (controls the false discovery rate of independent or
    positively dependent tests): sorted ascending, ``p_(i) * m / i`` made monotone from the top, capped at 1."""
    p = np.asarray(pvalues, dtype=np.float64)
    if p.size == 0:
        return []
    order = np.argsort(p, kind="stable")
    scaled = p[order] * p.size / np.arange(1, p.size + 1)
    adjusted = np.minimum.accumulate(scaled[::-1])[::-1]
    out = np.empty_like(p)
    out[order] = np.minimum(adjusted, 1.0)
    return out.tolist()


#: The ``--adjust`` methods of the vs-reference family.
ADJUSTMENTS = {"holm": stats.holm, "bh": benjamini_hochberg}


def adjust(pvalues: Sequence[float], method: str) -> list[float]:
    """``pvalues`` adjusted by ``method`` (``holm`` or ``bh``, see :data:`ADJUSTMENTS`)."""
    if not len(pvalues):
        return []
    return ADJUSTMENTS[method](list(pvalues))


def adjusted_levels(pvalues: Sequence[float], alpha: float, method: str) -> list[float]:
    """The level of each test's interval, adjusted as :func:`adjust` adjusts its p: ``holm``, the test's level at
    its step of Holm's procedure (:func:`recallk.stats.inference.holm_levels`); ``bh``, ``alpha * R / m`` for
    every test, R the number the adjusted p-values reject (at least 1): Benjamini and Yekutieli's (2005)
    false-coverage-rate intervals."""
    if method == "holm":
        return stats.holm_levels(pvalues, alpha)
    rejected = sum(p < alpha for p in adjust(pvalues, method))
    return [alpha * max(rejected, 1) / len(pvalues)] * len(pvalues)


def between_run_sd(run_means: Sequence[float]) -> float | None:
    """The standard deviation (ddof 1) of a system's per-run means; None with a single run."""
    if len(run_means) < 2:
        return None
    mean = math.fsum(run_means) / len(run_means)
    return math.sqrt(math.fsum((x - mean) ** 2 for x in run_means) / (len(run_means) - 1))
