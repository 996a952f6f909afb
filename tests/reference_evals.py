"""Reference evaluations the tests port, to check the engine against (importable beside helpers).

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

``pml_leave_one_out``: pytorch-metric-learning's AccuracyCalculator conventions (its docstring).
"""

from __future__ import annotations

import numpy as np

from recallk.score.similarity import l2_normalize


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
