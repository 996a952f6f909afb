"""recallk.stats.inference: the vectorised sign flips and bootstraps, the draws' cap and the power analysis."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats as scipy_stats

from recallk.stats import inference as stats


def test_every_column_gets_its_exact_randomization_p():
    delta = np.array([[0.5, 1.0, 0.0], [-0.25, 1.0, 0.0], [1.0, -1.0, 0.0], [0.0, 1.0, 0.0], [0.75, 1.0, 0.0]])
    p, exact = stats.sign_flip_pvalues(delta, permutations=10_000)
    assert exact
    for j in range(delta.shape[1]):
        d = delta[:, j]
        want = np.mean([abs(np.dot(s, d)) >= abs(d.sum()) - 1e-12 for s in itertools.product([-1, 1], repeat=5)])
        assert p[j] == pytest.approx(want, abs=1e-15)
    assert p[2] == 1.0  # a column with no difference at all


def test_group_sign_flips_are_the_flips_of_the_group_sums():
    rng = np.random.default_rng(4)
    groups = np.repeat(np.arange(12), 5)
    delta = rng.normal(0.1, 1.0, size=60)
    sums = np.array([delta[groups == g].sum() for g in range(12)])
    assert stats.sign_flip_pvalue(delta, 10_000, groups=groups) == stats.sign_flip_pvalue(sums, 10_000)  # 4,096


def test_monte_carlo_sign_flips_match_the_t_test_on_every_column():
    rng = np.random.default_rng(0)
    delta = rng.normal([0.0, 0.1, 0.2], 1.0, size=(400, 3))
    p, exact = stats.sign_flip_pvalues(delta, 20_000, seed=1)
    assert not exact
    assert p == pytest.approx([scipy_stats.ttest_1samp(delta[:, j], 0).pvalue for j in range(3)], abs=0.01)


def test_two_level_with_one_query_per_label_is_the_label_bootstrap_spread_by_the_small_sample_factor():
    rng = np.random.default_rng(1)
    delta = rng.normal(size=(30, 2))
    labels = np.arange(30).astype(str)
    label = stats.bootstrap_deltas(delta, 300, 5, labels)
    two = stats.bootstrap_deltas(delta, 300, 5, labels, two_level=True)
    # no within-label spread: the same label draws, each deviation from the mean times sqrt(G / (G - 1))
    mean = delta.mean(axis=0)
    expected = np.clip(mean + np.sqrt(30 / 29) * (label - mean), delta.min(axis=0), delta.max(axis=0))
    np.testing.assert_allclose(two, expected, rtol=0, atol=1e-12)


def test_bootstrap_spreads_follow_the_units():
    rng = np.random.default_rng(2)
    groups = np.repeat(np.arange(40), 10)
    delta = np.repeat(rng.normal(0, 0.5, size=40), 10) + rng.normal(0, 1.0, size=400)  # label effects
    by_query = stats.bootstrap_deltas(delta, 4000, 0).std()
    by_label = stats.bootstrap_deltas(delta, 4000, 0, groups).std()
    two_level = stats.bootstrap_deltas(delta, 4000, 0, groups, two_level=True).std()
    within = np.mean([delta[groups == g].var(ddof=1) for g in range(40)])
    label_means = np.array([delta[groups == g].mean() for g in range(40)])
    assert by_query == pytest.approx(delta.std() / np.sqrt(400), rel=0.05)
    assert by_label > 1.5 * by_query  # correlated queries: the query bootstrap is optimistic
    # the within-label spread counted once: var = the unbiased var(label means) / G, not + within / n again
    assert two_level**2 == pytest.approx(label_means.var(ddof=1) / 40, rel=0.1)
    assert two_level**2 < 0.9 * (by_label**2 + within / 400)


@pytest.mark.parametrize("tau", [0.0, 0.5])
def test_two_level_variance_matches_the_unbiased_components_with_unequal_labels(tau):
    """Unequal labels (1 to 12 queries): the two-level bootstrap variance of the query-weighted mean is
    max(G/(G-1) V_label, V_within), both linearised, whatever the label effect (none, or strong)."""
    rng = np.random.default_rng(4)
    sizes = rng.integers(1, 13, size=50)
    groups = np.repeat(np.arange(50), sizes)
    delta = tau * rng.normal(size=50)[groups] + rng.normal(size=groups.size)
    n = delta.size
    means = np.array([delta[groups == g].mean() for g in range(50)])
    v_label = ((sizes * (means - delta.mean())) ** 2).sum() / n**2
    v_within = sum(((delta[groups == g] - means[g]) ** 2).sum() * s / max(s - 1, 1)
                   for g, s in enumerate(sizes)) / n**2
    two_level = stats.bootstrap_deltas(delta, 3000, 1, groups, two_level=True)[:, 0]
    assert two_level.var() == pytest.approx(max(50 / 49 * v_label, v_within), rel=0.08)
    assert two_level.mean() == pytest.approx(delta.mean(), abs=0.1 * two_level.std())


def test_a_constant_column_resamples_to_itself():
    delta = np.column_stack([np.full(50, 0.1), np.linspace(-1, 1, 50)])
    for groups, two in ((None, False), (np.arange(50) % 7, False), (np.arange(50) % 7, True)):
        means = stats.bootstrap_deltas(delta, 200, 0, groups, two)
        assert (means[:, 0] == 0.1).all() and means.shape == (200, 2)


@pytest.mark.parametrize("requested, units, max_draws, want", [
    (10_000, 100, 10**8, 10_000),        # small: every draw asked
    (10_000, 200_000, 2 * 10**8, 1_000),  # 200,000 queries: capped at 1,000
    (10_000, 10**6, 2 * 10**8, 1_000),    # never below 1,000 ...
    (500, 10**6, 2 * 10**8, 500),         # ... unless fewer were asked
])
def test_capped(requested, units, max_draws, want):
    assert stats.capped(requested, units, max_draws) == want


def test_power_analysis_by_hand():
    se = 0.01
    mde = stats.detectable(se)
    assert mde == pytest.approx((1.959964 + 0.841621) * se, rel=1e-6)
    assert stats.power_at(mde, se) == pytest.approx(0.8 + scipy_stats.norm.cdf(-mde / se - 1.959964), rel=1e-6)
    assert stats.power_at(0.0, se) == pytest.approx(0.05)
    assert stats.queries_needed(1000, se, mde) == 1000  # that Δ is detected at these queries already
    assert stats.queries_needed(1000, se, mde / 2) == 4000  # half the Δ: four times the queries
    assert stats.queries_needed(1000, 0.0, 0.01) is None  # no spread to scale


@pytest.mark.parametrize("by_group", [False, True])
def test_bootstrap_counts_cache_gives_the_fresh_draws_bit_for_bit(by_group: bool) -> None:
    # The index stage reuses one sweep's counts for every point: a cached call equals a fresh one exactly,
    # for other deltas with the same rows; a larger cache key (other resamples) draws afresh.
    rng = np.random.default_rng(5)
    groups = rng.integers(0, 7, 90) if by_group else None
    cache: dict = {}
    for _ in range(3):
        delta = rng.normal(size=(90, 2))
        fresh = stats.bootstrap_deltas(delta, 300, 11, groups)
        cached = stats.bootstrap_deltas(delta, 300, 11, groups, counts_cache=cache)
        assert np.array_equal(fresh, cached)
    assert len(cache) == 1
    assert np.array_equal(stats.bootstrap_deltas(delta, 40, 11, groups, counts_cache=cache),
                          stats.bootstrap_deltas(delta, 40, 11, groups)) and len(cache) == 2
