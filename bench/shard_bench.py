"""Sharding at size: ``score.shards: 4`` on Ray tasks (``score.engine: ray``, ``backend: torch`` on CPU) against the
unsharded run, 2,000 queries x 10,000,000 gallery x 64-d synthetic by default.

Prints both wall times, whether the rankings are byte-identical (first ranks under both tie rules, every rank
within each query's first L, offsets), the driver's peak resident memory and the largest peak a Ray worker
reported and its most above its resident memory at a task's start, beside the bound the issue sets: one shard
(m / shards x d x 4 bytes) plus ``--max-memory-mb``. The full size took 8.4 GiB resident on the driver (the
gallery, its sorted unit copy, the shards it writes to the object store) and 18 minutes on 2 shared cores
(docs/gpu.md); ``--scale`` shrinks the gallery. From the project root:

    python bench/shard_bench.py                  # 2,000 x 10,000,000 x 64, 4 shards
    python bench/shard_bench.py --scale 0.002    # 20,000 gallery items: a quick look
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


from recallk.score.data import RetrievalData  # noqa: E402
from recallk.score.passes import Pass  # noqa: E402
from recallk.score.ranking.torch_backend import TorchOptions, rank_data_torch  # noqa: E402
from torch_timing import clustered, identical, timed, warm_up  # noqa: E402


class Lines(logging.Handler):
    """The torch backend's debug lines (they carry the Ray workers' peak memory)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the 10,000,000 gallery items")
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--num-cpus", type=int, default=1, help="CPUs per Ray task (score.ray.num_cpus)")
    parser.add_argument("--max-memory-mb", type=float, default=512)
    args = parser.parse_args(argv)
    n, m, d = args.queries, max(args.shards, int(10_000_000 * args.scale)), args.dim
    q, g, ql, gl = clustered(n, m, d)
    data = RetrievalData(q, g, ql, gl, same_set=False)
    ranks = Pass.top(10)  # recall@K, precision@K, r_precision, map@r, mrr: the score stage's pass without map
    print(f"{n:,} queries x {m:,} gallery x {d}-d, {args.shards} shards, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}")
    warm_up()
    whole_s, whole = timed(lambda: rank_data_torch(data, ranks, args.max_memory_mb, TorchOptions(device="cpu")))
    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    print(f"  unsharded, local      {whole_s:8.1f} s, driver peak {driver:,.0f} MiB")
    lines = Lines()
    logger = logging.getLogger("recallk.score.ranking.torch_backend")
    logger.addHandler(lines)
    logger.setLevel(logging.DEBUG)
    shard_s, sharded = timed(lambda: rank_data_torch(data, ranks, args.max_memory_mb, TorchOptions(
        device="cpu", shards=args.shards, ray=(None, args.num_cpus))))
    peak = next((line.rsplit("worker peak ", 1)[1] for line in lines.lines if "worker peak" in line), "?")
    bound = m / args.shards * d * 4 / 2**20 + args.max_memory_mb
    print(f"  {args.shards} shards on Ray      {shard_s:8.1f} s, worker peak {peak}; bound: shard + budget = "
          f"{bound:,.0f} MiB above the worker's own Python, Ray and torch")
    same = identical(whole, sharded)
    print(f"  rankings {'byte-identical' if same else 'DIFFER'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
