"""Memory benchmark: exact recall@K of a large gallery under ``max_memory_mb``, peak extra memory and wall time.

Default: 20,000 queries x 1,000,000 gallery items x 128-d (float32 inputs: 10 MB and 512 MB), clustered
(1,000 class centres plus noise), recall@{1,5,10} through :func:`recallk.score.metrics.recall_at_k` under a
512 MB budget; ``--metrics recall,mrr`` takes the full first-positive pass (every first rank exact), any
other metric the complete ranking. The unit copy of this gallery alone would take the whole budget, so the
engine reads it normalised per tile.

Peak extra memory is the RSS high-water mark during the call minus the RSS just before it (inputs generated
in place, float32, in chunks: no float64 temporary): Linux's ``/proc/self/clear_refs`` resets the high-water
mark after the data are made, ``VmHWM`` in ``/proc/self/status`` reads it afterwards. Run from the project
root (``--quick``: 20x fewer queries and gallery items, a smoke run):

    nice python bench/memory_bench.py [--quick] [--queries 20000] [--gallery 1000000] [--dim 128]
                                      [--max-memory-mb 512] [--metrics recall] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from recallk.score.metrics import retrieval_summary  # noqa: E402

CLASSES = 1000
NOISE = 1.8  # per-dimension noise around unit-variance class centres (128-d)
CHUNK_ROWS = 65536  # rows generated at a time


def _status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def make_data(n: int, m: int, dim: int, seed: int) -> tuple[np.ndarray, ...]:
    """Clustered float32 vectors and their int64 labels, generated in place chunk by chunk."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CLASSES, dim), dtype=np.float32)
    out = []
    for rows in (n, m):
        labels = rng.integers(0, CLASSES, rows)
        x = np.empty((rows, dim), dtype=np.float32)
        for s in range(0, rows, CHUNK_ROWS):
            part = x[s:s + CHUNK_ROWS]
            rng.standard_normal(part.shape, dtype=np.float32, out=part)
            part *= NOISE
            part += centres[labels[s:s + CHUNK_ROWS]]
        out += [x, labels]
    return tuple(out)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--queries", type=int, default=20_000)
    ap.add_argument("--gallery", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--max-memory-mb", type=float, default=512)
    ap.add_argument("--metrics", default="recall")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # the engine's progress lines
    n, m = (args.queries // 20, args.gallery // 20) if args.quick else (args.queries, args.gallery)
    q, ql, g, gl = make_data(n, m, args.dim, args.seed)
    metrics = args.metrics.split(",")
    Path("/proc/self/clear_refs").write_text("5")  # reset the RSS high-water mark to the current RSS
    before = _status_kib("VmRSS")
    started = time.perf_counter()
    summary = retrieval_summary(q, g, ql, gl, ks=(1, 5, 10), metrics=metrics, max_memory_mb=args.max_memory_mb)
    wall = time.perf_counter() - started
    peak = _status_kib("VmHWM")
    result = {"queries": n, "gallery": m, "dim": args.dim, "metrics": metrics, "max_memory_mb": args.max_memory_mb,
              "inputs_mb": round((q.nbytes + g.nbytes + ql.nbytes + gl.nbytes) / 2**20, 1),
              "peak_extra_mb": round((peak - before) / 1024, 1), "wall_s": round(wall, 1),
              "ns_per_cell": round(wall * 1e9 / (n * m), 2),
              **{k: round(v, 4) for k, v in summary.items() if k.startswith(("recall@", "mrr"))}}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
