"""Paired statistics of two systems scored on the same queries.

Every function takes per-query values ``a`` and ``b`` (same queries, same order) or
their differences ``delta = b - a``, and optional ``groups`` (one id per query, e.g.
the label) for a cluster-level analysis, where whole groups are resampled or
sign-flipped together (leave-one-out queries of one label are correlated, so a
query-level analysis is optimistic there).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import stats

from recallk.score.resample import bootstrap_means, percentile_interval, unit_sums

#: Differences closer than this (relative to the largest |delta|) count as equal in the
#: randomization test, so float rounding never turns |T*| = |T| into |T*| < |T|.
_TIE_TOL = 1e-12


def paired_bootstrap_ci(delta: np.ndarray, resamples: int, seed: int, confidence: float = 0.95,
                        groups: np.ndarray | None = None) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean difference, resampling queries (or, with ``groups``,
    whole groups) with replacement; the same ``seed`` gives every metric the same resample indices
    (:func:`recallk.score.resample.bootstrap_means`)."""
    means = bootstrap_means({"delta": np.asarray(delta, dtype=np.float64)}, resamples, seed, groups)["delta"]
    return percentile_interval(means, confidence)


def sign_flip_pvalue(delta: np.ndarray, resamples: int = 10_000, seed: int = 0,
                     groups: np.ndarray | None = None) -> tuple[float, bool]:
    """Two-sided paired randomization test of mean(delta) = 0 by sign flips.

    Under the null each unit's difference is as likely negative as positive, so its sign is
    flipped at random: ``T* = sum(s_u * d_u) / n`` with ``s_u = +-1`` per unit (a query, or a
    whole group), ``T = mean(delta)``. When ``2**units <= resamples`` every sign pattern is
    enumerated and ``p = #{|T*| >= |T|} / 2**units`` exactly; otherwise ``resamples`` random
    patterns give ``p = (1 + #{|T*| >= |T|}) / (resamples + 1)`` (the +1 counts the observed
    pattern, so p is never 0). Returns ``(p, exact)``.
    """
    delta = np.asarray(delta, dtype=np.float64)
    sums, sizes = (delta, np.ones(delta.size)) if groups is None else unit_sums(delta, groups)[:2]
    n_units, n = sums.size, sizes.sum()
    observed = abs(sums.sum()) / n
    tol = _TIE_TOL * max(float(np.abs(sums).max(initial=0.0)), 1e-300)
    if n_units <= 20 and 2**n_units <= resamples:
        patterns = ((np.arange(2**n_units)[:, None] >> np.arange(n_units)) & 1) * 2 - 1
        flipped = np.abs(patterns @ sums) / n
        return float(np.count_nonzero(flipped >= observed - tol) / patterns.shape[0]), True
    rng = np.random.default_rng(seed)
    count, step = 0, max(1, 2**22 // max(n_units, 1))
    for start in range(0, resamples, step):
        signs = rng.integers(0, 2, size=(min(step, resamples - start), n_units), dtype=np.int8) * 2 - 1
        count += int(np.count_nonzero(np.abs(signs @ sums) / n >= observed - tol))
    return (1 + count) / (resamples + 1), False


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


def fsum_mean(values: np.ndarray) -> float:
    """The correctly rounded mean (``math.fsum``), so the query order never changes a bit."""
    return math.fsum(np.asarray(values, dtype=np.float64).tolist()) / max(len(values), 1)
