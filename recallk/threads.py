"""One process-wide pool of worker threads for the engine's parallel parts (unit rows, positives, tiles).

Starting threads on every call costs more than a small problem's work: a new thread must be scheduled
before ``Thread.start`` returns, which on a 2-core machine whose other core is busy multiplying takes
milliseconds (measured: about 10 ms of a 0.12 s call at 2,000 x 10,000 x 512). :func:`run_all` hands
its items to threads started once and kept, and runs one share on the calling thread itself.

A call from inside one of the pool's threads runs its items there, one after another (a nested call
waiting on the pool it occupies could wait forever); a forked child starts with no pool and makes
its own (threads do not survive ``fork``).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, TypeVar

__all__ = ["run_all"]

T = TypeVar("T")
R = TypeVar("R")

#: Most threads the pool keeps (it starts them as calls need them, up to this many).
_MOST = max(4, os.cpu_count() or 1)

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_local = threading.local()  # ``inside``: this thread is running a share of :func:`run_all`


def _forget_pool() -> None:
    """In a forked child: the parent's threads are gone, so is its pool."""
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_MOST, thread_name_prefix="recallk")
        return _pool


def _inside(fn: Callable[[T], R], item: T) -> R:
    _local.inside = True
    try:
        return fn(item)
    finally:
        _local.inside = False


def run_all(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(item) for item in items]``, each item on its own thread: the first on the calling thread, the
    others on the shared pool's (at most :data:`_MOST` at once). Results come in the order of ``items``; the
    first exception is raised once the calling thread's own item is done (the pool's items still run to
    their end: a caller that must stop them early tells ``fn`` so, e.g. with an event)."""
    items = list(items)
    if len(items) <= 1 or getattr(_local, "inside", False):
        return [fn(item) for item in items]
    pool = _shared_pool()
    futures = [pool.submit(_inside, fn, item) for item in items[1:]]
    first = _inside(fn, items[0])
    return [first] + [f.result() for f in futures]
