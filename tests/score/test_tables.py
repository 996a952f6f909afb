"""recallk.score.tables through the score stage: the per-query and per-class tables, the recall curve and
the bootstrap intervals.

The stage runs as a subprocess (like ``dvc repro`` would run it) in copies of session projects that
already ran split and encode (conftest: ``uneven_base``, 20, 22 or 24 digits per label), so each test
pays only for the score runs it needs. Expected values come from a brute-force oracle written from the
formulas in the :mod:`recallk.score.metrics` docstring (``helpers.oracle``: rank by descending cosine
similarity, ties by gallery index), not from the ranking engine.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from helpers import (
    CURVE,
    EMBEDDINGS,
    PER_CLASS,
    PER_QUERY,
    SCORE_OUTPUTS,
    read_bytes,
    read_metrics,
    run_ok,
    set_params,
)
from recallk.score import suite, tables
from recallk.score.metrics import first_positive_ranks
from recallk.score.similarity import cosine_block, l2_normalize
from recallk.stats import mean
from score_oracle import KS, METRIC_KEYS, approx, eval_sets, fmean, oracle, read_per_query

# ---------------------------------------------------------------------------------------------- 1: tables and curve


def test_all_outputs_are_written_with_their_columns(uneven_scored_base):
    for rel in SCORE_OUTPUTS:
        assert (uneven_scored_base / rel).is_file() or any((uneven_scored_base / rel).iterdir()), rel
    per_class = pd.read_csv(uneven_scored_base / PER_CLASS)
    assert list(per_class.columns) == ["label", "num_queries", *METRIC_KEYS, "evaluated"]
    curve = pd.read_csv(uneven_scored_base / CURVE)
    assert list(curve.columns) == ["k", "recall", "evaluated"]
    per_query = read_per_query(uneven_scored_base)
    per_metric = [tables.per_query_column(k) for k in METRIC_KEYS]  # hit@K, precision@K, r_precision, ap@r, ap, rr
    assert list(per_query.columns) == ["image_id", "label", "num_positives", "num_retrievable", "first_positive_rank",
                                       "first_positive_rank_other_tie_rule", *per_metric, "top1_id", "top1_label",
                                       "evaluated"]
    compact = pd.read_csv(uneven_scored_base / "metrics/per_query.csv", dtype={"image_id": str, "label": str})
    assert list(compact.columns) == ["image_id", "label", "num_positives", "num_retrievable", *per_metric,
                                     "evaluated"]
    pd.testing.assert_frame_equal(compact, per_query[compact.columns])  # the copy kept in git for compare
    m = read_metrics(uneven_scored_base)
    assert [k for k in m if k in METRIC_KEYS] == METRIC_KEYS  # recall@K declared, the other means lead intervals
    for key in METRIC_KEYS:
        for suffix in ("_class_mean", "_ci_low", "_ci_high"):
            assert key + suffix in m
    assert m["num_queries"] + m["num_excluded_queries"] == len(per_query)


def test_per_query_table_matches_the_oracle_and_the_api(uneven_scored_base):
    s = eval_sets(uneven_scored_base)
    pq = read_per_query(uneven_scored_base)
    assert pq["image_id"].tolist() == sorted(s["q"])          # one row per query, sorted by id
    want = oracle(s["q_emb"], s["g_emb"], s["q_lab"], s["g_lab"], s["q"], s["g"], KS)
    by_id = pq.set_index("image_id").loc[s["q"]]              # back to split (query) order
    assert by_id["label"].tolist() == list(s["q_lab"])
    assert by_id["num_positives"].tolist() == want["n_pos"].tolist()
    assert by_id["num_retrievable"].tolist() == want["n_ret"].tolist()
    assert by_id["first_positive_rank"].tolist() == want["first"].tolist()
    assert by_id["first_positive_rank_other_tie_rule"].tolist() == want["first_opp"].tolist()
    for key in METRIC_KEYS:  # every metric's per-query value, named hit@K, ap@r, ap, rr where they differ
        np.testing.assert_allclose(by_id[tables.per_query_column(key)].to_numpy(float), want["values"][key],
                                   rtol=1e-9, err_msg=key)

    first, n_pos = first_positive_ranks(s["q_emb"], s["g_emb"], s["q_lab"], s["g_lab"], query_ids=s["q"],
                                        gallery_ids=s["g"])
    assert by_id["first_positive_rank"].tolist() == (first + 1).tolist()
    assert by_id["num_positives"].tolist() == n_pos.tolist()

    m = read_metrics(uneven_scored_base)
    assert fmean(pq["ap"]) == approx(m["map"])
    assert fmean(pq["ap@r"]) == approx(m["map@r"])
    for key in METRIC_KEYS:                                   # headline means = oracle means
        assert m[key] == approx(fmean(want["values"][key]), rel=1e-12), key
    for k in KS:
        assert m[f"tie_sensitive@{k}"] == int(np.count_nonzero((want["first"] <= k) != (want["first_opp"] <= k)))
    assert 0.5 < m["recall@1"] < 1.0, "the digits subset should give a non-trivial recall@1"


def test_neighbors_and_confusions_are_the_brute_force_ranking(uneven_scored_base):
    """neighbors.csv: each query's top max(ks) by exact cosine, ties by gallery order, never itself, then on
    while tied with the max(ks)-th (within 1e-6, big-ann-benchmarks' rule) and one more; per_query's top1
    columns and confusions.csv follow from it."""
    s = eval_sets(uneven_scored_base)
    sims = cosine_block(l2_normalize(s["q_emb"]), l2_normalize(s["g_emb"]).T)
    nb = pd.read_csv(uneven_scored_base / "data/scores/neighbors.csv",
                     dtype={"image_id": str, "label": str, "gallery_id": str, "gallery_label": str})
    g_ids, k = np.asarray(s["g"]), max(KS)
    for i, qid in enumerate(s["q"]):
        allowed = np.flatnonzero(g_ids != qid)
        order = allowed[np.lexsort((allowed, -sims[i, allowed]))]
        order = order[:int(tables.tie_end(1.0 - sims[i, order][None].astype(np.float64), k)[0]) + 1]
        mine = nb[nb["image_id"] == qid]
        assert mine["rank"].tolist() == list(range(1, len(order) + 1))
        assert mine["gallery_id"].tolist() == g_ids[order].tolist(), qid
        np.testing.assert_array_equal(mine["score"].to_numpy(np.float32), sims[i, order])
        assert mine["is_positive"].tolist() == (s["g_lab"][order] == s["q_lab"][i]).tolist()
    pq = read_per_query(uneven_scored_base).set_index("image_id")
    first = nb[nb["rank"] == 1].set_index("image_id")
    assert pq["top1_id"].astype(str).to_dict() == first["gallery_id"].to_dict()
    conf = pd.read_csv(uneven_scored_base / "metrics/confusions.csv", dtype={"label": str, "retrieved_label": str})
    want = first.groupby(["label", "gallery_label"]).size()
    assert dict(zip(zip(conf["label"], conf["retrieved_label"]), conf["queries"])) == want.to_dict()
    assert conf.groupby("label")["share"].sum().round(9).eq(1.0).all()


def test_per_class_table_is_the_per_label_mean_of_per_query_values(uneven_scored_base):
    s = eval_sets(uneven_scored_base)
    want = oracle(s["q_emb"], s["g_emb"], s["q_lab"], s["g_lab"], s["q"], s["g"], KS)
    per_class = pd.read_csv(uneven_scored_base / PER_CLASS, dtype={"label": str}).set_index("label")
    labels = sorted(set(s["q_lab"]))
    assert per_class.index.tolist() == labels
    for label in labels:
        mine = (s["q_lab"] == label) & (want["n_pos"] > 0)
        assert per_class.loc[label, "num_queries"] == int(mine.sum())
        for key in METRIC_KEYS:
            assert per_class.loc[label, key] == approx(fmean(want["values"][key][mine])), (label, key)

    # the same from the stage's own per-query table (the columns it derives from)
    pq = read_per_query(uneven_scored_base)
    for label, rows in pq.groupby("label"):
        rank = rows["first_positive_rank"].dropna()
        derived = {"map": rows["ap"].dropna(), "map@r": rows["ap@r"].dropna(), "mrr": 1.0 / rank,
                   **{f"recall@{k}": (rank <= k).astype(float) for k in KS}}
        for key, column in derived.items():
            assert per_class.loc[label, key] == approx(fmean(column)), (label, key)

    m = read_metrics(uneven_scored_base)
    assert per_class["num_queries"].nunique() > 1, "the fixture should give labels of different sizes"
    assert m["map_class_mean"] != approx(m["map"]), "class mean must weigh labels, not queries"
    for key in METRIC_KEYS:
        assert m[f"{key}_class_mean"] == approx(fmean(per_class[key])), key
        label_means = [fmean(want["values"][key][(s["q_lab"] == lab) & (want["n_pos"] > 0)]) for lab in labels]
        assert m[f"{key}_class_mean"] == approx(fmean(label_means), rel=1e-12), key


def test_exact_ties_fill_the_other_tie_rule_column(uneven):
    """Two gallery items (labels A and B) and one query of each label share one embedding: each query's
    positive ties exactly with a negative, so its first-positive rank is 1 under one tie rule and 2 under the other."""
    s = eval_sets(uneven)
    q_a = s["q"][0]
    label_a = s["cat"].loc[q_a, "label"]
    q_b = next(q for q in s["q"] if s["cat"].loc[q, "label"] != label_a)
    label_b = s["cat"].loc[q_b, "label"]
    g_a = next(g for g in s["g"] if s["cat"].loc[g, "label"] == label_a)
    g_b = next(g for g in s["g"] if s["cat"].loc[g, "label"] == label_b)
    emb = s["emb"].copy()
    for image in (q_a, q_b, g_b):
        emb[s["row"][image]] = emb[s["row"][g_a]]
    np.save(uneven / EMBEDDINGS, emb)
    run_ok(uneven, "score")

    pq = read_per_query(uneven).set_index("image_id")
    a_first = s["g"].index(g_a) < s["g"].index(g_b)        # smaller gallery index wins an exact tie
    assert tuple(pq.loc[q_a, ["first_positive_rank", "first_positive_rank_other_tie_rule"]]) == \
        ((1, 2) if a_first else (2, 1))
    assert tuple(pq.loc[q_b, ["first_positive_rank", "first_positive_rank_other_tie_rule"]]) == \
        ((2, 1) if a_first else (1, 2))
    s = eval_sets(uneven)
    want = oracle(s["q_emb"], s["g_emb"], s["q_lab"], s["g_lab"], s["q"], s["g"], KS)
    assert pq.loc[s["q"], "first_positive_rank"].tolist() == want["first"].tolist()
    assert pq.loc[s["q"], "first_positive_rank_other_tie_rule"].tolist() == want["first_opp"].tolist()
    m = read_metrics(uneven)
    assert m["tie_sensitive@1"] == int(np.count_nonzero((want["first"] <= 1) != (want["first_opp"] <= 1))) >= 2
    for key in METRIC_KEYS:
        assert m[key] == approx(fmean(want["values"][key]), rel=1e-12), key



def test_recall_curve_matches_recall_at_k_and_never_decreases(uneven_scored_base):
    curve = pd.read_csv(uneven_scored_base / CURVE)
    m = read_metrics(uneven_scored_base)
    pq = read_per_query(uneven_scored_base)
    assert curve["k"].tolist() == list(range(1, len(curve) + 1))
    assert len(curve) == min(max(max(KS), suite.CURVE_K), int(pq["num_retrievable"].max()))
    assert (np.diff(curve["recall"]) >= 0).all()
    assert curve["recall"].between(0, 1).all()
    for k in KS:
        assert curve.loc[curve["k"] == k, "recall"].item() == approx(m[f"recall@{k}"]), k
    ranks = pq["first_positive_rank"].dropna()
    for k, recall in zip(curve["k"], curve["recall"]):
        assert recall == approx(float((ranks <= k).mean())), k


# ---------------------------------------------------------------------------------------------- 2: bootstrap


def test_confidence_intervals_contain_the_means(uneven_scored_base):
    m = read_metrics(uneven_scored_base)
    for key in METRIC_KEYS:
        assert m[f"{key}_ci_low"] <= m[key] <= m[f"{key}_ci_high"], key
    assert m["map_ci_low"] < m["map_ci_high"], "map varies over queries: its interval has width"


def test_rerun_is_byte_identical(uneven_scored, uneven_scored_base):
    run_ok(uneven_scored, "score")
    assert read_bytes(uneven_scored, SCORE_OUTPUTS) == read_bytes(uneven_scored_base, SCORE_OUTPUTS)


def test_bootstrap_seed_moves_intervals_not_means(uneven_scored, uneven_scored_base):
    set_params(uneven_scored, {"score.bootstrap.seed": 1})
    run_ok(uneven_scored, "score")
    old, new = read_metrics(uneven_scored_base), read_metrics(uneven_scored)
    assert list(old) == list(new)
    ci = [k for k in old if k.endswith(("_ci_low", "_ci_high"))]
    assert {k: new[k] for k in old if k not in ci} == {k: old[k] for k in old if k not in ci}
    assert any(new[k] != old[k] for k in ci), "another seed must resample differently"
    for key in METRIC_KEYS:
        assert new[f"{key}_ci_low"] <= new[key] <= new[f"{key}_ci_high"], key
    for rel in (PER_CLASS, CURVE, PER_QUERY):
        assert (uneven_scored / rel).read_bytes() == (uneven_scored_base / rel).read_bytes(), rel


def test_zero_resamples_drop_the_intervals(uneven_scored, uneven_scored_base):
    set_params(uneven_scored, {"score.bootstrap.resamples": 0})
    proc = run_ok(uneven_scored, "score")
    old, new = read_metrics(uneven_scored_base), read_metrics(uneven_scored)
    assert not [k for k in new if "_ci_" in k]
    assert new == {k: v for k, v in old.items() if "_ci_" not in k}
    assert "recall@1:" in proc.stdout


def test_bootstrap_ci_unit():
    assert tables.bootstrap_ci({"a": np.full(7, 0.25)}, resamples=200, confidence=0.9, seed=3) == \
        {"a_ci_low": 0.25, "a_ci_high": 0.25}
    rng = np.random.default_rng(1)
    v = rng.random(40)
    one = tables.bootstrap_ci({"a": v, "b": 1.0 - v, "c": v.copy()}, resamples=500, confidence=0.95, seed=7)
    assert one == tables.bootstrap_ci({"a": v, "b": 1.0 - v, "c": v.copy()}, resamples=500, confidence=0.95, seed=7)
    assert one["a_ci_low"] < v.mean() < one["a_ci_high"]
    # every metric uses the same resampled queries
    assert (one["c_ci_low"], one["c_ci_high"]) == (one["a_ci_low"], one["a_ci_high"])
    assert one["b_ci_low"] == pytest.approx(1.0 - one["a_ci_high"]) and \
        one["b_ci_high"] == pytest.approx(1.0 - one["a_ci_low"])
    other = tables.bootstrap_ci({"a": v}, resamples=500, confidence=0.95, seed=8)
    assert (other["a_ci_low"], other["a_ci_high"]) != (one["a_ci_low"], one["a_ci_high"])
    narrow = tables.bootstrap_ci({"a": v}, resamples=500, confidence=0.5, seed=7)
    assert one["a_ci_low"] <= narrow["a_ci_low"] <= narrow["a_ci_high"] <= one["a_ci_high"]
    # NaN marks an excluded query: dropped before resampling
    with_nan = np.insert(v, [3, 10], np.nan)
    assert tables.bootstrap_ci({"a": with_nan}, 500, 0.95, 7) == tables.bootstrap_ci({"a": v}, 500, 0.95, 7)
    assert tables.bootstrap_ci({"a": v}, resamples=0, confidence=0.95, seed=7) == {}


@pytest.mark.parametrize("value, n", [(0.7, 6), (0.1, 3), (1 / 3, 7), (0.9, 11)])  # means that round off
def test_constant_metric_interval_is_its_mean(value, n):
    # every query has the same value: the headline and both ends of the interval are that value exactly
    values = np.full(n, value)
    assert tables.bootstrap_ci({"a": values}, resamples=300, confidence=0.95, seed=0) == \
        {"a_ci_low": value, "a_ci_high": value}
    assert mean(values) == value

