"""Scenario S of ``bench/score_bench.py``: a training loop's call, 64 queries x 64 gallery x 256-d, 1,000 times.

Each contender runs in its own process on the same seeded batch (clustered: class
centres plus noise, 16 classes, so most queries hit), 20 warm-up calls, then 1,000
timed calls; the median per call is reported:

* ``small engine``: :func:`recallk.score.metrics.recall_at_k` (the engine's direct path);
* ``small suite``: :func:`recallk.score.metrics.retrieval_metrics`, every metric;
* ``small numpy``: plain numpy, what a training loop would write: normalise, ``q @ g.T``,
  ``argsort``, the first hit per query (:func:`numpy_recall`);
* ``small pml``: pytorch-metric-learning's ``AccuracyCalculator`` (``bench/pml_anchor.py``), skipped
  when it is not importable.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import numpy as np

import pml_anchor
from blas_report import blas_lines
from full_matrix import unit

N_QUERY, N_GALLERY, DIM, CLASSES, NOISE = 64, 64, 256, 16, 3.0
CALLS, WARMUP = 1000, 20
TARGET = 2.0  # the issue's: the engine's call at most twice plain numpy's
#: Every S child runs BLAS on one thread: a 64 x 64 product gains nothing from threads, and BLAS threads waiting
#: for a core on a busy machine made plain numpy's calls swing from 0.15 to 16 ms between runs.
ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
METHODS = ("small engine", "small suite", "small numpy", "small pml")


def make_batch(seed: int) -> dict:
    """Seeded clustered float32 batch: class centres plus noise, labels drawn per item."""
    rng = np.random.default_rng([seed, ord("S")])
    centres = rng.standard_normal((CLASSES, DIM), dtype=np.float32)
    ql, gl = rng.integers(0, CLASSES, N_QUERY), rng.integers(0, CLASSES, N_GALLERY)
    q = centres[ql] + NOISE * rng.standard_normal((N_QUERY, DIM), dtype=np.float32)
    g = centres[gl] + NOISE * rng.standard_normal((N_GALLERY, DIM), dtype=np.float32)
    return {"q": q, "g": g, "ql": ql, "gl": gl}


def numpy_recall(q: np.ndarray, g: np.ndarray, ql: np.ndarray, gl: np.ndarray, ks) -> dict:
    """Plain numpy recall@K: unit rows, the full float32 product, each row argsorted, the first hit's rank;
    queries without a positive left out (as the engine does)."""
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    gn = g / np.linalg.norm(g, axis=1, keepdims=True)
    hit = gl[np.argsort(-(qn @ gn.T), axis=1)] == ql[:, None]
    has = hit.any(axis=1)
    first = hit.argmax(axis=1)[has]
    return {f"recall@{k}": float(np.mean(first < k)) for k in ks}


def _call(method: str, d: dict, ks) -> Callable[[], dict]:
    from recallk.score.metrics import recall_at_k, retrieval_metrics
    q, g, ql, gl = d["q"], d["g"], d["ql"], d["gl"]
    if method == "small engine":
        return lambda: recall_at_k(q, g, ql, gl, ks=ks)
    if method == "small suite":
        return lambda: retrieval_metrics(q, g, ql, gl, ks=ks)
    if method == "small pml":  # the batch converted to unit rows and tensors each call, as a loop would
        calc = pml_anchor.calculator()
        return lambda: pml_anchor.pml_metrics(calc, unit(q), unit(g), ql, gl, loo=False)
    return lambda: numpy_recall(q, g, ql, gl, ks)


def run(method: str, seed: int, ks) -> dict:
    """In a child: the method's median seconds per call over :data:`CALLS` calls, and its recall."""
    fn = _call(method, make_batch(seed), ks)
    for _ in range(WARMUP):
        info = fn()
    times = []
    for _ in range(CALLS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"seconds": statistics.median(times), "p90": float(np.percentile(times, 90)),
            "info": {k: v for k, v in info.items() if k.startswith("recall@") or k in pml_anchor.KEYS.values()}}


def report(run_child: Callable[[str], dict], ks) -> None:
    """Scenario S's lines: each method's median per call, the engine over plain numpy, whether recall agrees."""
    print(f"\nScenario S: small batch, {N_QUERY} queries x {N_GALLERY} gallery x {DIM}-d, {CLASSES} classes "
          f"(clustered), {CALLS:,} calls per method, ks={tuple(ks)}, BLAS on one thread in every child")
    print(f"  {'method':14s} {'median ms/call':>14s} {'p90 ms':>8s}   recall@{','.join(map(str, ks))}")
    res = {}
    for m in METHODS:
        if m == "small pml" and not pml_anchor.available():
            print(f"  {m:14s} {pml_anchor.SKIP_NOTE}")
            continue
        r = res[m] = run_child(m)
        if "error" in r:
            print(f"  {m:14s} {r['error']}")
            continue
        rec = pml_anchor.fmt(r["info"]) if m == "small pml" else " ".join(f"{r['info'][f'recall@{k}']:.4f}" for k in ks)
        print(f"  {m:14s} {r['seconds'] * 1e3:14.3f} {r['p90'] * 1e3:8.3f}   {rec}")
    for line in blas_lines(res):
        print(line)
    eng, ref = res.get("small engine", {}), res.get("small numpy", {})
    if "seconds" in eng and "seconds" in ref:
        ratio = eng["seconds"] / ref["seconds"]
        print(f"  small engine/small numpy = {ratio:5.2f}x per call (target <= {TARGET:.2f}x: "
              f"{'MET' if ratio <= TARGET else 'MISSED'})")
        suite = res.get("small suite", {})
        if "seconds" in suite:
            print(f"  small suite/small numpy = {suite['seconds'] / ref['seconds']:5.2f}x (no target: every metric)")
        agree = all(eng["info"][f"recall@{k}"] == ref["info"][f"recall@{k}"] for k in ks)
        print(f"  recall agrees: {'yes' if agree else 'no'}")
    for line in pml_anchor.compare(res.get("small suite", {}), res.get("small pml", {}), "small suite"):
        print(line)
