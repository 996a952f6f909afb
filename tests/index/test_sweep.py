"""The controls of the index stage's computation (Flat, IVF at nprobe = nlist, HNSW at a huge efSearch: the
exact run) and its bad-input errors, on a small clustered gallery."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from extras import extra
from recallk.errors import InputError
from recallk.index.inputs import exact_run, problem_of
from recallk.index.settings import IndexSettings, SweepSettings
from recallk.index.sweep import cheapest, score_index
from recallk.score.exclusion import junk_pair
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import BootstrapSettings, ScoreSettings
from recallk.stats import inference as stats
from recallk.tables_contract import check_per_query

extra("faiss", "faiss")
extra("hnswlib", "hnswlib")

METRIC_KEYS = ("recall@1", "recall@5", "precision@5", "r_precision", "map@r", "map", "mrr")
SCORE = ScoreSettings(ks=(1, 5), bootstrap=BootstrapSettings(resamples=200))


@pytest.fixture(scope="module")
def case():
    """600 gallery items and 80 queries around 8 label centres in 16-d, a camera column excluded, each query's
    own image in the gallery (the self-match rule), and the exact run."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(8, 16))
    labels = rng.integers(0, 8, 600)
    emb = (centres[labels] + rng.normal(scale=1.2, size=(600, 16))).astype(np.float32)
    ids = np.array([f"img{i}" for i in range(600)])
    cameras = rng.integers(0, 5, 600).astype(str)
    q = np.arange(80)
    data = RetrievalData(emb[q], emb, labels[q], labels, query_ids=ids[q], gallery_ids=ids,
                         exclude=[(cameras[q], cameras)])
    return problem_of(data, emb[::2]), exact_run(data, SCORE)


def run(case, kinds, depth=600, **sweep):
    problem, exact = case
    return score_index(problem, exact, IndexSettings(kinds=kinds, sweep=SweepSettings(**sweep), depth=depth), SCORE)


def test_flat_and_ivf_at_every_list_are_exact(case) -> None:
    points, tables = run(case, ("Flat", "IVF8,Flat"), nprobe=(1, 8))
    flat, ivf_one, ivf_all = points
    for point in (flat, ivf_all):
        assert point["short_lists"] == 0
        for key in METRIC_KEYS:
            assert point[f"delta_{key}"] == 0.0, (point["point"], key)
            assert point[f"delta_{key}_ci_low"] == point[f"delta_{key}_ci_high"] == 0.0
        for k in (1, 5):
            assert point[f"knn_recall@{k}_ann_benchmarks"] == point[f"knn_recall@{k}_big_ann_benchmarks"] == 1.0
        assert point["non_inferior"] and point["lost_recall@1"] == point["gained_recall@1"] == 0
    assert ivf_one["knn_recall@5_big_ann_benchmarks"] < 1.0  # one list of 8: a real approximation
    assert ivf_all["trained_on"] == "train split (300 rows)" and flat["trained_on"] == "none (no training)"
    assert cheapest(points) in {p["point"] for p in points if p["non_inferior"]}
    check_per_query(tables[0], "Flat's table")  # recallk compare reads it
    exact_table = case[1].table
    assert tables[0]["hit@1"].tolist() == exact_table["hit@1"].tolist()


def test_flat_is_exact_under_the_reid_rules() -> None:
    # The joint (label, camera) exclusion and junk-for-all (score.exclude_same_all, score.junk) reach the index's
    # lists through the same folded pairs as the exact run: Flat stays Δ = 0, and no list comes up short.
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(6, 16))
    labels = rng.integers(0, 6, 400)
    emb = (centres[labels] + rng.normal(scale=1.2, size=(400, 16))).astype(np.float32)
    cameras = rng.integers(0, 3, 400)
    q = np.arange(60, 120)
    joint = (np.c_[labels[q], cameras[q]], np.c_[labels, cameras])
    data = RetrievalData(emb[q], emb, labels[q], labels, exclude=[joint, junk_pair(len(q), rng.random(400) < 0.2)])
    problem, exact = problem_of(data), exact_run(data, SCORE)
    (flat,), _ = score_index(problem, exact, IndexSettings(kinds=("Flat",), depth=400), SCORE)
    assert flat["short_lists"] == 0
    for key in METRIC_KEYS:
        assert flat[f"delta_{key}"] == 0.0, key


@pytest.mark.parametrize("kind, param", [
    ("HNSW8", "efSearch"),  # FAISS's graph
    ("hnswlib,M8", "ef"),   # hnswlib's
])
def test_hnsw_at_a_huge_ef_converges_to_exact(case, kind, param) -> None:
    (small, huge), _ = run(case, (kind,), depth=None, **{param: (1, 5000)})
    assert huge["knn_recall@5_big_ann_benchmarks"] == 1.0 and huge["effective_value"] == 5000
    for key in ("recall@1", "recall@5", "precision@5", "r_precision", "map@r"):
        assert huge[f"delta_{key}"] == 0.0, key
    assert huge["order"].startswith("exact cosine")  # its float32 scores' rounding never reorders near-ties
    assert small["effective_value"] == small["searched_k"]  # ef below the k asked runs at k
    # depth null (max R, not the whole gallery): map, which reads every positive, is not reported; mrr is, as
    # every query lists a positive, and it is exact
    assert huge["unreported_metrics"] == ["map"] and "map" not in huge and "delta_map" not in huge
    assert huge["delta_mrr"] == 0.0


@pytest.mark.parametrize("kinds, sweep, message", [
    (("IVF8,Flt",), {}, r"'IVF8,Flt' is not a FAISS factory string the stage builds: its part 'Flt'"),  # a typo
    (("hnswlib,M",), {}, r"not an hnswlib kind; write `hnswlib`"),                                # hnswlib's syntax
    (("IVF8,Flat",), {"nprobe": (4, 16)}, r"IVF8,Flat has 8 lists .*Got 16 instead"),             # beyond nlist
    (("IVF8,Flat", "Flat"), {"efSearch": (16,)}, r"`index.sweep.efSearch` is set but no kind"),   # nothing has it
    (("IVF1024,Flat",), {}, r"IVF1024,Flat cannot train on 300 rows .*Number of training points"),  # too few rows
])
def test_bad_input_is_one_clear_error(case, kinds, sweep, message) -> None:
    with pytest.raises(InputError, match=message):
        run(case, kinds, **sweep)


def test_compressed_codes_keep_their_own_order(case) -> None:
    """PQ scores are approximations: the lists follow them (an uncompressed index's lists follow the exact cosine,
    which its scores equal up to float32 rounding)."""
    (pq, flat), _ = run(case, ("IVF8,PQ4x4", "Flat"), depth=None, nprobe=(8,))
    assert pq["order"] == "the index's own scores" and flat["order"].startswith("exact cosine")
    assert pq["knn_recall@5_big_ann_benchmarks"] < 1.0


def test_intervals_and_mcnemar_are_compares_own(case) -> None:
    """Each point's interval is `recallk compare`'s paired bootstrap (stats.paired_bootstrap_ci) of the per-query
    differences, metric by metric, and its McNemar is stats.mcnemar_exact: drawn once for every metric, the same."""
    points, tables = run(case, ("IVF8,Flat",), nprobe=(1,))
    exact_table, mine = case[1].table, tables[0]
    for column, key in (("hit@1", "recall@1"), ("precision@5", "precision@5"), ("ap@r", "map@r"), ("rr", "mrr")):
        delta = (mine[column] - exact_table[column]).dropna().to_numpy()  # full values on both sides
        low, high = stats.paired_bootstrap_ci(delta, 200, 0, 0.95)
        # the same resamples; one column's product may round its last bit apart from the stacked product's
        assert (points[0][f"delta_{key}_ci_low"], points[0][f"delta_{key}_ci_high"]) == pytest.approx(
            (low, high), abs=1e-12), key
    p, lost, gained = stats.mcnemar_exact(exact_table["hit@1"] > 0, mine["hit@1"] > 0)
    point = points[0]
    assert (point["mcnemar_p_recall@1"], point["lost_recall@1"], point["gained_recall@1"]) == (p, lost, gained)
    assert lost + gained > 0  # the case does have discordant queries


def test_efsearch_below_the_asked_k_warns_once_and_repeats_the_search(case, caplog) -> None:
    # FAISS HNSW searches with max(efSearch, k): 4 and 8 run at the k asked (one warning naming the param and
    # the value they ran at) and give the same lists; 400 runs as asked.
    with caplog.at_level(logging.WARNING, logger="recallk.index.sweep"):
        low, mid, high = run(case, ("HNSW8",), depth=20, efSearch=(4, 8, 400))[0]
    asked = low["searched_k"]
    assert 20 < asked < 400 and low["effective_value"] == mid["effective_value"] == asked
    assert high["effective_value"] == 400
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "recallk.index.sweep"]
    assert warning.startswith("`index.sweep.efSearch`: HNSW8") and f"efSearch 4, 8 ran at {asked}" in warning
    timing = {"point", "value", "build_seconds", "queries_per_second", "queries_per_second_one_thread"}
    assert {k: v for k, v in low.items() if k not in timing} == {k: v for k, v in mid.items() if k not in timing}
