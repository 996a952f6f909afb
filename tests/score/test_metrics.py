"""The metric formulas (recallk.score.metrics): hand-checkable toy tables (scikit-learn metrics-test style,
the README example among them), edge cases, the error tables of bad input, and tie sensitivity."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from ranking_cases import (
    INF_ROWS,
    NAN_ROW2,
    TIES,
    TOY,
    call_kwargs,
    case_summary,
    make_case,
    oracle,
    ranks_per_query,
    similarities,
)
from recallk.score.metrics import per_query, retrieval_metrics, retrieval_summary
from recallk.score.passes import Pass
from recallk.score.ranking import rank_positives
from recallk.score.settings import ScoreSettings
from recallk.stats import mean


@pytest.mark.parametrize("q, g, ql, gl, ks, extra, expected", TOY)
def test_hand_checked_values(q, g, ql, gl, ks, extra, expected):
    got = retrieval_summary(q, g, ql, gl, ks=ks, metrics=None, **extra)
    assert {key: got[key] for key in expected} == pytest.approx(expected, rel=1e-12, abs=0)
    # the oracle agrees with the hand computation (it checks the oracle, too)
    ref = oracle(q, g, ql, gl, ks, extra.get("query_ids"), extra.get("gallery_ids"), extra.get("exclude", ()))[0]
    assert {key: ref[key] for key in expected} == pytest.approx(expected, rel=1e-12, abs=0)
    assert got["num_queries"] + got["num_excluded_queries"] == len(q)


def test_readme_example_ranking_and_cosines():
    q, g = [[1.0, 0.0]], [[0.9, 0.1], [0.8, 0.6], [0.6, 0.8], [0.0, 1.0]]
    np.testing.assert_allclose(similarities(q, g)[0], [0.9939, 0.8, 0.6, 0.0], atol=1e-4)
    ranking = rank_positives(q, g, ["a"], ["a", "b", "a", "b"])
    assert ranking.ranks.tolist() == [0, 2] and ranking.n_positives.tolist() == [2]
    assert ranking.n_retrievable.tolist() == [4]
    out = retrieval_metrics(q, g, ["a"], ["a", "b", "a", "b"], ks=[1, 2])
    assert out == {"recall@1": 1.0, "recall@2": 1.0, "precision@1": 1.0, "precision@2": 0.5, "r_precision": 0.5,
                   "map@r": 0.5, "map": pytest.approx(0.8333333333333334, rel=1e-15), "mrr": 1.0}


@pytest.mark.parametrize("query_id, gallery_ids, own", [
    ("1", [1, 2], 0),  # text id "1" is gallery id 1: compared as strings, like the labels
    (1, ["x", "1"], 1),  # and the other way round
    (1.0, [1, 2], 0),  # numbers on both sides compare by value: 1.0 is the id 1 (as labels)
    (np.int64(2), [1, 2], 1),  # numpy integers read like Python ones
])
def test_ids_are_compared_as_strings_or_numbers_by_value(query_id, gallery_ids, own):
    ranking = rank_positives([[1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]], ["a"], ["a", "a"], query_ids=[query_id],
                             gallery_ids=gallery_ids)
    assert ranking.n_positives.tolist() == [1 if own >= 0 else 2]


def test_ids_repeated_as_text_are_refused():
    with pytest.raises(ValueError, match=r"`gallery_ids` must be unique \(compared as text\)"):
        rank_positives([[1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]], ["a"], ["a", "a"], query_ids=["q"], gallery_ids=[1, "1"])


def test_readme_example_with_a_tie():
    # README: g1 and g2 tied -> g1 first (lower index): precision@2 stays 1/2; the first positive g0 ranks
    # first under either rule, so no hit flips and tie_sensitive@2 is 0
    q, g = [[1.0, 0.0]], [[0.9, 0.1], [0.8, 0.6], [0.8, 0.6], [0.0, 1.0]]
    out = retrieval_summary(q, g, ["a"], ["a", "b", "a", "b"], ks=[2], metrics=["precision"])
    assert out["precision@2"] == 0.5 and out["tie_sensitive@2"] == 0


@pytest.mark.parametrize("values, expected", [
    ([0.7] * 6, 0.7),  # fsum 4.2 / 6 is 0.6999999999999998: kept within the values' range
    ([0.1] * 3, 0.1),  # 0.30000000000000004 / 3
    ([0.25, np.nan, 0.75], 0.5),  # NaN marks an excluded query
    ([np.nan], None),  # nothing included: NaN
])
def test_mean_is_exact_for_constants(values, expected):
    got = mean(np.array(values))
    assert (np.isnan(got) if expected is None else got == expected)


@pytest.mark.parametrize("metrics, ks, keys", [
    # report order follows `metrics`, recall/precision expand per K in the order of `ks`
    (["mrr", "precision", "map"], [5, 1], ["mrr", "precision@5", "precision@1", "map"]),
    ("map@r", [3], ["map@r"]),  # a single name as a string
    (None, [2], ["recall@2", "precision@2", "r_precision", "map@r", "map", "mrr"]),  # default: all
])
def test_metric_key_order(metrics, ks, keys):
    case = make_case("gaussian", 0)
    assert list(retrieval_metrics(ks=ks, metrics=metrics, **case)) == keys


def test_summary_default_is_recall_only():
    case = make_case("gaussian", 0)
    assert list(retrieval_summary(ks=(5, 2), **case)) == [
        "recall@5", "recall@2", "num_queries", "num_excluded_queries", "tie_sensitive@5", "tie_sensitive@2",
        "num_gallery", "embedding_dim"]


@pytest.mark.parametrize("kwargs, match", [
    (call_kwargs(gallery_emb=np.empty((0, 3)), gallery_labels=[]), "gallery_emb` is empty"),  # no gallery
    (call_kwargs(query_emb=np.empty((0, 3)), query_labels=[]), "query_emb` is empty"),  # no queries
    # every query excluded: NaN with a warning (tests/score/test_api_training_loop.py)
    (call_kwargs(gallery_emb=NAN_ROW2, gallery_labels=[0, 1, 2, 3]),
     r"`gallery_emb` has NaN or inf in 1 row\(s\), first rows \[2\]"),  # NaN row named
    (call_kwargs(query_emb=INF_ROWS), r"`query_emb` has NaN or inf in 1 row\(s\), first rows \[1\]"),  # -inf
    (call_kwargs(gallery_emb=np.eye(4), gallery_labels=[0, 1, 2, 3]), "same dimension. Got 3 and 4 instead"),
    (call_kwargs(query_emb=np.ones(3), query_labels=[0, 1, 2]), "2-D"),  # 1-D embeddings
    (call_kwargs(query_emb=np.array([["a", "b", "c"]] * 2)), "real numbers"),  # strings, not numbers
    (call_kwargs(metrics=["recall", "recall"]), "`metrics` must be distinct names"),  # repeated
    (call_kwargs(metrics=[]), "`metrics` must be distinct names"),  # empty
    (call_kwargs(metrics=["recal"]), r"Did you mean `recall`\?"),  # typo -> suggestion
    (call_kwargs(metrics=["map@R"]), r"Did you mean `map@r`\?"),  # case matters
    (call_kwargs(metrics=["ndcg"]), r"Got \['ndcg'\] instead\.$"),  # no close name: no suggestion
    (call_kwargs(backend="Numpy"),
     re.escape("`backend` must be one of numpy, torch. Got 'Numpy' instead. Did you mean `numpy`?")),
    (call_kwargs(backend="faiss"),  # removed: one sentence naming what to use instead
     re.escape("`backend` no longer takes `faiss` (it gave the numpy engine's numbers, only slower): use `numpy`")),
    (call_kwargs(backend="cupy"), "`backend` must be one of numpy, torch"),
    (call_kwargs(ks=[0, 5]), re.escape("`ks` must be positive integers. Got [0, 5] instead.")),
    (call_kwargs(ks=[2.0]), "positive integers"),  # float, even integral
    (call_kwargs(ks=[True]), "positive integers"),  # bool is not a count
    (call_kwargs(ks=[]), "positive integers"),  # empty
    (call_kwargs(query_ids=["a", "b"], gallery_ids=["a", "a", "c"]), "`gallery_ids` must be unique"),
    (call_kwargs(query_labels=[0]), "query_labels` must have one entry per row"),  # 1 label for 2 rows
    (call_kwargs(exclude=[(["c"], ["c", "c", "d"])]), r"each `exclude` entry must be a \(query values"),
    (call_kwargs(exclude=[(["c", "d"], ["c", "d"])]), r"each `exclude` entry must be a \(query values"),
    (call_kwargs(exclude=[["c", "d"]]), r"each `exclude` entry must be a \(query values"),  # not a pair
    (call_kwargs(exclude=None), r"each `exclude` entry must be a \(query values"),  # not a list
    # 2-D on one side only (2-D on both, with the same columns, is a joint exclusion: test_reid_protocol.py)
    (call_kwargs(exclude=[(np.zeros((2, 2)), np.zeros(3))]), r"pair of 1-D sequences"),
    (call_kwargs(ks=5), "`ks` must be positive integers. Got 5 instead."),  # a bare number
    (call_kwargs(ks=7), "`ks` must be positive integers. Got 7 instead."),  # a bare number (None: the default)
    (call_kwargs(ks=[1, 1]), re.escape("`ks` must not repeat a value. Got [1, 1] instead.")),  # as score.ks
    (call_kwargs(ks=[2**64]), r"`ks` must be at most 2\*\*62"),  # beyond int64: no OverflowError
    (call_kwargs(metrics=5), "`metrics` must be distinct names"),  # a bare number
    (call_kwargs(query_emb=np.ones((2, 0)), gallery_emb=np.ones((3, 0))), r"`query_emb` has dimension 0"),
    (call_kwargs(query_emb=[[1.0, 0.0, 0.0], [1.0]]), "rows of one length"),  # ragged rows
    (call_kwargs(query_ids=["a", "b"]), r"pass both `query_ids` and `gallery_ids`"),  # else self-matches count
    (call_kwargs(gallery_ids=["a", "b", "c"]), r"pass both `query_ids` and `gallery_ids`"),
    (call_kwargs(query_labels=[[0, 1], [1, 0]]), r"`query_labels` must be a 1-D sequence.*Got shape \(2, 2\)"),
    (call_kwargs(query_labels=[0, None]), r"`query_labels` has missing .* at rows \[1\]"),  # None is no class
    (call_kwargs(gallery_labels=[0.0, np.nan, 2.0]), r"`gallery_labels` has missing .* at rows \[1\]"),  # NaN
    (call_kwargs(gallery_labels=["a", "", "c"]), r"`gallery_labels` has missing .* at rows \[1\]"),  # empty
    (call_kwargs(query_ids=[None, "b"], gallery_ids=[None, "x", "y"]), r"`query_ids` has missing"),  # no self-match
    (call_kwargs(query_ids=[{1}, {2}], gallery_ids=["a", "b", "c"]), r"`query_ids` has missing or unhashable"),
    (call_kwargs(max_memory_mb=0), re.escape("`max_memory_mb` must be a positive number. Got 0 instead.")),
    (call_kwargs(max_memory_mb=-1.0), "`max_memory_mb` must be a positive number"),  # negative
    (call_kwargs(max_memory_mb=float("nan")), "`max_memory_mb` must be a positive number"),  # NaN
    (call_kwargs(max_memory_mb=float("inf")), "`max_memory_mb` must be a positive number"),  # no bound at all
    (call_kwargs(max_memory_mb="512"), "`max_memory_mb` must be a positive number"),  # text
    (call_kwargs(max_memory_mb=True), "`max_memory_mb` must be a positive number"),  # a bool is not a size
])
def test_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        retrieval_metrics(**kwargs)
    with pytest.raises(ValueError, match=match):
        retrieval_summary(**{**kwargs, "metrics": kwargs.get("metrics")})


def test_incomplete_ranking_refuses_metrics_that_need_every_positive():
    ranking = rank_positives([[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], ["a"], ["a", "a"], ranks=Pass.first())
    assert not ranking.complete
    with pytest.raises(ValueError, match=r"metrics \['map'\] need the complete ranking"):
        per_query(ranking, ScoreSettings(ks=(1,), metrics=("recall", "map")))


def test_zero_vectors_tie_at_similarity_zero():
    # q0 is a zero vector: similarity 0 to everything -> gallery order g0(b) g1(a) g2(a), positives at 2, 3.
    # q1=[1,0]: g0 (b, 1.0), then g1 ([0,1]) and g2 (zero vector) tie at 0 -> g1 first: positives at 2, 3.
    q = [[0.0, 0.0], [1.0, 0.0]]
    g = [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    got = retrieval_summary(q, g, ["a", "a"], ["b", "a", "a"], ks=[1, 2], metrics=None)
    assert not any(isinstance(v, float) and math.isnan(v) for v in got.values())
    assert ranks_per_query(rank_positives(q, g, ["a", "a"], ["b", "a", "a"])) == [[1, 2], [1, 2]]
    assert got == {"recall@1": 0.0, "recall@2": 1.0, "precision@1": 0.0, "precision@2": 0.5,
                   "r_precision": 0.5, "map@r": 0.25, "map": pytest.approx((1 / 2 + 2 / 3) / 2, rel=1e-15),
                   "mrr": 0.5, "num_queries": 2, "num_excluded_queries": 0,
                   # q0's hit at 1 is a pure tie: larger index first would put g2 (a) on top; q1's g0 is strict
                   "tie_sensitive@1": 1, "tie_sensitive@2": 0, "num_gallery": 3, "embedding_dim": 2}
    np.testing.assert_array_equal(similarities(q, g)[0], [0.0, 0.0, 0.0])


def test_exclude_values_compared_by_value_and_missing_never_match():
    q, g = [[1.0, 0.0]] * 4, [[1.0, 0.0], [0.6, 0.8]]
    # query cameras: int 1 (== 1.0, by value as the labels), NaN, None, "" -> only the first one excludes g0
    cams_q, cams_g = [1, float("nan"), None, ""], [1.0, float("nan")]
    got = rank_positives(q, g, ["a"] * 4, ["a", "a"], exclude=[(cams_q, cams_g)])
    assert got.n_retrievable.tolist() == [1, 2, 2, 2]
    assert ranks_per_query(got) == [[0], [0, 1], [0, 1], [0, 1]]


@pytest.mark.parametrize("nan", [
    float("nan"),  # python float
    np.float64("nan"),  # a float subclass
    np.float32("nan"),  # a numpy scalar that is not a python float (a list of float32 values, object columns)
    np.float16("nan"),
], ids=["float", "float64", "float32", "float16"])
@pytest.mark.parametrize("container", [list, lambda v: np.array(v, dtype=object)], ids=["list", "object_array"])
def test_nan_exclusion_value_never_matches_whatever_its_float_type(nan, container):
    # documented: missing values (None, NaN, "") never match; query NaN and gallery NaN must not exclude g0
    q, g = [[1.0, 0.0]], [[1.0, 0.0], [0.6, 0.8]]
    got = rank_positives(q, g, ["a"], ["a", "a"], exclude=[(container([nan]), container([nan, "x"]))])
    assert got.n_retrievable.tolist() == [2]
    assert ranks_per_query(got) == [[0, 1]]


def test_self_and_exclusion_counted_once_in_m_q():
    # query 0 is gallery item 0 (by id) and shares its camera: M_q = 3 - 1, not 3 - 2; precision@5 = 1/2
    g = [[1.0, 0.0], [0.8, 0.6], [0.6, 0.8]]
    out = retrieval_summary(g[:1], g, ["a"], ["a", "b", "a"], ks=[5], query_ids=[0], gallery_ids=[0, 1, 2],
                            metrics=["precision"], exclude=[(["c"], ["c", None, "d"])])
    assert out["precision@5"] == 0.5
    assert rank_positives(g[:1], g, ["a"], ["a", "b", "a"], query_ids=[0], gallery_ids=[0, 1, 2],
                          exclude=[(["c"], ["c", None, "d"])]).n_retrievable.tolist() == [2]


@pytest.mark.parametrize("g, gl, expected", TIES)
@pytest.mark.parametrize("backend", ["numpy", "faiss"])
@pytest.mark.parametrize("metrics", [["recall"], None])
def test_tie_sensitivity(g, gl, expected, backend, metrics):
    # the engine, and the FAISS oracle's ranking (tests/faiss_oracle.py)
    ks = sorted({int(key.split("@")[1]) for key in expected})
    case = dict(query_emb=[[1.0, 0.0]], gallery_emb=g, query_labels=["pos"], gallery_labels=gl, query_ids=None,
                gallery_ids=None, exclude=())
    got = case_summary(case, ks, metrics, backend=backend)
    assert {key: got[key] for key in expected} == expected


def test_tie_sensitivity_counts_only_included_queries_on_the_symmetric_path():
    # leave-one-out: items 0 and 1 are copies (labels a, b), item 2 (label a) is orthogonal.
    # q0 (a): retrievable g1 (b, cos 1), g2 (a, cos 0) -> miss at 1, no tie with its positive -> 0 flips.
    # q1 (b): its only positive would be itself -> excluded, not counted.
    # q2 (a): g0 (a) and g1 (b) tie at 0 -> hit by index, flips under the opposite rule.
    g = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    labels, ids = ["a", "b", "a"], [0, 1, 2]
    got = retrieval_summary(g, g, labels, labels, ks=[1, 2], query_ids=ids, gallery_ids=ids, metrics=None)
    assert (got["num_queries"], got["num_excluded_queries"]) == (2, 1)
    assert (got["recall@1"], got["recall@2"], got["tie_sensitive@1"], got["tie_sensitive@2"]) == (0.5, 1.0, 1, 0)
    assert got == retrieval_summary(g, g.copy() + 0.0, labels, labels, ks=[1, 2], query_ids=ids, gallery_ids=ids,
                                    metrics=None, max_memory_mb=1e-6)
