"""The encode stage (stages/encode.py) as a subprocess: aligned outputs, the embedding cache across runs,
precomputed embeddings, a kill and resume, and its errors."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from helpers import (
    CATALOG,
    EMBEDDINGS,
    ENCODE_OUTPUTS,
    IDS,
    SCORE_OUTPUTS,
    assert_no_outputs,
    run_fails,
    run_ok,
    set_params,
    tool_env,
)
from recallk import images
from recallk.encode.registry import get_backbone

pytestmark = pytest.mark.stage  # every test here runs stage scripts as subprocesses


def _encode(project):
    proc = run_ok(project, "encode")
    return proc.stderr, (project / EMBEDDINGS).read_bytes()


def test_encode_stage_writes_aligned_outputs(scored_base):
    emb = np.load(scored_base / EMBEDDINGS, allow_pickle=False)
    ids = np.load(scored_base / IDS, allow_pickle=False)
    cat = pd.read_csv(scored_base / CATALOG, dtype=str)
    assert emb.dtype == np.float32 and emb.shape == (200, 768)
    assert ids.tolist() == cat["image_id"].tolist()
    first = images.load(scored_base / cat["path"][0])
    np.testing.assert_array_equal(emb[0], get_backbone("pixels", {"resolution": 16}).encode([first])[0])


def test_stage_serves_the_second_run_from_the_cache(split_project, tmp_path, monkeypatch):
    monkeypatch.setenv("RECALLK_CACHE_DIR", str(tmp_path / "cache"))
    log1, emb1 = _encode(split_project)
    assert "encoded 200 images, served 0 from the cache" in log1
    assert (tmp_path / "cache" / "embeddings.sqlite").is_file()
    log2, emb2 = _encode(split_project)
    assert "encoded 0 images, served 200 from the cache" in log2
    assert emb2 == emb1


def test_stage_precomputed_follows_catalog_order(split_project, tmp_path, monkeypatch):
    monkeypatch.setenv("RECALLK_CACHE_DIR", str(tmp_path / "cache"))
    ids = pd.read_csv(split_project / CATALOG, dtype=str)["image_id"].to_numpy(dtype=str)
    want = np.random.default_rng(1).standard_normal((len(ids), 6)).astype(np.float32)
    order = np.random.default_rng(2).permutation(len(ids))
    np.savez(split_project / "pre.npz", ids=np.append(ids[order], "extra"),
             embeddings=np.vstack([want[order], np.ones(6)]))
    set_params(split_project, {"encode.backbone": "precomputed",
                               "encode.precomputed": {"path": "pre.npz", "ids": "recallk/encode/no_file.txt"}})
    log, _ = _encode(split_project)
    assert "loaded 200 precomputed embeddings (dim 6)" in log
    np.testing.assert_array_equal(np.load(split_project / EMBEDDINGS), want)


SLOWENC = """import time
import numpy as np

def embed(images):
    time.sleep(0.2)
    return np.array([np.concatenate([np.asarray(i, dtype=np.float32).mean((0, 1)),
                                     np.asarray(i.resize((4, 4)), dtype=np.float32).ravel()]) for i in images])
"""


def _cache_rows(db_path):
    if not db_path.is_file():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1)) as db:
            return db.execute("SELECT count(*) FROM embedding").fetchone()[0]
    except sqlite3.OperationalError:  # the table is not created yet
        return 0


def test_stage_resumes_after_sigkill(split_project, tmp_path, monkeypatch):
    project = split_project
    (project / "slowenc.py").write_text(SLOWENC)
    set_params(project, {"encode.backbone": "callable:slowenc:embed", "encode.callable.module_file": "slowenc.py",
                          "encode.batch_size": 10})
    cache_dir = tmp_path / "cache"
    db_path = cache_dir / "embeddings.sqlite"
    env = {**tool_env(), "RECALLK_CACHE_DIR": str(cache_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "stages.encode"], cwd=project, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while _cache_rows(db_path) < 30 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the encode run finished before it could be killed"
        assert _cache_rows(db_path) >= 30, "the cache did not fill within 60 s"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    out_dir = project / "data/embeddings"
    assert not (out_dir / "embeddings.npy").exists() and not (out_dir / "ids.npy").exists()
    assert list(project.rglob("*.tmp")) == []
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    n_kept = _cache_rows(db_path)

    monkeypatch.setenv("RECALLK_CACHE_DIR", str(cache_dir))
    log, resumed = _encode(project)
    served = int(log.split(" from the cache")[0].rsplit("served ", 1)[1])
    assert served == n_kept >= 30 and f"encoded {200 - served} images, served {served} " in log

    monkeypatch.setenv("RECALLK_CACHE_DIR", str(tmp_path / "fresh"))
    log, fresh = _encode(project)
    assert "encoded 200 images, served 0 from the cache" in log
    assert resumed == fresh


def test_unknown_backbone_lists_available_and_suggests(split_project):
    set_params(split_project, {"encode.backbone": "pixel"})
    run_fails(split_project, "encode", "unknown backbone 'pixel' in `encode.backbone`", "Did you mean `pixels`?",
              "Available backbones: ", "pixels, precomputed")
    assert_no_outputs(split_project, ENCODE_OUTPUTS + SCORE_OUTPUTS)
    assert (split_project / CATALOG).is_file()  # the split outputs are untouched
