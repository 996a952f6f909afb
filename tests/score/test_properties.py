"""Hypothesis: the oracle on arbitrary small integer and gaussian problems (ties, zero vectors,
self-matches, exclusion) and the metric invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ranking_cases import (
    BACKENDS,
    KS,
    PROPERTY,
    assert_matches_oracle,
    assert_same_ranking,
    case_oracle,
    case_summary,
    has_positive,
    oracle,
    rank_case,
    ranks_per_query,
    similarities,
)
from ranking_strategies import gaussian_problems, integer_problems
from recallk.errors import InputError
from recallk.score.metrics import METRICS, metric_keys


@PROPERTY
@given(integer_problems(), st.sampled_from(BACKENDS))
def test_property_matches_oracle_on_small_integer_problems(case, backend):
    ks = (1, 2, 4, 9)
    expected, detail = case_oracle(case, ks)
    if not set(case["query_labels"]) & set(case["gallery_labels"]):  # no query label in the gallery: an error
        with pytest.raises(InputError, match="no query label occurs in `gallery_labels`"):
            case_summary(case, ks, backend=backend)
        return
    if expected["num_queries"] == 0:  # every query excluded: NaN metrics with a warning (the stage refuses it)
        with pytest.warns(RuntimeWarning, match="every one of the"):
            summary = case_summary(case, ks, backend=backend)
        assert all(np.isnan(summary[f"recall@{k}"]) for k in ks) and summary["num_queries"] == 0
        return
    assert_matches_oracle(case_summary(case, ks, backend=backend), expected)
    assert_matches_oracle(case_summary(case, ks, metrics=["recall", "mrr"], backend=backend), expected)
    assert ranks_per_query(rank_case(case, backend=backend)) == detail["ranks"]
    assert rank_case(case, backend=backend).first_rank_opposite.tolist() == detail["opposite"]


@PROPERTY
@given(gaussian_problems())
def test_property_shuffling_gallery_and_queries_changes_nothing(problem):
    case, rng = problem
    assume(has_positive(case))
    sims = similarities(case["query_emb"], case["gallery_emb"])
    assume(all(np.unique(row).size == row.size for row in sims))  # no exact ties
    pg, pq = rng.permutation(len(case["gallery_emb"])), rng.permutation(len(case["query_emb"]))
    shuffled = dict(case, gallery_emb=case["gallery_emb"][pg], gallery_labels=case["gallery_labels"][pg],
                    query_emb=case["query_emb"][pq], query_labels=case["query_labels"][pq])
    before = case_summary(case)
    assert case_summary(shuffled) == before
    assert all(before[f"tie_sensitive@{k}"] == 0 for k in KS)  # no ties, nothing to flip


@PROPERTY
@given(integer_problems(), st.lists(st.integers(-30, 30), min_size=20, max_size=20))
def test_property_power_of_two_row_scaling_is_exactly_invariant(case, exponents):
    # scaling rows by 2**e is exact, so even the many exact ties of integer data must stay where they are
    q, g = np.asarray(case["query_emb"], dtype=np.float64), np.asarray(case["gallery_emb"], dtype=np.float64)
    assume(oracle(q, g, case["query_labels"], case["gallery_labels"], KS, case["query_ids"], case["gallery_ids"],
                  case["exclude"])[0]["num_queries"] > 0)
    scale = np.exp2(np.array(exponents, dtype=np.float64))
    scaled = dict(case, query_emb=q * scale[:len(q), None], gallery_emb=g * scale[::-1][:len(g), None])
    assert_same_ranking(rank_case(scaled), rank_case(dict(case, query_emb=q, gallery_emb=g)))
    assert case_summary(scaled) == case_summary(case)


@PROPERTY
@given(gaussian_problems(), st.floats(1e-3, 1e3), st.floats(1e-3, 1e3))
def test_property_positive_scaling_is_invariant(problem, a, b):
    case, rng = problem
    assume(has_positive(case))
    row_scale = rng.uniform(0.1, 10.0, size=(len(case["gallery_emb"]), 1))
    scaled = dict(case, query_emb=case["query_emb"] * a, gallery_emb=case["gallery_emb"] * b * row_scale)
    got, ref = case_summary(scaled), case_summary(case)
    assert_matches_oracle(got, ref)


@PROPERTY
@given(integer_problems())
def test_property_metric_bounds_and_orderings(case):
    ks = tuple(range(1, 12))
    expected = case_oracle(case, ks)[0]
    assume(expected["num_queries"] > 0)
    got = case_summary(case, ks)
    values = {key: got[key] for key in metric_keys(METRICS, ks)}
    assert all(0.0 <= v <= 1.0 for v in values.values()), values
    recall = [got[f"recall@{k}"] for k in ks]
    assert all(a <= b for a, b in zip(recall, recall[1:]))  # recall@K never decreases as K grows
    assert recall[-1] == 1.0  # K=11 >= gallery size: every included query hits
    assert got["precision@1"] == got["recall@1"]
    assert all(got[f"precision@{k}"] <= got[f"recall@{k}"] + 1e-12 for k in ks)
    assert got["map@r"] <= got["r_precision"] + 1e-12
    assert got["map@r"] <= got["map"] + 1e-12
    assert got["mrr"] >= got["recall@1"] - 1e-12
    assert all(0 <= got[f"tie_sensitive@{k}"] <= got["num_queries"] for k in ks)


@PROPERTY
@given(gaussian_problems())
def test_property_gallery_with_copies_of_every_query_gives_recall_1(problem):
    case, rng = problem
    q, ql = case["query_emb"], case["query_labels"]
    g = np.vstack([case["gallery_emb"], q])
    gl = np.concatenate([case["gallery_labels"], ql])
    order = rng.permutation(len(g))  # the copies anywhere in the gallery
    with_copies = dict(case, gallery_emb=g[order], gallery_labels=gl[order])
    got = case_summary(with_copies, metrics=["recall", "mrr", "precision"])
    assert got["recall@1"] == 1.0 and got["mrr"] == 1.0 and got["precision@1"] == 1.0
    assert got["num_excluded_queries"] == 0 and got["num_queries"] == len(q)
    if "faiss" in BACKENDS:
        assert got == case_summary(with_copies, metrics=["recall", "mrr", "precision"], backend="faiss")
