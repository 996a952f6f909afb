"""``score.engine: ray``: the exact engine's tile jobs on Ray tasks, with byte-identical counts.

The driver prepares the problem and the positive lists as the local engine does
(:func:`~recallk.score.ranking.engine.rank_data` with ``count_tiles=RayTiles(...)``); only
the tiles go out. The work units are the engine's own jobs: query x gallery, runs of query
rows over every gallery tile; leave-one-out, the square tiles on and above the diagonal. The
gallery goes to the object store once (``ray.put``), the rest of the problem and the positive
lists once per pass; each task takes every ``shares``-th job, runs the engine's tile workers on
its ``num_cpus`` threads under the pass's tile budget (the same ``max_memory_mb`` rules as
locally, per task), and returns its per-threshold counts. Counts are integers, so their sum
is the local engine's, whatever the split; the driver reads the ranks from it as locally.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np

from recallk.cluster import connect
from recallk.errors import InputError
from recallk.progress import Progress
from recallk.score.passes import Pass
from recallk.score.ranking.budget import Budget
from recallk.score.ranking.counting import RankCounter
from recallk.score.ranking.engine import count_tiles_here
from recallk.score.ranking.problem import Problem
from recallk.score.ranking.schedule import threads

log = logging.getLogger(__name__)

#: Tasks per CPU slot of the cluster: a little more than one, so that a slow node's share is small.
TASKS_PER_SLOT = 2


def count_share(p: Problem, gallery: np.ndarray, positives: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
                tiles: Budget, ranks: Pass, share: int, shares: int,
                n_threads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]:
    """One task: jobs ``share``, ``share + shares``, ... of the pass, on ``n_threads`` threads.

    Parameters
    ----------
    p : Problem
        The problem without its gallery (``gallery``: the sorted unit gallery, from the object store).
    positives : (offsets, values, columns, handed)
        The pass's positive lists (thresholds), as the driver made them, and the queries it has already handed to
        the exact pass (their positives crowd their best: placeholders, not to be counted).
    tiles, ranks
        The pass's tile budget and the pass (``Pass.every()`` or ``Pass.first(cap)``), as locally.

    Returns
    -------
    (gt, eq_lt, eq_gt, handed, jobs, tiles)
        This share's counts per threshold (int64), the queries it handed to the exact pass (bool, see
        :attr:`~recallk.score.ranking.counting.RankCounter.handed`), and the jobs and tiles it did.
    """
    p = replace(p, gp=gallery)
    *lists, handed = positives
    counter = RankCounter(p, *lists)
    counter.handed |= handed

    def select(jobs: list) -> list:
        return jobs[share::shares]

    with threads(n_threads):
        jobs, n_tiles = count_tiles_here(p, counter, tiles, ranks, select)
    return counter.gt, counter.eq_lt, counter.eq_gt, counter.handed, jobs, n_tiles


_REMOTE: dict[int, Any] = {}  # CPUs per task -> count_share as a Ray task (Ray exports it once per job)


def _remote(ray: Any, num_cpus: int) -> Any:
    if num_cpus not in _REMOTE:
        _REMOTE[num_cpus] = ray.remote(count_share).options(num_cpus=num_cpus)
    return _REMOTE[num_cpus]


class RayTiles:
    """The ``count_tiles`` hook of :func:`~recallk.score.ranking.engine.rank_data` on Ray.

    Parameters
    ----------
    address : str or None
        The cluster (:func:`recallk.cluster.connect`).
    num_cpus : int
        CPUs (and threads) per task.
    shares : int, optional
        Tasks per pass; default :data:`TASKS_PER_SLOT` per ``num_cpus`` slot of the cluster.
    """

    def __init__(self, address: str | None = None, num_cpus: int = 1, shares: int | None = None) -> None:
        self.address, self.num_cpus, self.shares = address, num_cpus, shares
        self._gallery: tuple[Any, Any] | None = None  # (the gallery array, its object ref): put once
        self.passes = self.jobs = 0  # what the passes so far did (for the log and the tests)

    def __call__(self, p: Problem, counter: RankCounter, tiles: Budget, ranks: Pass) -> tuple[int, int]:
        ray = connect(self.address, "score.engine: ray")
        most = max((node["Resources"].get("CPU", 0) for node in ray.nodes() if node.get("Alive")), default=0)
        if self.num_cpus > most:  # such a task would wait forever for a node
            raise InputError(f"`score.ray.num_cpus` is {self.num_cpus}, but the largest node of the Ray cluster has "
                             f"{most:g} CPUs; set it to at most {most:g}.")
        if self._gallery is None or self._gallery[0] is not p.gp:
            self._gallery = (p.gp, ray.put(p.gp))
        shares = self.shares or max(1, TASKS_PER_SLOT * int(ray.cluster_resources().get("CPU", 1) // self.num_cpus))
        rest = ray.put(replace(p, gp=np.empty((0, p.gp.shape[1]), dtype=p.gp.dtype)))
        positives = ray.put((counter.off, counter.val, counter.col, counter.handed.copy()))
        task = _remote(ray, self.num_cpus)
        pending = [task.remote(rest, self._gallery[1], positives, tiles, ranks, share, shares, self.num_cpus)
                   for share in range(shares)]
        jobs = n_tiles = 0
        with Progress(shares, "score on Ray", "task", log) as bar:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                gt, eq_lt, eq_gt, handed, share_jobs, share_tiles = ray.get(done[0])
                counter.gt += gt
                counter.eq_lt += eq_lt
                counter.eq_gt += eq_gt
                counter.handed |= handed  # handed over by any share: its counts are partial, the exact pass ranks it
                jobs, n_tiles = jobs + share_jobs, n_tiles + share_tiles
                bar.update(1)
        self.passes, self.jobs = self.passes + 1, self.jobs + jobs
        log.debug("Ray pass: %d tasks of %d CPU(s), %d jobs, %d tiles", shares, self.num_cpus, jobs, n_tiles)
        return jobs, n_tiles
