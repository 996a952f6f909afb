"""The re-ID protocol's engine rules (recallk.score.exclusion) against torchreid's evaluation, and the
leave-one-out conventions against pytorch-metric-learning's AccuracyCalculator.

The references are ported in tests/reference_evals.py (torchreid's eval_market1501, with the source cited;
AccuracyCalculator's leave-one-out conventions).
"""

from __future__ import annotations

import numpy as np
import pytest

from extras import extra
from ranking_cases import case_summary
from recallk.score.exclusion import joint_values, junk_flags, junk_pair
from recallk.score.metrics import retrieval_summary
from reference_evals import eval_market1501, pml_leave_one_out, similarity

KS = list(range(1, 11))


def reid_problem(rng: np.random.Generator):
    """A small re-ID problem: persons seen by 3 cameras, distractors (pid 0), junk (pid -1), exact ties
    (low-dimensional integer vectors, some gallery rows repeated), queries with no match under another camera."""
    n_persons = int(rng.integers(2, 7))
    m, n, d = int(rng.integers(8, 40)), int(rng.integers(1, 12)), int(rng.integers(2, 5))
    g_pid = rng.integers(-1, n_persons + 1, size=m)  # -1 junk, 0 distractor, 1.. persons
    g_cam = rng.integers(1, 4, size=m)
    q_pid = rng.integers(1, n_persons + 2, size=n)   # n_persons + 1: a person never in the gallery
    q_cam = rng.integers(1, 4, size=n)
    g = rng.integers(-2, 3, size=(m, d)).astype(np.float32)
    g[rng.random(m) < 0.2] = g[0]                     # repeated rows: exact ties across persons and junk
    q = rng.integers(-2, 3, size=(n, d)).astype(np.float32)
    g[~g.any(axis=1), 0] = 1.0
    q[~q.any(axis=1), 0] = 1.0
    return q, g, q_pid, g_pid, q_cam, g_cam


def engine_reid(q, g, q_pid, g_pid, q_cam, g_cam, backend="numpy", metrics=("recall", "map")):
    """The engine with the re-ID rules: joint (person, camera) exclusion and the -1 files junk for all
    (``backend="faiss"``: the FAISS oracle's ranking, tests/faiss_oracle.py)."""
    exclude = [(np.c_[q_pid, q_cam], np.c_[g_pid, g_cam]), junk_pair(len(q_pid), g_pid == -1)]
    case = dict(query_emb=q, gallery_emb=g, query_labels=q_pid, gallery_labels=g_pid, query_ids=None,
                gallery_ids=None, exclude=exclude)
    return case_summary(case, KS, list(metrics), backend=backend)


def test_reid_rules_agree_with_torchreid_eval_market1501_on_random_problems():
    rng = np.random.default_rng(27)
    checked = no_match = 0
    for _ in range(240):
        q, g, q_pid, g_pid, q_cam, g_cam = reid_problem(rng)
        kept = g_pid != -1                             # torchreid's loader drops the junk files
        if not kept.any():
            continue
        dist = -similarity(q, g[kept]).astype(np.float64)
        has_match = [((g_pid[kept] == p) & (g_cam[kept] != c)).any() for p, c in zip(q_pid, q_cam)]
        if not any(has_match):                          # torchreid asserts; the engine reports NaN
            continue
        cmc, m_ap, valid = eval_market1501(dist, q_pid, g_pid[kept], q_cam, g_cam[kept], max(KS))
        got = engine_reid(q, g, q_pid, g_pid, q_cam, g_cam)
        assert got["num_queries"] == valid and got["num_excluded_queries"] == len(q_pid) - valid
        for k in KS:
            assert abs(got[f"recall@{k}"] - cmc[k - 1]) <= 1e-12, k
        assert abs(got["map"] - m_ap) <= 1e-12
        checked += 1
        no_match += valid < len(q_pid)
    assert checked >= 200 and no_match >= 50  # enough problems, many with queries the protocol skips


def test_faiss_oracle_honours_the_reid_rules():
    extra("faiss", "faiss")
    rng = np.random.default_rng(5)
    for _ in range(20):
        problem = reid_problem(rng)
        _, _, q_pid, g_pid, q_cam, g_cam = problem
        if not any(((g_pid == p) & (g_cam != c)).any() for p, c in zip(q_pid, q_cam)):
            continue
        want = engine_reid(*problem)
        got = engine_reid(*problem, backend="faiss")
        assert got == pytest.approx(want, nan_ok=True, abs=0)


def test_torch_backend_honours_the_reid_rules():
    # The torch backend masks through the same Problem.excluded as the numpy engine; map@r and r_precision run on
    # its own candidate pass (full `map` would be handed to the numpy engine and prove nothing here).
    extra("torch", "torch")
    rng = np.random.default_rng(6)
    metrics = ("recall", "map@r", "r_precision", "mrr")
    for _ in range(20):
        problem = reid_problem(rng)
        _, _, q_pid, g_pid, q_cam, g_cam = problem
        if not any(((g_pid == p) & (g_cam != c)).any() for p, c in zip(q_pid, q_cam)):
            continue
        want = engine_reid(*problem, metrics=metrics)
        got = engine_reid(*problem, backend="torch", metrics=metrics)
        assert got == pytest.approx(want, nan_ok=True, abs=0)


def test_junk_items_change_no_metric_and_distractors_are_negatives():
    rng = np.random.default_rng(3)
    q, g = rng.normal(size=(6, 8)), rng.normal(size=(30, 8))
    q_lab, g_lab = rng.integers(1, 4, size=6), rng.integers(1, 4, size=30)
    junk = rng.random(30) < 0.3
    with_junk = retrieval_summary(q, g, q_lab, g_lab, exclude=[junk_pair(6, junk)], ks=KS, metrics=["recall", "map"])
    without = retrieval_summary(q, g[~junk], q_lab, g_lab[~junk], ks=KS, metrics=["recall", "map"])
    assert {k: v for k, v in with_junk.items() if k != "num_gallery"} == \
        {k: v for k, v in without.items() if k != "num_gallery"}
    # a distractor (a label no query has) that is the nearest item pushes every first hit one rank down
    d_lab = np.r_[g_lab, [0]]
    near = retrieval_summary(q, np.r_[g, q[:1] * 5], q_lab, d_lab, ks=[1], metrics=["mrr"])
    alone = retrieval_summary(q, g, q_lab, g_lab, ks=[1], metrics=["mrr"])
    assert near["mrr"] < alone["mrr"]


@pytest.mark.parametrize("q_rows, g_rows, want", [
    ([[1, 1]], [[1, 1], [1, 2], [2, 1]], [True, False, False]),  # both columns equal: excluded, one alone: not
    ([[1, None]], [[1, None], [1, 2]], [False, False]),          # a missing value never matches
    ([["1", 2]], [[1, "2"]], [True]),                            # compared as text, like labels
])
def test_joint_exclusion_matches_every_column(q_rows, g_rows, want):
    qk, gk = joint_values(q_rows), joint_values(g_rows)
    assert [qk[0] is not None and qk[0] == v for v in gk] == want


@pytest.mark.parametrize("values, want", [
    (["true", "False", "", "1", "0", "YES", None], [True, False, False, True, False, True, False]),  # texts
    ([True, False, np.nan], [True, False, False]),                                                # bools, NaN
    ([1.0, 0.0, np.int64(1), np.float32(0)], [True, False, True, False]),  # numbers by value (1.0 was refused)
])
def test_junk_flags(values, want):
    assert junk_flags(values, "junk").tolist() == want


@pytest.mark.parametrize("values, bad", [(["true", "maybe"], "'maybe'"), ([1, 2.0], "2.0")])
def test_junk_flags_refuse_other_values(values, bad):
    with pytest.raises(Exception, match=rf"junk column `junk` must hold true/false .* Got {bad} in row 2"):
        junk_flags(values, "junk")


# ------------------------------------------------------------------ leave-one-out: pytorch-metric-learning


def test_leave_one_out_conventions_agree_with_pytorch_metric_learning():
    rng = np.random.default_rng(11)
    for _ in range(60):
        n, d = int(rng.integers(4, 40)), int(rng.integers(2, 5))
        x = rng.integers(-2, 3, size=(n, d)).astype(np.float32)
        x[~x.any(axis=1), 0] = 1.0
        labels = rng.integers(0, max(2, n // 3), size=n)
        if np.unique(labels, return_counts=True)[1].max() < 2:
            continue
        ids = np.arange(n)
        want = pml_leave_one_out(similarity(x, x), labels)
        got = retrieval_summary(x, x, labels, labels, query_ids=ids, gallery_ids=ids, ks=[1, 4],
                                metrics=["recall", "precision", "r_precision", "map@r"])
        assert abs(got["precision@1"] - want["precision@1"]) <= 1e-12
        for key in ("r_precision", "map@r", "recall@4"):
            assert abs(got[key] - want[key]) <= 1e-12, key


def test_leave_one_out_agrees_with_pytorch_metric_learnings_own_accuracy_calculator():
    # The library itself (not the port above): AccuracyCalculator(k="max_bin_count") with no reference set is
    # leave-one-out over the query set. Continuous data (no exact ties: its faiss k-NN orders ties its own way)
    # and float32 neighbours, hence 1e-6.
    extra("pytorch_metric_learning", "peers")
    import torch
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    calculator = AccuracyCalculator(include=("precision_at_1", "r_precision", "mean_average_precision_at_r"),
                                    k="max_bin_count", device=torch.device("cpu"))
    rng = np.random.default_rng(12)
    for _ in range(20):
        n, d = int(rng.integers(20, 120)), int(rng.integers(4, 16))
        labels = rng.integers(0, max(2, n // 6), size=n)
        x = rng.normal(size=(n, d)).astype(np.float32) + labels[:, None] % 3
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        want = calculator.get_accuracy(torch.from_numpy(x), torch.from_numpy(labels))
        ids = np.arange(n)
        got = retrieval_summary(x, x, labels, labels, query_ids=ids, gallery_ids=ids, ks=[1],
                                metrics=["precision", "r_precision", "map@r"])
        for theirs, ours in (("precision_at_1", "precision@1"), ("r_precision", "r_precision"),
                             ("mean_average_precision_at_r", "map@r")):
            assert abs(got[ours] - want[theirs]) <= 1e-6, (theirs, got[ours], want[theirs])


@pytest.mark.ray
def test_ray_engine_honours_the_reid_rules(ray_cluster):
    from recallk.score.metrics import rank
    from recallk.score.retrieval_data import RetrievalData
    from recallk.score.settings import RaySettings, ScoreSettings

    rng = np.random.default_rng(8)
    q, g, q_pid, g_pid, q_cam, g_cam = reid_problem(rng)
    exclude = [(np.c_[q_pid, q_cam], np.c_[g_pid, g_cam]), junk_pair(len(q_pid), g_pid == -1)]
    data = RetrievalData(q, g, q_pid, g_pid, exclude=exclude)
    local = rank(data, ScoreSettings(max_memory_mb=1))
    remote = rank(data, ScoreSettings(max_memory_mb=1, engine="ray", ray=RaySettings(num_cpus=1)))
    for name in ("n_positives", "n_retrievable", "offsets", "ranks", "first_rank_opposite"):
        assert np.asarray(getattr(remote, name)).tobytes() == np.asarray(getattr(local, name)).tobytes(), name
    assert (local.n_retrievable < len(g_pid)).all()  # the rules really removed items


@pytest.mark.parametrize("exclude, same_set, message", [
    # a junk pair under leave-one-out: each query is its own gallery row, so the values must be the same
    ("junk", True, r"`same_set=True` needs the same exclusion values on both sides"),
    # a joint pair with different column counts
    ("ragged", None, r"each `exclude` entry must be .* the same columns on both sides"),
])
def test_exclusion_pairs_refused(exclude, same_set, message):
    from recallk.errors import InputError
    from recallk.score.retrieval_data import RetrievalData

    x = np.eye(4, dtype=np.float32)
    ids = np.arange(4)
    pair = junk_pair(4, [True, False, False, False]) if exclude == "junk" else (np.ones((4, 2)), np.ones((4, 3)))
    with pytest.raises(InputError, match=message):
        RetrievalData(x, x, [0, 0, 1, 1], [0, 0, 1, 1], query_ids=ids, gallery_ids=ids, exclude=[pair],
                      same_set=same_set)
