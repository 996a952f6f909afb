"""``score.backend: torch`` with ``score.engine: ray``: each gallery shard (``score.shards``) searched by Ray tasks.

The driver puts each shard's sorted unit rows into the object store once, and the problem without its embeddings
(labels, ids, exclusion codes: what :meth:`~recallk.score.ranking.problem.Problem.excluded` reads) once; for each
block of queries, one task per shard runs :func:`~recallk.score.ranking.torch_tiles.candidates` on CPU torch and
returns its ``K`` best (score, column) pairs per query, which the driver merges and finishes exactly as for local
shards. A task holds its shard, the block and its buffers: memory per worker is the shard plus the block budget.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from recallk.cluster import connect
from recallk.score.ranking import torch_tiles as tt
from recallk.score.ranking.problem import Problem


def shard_candidates(p: Problem, shard: np.ndarray, q: np.ndarray, rows: np.ndarray, c0: int, keep: tt.Keep,
                     num_threads: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """One task: :func:`~recallk.score.ranking.torch_tiles.candidates` of the queries ``q`` (their positions
    ``rows``) against ``shard`` (gallery columns from ``c0``) on CPU torch; (values, columns) as arrays, the
    worker's peak resident memory in bytes so far, and its resident memory when the task began (its Python,
    Ray and torch, and what earlier tasks left; the shard, mapped from the object store, counts once read)."""
    import resource
    import warnings

    import torch

    start = resident_bytes()

    torch.set_num_threads(num_threads)
    with warnings.catch_warnings():  # the object store's arrays are read-only; candidates never writes them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        left, right = torch.from_numpy(q), torch.from_numpy(shard)
    with tt.matmul_mode(torch, left.device, keep.precision):  # a reused worker may hold another process-wide setting
        vals, cols = tt.candidates(torch, p, left, right, rows, (c0, c0 + shard.shape[0]), keep)
    return vals.numpy(), cols.numpy(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, start


def resident_bytes() -> int:
    """This process's resident memory now, bytes (Linux ``/proc/self/statm``; 0 where it is missing)."""
    import os

    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class RayShards:
    """The shards of one problem on Ray tasks (``address``, ``num_cpus`` per task: ``score.ray``)."""

    def __init__(self, address: str | None, num_cpus: int) -> None:
        self.address, self.num_cpus = address, num_cpus
        self.refs: list[tuple[int, Any]] = []
        self.rest = None
        self.tasks = 0
        self.peak_rss = 0  # the largest peak resident memory a worker reported, bytes
        self.peak_growth = 0  # the most a worker's peak exceeded its resident memory at a task's start, bytes

    def prepare(self, p: Problem, gallery: np.ndarray, cuts: list[tuple[int, int]]) -> None:
        """Put the shards ``cuts`` of the unit ``gallery`` and the problem without embeddings into the store."""
        self.ray = connect(self.address, "score.engine: ray")
        empty = np.empty((0, gallery.shape[1]), dtype=np.float32)
        self.rest = self.ray.put(replace(p, q=empty, gp=empty))
        self.refs = [(a, self.ray.put(np.ascontiguousarray(gallery[a:b]))) for a, b in cuts]
        self.task = self.ray.remote(shard_candidates).options(num_cpus=self.num_cpus)

    def __call__(self, q: np.ndarray, rows: np.ndarray, k: int, width: int, precision: str) -> list[tuple]:
        """Every shard's (values, columns) for one block of queries."""
        block = self.ray.put(np.ascontiguousarray(q))
        keep = tt.Keep(k, width, precision)
        pending = [self.task.remote(self.rest, ref, block, rows, a, keep, self.num_cpus)
                   for a, ref in self.refs]
        self.tasks += len(pending)
        out = self.ray.get(pending)
        self.peak_rss = max([self.peak_rss] + [rss for _, _, rss, _ in out])
        self.peak_growth = max([self.peak_growth] + [rss - start for _, _, rss, start in out])
        return [(vals, cols) for vals, cols, _, _ in out]
