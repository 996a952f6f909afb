"""Paired statistics of two systems scored on the same queries.

Every function takes per-query values ``a`` and ``b`` (same queries, same order) or
their differences ``delta = b - a`` (one column per metric for the vectorised ones), and
optional ``groups`` (one id per query, e.g. the label) for a cluster-level analysis,
where whole groups are resampled or sign-flipped together (leave-one-out queries of one
label are correlated, so a query-level analysis is optimistic there). The two-level
bootstrap resamples labels, then queries within each drawn label, from variance-matched values
(:func:`two_level_values`: shrunk label means and rescaled within-label residuals, after Davison &
Hinkley 1997, §3.8), so that the within-label spread is counted once, not twice.

Bootstrap resamples and sign-flip patterns are drawn in chunks of about :data:`CELLS`
unit draws, every metric in one matrix product per chunk, so the scratch stays bounded
and the cost is ``units x draws`` whatever the number of metrics.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from scipy import stats

from recallk.errors import InputError
from recallk.stats import MAX_ASKED
from recallk.stats.resample import CELLS, percentile_interval

#: Differences closer than this, relative to the sum of the |unit sums|, count as equal in the
#: randomization test, so float rounding never turns |T*| = |T| into |T*| < |T|.
TIE_TOL = 1e-10
#: The most bootstrap counts (resamples x units, float64) :func:`bootstrap_deltas` keeps in a caller's cache
#: (128 MiB).
CACHE_CELLS = 2**24
#: The most unit draws (units x resamples, and units x sign patterns) one comparison makes by default:
#: beyond it the resamples and patterns are capped (:func:`capped`) and the result says so.
MAX_DRAWS = 200_000_000
#: The fewest resamples or patterns a cap leaves (below it a percentile bound or a p-value is too coarse).
MIN_DRAWS = 1_000
#: The most bootstrap resamples or permutations (sign flips, Tukey's label shuffles) a command may ask for, as
#: the score stage's ``bootstrap.resamples``: ``recallk compare``, ``leaderboard``, ``track`` and ``report`` alike.

Tick = Callable[[int], None]


def check_asked(option: str, value: object) -> None:
    """The one rule for ``--resamples`` and ``--permutations`` in every command (and their settings): an integer
    from 1 to :data:`MAX_ASKED`; else an InputError naming ``option``, the rule and the fix."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= MAX_ASKED:
        raise InputError(f"`{option}` must be an integer from 1 to {MAX_ASKED:,} (its memory and time grow with it; "
                         f"10,000 gives p-values and interval bounds to about 0.002). Got {value!r} instead.")


def capped(requested: int, units: int, max_draws: int = MAX_DRAWS) -> int:
    """The resamples (or sign patterns) to draw: ``requested``, capped so that ``units x draws <= max_draws``,
    but never below ``min(requested, MIN_DRAWS)``."""
    return int(min(requested, max(max_draws // max(units, 1), min(requested, MIN_DRAWS))))


def _as_matrix(delta: np.ndarray) -> np.ndarray:
    delta = np.asarray(delta, dtype=np.float64)
    return delta[:, None] if delta.ndim == 1 else delta


def unit_totals(delta: np.ndarray, groups: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per unit (a query, or a group): the sum of each column of ``delta`` (n, M), the unit's number of
    queries, and each query's unit (groups numbered in sorted order of their ids as text)."""
    delta = _as_matrix(delta)
    if groups is None:
        return delta, np.ones(delta.shape[0]), np.arange(delta.shape[0])
    _, inverse = np.unique(np.asarray(groups).astype(str), return_inverse=True)
    inverse = inverse.ravel()
    units = int(inverse.max(initial=-1)) + 1
    sums = np.zeros((units, delta.shape[1]))
    np.add.at(sums, inverse, delta)
    return sums, np.bincount(inverse, minlength=units).astype(np.float64), inverse


def sign_flip_pvalues(delta: np.ndarray, permutations: int = 10_000, seed: int = 0,
                      groups: np.ndarray | None = None, tick: Tick | None = None) -> tuple[np.ndarray, bool]:
    """Two-sided paired randomization test of mean = 0 by sign flips, for every column of ``delta``.

    Parameters
    ----------
    delta : array (n,) or (n, M)
        Per-query differences B - A, one column per metric (no NaN).
    permutations : int
        Random sign patterns (the same patterns serve every column).
    seed : int
    groups : array (n,), optional
        Flip whole groups: ``T* = sum_u s_u * S_u`` over the groups' sums ``S_u``.
    tick : callable, optional
        Called with the number of patterns done after each chunk (progress).

    Returns
    -------
    p : array (M,)
        Under the null each unit's difference is as likely negative as positive, so its sign is flipped
        at random: ``T* = sum_u s_u S_u`` (``s_u = +-1``), ``T = sum_u S_u``. Units whose sums are all 0
        are left out (they never move T*). When ``2**units <= permutations`` (and at most 20 units) every
        pattern is enumerated and ``p = #{|T*| >= |T|} / 2**units`` exactly; otherwise ``p = (1 +
        #{|T*| >= |T|}) / (permutations + 1)`` (the +1 counts the observed pattern, so p is never 0).
    exact : bool
        Whether every pattern was enumerated.
    """
    sums = unit_totals(delta, groups)[0]
    sums = sums[(sums != 0).any(axis=1)]
    n_units, total = sums.shape[0], sums.sum(axis=0)
    observed = np.abs(total) - TIE_TOL * np.abs(sums).sum(axis=0)
    if n_units <= 20 and 2**n_units <= permutations:
        patterns = ((np.arange(2**n_units)[:, None] >> np.arange(n_units)) & 1) * 2.0 - 1.0
        flipped = np.abs(patterns @ sums)
        if tick:
            tick(permutations)
        return np.count_nonzero(flipped >= observed, axis=0) / patterns.shape[0], True
    rng = np.random.default_rng(seed)
    count = np.zeros(sums.shape[1], dtype=np.int64)
    step = max(1, CELLS // n_units)
    for start in range(0, permutations, step):
        size = min(step, permutations - start)
        bits = np.unpackbits(rng.integers(0, 256, size=(size, (n_units + 7) // 8), dtype=np.uint8), axis=1,
                             count=n_units)
        flipped = np.abs(2.0 * (bits.astype(np.float64) @ sums) - total)  # s = 2 * bit - 1
        count += np.count_nonzero(flipped >= observed, axis=0)
        if tick:
            tick(size)
    return (1 + count) / (permutations + 1), False


def sign_flip_pvalue(delta: np.ndarray, resamples: int = 10_000, seed: int = 0,
                     groups: np.ndarray | None = None, tick: Tick | None = None) -> tuple[float, bool]:
    """:func:`sign_flip_pvalues` of one metric's differences: ``(p, exact)``."""
    p, exact = sign_flip_pvalues(np.asarray(delta, dtype=np.float64), resamples, seed, groups, tick)
    return float(p[0]), exact


def _counts(rng: np.random.Generator, size: int, units: int) -> np.ndarray:
    """``size`` rows of bootstrap counts: how often each of ``units`` is drawn in ``units`` draws."""
    idx = rng.integers(0, units, size=(size, units))
    idx += (np.arange(size) * units)[:, None]
    return np.bincount(idx.ravel(), minlength=size * units).reshape(size, units).astype(np.float64)


def _cached_counts(cache: dict | None, key: tuple, cells: int, two_level: bool) -> list | None:
    """The list of count chunks ``cache`` keeps under ``key`` (made empty on first use), or None: no cache, a
    two-level draw (its stream interleaves the counts with the within-group draws), or counts above
    :data:`CACHE_CELLS`."""
    if cache is None or two_level or cells > CACHE_CELLS:
        return None
    return cache.setdefault(key, [])


def _two_level_counts(rng: np.random.Generator, label_counts: np.ndarray, starts: np.ndarray,
                      sizes: np.ndarray, n: int) -> np.ndarray:
    """Query counts of two-level resamples: each drawn label (``label_counts`` (size, G) times) draws its
    own number of queries with replacement from its queries (``starts``/``sizes``: its rows, sorted by
    label)."""
    size, n_labels = label_counts.shape
    draws = (label_counts * sizes).astype(np.int64).ravel()
    cell = np.repeat(np.arange(size * n_labels), draws)
    label, row = cell % n_labels, cell // n_labels
    query = starts[label] + (rng.random(cell.size) * sizes[label]).astype(np.int64)
    return np.bincount(row * n + query, minlength=size * n).reshape(size, n).astype(np.float64)


def two_level_values(delta: np.ndarray, sizes: np.ndarray, inverse: np.ndarray,
                     sums: np.ndarray) -> np.ndarray:
    """The values the two-level bootstrap resamples: ``mean + c (label mean - mean) + d_i (value - label mean)``.

    Resampling labels and then queries within labels, both with replacement, from the raw values counts the
    within-label spread twice: once inside the spread of the drawn labels' means, and again in the second
    stage, so the bootstrap variance of the mean is about ``V_label + V_within`` (its intervals over-cover).
    Davison & Hinkley (1997, §3.8) resample adjusted values instead, chosen so that the two stages reproduce
    the moment estimates of the two variance components. With ``G`` labels of ``m_i`` queries (``N`` in
    all), label means ``ybar_i`` and grand mean ``ybar`` (the query-weighted mean):

    - each residual is scaled by ``d_i = sqrt(m_i / (m_i - 1))`` (1 for a label of one query), so that the
      second stage's variance of a label's sum is ``m_i s_i**2`` (``s_i**2`` the unbiased within-label
      variance), and the within part of the bootstrap variance of the mean is
      ``V_within = sum_i m_i s_i**2 / N**2``;
    - each label mean's deviation is shrunk by ``c = sqrt(max(0, G/(G-1) V_label - V_within) / V_label)``,
      ``V_label = sum_i m_i**2 (ybar_i - ybar)**2 / N**2`` (the label bootstrap's linearised variance of the
      mean; the label stage then contributes ``c**2 V_label``);

    so the total, ``c**2 V_label + V_within``, is ``G/(G-1) V_label``: in the balanced case the unbiased
    ANOVA estimate ``SSB / (G (G-1))`` of the variance of the mean (between component ``sigma_b**2 / G``,
    within ``sigma_w**2 / N``, each estimated without bias). When the within part alone exceeds it (a
    negative between-component estimate: labels no more different than their queries), ``c = 0`` and the
    bootstrap resamples queries within labels only. With unequal label sizes the same match holds for the
    linearised variance of the query-weighted mean. Every column gets its own ``c``.

    Parameters
    ----------
    delta : array (n, M)
    sizes, inverse, sums : arrays
        :func:`unit_totals` of ``delta`` by label: queries per label (G,), each query's label (n,), and the
        label sums (G, M).

    Returns
    -------
    array (n, M)
        The adjusted values, in the order of ``delta``.
    """
    n, labels = delta.shape[0], sizes.size
    means = sums / sizes[:, None]
    grand = sums.sum(axis=0) / n
    scale = np.sqrt(sizes / np.maximum(sizes - 1.0, 1.0))[inverse][:, None]
    residual = scale * (delta - means[inverse])
    v_label = ((sizes[:, None] * (means - grand)) ** 2).sum(axis=0) / n**2
    v_within = (residual**2).sum(axis=0) / n**2
    target = v_label * (labels / (labels - 1) if labels > 1 else 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        shrink = np.where(v_label > 0, np.sqrt(np.maximum(target - v_within, 0.0) / v_label), 0.0)
    return grand + shrink * (means[inverse] - grand) + residual


def bootstrap_deltas(delta: np.ndarray, resamples: int, seed: int, groups: np.ndarray | None = None,
                     two_level: bool = False, tick: Tick | None = None,
                     counts_cache: dict | None = None) -> np.ndarray:
    """Bootstrap means of every column of ``delta`` (n, M): the same resamples serve every column.

    By query (no ``groups``): ``n`` queries drawn with replacement. By group: ``G`` groups drawn with
    replacement, the mean being the sum of their values over the number of their queries. Two-level
    (``groups`` and ``two_level``): ``G`` groups drawn with replacement, then within each drawn group as
    many queries as it holds, drawn with replacement from its queries' variance-matched values
    (:func:`two_level_values`: the within-group spread counted once; the bootstrap variance of the mean is
    ``G/(G-1)`` times the group bootstrap's, or the within-group part alone where that is larger). Every
    mean is kept within the range of its column (a constant column's resamples are that constant exactly).
    Returns (resamples, M).

    ``counts_cache`` (a dict the caller keeps): the resamples' counts are drawn once and reused by later
    calls with the same ``resamples``, ``seed`` and units (one query or one group each), which draw the same
    counts anyway: the results are those of a fresh draw, bit for bit (by query or by group, while the counts
    fit :data:`CACHE_CELLS`; two-level resamples are always drawn afresh).
    """
    delta = _as_matrix(delta)
    n = delta.shape[0]
    low, high = delta.min(axis=0), delta.max(axis=0)
    rng = np.random.default_rng(seed)
    out = np.empty((resamples, delta.shape[1]))
    if groups is None:
        sums, sizes = delta, None
    else:
        sums, sizes, inverse = unit_totals(delta, groups)
        if two_level:
            order = np.argsort(inverse, kind="stable")
            adjusted = two_level_values(delta, sizes, inverse, sums)
            sorted_delta, starts = adjusted[order], np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    units = sums.shape[0]
    step = max(1, CELLS // max(units if not (groups is not None and two_level) else n, 1))
    cached = _cached_counts(counts_cache, (resamples, seed, units, step), resamples * units,
                            groups is not None and two_level)
    for number, start in enumerate(range(0, resamples, step)):
        size = min(step, resamples - start)
        if cached is not None and number < len(cached):
            counts = cached[number]
        else:
            counts = _counts(rng, size, units)
            if cached is not None:
                cached.append(counts)
        if sizes is None:
            means = counts @ sums / n
        elif two_level:
            queries = _two_level_counts(rng, counts, starts, sizes.astype(np.int64), n)
            means = (queries @ sorted_delta) / queries.sum(axis=1, keepdims=True)
        else:
            means = (counts @ sums) / (counts @ sizes)[:, None]
        np.clip(means, low, high, out=out[start:start + size])
        if tick:
            tick(size)
    return out


def paired_bootstrap_ci(delta: np.ndarray, resamples: int, seed: int, confidence: float = 0.95,
                        groups: np.ndarray | None = None, tick: Tick | None = None) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean difference, resampling queries (or, with ``groups``,
    whole groups) with replacement (:func:`bootstrap_deltas`; ``tick``: progress)."""
    means = bootstrap_deltas(np.asarray(delta, dtype=np.float64), resamples, seed, groups, tick=tick)[:, 0]
    return percentile_interval(means, confidence)


def _quantile(q: float, units: int | None) -> float:
    """The standard normal quantile, or Student's t with ``units - 1`` degrees of freedom."""
    return float(stats.norm.ppf(q) if units is None or units < 3 else stats.t.ppf(q, units - 1))


def _unbiased(se: float, units: int | None) -> float:
    """A bootstrap standard error over ``units`` scaled by sqrt(units / (units - 1)) (the bootstrap's
    plug-in variance divides by ``units``)."""
    return se if units is None or units < 2 else se * math.sqrt(units / (units - 1))


def detectable(se: float, alpha: float = 0.05, power: float = 0.8, units: int | None = None) -> float:
    """The minimum detectable |Δ| of a two-sided level-``alpha`` test at ``power``, when the estimate of
    Δ has standard error ``se``: ``(q_{1-alpha/2} + q_power) * se``, with normal quantiles, or, given the
    number of resampled ``units`` (queries, or labels), Student's t quantiles with ``units - 1`` degrees
    of freedom and ``se * sqrt(units / (units - 1))`` (few labels: a t-like test)."""
    return float((_quantile(1 - alpha / 2, units) + _quantile(power, units)) * _unbiased(se, units))


def power_at(delta: float, se: float, alpha: float = 0.05, units: int | None = None) -> float:
    """The power of a two-sided level-``alpha`` test to detect a true Δ of ``delta`` with standard error
    ``se``: ``F(|Δ|/se - q) + F(-|Δ|/se - q)``, ``q = q_{1-alpha/2}``, F normal (or t, as in
    :func:`detectable`); ``alpha`` when ``se`` and Δ are 0, 1 when only ``se`` is."""
    se = _unbiased(se, units)
    if se <= 0:
        return alpha if delta == 0 else 1.0
    q, shift = _quantile(1 - alpha / 2, units), abs(delta) / se
    cdf = stats.norm.cdf if units is None or units < 3 else (lambda x: stats.t.cdf(x, units - 1))
    return float(cdf(shift - q) + cdf(-shift - q))


def queries_needed(queries: int, se: float, delta: float, alpha: float = 0.05, power: float = 0.8) -> int | None:
    """About how many queries (like these: the same spread, the same queries per label) detect a true
    ``delta`` at ``power``: the standard error shrinks as 1/sqrt(queries), so ``ceil(queries *
    (detectable / delta)**2)`` (normal quantiles). None when ``se`` is 0 (no spread to scale)."""
    if se <= 0 or delta == 0:
        return None
    return max(1, math.ceil(queries * (detectable(se, alpha, power) / abs(delta)) ** 2))


def mcnemar_exact(hit_a: np.ndarray, hit_b: np.ndarray) -> tuple[float, int, int]:
    """Exact McNemar test of two paired hit/miss outcomes: the discordant counts
    ``b = #(A hit, B miss)``, ``c = #(A miss, B hit)`` and the two-sided binomial p-value of
    ``c`` out of ``b + c`` at 1/2 (``scipy.stats.binomtest``); p = 1 with no discordant pair."""
    hit_a, hit_b = np.asarray(hit_a, dtype=bool), np.asarray(hit_b, dtype=bool)
    b, c = int(np.count_nonzero(hit_a & ~hit_b)), int(np.count_nonzero(~hit_a & hit_b))
    p = 1.0 if b + c == 0 else float(stats.binomtest(c, b + c, 0.5).pvalue)
    return p, b, c


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (controls the family-wise error rate):
    sorted ascending, ``p_(i) * (m - i)`` made monotone, capped at 1."""
    p = np.asarray(pvalues, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    adjusted = np.maximum.accumulate(p[order] * (p.size - np.arange(p.size)))
    out = np.empty_like(p)
    out[order] = np.minimum(adjusted, 1.0)
    return out.tolist()


def holm_levels(pvalues: Sequence[float], alpha: float) -> list[float]:
    """Each test's level at its step of Holm's procedure: ``alpha / (m - i + 1)`` for the i-th smallest of the
    ``m`` p-values (tied p-values share the level of the first of them, as they share their adjusted p). An
    interval at this level (``recallk compare``'s verdicts: ``ci_holm_*``) is adjusted as the Holm p is: it
    excludes 0 when this test's own step of the procedure rejects (where the interval and the test agree)."""
    order = sorted(range(len(pvalues)), key=lambda j: pvalues[j])
    levels = [0.0] * len(pvalues)
    for i, j in enumerate(order):
        tied = i and pvalues[j] == pvalues[order[i - 1]]
        levels[j] = levels[order[i - 1]] if tied else alpha / (len(pvalues) - i)
    return levels


def cohens_dz(delta: np.ndarray) -> float | None:
    """Cohen's d_z = mean(delta) / sd(delta) (ddof 1): 0 when every difference is 0, None when the
    differences are all equal but not 0 (no spread: d_z is unbounded) or there are fewer than 2."""
    delta = np.asarray(delta, dtype=np.float64)
    if delta.size < 2:
        return None
    sd = float(delta.std(ddof=1))
    mean = float(delta.mean())
    if sd == 0.0:
        return 0.0 if mean == 0.0 else None
    return mean / sd


def win_tie_loss(delta: np.ndarray) -> tuple[int, int, int]:
    """Queries where B beats A, ties it, and loses to it."""
    delta = np.asarray(delta, dtype=np.float64)
    return int(np.count_nonzero(delta > 0)), int(np.count_nonzero(delta == 0)), int(np.count_nonzero(delta < 0))
