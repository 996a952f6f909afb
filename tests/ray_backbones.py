"""Backbones for the Ray tests, imported by Ray workers as ``callable:ray_backbones:<name>``.

Workers do not share the test's environment variables set after the cluster started, so the
test steers them through files in ``$RECALLK_RAY_TEST_DIR`` (set in the cluster's runtime_env
by the ``ray_cluster`` fixture): ``crash_after`` holds N; once N images were encoded (one line
per image in ``encoded``, appended by every worker), the worker kills its own process. If
``wait_for`` holds "M PATH", it first waits until the driver has committed M images to the
embedding cache at PATH: Ray Data drops the outputs still queued when an actor dies (and its
iterator hands a block on only once the next one exists), so without the wait how many batches
reach the cache depends on timing (a fast backbone can finish every batch before the driver reads
the first).
"""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import numpy as np

from recallk.encode.registry import encode_pixels


def control_dir() -> Path:
    return Path(os.environ["RECALLK_RAY_TEST_DIR"])


def crashing(images):
    """4x4 pixels; kills its own process (os._exit, as a lost node or an OOM kill would) once
    ``crash_after`` images were encoded, when that file exists."""
    folder = control_dir()
    limit = folder / "crash_after"
    log = folder / "encoded"
    if limit.exists() and log.exists() and len(log.read_text().splitlines()) >= int(limit.read_text()):
        _wait_until_committed(folder / "wait_for")
        os._exit(1)
    with open(log, "a") as fh:
        fh.write("".join("x\n" for _ in images))
    return encode_pixels(images, resolution=4)


def _wait_until_committed(wait_for: Path, timeout: float = 60.0) -> None:
    """Wait (up to ``timeout`` s) until the cache named in ``wait_for`` ("M PATH") holds M embeddings."""
    if not wait_for.exists():
        return
    n, path = wait_for.read_text().split(" ", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
                if db.execute("SELECT count(*) FROM embedding").fetchone()[0] >= int(n):
                    return
        except sqlite3.OperationalError:  # not created yet, or locked for a moment
            pass
        time.sleep(0.05)


def failing(images):
    """A backbone whose model fails on a batch (not an input problem: Ray's error comes through)."""
    raise RuntimeError("the model ran out of memory")


def two_rows_short(images):
    """Returns two rows fewer than images: the same InputError as locally."""
    return np.ones((max(len(images) - 2, 0), 3), dtype=np.float32)
