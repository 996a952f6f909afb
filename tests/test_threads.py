"""recallk.threads.run_all: the engine's one pool of threads, started once, nested calls inline, forks safe."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from recallk import threads
from recallk.score.ranking import schedule


def test_results_come_in_order_and_the_calling_thread_takes_the_first_item():
    where = {}

    def record(i):
        where[i] = threading.get_ident()
        time.sleep(0.01)
        return i * i

    assert threads.run_all(record, range(5)) == [0, 1, 4, 9, 16]
    assert where[0] == threading.get_ident()
    assert len(set(where.values())) > 1  # the others ran on the pool's threads


def test_the_pool_threads_are_started_once_and_kept():
    # the pool filled first (a thread still marking itself idle would otherwise make the executor start
    # another one); Thread objects, not idents, which a new thread may reuse
    threads.run_all(lambda i: time.sleep(0.01), range(threads._MOST + 1))
    before = {t for t in threading.enumerate() if t.name.startswith("recallk")}
    for _ in range(2):
        threads.run_all(lambda i: time.sleep(0.01), range(3))
    after = {t for t in threading.enumerate() if t.name.startswith("recallk")}
    assert before and after == before


def test_a_nested_call_runs_inline_instead_of_waiting_on_the_busy_pool():
    def outer(i):
        return threads.run_all(lambda j: (i, j, threading.get_ident()), range(3))

    for i, inner in enumerate(threads.run_all(outer, range(threads._MOST + 2))):  # more outer items than threads
        assert [(a, b) for a, b, _ in inner] == [(i, 0), (i, 1), (i, 2)]
        assert len({t for _, _, t in inner}) == 1  # all on the thread of its outer item


def test_an_error_on_a_pool_thread_reaches_the_caller():
    def fail(i):
        if i == 2:
            raise ValueError("item 2")
        return i

    with pytest.raises(ValueError, match="item 2"):
        threads.run_all(fail, range(4))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_forked_child_makes_its_own_pool():
    threads.run_all(lambda i: i, range(3))  # the parent's pool exists
    pid = os.fork()
    if pid == 0:  # the child: the parent's threads are gone; a pool of its own must serve it
        try:
            ok = threads.run_all(lambda i: i + 1, range(4)) == [1, 2, 3, 4]
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_each_core_stops_the_other_threads_after_a_failure(monkeypatch):
    # 200 jobs on 2 threads; job 3 fails: the failure reaches the caller and the other thread stops after the
    # job it is on, instead of running every job left.
    monkeypatch.setattr(schedule, "worker_count", lambda: 2)
    done = []

    class Worker(schedule.TileWorker):
        def __init__(self):
            self.ticked, self.on_tiles = 0, None

        def run(self, job):
            if job == 3:
                raise RuntimeError("job 3")
            time.sleep(0.002)
            done.append(job)

    with pytest.raises(RuntimeError, match="job 3"):
        schedule.each_core(list(range(200)), Worker)
    time.sleep(0.05)  # the other thread's last job ends
    assert len(done) < 100, len(done)  # about 196 with no stop; a thread kept off the GIL a while does a few more
    assert np.all(np.diff(sorted(done)) > 0)
