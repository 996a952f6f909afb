"""Backbones for the Ray tests, imported by Ray workers as ``callable:ray_backbones:<name>``.

Workers do not share the test's environment variables set after the cluster started, so the
test steers them through files in ``$RECALLK_RAY_TEST_DIR`` (set in the cluster's runtime_env
by the ``ray_cluster`` fixture): ``crash_after`` holds N; once N images were encoded (one line
per image in ``encoded``, appended by every worker), the worker kills its own process.
"""

from __future__ import annotations

import os
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
        os._exit(1)
    with open(log, "a") as fh:
        fh.write("".join("x\n" for _ in images))
    return encode_pixels(images, resolution=4)


def failing(images):
    """A backbone whose model fails on a batch (not an input problem: Ray's error comes through)."""
    raise RuntimeError("the model ran out of memory")


def two_rows_short(images):
    """Returns two rows fewer than images: the same InputError as locally."""
    return np.ones((max(len(images) - 2, 0), 3), dtype=np.float32)
