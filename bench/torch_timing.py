"""What the torch backend's benches share (bench/torch_score_bench.py, bench/shard_bench.py,
bench/gpu_score_check.py): clustered synthetic data, a warm-up, and wall times that count the device's work.

On a machine other jobs share, one run of each engine measures the neighbours as much as the engines:
:func:`best_of` runs them in turn, ``repeat`` times, and keeps each one's fastest run, so a ratio of two
engines compares runs that met about the same load.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

#: The fields of a :class:`~recallk.score.ranking.engine.Ranking` that the metrics read.
FIELDS = ("n_positives", "n_retrievable", "offsets", "ranks", "first_rank", "first_rank_opposite")
#: Gallery rows drawn at once by :func:`clustered` (its peak beyond the gallery itself: one chunk).
CHUNK = 1_000_000


def clustered(n: int, m: int, d: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Queries and gallery around ``m // 10`` centres (10 positives per query) like real embeddings, float32, and
    their labels: ``(q, g, query_labels, gallery_labels)``. The gallery is drawn :data:`CHUNK` rows at a time (the
    same values as in one draw), so 10,000,000 x 64 needs its 2.56 GB and little more."""
    rng = np.random.default_rng(seed)
    classes = max(1, m // 10)
    centres = rng.standard_normal((classes, d), dtype=np.float32)
    gl, ql = np.arange(m) % classes, rng.integers(0, classes, n)
    g = np.empty((m, d), dtype=np.float32)
    for s in range(0, m, CHUNK):
        rows = slice(s, min(s + CHUNK, m))
        g[rows] = rng.standard_normal((rows.stop - s, d), dtype=np.float32)
        g[rows] *= np.float32(0.5)
        g[rows] += centres[gl[rows]]
    q = centres[ql] + 0.5 * rng.standard_normal((n, d), dtype=np.float32)
    return q, g, ql, gl


def warm_up() -> None:
    """Both engines once on a tiny problem: torch loads its kernels lazily (seconds), not the timed runs' cost."""
    from recallk.score.passes import Pass
    from recallk.score.ranking import rank_data
    from recallk.score.ranking.torch_backend import TorchOptions, rank_data_torch
    from recallk.score.retrieval_data import RetrievalData

    rng = np.random.default_rng(1)
    tiny = RetrievalData(rng.normal(size=(8, 4)), rng.normal(size=(32, 4)), np.arange(8) % 3, np.arange(32) % 3)
    rank_data_torch(tiny, Pass.top(2), 64, TorchOptions(device="cpu"))
    rank_data(tiny, Pass.top(2), 64)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Wall seconds of ``fn()`` (a CUDA device's queued work included) and its result."""
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - started, out


def best_of(runs: dict[str, Callable[[], Any]], repeat: int) -> dict[str, tuple[float, Any]]:
    """Each of ``runs`` ``repeat`` times, in turn (a, b, a, b, ...): its fastest wall time and its last result."""
    best: dict[str, tuple[float, Any]] = {}
    for _ in range(max(1, repeat)):
        for name, fn in runs.items():
            seconds, out = timed(fn)
            best[name] = (min(seconds, best.get(name, (np.inf,))[0]), out)
    return best


def identical(a: Any, b: Any) -> bool:
    """Whether two rankings hold the same bytes in every field a metric reads (:data:`FIELDS`)."""
    return all(np.asarray(getattr(a, f)).tobytes() == np.asarray(getattr(b, f)).tobytes() for f in FIELDS)
