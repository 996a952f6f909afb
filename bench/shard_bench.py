"""Sharding at size: ``score.shards: 4`` on Ray tasks (``score.engine: ray``, ``backend: torch`` on CPU) against the
unsharded run, 2,000 queries x 10,000,000 gallery x 64-d synthetic by default.

Prints both wall times, whether the rankings are byte-identical (first ranks under both tie rules, every rank
within each query's first L, offsets), the driver's peak resident memory and the largest peak a Ray worker
reported and its most above its resident memory at a task's start, beside the bound the issue sets: one shard
(m / shards x d x 4 bytes) plus ``--max-memory-mb``; and, sampled from ``/proc``, each worker's private memory
above its idle state (bound: the budget) and the object-store pages it mapped. Exits 1 unless the rankings are
identical and both bounds hold. The full size took 6 GiB resident on the driver (the gallery, its sorted unit
copy, the shards it writes to the object store) and about 4 minutes on the idle 2-core machine, 18 on a busy
one (docs/internals/gpu.md); ``--scale`` shrinks the gallery. From the project root:

    python bench/shard_bench.py                  # 2,000 x 10,000,000 x 64, 4 shards
    python bench/shard_bench.py --scale 0.002    # 20,000 gallery items: a quick look
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


from recallk.score.passes import Pass  # noqa: E402
from recallk.score.ranking.torch_backend import TorchOptions, rank_data_torch  # noqa: E402
from recallk.score.retrieval_data import RetrievalData  # noqa: E402
from torch_timing import clustered, identical, timed, warm_up  # noqa: E402


class Workers(threading.Thread):
    """Samples every local Ray worker's memory (``/proc/PID/status``) every ``every`` seconds while it runs: per
    worker its private (anonymous) memory at the first sample and at its peak, the most object-store memory it
    had mapped (``RssShmem``: the shards and query blocks, shared pages the store holds once) and its peak
    resident memory. Private memory is what the worker itself allocated: a copy of its shard, or buffers beyond
    the budget, would show there."""

    def __init__(self, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.every, self.done = every, threading.Event()
        self.first: dict[int, int] = {}
        self.anon: dict[int, int] = {}
        self.shmem: dict[int, int] = {}
        self.rss: dict[int, int] = {}

    def sample(self) -> None:
        for pid in workers():
            try:
                with open(f"/proc/{pid}/status") as f:
                    kb = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f)
                          if k in ("RssAnon", "RssShmem", "VmRSS")}
            except (OSError, ValueError):
                continue  # the worker exited between the listing and the read
            self.first.setdefault(pid, kb.get("RssAnon", 0))
            for peak, key in ((self.anon, "RssAnon"), (self.shmem, "RssShmem"), (self.rss, "VmRSS")):
                peak[pid] = max(peak.get(pid, 0), kb.get(key, 0))

    def run(self) -> None:
        while not self.done.wait(self.every):
            self.sample()

    def growth(self) -> int:
        """The most any worker's private memory grew above its first sample, bytes."""
        return max((self.anon[pid] - self.first[pid] for pid in self.anon), default=0)


def workers() -> list[int]:
    """The pids of this machine's Ray workers (their process title starts with ``ray::``)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read(5) == b"ray::":
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


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
    sharded_options = TorchOptions(device="cpu", shards=args.shards, ray=(None, args.num_cpus))
    tiny = RetrievalData(g[:8], g[:64], gl[:8], gl[:64], same_set=False)
    rank_data_torch(tiny, ranks, args.max_memory_mb, sharded_options)  # the workers start and import torch
    watch = Workers()
    watch.sample()  # each worker's private memory idle, before the timed call
    watch.start()
    shard_s, sharded = timed(lambda: rank_data_torch(data, ranks, args.max_memory_mb, sharded_options))
    watch.done.set()
    watch.join()
    line = next((line for line in reversed(lines.lines) if "worker peak" in line), "")
    peak = line.rsplit("worker peak ", 1)[1] if line else "?"
    shard_mib, budget = m / args.shards * d * 4 / 2**20, args.max_memory_mb
    bound = shard_mib + budget
    private = watch.growth() / 2**20
    print(f"  {args.shards} shards on Ray      {shard_s:8.1f} s, worker peak {peak}; bound: shard + budget = "
          f"{bound:,.0f} MiB above the worker's own Python, Ray and torch")
    print(f"  {len(watch.anon)} workers sampled every {watch.every * 1000:.0f} ms: private memory at most "
          f"{private:,.0f} MiB above its idle state (bound: the budget, {budget:,.0f} MiB), object-store pages "
          f"mapped at most {max(watch.shmem.values(), default=0) / 2**20:,.0f} MiB (a shard: {shard_mib:,.0f} MiB; "
          f"shared, held once by the store), resident at most {max(watch.rss.values(), default=0) / 2**20:,.0f} MiB")
    growth = float(peak.split(" MiB above", 1)[0].rsplit(",", 1)[-1]) if " MiB above" in peak else float("inf")
    same = identical(whole, sharded)
    within = growth <= bound and private <= budget
    print(f"  rankings {'byte-identical' if same else 'DIFFER'}; memory per worker "
          f"{'within' if within else 'ABOVE'} shard + budget")
    return 0 if same and within else 1


if __name__ == "__main__":
    sys.exit(main())
