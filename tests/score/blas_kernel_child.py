"""Child process of tests/score/test_blas_kernels.py: run under one OpenBLAS kernel (``OPENBLAS_CORETYPE``),
print a JSON line with the kernel OpenBLAS reports, a digest of plain float32 products (which differ between
kernels: FMA or not, other blockings) and, per case, a digest of every metric and of the rankings the engine
gives (which must not differ: the float32 scores only choose candidates, decided within a certified margin).

Cases: clustered leave-one-out embeddings quantised to 8 bits (exact ties across classes), a query x gallery
set of clustered rows with duplicated gallery rows, and near-ties (one direction plus 1e-6 noise, closer than
float32's error), each with K at and beyond the gallery size, at the default and a tight memory bound.
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
from threadpoolctl import threadpool_info

from recallk.score.data import RetrievalData
from recallk.score.metrics import METRICS, rank, retrieval_summary
from recallk.score.passes import Pass
from recallk.settings.score import ScoreSettings


def _clustered(rng: np.random.Generator, n: int, classes: int, d: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    labels = rng.integers(0, classes, n)
    centres = rng.standard_normal((classes, d)).astype(np.float32)
    return centres[labels] + noise * rng.standard_normal((n, d)).astype(np.float32), labels


def cases() -> dict[str, dict]:
    rng = np.random.default_rng(2026)
    x, lab = _clustered(rng, 1500, 60, 256, 1.2)
    x = np.round(x / np.abs(x).max() * 127).astype(np.float32)  # 8-bit levels: many exactly equal cosines
    ids = list(range(x.shape[0]))
    q, ql = _clustered(rng, 400, 40, 384, 1.0)
    g, gl = _clustered(rng, 2500, 40, 384, 1.0)
    g[1::5] = g[0:-1:5]  # duplicated gallery rows: exact ties
    base = rng.standard_normal(256)
    near_q = (base + 1e-6 * rng.standard_normal((300, 256))).astype(np.float32)
    near_g = (base + 1e-6 * rng.standard_normal((1200, 256))).astype(np.float32)
    return {
        "leave_one_out_8bit": dict(query_emb=x, gallery_emb=x, query_labels=lab, gallery_labels=lab,
                                   query_ids=ids, gallery_ids=ids),
        "query_gallery_duplicates": dict(query_emb=q, gallery_emb=g, query_labels=ql, gallery_labels=gl),
        "near_ties": dict(query_emb=near_q, gallery_emb=near_g, query_labels=rng.integers(0, 4, 300),
                          gallery_labels=rng.integers(0, 4, 1200)),
    }


def digest(case: dict, max_memory_mb: float, backend: str = "numpy") -> str:
    """sha256 of every metric (repr of each value) and of the full ranking's arrays (``backend="faiss"``:
    the metrics alone, from FAISS's candidates, which its own OpenBLAS computes under the same kernel)."""
    ks = (1, 5, 10, case["gallery_emb"].shape[0] + 10)
    summary = retrieval_summary(**case, ks=ks, metrics=None, max_memory_mb=max_memory_mb, backend=backend)
    if backend != "numpy":
        return hashlib.sha256(json.dumps({k: repr(v) for k, v in summary.items()}, sort_keys=True).encode()).hexdigest()
    ranking = rank(RetrievalData(**case), ScoreSettings(metrics=METRICS, ks=ks, max_memory_mb=max_memory_mb),
                   Pass.every())
    h = hashlib.sha256(json.dumps({k: repr(v) for k, v in summary.items()}, sort_keys=True).encode())
    for field in ("n_positives", "n_retrievable", "offsets", "ranks", "first_rank_opposite", "first_rank"):
        h.update(np.ascontiguousarray(getattr(ranking, field)).tobytes())
    return h.hexdigest()


def main() -> None:
    if "--faiss" in sys.argv:
        import faiss  # noqa: F401  (its OpenBLAS loaded, so threadpool_info lists it)
    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    all_cases = cases()
    x = all_cases["leave_one_out_8bit"]["query_emb"]
    q = all_cases["query_gallery_duplicates"]["query_emb"]
    products = hashlib.sha256((x[:300] @ x[300:900].T).tobytes() + (q @ q.T).tobytes()).hexdigest()
    out = {name: digest(case, 512) for name, case in all_cases.items()}
    out |= {f"{name}@tight": digest(case, 1) for name, case in all_cases.items()}  # 1 MB: many small tiles
    if "--faiss" in sys.argv:
        out |= {f"{name}@faiss": digest(case, 512, "faiss") for name, case in all_cases.items()}
    print(json.dumps({"blas": [(i["internal_api"], i.get("architecture"), i["filepath"]) for i in blas],
                      "products": products, "digests": out}))


if __name__ == "__main__":
    sys.exit(main())
