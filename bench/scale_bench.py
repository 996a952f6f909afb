"""Scale benchmark: the exact engine on Ray against the local engine, and what that means at 1M and 10M.

On one seeded data set (random normal float32 vectors, 1,000 classes, as score_bench.py's
scenario A: 10,000 queries x 50,000 gallery x 512-d) it times, in this one process:

* ``local``: :func:`recallk.score.metrics.rank` on this machine's cores (``score.engine: local``);
* ``ray``: the same call with ``engine="ray"`` on a local Ray cluster of the same cores
  (``score.engine: ray``), started once before the timings (its start and the first call, which
  starts the worker processes, are reported apart: a cluster is started once per session);

each for the first-positive pass (recall and MRR: every query's exact first rank, no early
stop) and the complete ranking (every metric). The two rankings are compared array for array
(``identical``). Target (the issue's): Ray <= 1.3x local wall time.

From the local first-positive time it derives ns per cell per core, and extrapolates the
exact first-positive pass (and the complete ranking) to 1M x 1M and 10M x 10M on N nodes of C
cores (at the measured Ray efficiency) and to GPUs at their published peak FLOP rates (a
bound: 2 * d FLOPs per cell, the product alone). ``--markdown`` prints the table for
docs/internals/scale.md.

Run from the project root (``--quick``: 10x smaller, a smoke run):

    nice python bench/scale_bench.py [--quick] [--seed 0] [--repeat 2] [--markdown]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from recallk.score.metrics import rank  # noqa: E402
from recallk.score.passes import Pass  # noqa: E402
from recallk.score.retrieval_data import RetrievalData  # noqa: E402
from recallk.score.settings import ScoreSettings  # noqa: E402

DIM = 512
N_CLASSES = 1000
MAX_MEMORY_MB = 512
TARGET = 1.3
FIRST = ("recall", "mrr")  # the first-positive pass without a cap: every query's exact first rank
SUITE = ("recall", "precision", "r_precision", "map@r", "map", "mrr")  # every positive
#: Published peak rates, TFLOP/s: (FP32 vector, FP64 vector), from NVIDIA's datasheets:
#: A100 SXM: nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/
#:           nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
#: H100 SXM: nvidia.com/en-us/data-center/h100/ (datasheet table; the H200 has the same compute).
GPUS = {"A100 SXM": (19.5, 9.7), "H100 SXM": (67.0, 34.0)}
CLUSTERS = ((1, 2), (1, 64), (8, 64), (64, 64))  # (nodes, cores per node)
SIZES = {"1M x 1M": 10**6, "10M x 10M": 10**7}


def data(n: int, m: int, seed: int):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, DIM), dtype=np.float32)
    g = rng.standard_normal((m, DIM), dtype=np.float32)
    g_lab = np.r_[np.arange(N_CLASSES), rng.integers(0, N_CLASSES, m - N_CLASSES)]
    return q, g, rng.integers(0, N_CLASSES, n), g_lab


def ranked(q, g, q_lab, g_lab, metrics, engine: str):
    """:func:`recallk.score.metrics.rank` of one problem: the first-positive pass (``FIRST``, no cap) or the
    complete ranking (``SUITE``), on ``engine``."""
    ranks = Pass.first() if metrics == FIRST else Pass.every()
    settings = ScoreSettings(metrics=metrics, max_memory_mb=MAX_MEMORY_MB, engine=engine)
    return rank(RetrievalData(q, g, q_lab, g_lab), settings, ranks)


def timed(call) -> tuple[float, object]:
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def same(a, b) -> bool:
    return all(np.asarray(getattr(a, k)).tobytes() == np.asarray(getattr(b, k)).tobytes()
               for k in ("n_positives", "n_retrievable", "offsets", "ranks", "first_rank_opposite"))


def human(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=2, help="timings per method (the best counts)")
    ap.add_argument("--markdown", action="store_true", help="print the extrapolation table as markdown")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    n, m = (1000, 5000) if args.quick else (10_000, 50_000)
    cores = len(os.sched_getaffinity(0))
    q, g, q_lab, g_lab = data(n, m, args.seed)
    print(f"scale bench: {n:,} x {m:,} x {DIM}-d, {N_CLASSES} classes, max_memory_mb={MAX_MEMORY_MB}, "
          f"{cores} cores, {platform.processor() or platform.machine()}, load average "
          f"{os.getloadavg()[0]:.1f} (a shared machine: timings are noisy)")

    import ray

    from recallk.cluster import worker_env

    t_init, _ = timed(lambda: ray.init(num_cpus=cores, include_dashboard=False, logging_level=logging.WARNING,
                                       runtime_env=worker_env()))
    t_first, _ = timed(lambda: ranked(q[:200], g[:2000], q_lab[:200], g_lab[:2000], FIRST, "ray"))
    print(f"ray cluster start {t_init:.1f} s, first call (starts the workers) {t_first:.1f} s: once per session")

    results = {}
    for label, metrics in (("first positive", FIRST), ("every positive", SUITE)):
        best = {"local": np.inf, "ray": np.inf}
        rankings = {}
        for _ in range(args.repeat):  # interleaved, so that the machine's load hits both alike
            for engine in ("local", "ray"):
                seconds, rankings[engine] = timed(lambda metrics=metrics, engine=engine: ranked(
                    q, g, q_lab, g_lab, metrics, engine))
                best[engine] = min(best[engine], seconds)
        ratio = best["ray"] / best["local"]
        results[label] = (best["local"], best["ray"])
        print(f"{label:>15}: local {best['local']:6.2f} s, ray {best['ray']:6.2f} s, ray/local {ratio:.2f}x "
              f"(target <= {TARGET}x: {'met' if ratio <= TARGET else 'MISSED'}), identical: "
              f"{'yes' if same(rankings['ray'], rankings['local']) else 'NO'}")
    ray.shutdown()

    cells = n * m
    table = ["| | first positive | every positive |", "|---|---|---|"]
    per_core = {k: v[0] * cores / cells * 1e9 for k, v in results.items()}
    efficiency = {k: v[0] / v[1] for k, v in results.items()}
    table.append(f"| ns per cell per core (measured, local) | {per_core['first positive']:.2f} | "
                 f"{per_core['every positive']:.2f} |")
    table.append(f"| Ray efficiency (local / ray time, measured) | {efficiency['first positive']:.2f} | "
                 f"{efficiency['every positive']:.2f} |")
    for size, side in SIZES.items():
        for nodes, per_node in CLUSTERS:
            row = [human(side * side * per_core[k] * 1e-9 / (nodes * per_node) / min(1.0, efficiency[k]))
                   for k in ("first positive", "every positive")]
            table.append(f"| {size}, {nodes} node(s) x {per_node} cores | {row[0]} | {row[1]} |")
        for gpu, (fp32, fp64) in GPUS.items():
            flops = 2 * DIM * side * side
            table.append(f"| {size}, one {gpu} at peak (FP32 {fp32:g} / FP64 {fp64:g} TFLOP/s) | "
                         f"{human(flops / (fp32 * 1e12))} | {human(flops / (fp64 * 1e12))} |")
    print("\nextrapolation (query x gallery; leave-one-out multiplies half the tiles):")
    print("\n".join(table) if args.markdown else "\n".join(line.replace("|", " ") for line in table))


if __name__ == "__main__":
    main()
