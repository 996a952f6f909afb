"""The embedding cache's location (one per user, shared by every workspace) and concurrent writers."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, tool_env
from recallk.encode.cache import EmbeddingCache, default_dir, default_path


@pytest.mark.parametrize("recallk_dir, xdg, expected", [
    ("/srv/cache", "/xdg", "/srv/cache"),            # RECALLK_CACHE_DIR moves it, whatever else is set
    ("rel/cache", None, "rel/cache"),                # a relative one is read from the stage's working directory
    (None, "/xdg", "/xdg/recallk"),                  # the XDG base directory spec's cache home
    (None, "relative/xdg", "HOME/.cache/recallk"),   # a relative XDG_CACHE_HOME is ignored, as the spec says
    (None, None, "HOME/.cache/recallk"),             # the per-user default, as Hugging Face and torch hub
    ("", "", "HOME/.cache/recallk"),                 # empty variables count as unset
])
def test_default_dir_is_one_folder_per_user(recallk_dir, xdg, expected, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name, value in (("RECALLK_CACHE_DIR", recallk_dir), ("XDG_CACHE_HOME", xdg)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert default_dir() == Path(expected.replace("HOME", str(tmp_path)))
    assert default_path() == default_dir() / "embeddings.sqlite"


def test_every_test_has_its_own_cache(embedding_cache, tmp_path):
    # conftest's autouse fixture: nothing a test encodes lands in the per-user cache
    assert default_dir() == embedding_cache and embedding_cache.is_relative_to(tmp_path)


_WRITER = """
import sys
import numpy as np
from recallk.encode.cache import EmbeddingCache
path, who, ready = sys.argv[1], sys.argv[2], sys.argv[3]
open(ready, "w").close()
import os, time
while not os.path.exists(sys.argv[4]):  # both start writing at the same moment
    time.sleep(0.001)
with EmbeddingCache(path, "fp") as cache:
    for b in range(40):  # 40 transactions of 10 rows each
        shas = [f"{who}-{b}-{i}" for i in range(10)]
        cache.put_many(shas, np.full((10, 4), b, np.float32))
"""


def test_two_processes_writing_at_once_keep_every_row(tmp_path):
    # Two encodes on one machine share the per-user cache: both create the file and write batches at once.
    db, go = tmp_path / "shared" / "embeddings.sqlite", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(db), who, str(tmp_path / f"ready-{who}"), str(go)],
                              cwd=ROOT, env=tool_env(), stderr=subprocess.PIPE, text=True) for who in ("a", "b")]
    while not all((tmp_path / f"ready-{who}").exists() for who in ("a", "b")):
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    go.touch()
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(*) FROM embedding").fetchone()[0] == 800
    with EmbeddingCache(db, "fp") as cache:
        got = cache.get_many([f"{who}-{b}-{i}" for who in "ab" for b in range(40) for i in range(10)])
    assert len(got) == 800 and all(np.array_equal(v, np.full(4, int(k.split("-")[1]), np.float32))
                                   for k, v in got.items())
