"""recallk compare: paired statistics checked by hand, against scipy.stats, and by exact enumeration."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from recallk.compare import cli, paired, sources
from recallk.errors import InputError
from recallk.stats import inference as stats


def table(hits: list[int], aps: list[float] | None = None, labels: list[str] | None = None,
          ids: list[str] | None = None, retrievable: int = 9) -> pd.DataFrame:
    """A per-query table as the score stage writes it (hit@1 and ap per query)."""
    n = len(hits)
    return pd.DataFrame({"image_id": ids or [f"q{i:02d}" for i in range(n)], "label": labels or ["a"] * n,
                         "num_positives": ["2"] * n, "num_retrievable": [str(retrievable)] * n,
                         "hit@1": [str(float(h)) for h in hits],
                         "ap": [str(x) for x in (aps if aps is not None else [0.5] * n)]})


# ------------------------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("delta", [
    [0.5, -0.25, 1.0, 0.0, 0.75],          # mixed signs and a tie
    [1.0, 1.0, 1.0],                       # all the same sign: the observed pattern is the extreme
    [0.0, 0.0, 0.0, 0.0],                  # no difference at all: p = 1
    [0.1, -0.1, 0.2, -0.2, 0.3, -0.3, 0.4],  # symmetric around 0
])
def test_sign_flip_p_is_the_exact_randomization_distribution_on_small_n(delta):
    d = np.array(delta)
    t = abs(d.mean())
    patterns = [np.array(s) for s in itertools.product([-1, 1], repeat=d.size)]
    want = sum(abs((s * d).mean()) >= t - 1e-12 for s in patterns) / len(patterns)
    got, exact = stats.sign_flip_pvalue(d, resamples=10_000)
    assert exact and got == pytest.approx(want, abs=1e-15)


def test_sign_flip_p_by_monte_carlo_is_never_zero_and_is_seeded():
    d = np.full(40, 0.5)  # every query better: no random pattern is as extreme, yet p > 0
    p, exact = stats.sign_flip_pvalue(d, resamples=999, seed=3)
    assert not exact and p == pytest.approx(1 / 1000)
    noisy = np.random.default_rng(1).normal(0.05, 1.0, size=200)
    assert stats.sign_flip_pvalue(noisy, 2000, seed=5) == stats.sign_flip_pvalue(noisy, 2000, seed=5)


def test_sign_flip_p_agrees_with_the_paired_t_test_on_large_n():
    rng = np.random.default_rng(0)
    a = rng.normal(size=400)
    b = a + rng.normal(0.1, 1.0, size=400)
    p, _ = stats.sign_flip_pvalue(b - a, resamples=20_000, seed=0)
    assert p == pytest.approx(scipy_stats.ttest_rel(b, a).pvalue, abs=0.01)


def test_mcnemar_is_the_exact_binomial_test_of_the_discordant_pairs():
    hit_a = np.array([1, 1, 1, 0, 0, 0, 0, 0, 1, 1], dtype=bool)
    hit_b = np.array([1, 0, 1, 1, 1, 1, 1, 1, 1, 1], dtype=bool)
    p, b, c = stats.mcnemar_exact(hit_a, hit_b)
    assert (b, c) == (1, 5)  # A alone hits q1; B alone hits q3..q7
    assert p == pytest.approx(scipy_stats.binomtest(5, 6, 0.5).pvalue)
    assert p == pytest.approx(2 * (1 + 6) / 64)  # two-sided: P(X <= 1) + P(X >= 5) of Binomial(6, 1/2)
    assert stats.mcnemar_exact(hit_a, hit_a) == (1.0, 0, 0)  # no discordant pair


@pytest.mark.parametrize("pvalues, want", [
    ([0.01, 0.04, 0.03], [0.03, 0.06, 0.06]),  # 0.01*3; 0.03*2 = 0.06; max(0.04*1, 0.06)
    ([0.5], [0.5]),                            # one test: unchanged
    ([0.4, 0.6], [0.8, 0.8]),                  # 0.4*2 = 0.8, then monotone: max(0.6, 0.8)
    ([0.9, 0.8, 0.7], [1.0, 1.0, 1.0]),        # capped at 1
])
def test_holm(pvalues, want):
    assert stats.holm(pvalues) == pytest.approx(want)


@pytest.mark.parametrize("delta, want", [
    ([1.0, 2.0, 3.0], 2.0),     # mean 2, sd 1
    ([0.0, 0.0], 0.0),          # no difference
    ([0.5, 0.5, 0.5], None),    # no spread: unbounded
    ([1.0], None),              # one query: no sd
])
def test_cohens_dz(delta, want):
    assert stats.cohens_dz(np.array(delta)) == (want if want is None else pytest.approx(want))


def test_paired_bootstrap_interval_brackets_the_mean_and_clusters_widen_it():
    rng = np.random.default_rng(2)
    groups = np.repeat(np.arange(20), 10)
    delta = np.repeat(rng.normal(0.1, 0.5, size=20), 10) + rng.normal(0, 0.05, size=200)  # label effects
    low, high = stats.paired_bootstrap_ci(delta, 2000, 0)
    c_low, c_high = stats.paired_bootstrap_ci(delta, 2000, 0, groups=groups)
    assert low < delta.mean() < high and c_low < delta.mean() < c_high
    assert c_high - c_low > 2 * (high - low)  # correlated queries: the query bootstrap is optimistic


# ------------------------------------------------------------------------------------------- comparison


def test_a_system_compared_with_itself_has_no_difference():
    a = table([1, 0, 1, 1, 0, 1], [0.9, 0.1, 0.5, 0.7, 0.2, 1.0])
    result = paired.compare(a, a.copy(), paired.CompareSettings(resamples=500, permutations=500))
    for name in ("recall@1", "map"):
        m = result["metrics"][name]
        assert (m["delta"], m["ci_low"], m["ci_high"], m["p"], m["p_holm"]) == (0.0, 0.0, 0.0, 1.0, 1.0)
        assert m["dz"] == 0.0 and (m["wins"], m["losses"]) == (0, 0)
    assert result["metrics"]["recall@1"]["p_mcnemar"] == 1.0
    assert result["flips"]["recall@1"] == {"lost": [], "gained": []}


def test_hand_checked_comparison():
    a = table([1, 0, 0, 0, 1, 0], [1.0, 0.2, 0.3, 0.25, 0.5, 0.1], labels=list("aabbcc"))
    b = table([1, 1, 1, 0, 0, 1], [1.0, 0.7, 0.8, 0.25, 0.5, 0.6], labels=list("aabbcc"))
    result = paired.compare(a, b, paired.CompareSettings(resamples=1000, permutations=10_000))
    r1 = result["metrics"]["recall@1"]
    assert (r1["mean_a"], r1["mean_b"]) == (pytest.approx(2 / 6), pytest.approx(4 / 6))
    assert r1["delta"] == pytest.approx(2 / 6) and (r1["wins"], r1["ties"], r1["losses"]) == (3, 2, 1)
    assert r1["discordant"] == [1, 3] and r1["p_mcnemar"] == pytest.approx(scipy_stats.binomtest(3, 4).pvalue)
    assert r1["p_exact"]  # 2**6 patterns <= 10,000: enumerated
    # delta = [0, 1, 1, 0, -1, 1], T = 2/6: of the 16 sign patterns of the four +-1 entries, 2 give |sum| 4 and
    # 8 give |sum| 2 (6 give 0); each counts 4 times (the two zeros' signs): 40 of 64
    assert r1["p"] == pytest.approx(40 / 64)
    ap = result["metrics"]["map"]
    assert ap["delta"] == pytest.approx(0.25) and ap["ci_low"] <= 0.25 <= ap["ci_high"]
    assert [r["p_holm"] for r in result["metrics"].values()] == pytest.approx(
        stats.holm([r["p"] for r in result["metrics"].values()]))
    assert [q["image_id"] for q in result["flips"]["recall@1"]["gained"]] == ["q01", "q02", "q05"]
    assert [q["image_id"] for q in result["flips"]["recall@1"]["lost"]] == ["q04"]
    by_label = {row["label"]: row["recall@1"]["delta"] for row in result["per_label"]}
    assert by_label == {"a": 0.5, "b": 0.5, "c": 0.0}


def test_patterns_counted_by_hand_for_the_example_above():
    d = np.array([0, 1, 1, 0, -1, 1], dtype=float)
    count = sum(abs(np.dot(s, d)) >= 2 - 1e-12 for s in itertools.product([-1, 1], repeat=6))
    assert count == 40


@pytest.mark.parametrize("b_changes, message", [
    (lambda t: t.assign(image_id=[f"x{i}" for i in range(len(t))]),                               # other split:
     r"scored different queries .*no query in common, so --intersect cannot help"),              # no --intersect
    (lambda t: t.iloc[1:], r"1 only in A, e\.g\. \['q00'\].* Pass --intersect to compare the 3 common"),  # dropped
    (lambda t: t.assign(num_retrievable="8"), "differ in `num_retrievable`"),                   # another gallery
    (lambda t: t.assign(label=["z"] * len(t)), "differ in `label`"),                            # relabelled
    (lambda t: t.drop(columns=["hit@1", "ap"]), "share no per-query metric column"),            # old table
])
def test_different_tasks_are_refused(b_changes, message):
    a = table([1, 0, 1, 1])
    with pytest.raises(InputError, match=message):
        paired.compare(a, b_changes(a.copy()), paired.CompareSettings(resamples=10, permutations=10))


def test_intersect_compares_the_common_queries_and_counts_the_dropped():
    a = table([1, 0, 1, 1], ids=["q0", "q1", "q2", "q3"])
    b = table([1, 1, 1], ids=["q1", "q2", "q9"])
    result = paired.compare(a, b, paired.CompareSettings(intersect=True, resamples=10, permutations=10))
    assert result["queries"] == 2 and result["dropped"] == {"A": 2, "B": 1}
    assert result["metrics"]["recall@1"]["delta"] == pytest.approx(0.5)


def test_excluded_queries_are_left_out_of_both_sides():
    a, b = table([1, 0, 1]), table([1, 1, 1])
    for t in (a, b):
        t.loc[2, ["hit@1", "ap"]] = pd.NA  # q02 has no positive
    result = paired.compare(a, b, paired.CompareSettings(resamples=10, permutations=10))
    assert result["queries"] == 2 and result["excluded"] == 1


# ------------------------------------------------------------------------------------------- command line


def test_cli_writes_json_and_markdown_and_gates_on_a_significant_regression(tmp_path, capsys):
    good, bad = table([1] * 30), table([0] * 25 + [1] * 5)
    good.to_csv(tmp_path / "good.csv", index=False)
    bad.to_csv(tmp_path / "bad.csv", index=False)
    code = cli.main([str(tmp_path / "good.csv"), str(tmp_path / "bad.csv"), "--json", str(tmp_path / "r.json"),
                     "--md", str(tmp_path / "r.md"), "--fail-if-worse", "recall@1", "--resamples", "200"])
    out, err = capsys.readouterr()
    assert code == 1 and "significantly worse than A on recall@1" in err
    assert "30 queries compared" in out and "recall@1: 0 queries miss -> hit, 25 hit -> miss" in out
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["metrics"]["recall@1"]["delta"] == pytest.approx(-25 / 30)
    assert len(result["flips"]["recall@1"]["lost"]) == 25
    assert (tmp_path / "r.md").read_text().count("\n| recall@1 |") == 1
    # the other way round B is better: the gate passes
    assert cli.main([str(tmp_path / "bad.csv"), str(tmp_path / "good.csv"), "--fail-if-worse", "recall@1",
                     "--resamples", "200"]) == 0


@pytest.mark.parametrize("args, message", [
    (["nope.csv", "nope.csv"], "is not a file, a folder, a git revision or a DVC experiment"),   # typo
    (["{good}", "{good}", "--fail-if-worse", "recall@5"], "--fail-if-worse names 'recall@5'"),  # not scored
    (["{good}", "{good}", "--alpha", "1.5"], "`--alpha` must be strictly between 0 and 1"),     # bad level
    (["{dir}", "{good}"], "holds no per-query table"),                                          # empty folder
])
def test_cli_user_errors_are_one_message_and_exit_2(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    table([1, 0]).to_csv(tmp_path / "good.csv", index=False)
    (tmp_path / "empty").mkdir()
    argv = [a.format(good=tmp_path / "good.csv", dir=tmp_path / "empty") for a in args]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_a_folder_of_score_outputs_is_read_from_its_metrics_table(tmp_path):
    (tmp_path / "metrics").mkdir()
    table([1, 0]).to_csv(tmp_path / "metrics" / "per_query.csv", index=False)
    frame, origin = sources.load(str(tmp_path))
    assert origin.endswith("metrics/per_query.csv") and frame["hit@1"].tolist() == ["1.0", "0.0"]
