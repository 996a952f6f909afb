"""Who does what: queries in chunks, tiles in jobs, jobs on every core.

Each core takes jobs from one shared list and multiplies each tile with
single-threaded BLAS (:func:`each_core`). Query x gallery: a job is a run of
query rows sorted by label, over every gallery tile. Leave-one-out (the gallery
*is* the query set): a job is one square tile on or above the diagonal, which
serves its rows and its columns.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Callable, Iterator

import numpy as np

from recallk.progress import Progress
from recallk.score.ranking.budget import Budget
from recallk.score.ranking.counting import RankCounter
from recallk.score.ranking.problem import Problem
from recallk.score.ranking.scan import Buffers
from recallk.threads import run_all

#: Fast tiles' gallery width (query x gallery); leave-one-out tiles are square.
TILE_WIDTH = 2048
#: Products of at most this many multiply-adds run on one BLAS thread anyway (OpenBLAS threads a gemm only
#: above 65,536 x 4): no threadpoolctl call for them.
_ONE_THREAD_MACS = 2**18

#: Seconds between progress lines when stderr is not a terminal (under ``dvc repro``), and before a
#: terminal's bar appears: calls that end sooner (a training loop's) show nothing.
_PROGRESS_INTERVAL = 10.0
_PROGRESS_DELAY = 3.0

log = logging.getLogger(__name__)

_blas_libraries = None  # threadpoolctl's controllers of the BLAS libraries loaded (numpy's among them), found once


class TileWorker:
    """One thread's jobs in :func:`each_core`: :meth:`run` hands each to :meth:`query_run` or :meth:`symmetric_tile`.

    Parameters
    ----------
    p : Problem
        The problem; ``p.same_set`` tells which kind of job :func:`tiling` made.
    counter : RankCounter
        The counts, shared by every thread (it locks its updates).
    width : int
        Gallery width of a query run's tiles, or the side of a leave-one-out tile.
    """

    def __init__(self, p: Problem, counter: RankCounter, width: int) -> None:
        self.p, self.counter, self.width, self.scratch = p, counter, width, Buffers()
        self.ticked, self.on_tiles = 0, None  # tiles reported during the current job; :func:`each_core`'s sink

    def tiles_done(self, n: int = 1) -> None:
        """Report ``n`` tiles of the current job done (progress within a long query run)."""
        self.ticked += n
        if self.on_tiles is not None:
            self.on_tiles(n)

    def run(self, job: Any) -> None:
        """Do one job: a leave-one-out tile ``(r0, c0)``, or a run of query rows."""
        if self.p.same_set:
            self.symmetric_tile(*job)
        else:
            self.query_run(job)

    def query_run(self, rows: np.ndarray) -> None:
        """Query x gallery: count queries ``rows`` over every gallery tile."""
        raise NotImplementedError

    def symmetric_tile(self, r0: int, c0: int) -> None:
        """Leave-one-out: count the tile of sorted rows from ``r0`` and columns from ``c0`` (``c0 >= r0``)."""
        raise NotImplementedError

    def finish(self) -> None:
        """Called once, after this thread's last job."""


def consecutive_runs(counts: np.ndarray, most: int) -> list[tuple[int, int]]:
    """Split ``range(len(counts))`` into consecutive runs holding about ``most`` of ``counts`` each.

    A run starts wherever the total before an entry crosses a multiple of ``most``, so a
    run holds less than ``most`` plus its last entry's count.

    Parameters
    ----------
    counts : array_like of int
        One count per entry (e.g. positives per query).
    most : int
        The total a run should hold.

    Returns
    -------
    list of (int, int)
        The runs ``(a, b)``, in order; one run when the total fits.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if counts.sum() <= most:
        return [(0, counts.size)]
    before = np.cumsum(counts) - counts
    starts = np.r_[0, np.flatnonzero(np.diff(before // most)) + 1]
    return list(zip(starts.tolist(), np.r_[starts[1:], counts.size].tolist()))


def rows_to_csr(n: int, parts: list[tuple]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per-query lists gathered from ``parts`` into one CSR layout over ``n`` queries.

    Each part is ``(rows, sizes, *arrays)``: query ``rows[i]`` has ``sizes[i]`` entries, one after another in
    each of ``arrays`` (every query in at most one part; the others get none). Returns the offsets (n + 1,)
    and, per array position, the entries of every query in query order."""
    counts = np.zeros(n, dtype=np.int64)
    for rows, sizes, *_ in parts:
        counts[rows] = sizes
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    outs = [np.empty(offsets[-1], dtype=a.dtype) for a in parts[0][2:]] if parts else []
    for rows, sizes, *arrays in parts:
        dest = spans(offsets[rows], sizes)
        for out, a in zip(outs, arrays):
            out[dest] = a
    return offsets, outs


def spans(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The positions ``starts[i] + range(sizes[i])`` for every i, one after another."""
    return np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(int(np.sum(sizes)))


def query_chunks(p: Problem, budget: Budget) -> list[np.ndarray]:
    """Consecutive runs of queries whose positive lists and counters fit :meth:`Budget.chunk_positives`
    each; one run when all of them fit."""
    return [np.arange(a, b) for a, b in consecutive_runs(p.hi - p.lo, budget.chunk_positives())]  # at most hi - lo


def tiling(p: Problem, cells: int, most: int | None = None, run_rows: int | None = None) -> tuple[list, int]:
    """Jobs of about ``cells`` cells per tile for :func:`each_core`, and their tiles' side (leave-one-out:
    square tiles (r0, c0) on and above the diagonal) or gallery width (query x gallery: runs of query
    rows sorted by label, so that a tile's masked positives are a few runs, each over every gallery
    tile, of ``run_rows`` rows if given, else one tile's); no side, width or run longer than ``most``."""
    n, m = p.q.shape[0], p.gp.shape[0]
    most = m if most is None else most
    if p.same_set:
        side = max(1, min(m, math.isqrt(cells), most))
        return [(r0, c0) for r0 in range(0, m, side) for c0 in range(r0, m, side)], side
    width = max(1, min(m, TILE_WIDTH, cells, most))
    height = max(1, min(run_rows or cells // width, most))
    q_order = np.argsort(p.lo, kind="stable")
    return [q_order[r0:r0 + height] for r0 in range(0, n, height)], width


def job_tiles(p: Problem, width: int) -> int:
    """Tiles one job of :func:`tiling` covers: one (leave-one-out), else every gallery tile."""
    return 1 if p.same_set else -(-p.gp.shape[0] // width)


#: Picks a share of a pass's jobs (a Ray task's), or None for all of them.
Select = Callable[[list], list] | None


def tile_count(p: Problem, jobs: list, width: int) -> int:
    """Tiles that jobs of :func:`tiling` cover: one each (leave-one-out), else every gallery tile each."""
    return len(jobs) * job_tiles(p, width)


def each_core(jobs: list, new_worker: Callable[[], TileWorker], tiles_per_job: int = 1, desc: str = "rank") -> None:
    """Do ``jobs`` on every core: each thread makes its worker with ``new_worker()``, calls its ``run(job)``
    for jobs taken in turn from the shared list, then its ``finish()``. BLAS runs single-threaded meanwhile:
    one product per core, with no BLAS threads spinning beside the numpy work. The threads are the calling
    one and those of the process's pool (:func:`recallk.threads.run_all`, started once); when one fails or
    the caller is interrupted (Ctrl-C), the others stop after the job they are on.

    Progress (:class:`~recallk.progress.Progress`, ``desc``, in tiles: ``tiles_per_job`` per job, reported by
    the worker as it goes (:meth:`TileWorker.tiles_done`) or when the job ends): a bar on
    a terminal once the pass has run :data:`_PROGRESS_DELAY` seconds, else an INFO line with the rate and the
    time left every :data:`_PROGRESS_INTERVAL` seconds."""
    pending, lock = iter(jobs), threading.Lock()
    bar = Progress(len(jobs) * tiles_per_job, desc, "tile", log, interval=_PROGRESS_INTERVAL, delay=_PROGRESS_DELAY)

    def advance(n: int) -> None:
        if n > 0:
            with lock:
                bar.update(n)

    stop = threading.Event()  # set when a thread fails or the caller is interrupted: the others stop after their job

    def work(_: int) -> None:
        worker = new_worker()
        worker.on_tiles = advance
        while not stop.is_set():
            with lock:
                job = next(pending, None)
            if job is None:
                return worker.finish()
            worker.ticked = 0
            try:
                worker.run(job)
            except BaseException:
                stop.set()
                raise
            advance(tiles_per_job - worker.ticked)  # the tiles a job skipped (stopped queries) or did not report
        return None

    threads = max(1, min(worker_count(), len(jobs)))
    with bar, single_threaded_blas():
        run_all(work, range(threads))  # the calling thread takes one share; the pool's threads, started once, the rest


def single_threaded_blas(macs: float | None = None) -> AbstractContextManager:
    """A context in which BLAS runs on one thread (threadpoolctl), for a product of ``macs`` multiply-adds
    (None: any size). Nothing to do, and no threadpoolctl call, when the product is tiny (at most
    ``_ONE_THREAD_MACS``) or BLAS already runs one thread.

    The libraries are found once, at the first call that needs them (finding them takes about 0.5 ms; numpy's
    BLAS, the one the engine's products use, is loaded with numpy).
    """
    global _blas_libraries
    if macs is not None and macs <= _ONE_THREAD_MACS:
        return nullcontext()
    if _blas_libraries is None:
        from threadpoolctl import ThreadpoolController

        _blas_libraries = ThreadpoolController().select(user_api="blas").lib_controllers
    threads = [lib.get_num_threads() for lib in _blas_libraries]
    if all(t == 1 for t in threads):
        return nullcontext()
    return _OneThread(_blas_libraries, threads)


class _OneThread:
    """:func:`single_threaded_blas`'s context: each library on one thread, then back to ``threads``
    (threadpoolctl's own limiter reads every library's full info first, which takes longer than a small product)."""

    def __init__(self, libraries: list, threads: list[int]) -> None:
        self.libraries, self.threads = libraries, threads

    def __enter__(self) -> None:
        for lib in self.libraries:
            lib.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        for lib, n in zip(self.libraries, self.threads):
            lib.set_num_threads(n)


#: Threads for the tiles when set (:func:`threads`): a Ray task runs on the cores Ray gave it.
_THREADS: int | None = None


@contextmanager
def threads(n: int) -> Iterator[None]:
    """Within it, the tiles take ``n`` threads instead of every core this process may run on."""
    global _THREADS
    before, _THREADS = _THREADS, n
    try:
        yield
    finally:
        _THREADS = before


def worker_count() -> int:
    """Threads for the tiles: every core this process may run on (or :func:`threads`' count)."""
    if _THREADS is not None:
        return _THREADS
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
