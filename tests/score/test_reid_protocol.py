"""The re-ID protocol's engine rules (recallk.score.exclusion) against torchreid's evaluation, and the
leave-one-out conventions against pytorch-metric-learning's AccuracyCalculator.

``eval_market1501`` below is a port of torchreid's python evaluation, ``eval_market1501`` in
torchreid/metrics/rank.py of KaiyangZhou/deep-person-reid (commit 37f92b7): rank the gallery by distance,
drop the gallery items of the query's person *and* camera, skip a query left without a match, CMC@k =
1[first match within k], AP = mean precision at each match. Torchreid's Market-1501 loader drops the
``-1`` (junk) files before evaluating, so the reference sees the gallery without them, while the engine
sees them flagged (junk for every query) and must give the same numbers. Two departures, both so the
comparison is exact: a stable argsort (the engine's documented tie rule: equal similarities rank by
gallery index, smaller first; torchreid's default sort leaves that order unspecified) and float64 CMC
(torchreid casts it to float32); a query with fewer kept items than ``max_rank`` keeps its last CMC value
(1: it has a match), where torchreid would need equal lengths.
"""

from __future__ import annotations

import numpy as np
import pytest

from extras import extra
from recallk.score.exclusion import joint_values, junk_flags, junk_pair
from recallk.score.metrics import retrieval_summary
from recallk.score.similarity import l2_normalize

KS = list(range(1, 11))


def eval_market1501(distmat, q_pids, g_pids, q_camids, g_camids, max_rank):
    """torchreid's eval_market1501 (module docstring): (CMC@1..max_rank, mAP, valid queries)."""
    indices = np.argsort(distmat, axis=1, kind="stable")
    matches = (g_pids[indices] == q_pids[:, None]).astype(np.int64)
    all_cmc, all_ap = [], []
    for q in range(distmat.shape[0]):
        order = indices[q]
        keep = ~((g_pids[order] == q_pids[q]) & (g_camids[order] == q_camids[q]))
        raw = matches[q][keep]
        if not raw.any():  # the query's person is not in the gallery under another camera
            continue
        cmc = np.minimum(raw.cumsum(), 1)
        cmc = np.concatenate([cmc, np.ones(max(0, max_rank - cmc.size), dtype=cmc.dtype)])
        all_cmc.append(cmc[:max_rank])
        precision = raw.cumsum() / np.arange(1.0, raw.size + 1)
        all_ap.append((precision * raw).sum() / raw.sum())
    return np.asarray(all_cmc, dtype=np.float64).sum(0) / len(all_cmc), float(np.mean(all_ap)), len(all_cmc)


def similarity(q: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The engine's cosine (docs/metrics.md): float32 unit vectors, products summed in float64, rounded to float32."""
    return (l2_normalize(q).astype(np.float64) @ l2_normalize(g).astype(np.float64).T).astype(np.float32)


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


def engine_reid(q, g, q_pid, g_pid, q_cam, g_cam, backend="numpy"):
    """The engine with the re-ID rules: joint (person, camera) exclusion and the -1 files junk for all."""
    exclude = [(np.c_[q_pid, q_cam], np.c_[g_pid, g_cam]), junk_pair(len(q_pid), g_pid == -1)]
    return retrieval_summary(q, g, q_pid, g_pid, exclude=exclude, ks=KS, metrics=["recall", "map"],
                             backend=backend)


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


def test_faiss_backend_honours_the_reid_rules():
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
])
def test_junk_flags(values, want):
    assert junk_flags(values, "junk").tolist() == want


def test_junk_flags_refuse_other_values():
    with pytest.raises(Exception, match=r"junk column `junk` must hold true/false .* Got 'maybe' in row 2"):
        junk_flags(["true", "maybe"], "junk")


# ------------------------------------------------------------------ leave-one-out: pytorch-metric-learning


def pml_leave_one_out(sims: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """AccuracyCalculator's conventions with query set = reference set (pytorch-metric-learning,
    src/pytorch_metric_learning/utils/accuracy_calculator.py, `embeddings_come_from_same_source`): each
    query's own row is left out of its neighbours, R = its label's count - 1, queries whose label occurs once
    ("lone" queries) are left out of every mean; precision_at_1, r_precision = matches in the first R / R,
    mean_average_precision_at_r = (1/R) sum over the first R of precision@i at each match. Neighbours in the
    engine's order (similarity, then index), so the check is exact; recall@K (1[first match within K]) is
    the metric-learning papers' Recall@K over the same neighbours."""
    n = labels.size
    values, counts = np.unique(labels, return_counts=True)
    count = dict(zip(values.tolist(), counts.tolist()))
    out: dict[str, list[float]] = {"precision@1": [], "r_precision": [], "map@r": [], "recall@4": []}
    for i in range(n):
        r = count[labels[i]] - 1
        if r == 0:
            continue
        others = np.delete(np.arange(n), i)
        order = others[np.lexsort((others, -sims[i, others]))]
        same = labels[order] == labels[i]
        out["precision@1"].append(float(same[0]))
        out["r_precision"].append(same[:r].sum() / r)
        out["map@r"].append(float((np.cumsum(same[:r]) / np.arange(1, r + 1) * same[:r]).sum() / r))
        out["recall@4"].append(float(same[:4].any()))
    return {k: float(np.mean(v)) for k, v in out.items()}


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
