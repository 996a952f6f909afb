"""A tie-heavy gallery (every vector eight times, under mixed labels): exact ties straddle every cut, and the
index stage still gives `Flat` Δ = 0 on every metric it reports and k-NN recall 1 under both definitions
(issue 39)."""

from __future__ import annotations

import numpy as np
import pytest

from extras import extra
from recallk.index import kinds as kinds_mod
from recallk.index.inputs import exact_run, problem_of
from recallk.index.settings import IndexSettings
from recallk.index.sweep import score_index
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import BootstrapSettings, ScoreSettings
from recallk.score.tables import tie_end
from recallk.tables_contract import per_query_column

extra("faiss", "faiss")

SCORE = ScoreSettings(ks=(1, 5, 10), bootstrap=BootstrapSettings(resamples=100))


@pytest.fixture(scope="module")
def tied():
    """30 distinct 16-d vectors, each 8 times in a 240-item gallery under random labels of 4, and 40 queries: every
    query's ranking is groups of 8 exact ties."""
    rng = np.random.default_rng(7)
    distinct = rng.normal(size=(30, 16)).astype(np.float32)
    gallery = np.repeat(distinct, 8, axis=0)
    labels = rng.integers(0, 4, len(gallery))
    queries = rng.normal(size=(40, 16)).astype(np.float32)
    data = RetrievalData(queries, gallery, rng.integers(0, 4, len(queries)), labels)
    return problem_of(data), exact_run(data, SCORE)


def test_the_exact_table_runs_past_the_cut_while_tied(tied) -> None:
    """Like big-ann-benchmarks' ground truth, deeper than K: the rows tied with the max(ks)-th and one more."""
    _, exact = tied
    rows, scores = exact.neighbor_rows, exact.neighbor_scores
    ends = tie_end(1.0 - scores.astype(np.float64), 10)
    assert (ends > 10).any()  # the case does straddle the cut
    assert (np.count_nonzero(rows >= 0, axis=1) == ends + 1).all()  # to the tie's end, and one row past it
    assert np.all(scores[np.arange(len(ends)), ends] < scores[:, 9])  # that row is below the tie


@pytest.mark.parametrize("depth", [
    None,  # max R (r_precision, map@r): a cut inside a tie group of the 60-odd positives' depth
    10,    # max(ks): the cut of recall@10 and precision@10 inside a group
    7,     # below max(ks): the @10 metrics need deeper lists, so Flat does not report them when any is open
])
def test_flat_is_exact_on_every_metric_it_reports(tied, depth) -> None:
    problem, exact = tied
    (flat,), (table,) = score_index(problem, exact, IndexSettings(kinds=("Flat",), depth=depth), SCORE)
    reported = [k for k in ("recall@1", "recall@5", "recall@10", "precision@1", "precision@5", "precision@10",
                            "r_precision", "map@r", "map", "mrr") if k not in flat["unreported_metrics"]]
    assert reported and flat["tie_extended_queries"] > 0  # asked again past a tie at the cut
    for key in reported:
        assert flat[f"delta_{key}"] == flat[f"delta_{key}_ci_low"] == flat[f"delta_{key}_ci_high"] == 0.0, key
    for key in flat["unreported_metrics"]:
        assert key not in flat and f"delta_{key}" not in flat
        assert per_query_column(key) not in table.columns  # nor in its per-query table
    for k in (1, 5, 10):
        if k <= flat["depth"]:
            assert flat[f"knn_recall@{k}_ann_benchmarks"] == flat[f"knn_recall@{k}_big_ann_benchmarks"] == 1.0, k
    assert flat["non_inferior"]
    if depth == 7:
        assert {"recall@10", "precision@10"} <= set(flat["unreported_metrics"])


def test_faiss_alone_keeps_other_members_of_a_tie_at_the_cut(tied) -> None:
    """Why the stage searches past the cut: FAISS's own top 10 holds another subset of the tie group at rank 10
    than the exact engine's order (exact cosine, ties by gallery row) for some query."""
    problem, exact = tied
    built = kinds_mod.build(kinds_mod.parse_kind("Flat", 16), problem.gallery, problem.gallery, 1, 0)
    ids = kinds_mod.search(built, problem.queries, 10, {}, 1)[0]
    differs = [set(ids[i]) != set(exact.neighbor_rows[i, :10]) for i in range(len(ids))]
    assert any(differs)
