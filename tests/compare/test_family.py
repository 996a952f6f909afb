"""Family-wise statistics: the permutations are uniform, Tukey HSD is the exact randomization distribution on
tiny inputs and matches ranx's Tukey where both tests' assumptions meet, Holm and BH match statsmodels, and the
compact letter display says exactly which pairs differ."""

from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest
from scipy import stats as scipy_stats

from extras import extra
from recallk.compare import family


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6, 7])
def test_every_permutation_comes_from_exactly_one_triple(k):
    left, right, n_left, n_right = family.split_tables(k)
    subsets = len(left) // n_left
    assert subsets == math.comb(k, k // 2) and len(right) // n_right == subsets
    perms = {tuple(left[s * n_left + a]) + tuple(right[s * n_right + b])
             for s in range(subsets) for a in range(n_left) for b in range(n_right)}
    assert len(perms) == math.factorial(k) == subsets * n_left * n_right  # a bijection onto S_k


def test_permuted_rows_are_uniform_and_depend_on_the_seed_alone(monkeypatch):
    values = np.array([[1.0, 10.0, 100.0, 1000.0]], dtype=np.float32)  # one unit: the sums name the permutation
    draws = family.permuted_column_sums(values, 24_000, seed=4)
    _, counts = np.unique(draws, axis=0, return_counts=True)
    assert len(counts) == 24  # every one of the 4! orders appears
    assert counts.min() > 1000 - 4 * 31 and counts.max() < 1000 + 4 * 31  # 1000 each, sd ~31
    wide = np.random.default_rng(0).random((300, 5)).astype(np.float32)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    one_thread = family.permuted_column_sums(wide, 5000, seed=9)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert np.array_equal(one_thread, family.permuted_column_sums(wide, 5000, seed=9))


def test_tukey_p_is_the_randomization_distribution_counted_by_hand():
    values = np.array([[0.2, 0.5, 0.9], [0.1, 0.4, 0.3]])  # two queries, three systems: 6 x 6 labellings
    sums = values.sum(axis=0)
    ranges = [np.ptp(values[0, list(p)] + values[1, list(q)]) for p in itertools.permutations(range(3))
              for q in itertools.permutations(range(3))]
    result = family.randomized_tukey_hsd(values, permutations=40_000, seed=1)
    for i, j in itertools.combinations(range(3), 2):
        exact = np.mean([r >= abs(sums[i] - sums[j]) - 1e-9 for r in ranges])
        assert result["p"][i, j] == result["p"][j, i] == pytest.approx(exact, abs=4 * math.sqrt(0.25 / 40_000))
    assert np.allclose(result["diff"], result["means"][None, :] - result["means"][:, None])
    assert np.all(np.diag(result["p"]) == 1.0)


def test_tukey_keeps_the_family_wise_error_under_the_null():
    """Systems that differ by nothing but noise (with a shared per-query effect): some pair is found different
    in about alpha of the trials. 300 trials: the family-wise error 0.05 has a standard error of 0.013."""
    rng = np.random.default_rng(3)
    found = 0
    for trial in range(300):
        values = rng.normal(size=(60, 1)) + rng.normal(size=(60, 5))
        found += bool((family.randomized_tukey_hsd(values, 400, seed=trial)["p"] < 0.05).any())
    assert 0.02 <= found / 300 <= 0.09


def _ranx_tukey(values: np.ndarray) -> np.ndarray:
    """ranx's compare(stat_test="tukey") p-values of per-query ``values`` (queries x systems): ranx's
    statistical_tests/tukey_hsd_test.py returns ``scipy.stats.tukey_hsd(*scores).pvalue`` (checked against ranx
    itself by test_ranx_tukey_is_scipys_tukey_hsd; ranx.compare's Qrels/Run building costs over a minute of numba
    here, so bench/leaderboard_bench.py --peers runs it end to end)."""
    return scipy_stats.tukey_hsd(*values.T).pvalue


@pytest.mark.parametrize("shared", [0.0, 0.2])
def test_tukey_matches_ranx_to_its_monte_carlo_error(shared):
    """Both p-values are the studentized range's tail at a pair's |Δ| over a scale. ranx's (classical, unpaired):
    ``sf(|Δ| / sqrt(MSE / n), k, k (n - 1))``, MSE the pooled within-system variance, exactly. Ours (paired,
    randomized): the permutation distribution of the range, whose limit is ``sf(|Δ| / sqrt(v), k, inf)``, v the
    mean within-query variance over n. Ours must match that limit to its Monte Carlo error, and ranx's whenever
    the two scales agree: independent queries (``shared = 0``, v / (MSE / n) = 0.998 here, so the p-values agree
    to the Monte Carlo error alone). A per-query effect shared by every system (``shared = 0.2``, the usual case in
    retrieval) leaves v alone and inflates MSE: there the paired test is the right one, and far more powerful."""
    rng = np.random.default_rng(7)
    n, k, draws = 1000, 5, 10_000
    values = rng.normal(0.5, 0.12, (n, k)) + rng.normal(0, shared, (n, 1)) + np.linspace(0, 0.016, k)
    theirs, ours = _ranx_tukey(values), family.randomized_tukey_hsd(values, draws, seed=0)["p"]
    means, mse = values.mean(axis=0), values.var(axis=0, ddof=1).mean()
    scale = values.var(axis=1, ddof=1).mean() / n
    for i, j in itertools.combinations(range(k), 2):
        diff = abs(means[i] - means[j])
        classical = scipy_stats.studentized_range.sf(diff / math.sqrt(mse / n), k, k * (n - 1))
        assert theirs[i, j] == pytest.approx(classical, rel=1e-4, abs=1e-6)  # ranx's, by its construction
        limit = scipy_stats.studentized_range.sf(diff / math.sqrt(scale), k, np.inf)
        error = 4 * math.sqrt(limit * (1 - limit) / draws) + 1.5 / draws  # 4 Monte Carlo SE (+ the p's +1)
        assert ours[i, j] == pytest.approx(limit, abs=error), (i, j)  # ours, to its Monte Carlo error
        if shared == 0:
            assert ours[i, j] == pytest.approx(theirs[i, j], abs=error), (i, j)
    if shared == 0:
        assert scale / (mse / n) == pytest.approx(1, abs=0.01)
    else:  # ranx's variance is ~4x ours: ranx finds no pair, the paired test tells the far ends apart
        assert scale / (mse / n) < 0.3 and (theirs[np.triu_indices(k, 1)] > 0.05).all() and ours[0, k - 1] < 0.01


def test_ranx_tukey_is_scipys_tukey_hsd():
    tukey_hsd_test = extra("ranx.statistical_tests.tukey_hsd_test", "ranx").tukey_hsd_test
    values = np.random.default_rng(1).random((50, 3)) + [0, 0.05, 0.2]
    names = ["a", "b", "c"]
    rows = tukey_hsd_test(names, list(values.T), 0.05)  # what ranx.compare(stat_test="tukey") calls per metric
    got = {(r["control"], r["treatment"]): r["p-value"] for r in rows}
    theirs = _ranx_tukey(values)
    assert all(got[names[i], names[j]] == theirs[i, j] for i in range(3) for j in range(3))


@pytest.mark.parametrize("pvalues", [
    [0.01, 0.04, 0.03, 0.2],            # a mix
    [0.5],                              # one test
    [0.001, 0.001, 0.04, 0.04, 0.9],    # ties
    [0.9, 0.95, 0.99],                  # nothing: capped at 1
])
@pytest.mark.parametrize("method, theirs", [("holm", "holm"), ("bh", "fdr_bh")])
def test_adjustments_match_statsmodels(pvalues, method, theirs):
    multipletests = extra("statsmodels.stats.multitest", "peers").multipletests
    assert family.adjust(pvalues, method) == pytest.approx(multipletests(pvalues, method=theirs)[1].tolist())


@pytest.mark.parametrize("pairs, want", [
    ([], ["a", "a", "a"]),                          # nothing differs: one group
    ([(0, 1), (0, 2), (1, 2)], ["a", "b", "c"]),    # everything differs
    ([(0, 2)], ["a", "ab", "b"]),                   # a chain: 0~1, 1~2, 0 != 2
    ([(0, 1), (0, 2)], ["a", "b", "b"]),            # the best alone
])
def test_compact_letters(pairs, want):
    significant = np.zeros((3, 3), dtype=bool)
    for i, j in pairs:
        significant[i, j] = significant[j, i] = True
    assert family.compact_letters([0, 1, 2], significant) == want


def test_letters_are_shared_exactly_by_the_pairs_not_told_apart():
    rng = np.random.default_rng(5)
    for _ in range(60):
        upper = np.triu(rng.random((7, 7)) < rng.random(), 1)
        significant = upper | upper.T
        letters = family.compact_letters(list(rng.permutation(7)), significant)
        for i, j in itertools.combinations(range(7), 2):
            assert bool(set(letters[i]) & set(letters[j])) == (not significant[i, j])


@pytest.mark.parametrize("runs, want", [
    ([0.5], None),                        # one run: no spread
    ([0.5, 0.7], math.sqrt(0.02)),        # two runs: |0.2| / sqrt(2)
    ([0.6, 0.6, 0.6], 0.0),               # identical runs
])
def test_between_run_sd(runs, want):
    got = family.between_run_sd(runs)
    assert got == (None if want is None else pytest.approx(want))


def test_many_metrics_share_the_permutations_and_each_test_is_the_same_as_alone():
    values = np.random.default_rng(8).random((50, 3, 10))  # ten metrics, one set of permutations
    together = family.randomized_tukey_hsd_many(values, 300, seed=6)
    for m in (0, 7, 8, 9):
        alone = family.randomized_tukey_hsd(values[:, :, m], 300, seed=6)
        assert np.array_equal(together[m]["p"], alone["p"]) and np.array_equal(together[m]["ranges"], alone["ranges"])


def test_more_systems_than_the_tables_serve_are_permuted_uniformly_too():
    k = family.TABLE_MAX_SYSTEMS + 1  # drawn by sorting random keys
    draws = family.permuted_column_sums(np.arange(k, dtype=np.float32)[None, :], 13_000, seed=2)
    assert np.all(np.sort(draws, axis=1) == np.arange(k))  # every draw a permutation of the one unit
    counts = np.array([np.bincount(draws[:, j].astype(int), minlength=k) for j in range(k)])
    assert counts.min() > 1000 - 4 * 31 and counts.max() < 1000 + 4 * 31  # each value at each position 1/13


@pytest.mark.parametrize("pvalues, method, want", [
    ([0.01, 0.04, 0.03], "holm", [0.05 / 3, 0.05, 0.025]),  # Holm: each test's level at its step
    ([0.01, 0.04, 0.03], "bh", [0.05] * 3),                 # BH rejects all 3: alpha * 3 / 3 (FCR intervals)
    ([0.01, 0.5, 0.9], "bh", [0.05 / 3] * 3),               # BH rejects 1: alpha * 1 / 3
])
def test_adjusted_levels(pvalues, method, want):
    assert family.adjusted_levels(pvalues, 0.05, method) == pytest.approx(want)
