"""recallk.score.registry: one function and one row per metric; the names, the first-rank-only set, the pass
that serves a set of metrics and the dispatch all come from the table, so a new metric is one function and
one row (shown with a toy metric registered in a copy of the table)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from recallk.errors import InputError
from recallk.score import registry
from recallk.score.metrics import METRICS, Scorer, retrieval_metrics, retrieval_summary
from recallk.score.passes import Pass, Ranks
from recallk.score.registry import Metric, Span


def test_the_names_and_the_first_rank_set_come_from_the_table():
    assert registry.names() == registry.METRICS == METRICS == (
        "recall", "precision", "r_precision", "map@r", "map", "mrr")  # report order, as params.yaml lists them
    assert registry.FIRST_ONLY == {"recall", "mrr"}
    assert [m.name for m in registry.TABLE if m.per_k] == ["recall", "precision"]
    assert registry.metric_keys(["mrr", "precision", "recall"], [5, 1]) == [
        "mrr", "precision@5", "precision@1", "recall@5", "recall@1"]


@pytest.mark.parametrize("metrics, capped, expected", [
    (["recall"], True, Pass.first(10)),                    # the API: recall alone stops counting at max(ks)
    (["recall"], False, Pass.first()),                     # the stage: exact first ranks (the recall curve)
    (["recall", "mrr"], True, Pass.first()),               # MRR reads the exact first rank
    (["recall", "precision"], True, Pass.top(10, cap=10)),  # precision@K: the top-L pass
    (["r_precision", "map@r", "mrr"], True, Pass.top(10)),
    (list(METRICS), True, Pass.every()),                   # full map: every rank
])
def test_the_serving_pass_is_the_cheapest_that_the_metrics_allow(metrics, capped, expected):
    assert registry.serving_pass(metrics, 10, capped=capped) == expected


def test_each_metric_reads_its_span():
    # one query, M = 5 retrievable items, positives at ranks 2, 4, 5 (0-based 1, 3, 4); R = 3
    span = Span(np.array([1]), np.array([3]), np.array([5]), np.array([3]), np.array([1, 3, 4]))
    got = {m.name: (m.compute(span, 2) if m.per_k else m.compute(span))[0] for m in registry.TABLE}
    assert got == {"recall": True, "precision": 0.5, "r_precision": 1 / 3, "map@r": (1 / 2) / 3,
                   "map": pytest.approx((1 / 2 + 2 / 4 + 3 / 5) / 3, rel=1e-15), "mrr": 0.5}


@pytest.mark.parametrize("given, message", [
    (["recall", "precison"], "`metrics` must be distinct names from recall, precision, r_precision, map@r, map, "
                             "mrr. Got ['recall', 'precison'] instead. Did you mean `precision`?"),
    ([], "`metrics` must be distinct names from"),
    (["mrr", "mrr"], "`metrics` must be distinct names from"),
    (3, "`metrics` must be distinct names from"),
])
def test_unknown_metric_names_are_refused(given, message):
    with pytest.raises(InputError, match=re.escape(message)):
        registry.check_metrics(given)


def hits(span: Span, k: int) -> np.ndarray:
    """A toy metric: how many positives rank within the top K (a count, not a share)."""
    return span.per_query((span.rank <= k).astype(np.float64))


def first_rank(span: Span) -> np.ndarray:
    """A toy metric: the 1-based rank of the first positive."""
    return span.first + 1.0


def test_a_new_metric_is_one_function_and_one_row(monkeypatch):
    # README's example: one query [1, 0]; g0 (a) .99, g1 (b) .8, g2 (a) .6, g3 (b) 0 -> positives at 1 and 3
    q, g, ql, gl = [[1.0, 0.0]], [[0.9, 0.1], [0.8, 0.6], [0.6, 0.8], [0.0, 1.0]], ["a"], ["a", "b", "a", "b"]
    with pytest.raises(InputError, match="Got \\['hits'\\] instead"):
        retrieval_metrics(q, g, ql, gl, metrics=["hits"])  # not registered yet
    monkeypatch.setattr(registry, "TABLE", registry.TABLE + (Metric("hits", hits, Ranks.TOP, per_k=True),
                                                             Metric("first_rank", first_rank, Ranks.FIRST)))
    got = retrieval_metrics(q, g, ql, gl, ks=[1, 2, 3], metrics=["recall", "hits", "first_rank"])
    assert got == {"recall@1": 1.0, "recall@2": 1.0, "recall@3": 1.0, "hits@1": 1.0, "hits@2": 1.0, "hits@3": 2.0,
                   "first_rank": 1.0}
    # the row's ranks choose the pass: hits needs the top L, first_rank (not per K) the exact first rank
    assert Scorer(ks=[3], metrics=["hits"]).ranks == Pass.top(3, cap=3)
    assert Scorer(ks=[3], metrics=["recall", "first_rank"]).ranks == Pass.first()
    summary = retrieval_summary(q, g, ql, gl, ks=[2], metrics=["hits"])
    assert summary["hits@2"] == 1.0 and summary["num_queries"] == 1
    assert "hits" in registry.names() and "hits" not in registry.METRICS  # the constant: the table at import


def test_a_query_without_positives_is_left_out_of_every_registered_metric(monkeypatch):
    monkeypatch.setattr(registry, "TABLE", registry.TABLE + (Metric("first_rank", first_rank, Ranks.FIRST),))
    got = retrieval_metrics([[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.1], [0.0, 1.0]], ["a", "z"], ["a", "b"],
                            ks=[1], metrics=["first_rank"])
    assert got == {"first_rank": 1.0}  # "z" has no positive: not a rank of 0, but out of the mean
