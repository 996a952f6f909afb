"""A full N x M similarity-matrix implementation of recall@K: the straightforward baseline of
``bench/score_bench.py`` (one float32 matrix of every query-gallery pair, then a top-K selection)."""

from __future__ import annotations

import numpy as np


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (zero rows stay zero), float32."""
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(n > 0, n, 1)).astype(np.float32, copy=False)


def full_matrix_recall(query_emb, gallery_emb, q_labels, g_labels, ks=(1, 5, 10), query_ids=None,
                       gallery_ids=None):
    """recall@K from the full N x M similarity matrix: ``q @ g.T``, the self-match set to -inf,
    argpartition for the top max(K), argsort of those (what a straightforward implementation does;
    its memory grows with N x M)."""
    if len(query_emb) == 0 or len(gallery_emb) == 0:
        return {f"recall@{k}": 0.0 for k in ks}
    g_label_set = set(g_labels.tolist())
    keep = np.array([lbl in g_label_set for lbl in q_labels])
    if not keep.any():
        return {f"recall@{k}": 0.0 for k in ks}
    q_emb_f = query_emb[keep]
    q_lab_f = q_labels[keep]
    q_id_f = query_ids[keep] if query_ids is not None else None
    q = unit(q_emb_f)
    g = unit(gallery_emb)
    sims = q @ g.T
    if q_id_f is not None and gallery_ids is not None:
        self_mask = q_id_f[:, None] == gallery_ids[None, :]
        sims = np.where(self_mask, -np.inf, sims)
    top_k_max = min(max(ks), g.shape[0])
    if top_k_max <= 0:
        return {f"recall@{k}": 0.0 for k in ks}
    top = np.argpartition(-sims, top_k_max - 1, axis=1)[:, :top_k_max]
    sorted_top = np.take_along_axis(top, np.argsort(-sims[np.arange(len(q))[:, None], top], axis=1), axis=1)
    out = {}
    for k in ks:
        k_eff = min(k, top_k_max)
        hits = np.any(g_labels[sorted_top[:, :k_eff]] == q_lab_f[:, None], axis=1)
        out[f"recall@{k}"] = float(hits.mean())
    out["num_queries"] = int(keep.sum())
    return out


def full_matrix_estimate_bytes(n_query: int, n_gallery: int, loo: bool) -> int:
    """sims float32 + ``-sims`` float32 + argpartition's int64 indices (+ the bool self mask), per pair."""
    return n_query * n_gallery * (4 + 4 + 8 + (1 if loo else 0))
