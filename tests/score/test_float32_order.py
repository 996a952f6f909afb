"""The same metrics and rankings, byte for byte, whatever order the BLAS sums a float32 product in.

Another machine's BLAS (another OpenBLAS kernel: Haswell's or SkylakeX's, FMA or not, other blockings;
MKL; a GPU) sums the float32 candidate products in another order, and their last bits differ; an engine
that ranked by them would rank differently. This one ranks by exact similarities, the float32 scores
only choosing candidates within a certified margin (Higham's gamma_d bound, which holds for any order).
Here every float32 ``np.matmul`` of the engine (the fast path's and the top-L pass's tiles, the stacked
positives) is summed in two halves of the dimensions instead, a real other order within the bound, and
the outputs must not change: 8-bit quantised leave-one-out embeddings (exact ties across classes),
duplicated gallery rows, near-ties (closer than float32's error) and collapsed embeddings, K beyond the
gallery, at the default budget and a tight one.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from recallk.score.metrics import METRICS, rank, retrieval_summary
from recallk.score.passes import Pass
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import ScoreSettings

_MATMUL = np.matmul


def split_sum_matmul(a, b, *args, out=None, **kwargs):
    """``np.matmul`` whose float32 products are summed over the first and the second half of the shared
    dimension apart, then added: each cell's rounding differs from one pass's; float64 products unchanged."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != np.float32 or b.dtype != np.float32 or a.shape[-1] < 2 or args or kwargs:
        return _MATMUL(a, b, *args, out=out, **kwargs)
    h = a.shape[-1] // 2
    result = _MATMUL(a[..., :h], b[..., :h, :]) + _MATMUL(a[..., h:], b[..., h:, :])
    if out is None:
        return result
    out[...] = result
    return out


def _clustered(rng: np.random.Generator, n: int, classes: int, d: int, noise: float):
    labels = rng.integers(0, classes, n)
    centres = rng.standard_normal((classes, d)).astype(np.float32)
    return centres[labels] + noise * rng.standard_normal((n, d)).astype(np.float32), labels


def _cases() -> dict[str, dict]:
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


CASES = _cases()


def _digest(case: dict, metrics, ranks: Pass, max_memory_mb: float) -> str:
    """sha256 of the metrics (repr of each value) and of the ranking's arrays."""
    ks = (1, 5, 10, case["gallery_emb"].shape[0] + 10)
    summary = retrieval_summary(**case, ks=ks, metrics=metrics, max_memory_mb=max_memory_mb)
    ranking = rank(RetrievalData(**case), ScoreSettings(metrics=metrics or METRICS, ks=ks,
                                                        max_memory_mb=max_memory_mb), ranks)
    h = hashlib.sha256(json.dumps({k: repr(v) for k, v in summary.items()}, sort_keys=True).encode())
    for field in ("n_positives", "n_retrievable", "offsets", "ranks", "first_rank_opposite", "first_rank"):
        h.update(np.ascontiguousarray(getattr(ranking, field)).tobytes())
    return h.hexdigest()


def test_the_split_sum_changes_float32_products():
    """The perturbation is real: other bits in the float32 products, float64 ones untouched."""
    x = CASES["leave_one_out_8bit"]["query_emb"]
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    a, b = x[:200], x[200:700].T
    assert not np.array_equal(split_sum_matmul(a, b), np.matmul(a, b))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert np.array_equal(split_sum_matmul(a64, b64), np.matmul(a64, b64))


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("metrics, ranks", [
    (("recall",), Pass.first(10)),                              # the fast path, capped
    (("recall", "mrr"), Pass.first()),                          # the fast path, every first rank exact
    (("recall", "precision", "r_precision", "map@r"), Pass.top(10)),  # the top-L pass
])
@pytest.mark.parametrize("max_memory_mb", [512, 1])  # 1 MB: many small tiles
def test_rankings_do_not_depend_on_the_float32_summation_order(monkeypatch, name, metrics, ranks, max_memory_mb):
    case = CASES[name]
    want = _digest(case, metrics, ranks, max_memory_mb)
    monkeypatch.setattr(np, "matmul", split_sum_matmul)
    assert _digest(case, metrics, ranks, max_memory_mb) == want
