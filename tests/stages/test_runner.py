"""stages/runner.py: a stage whose write fails (a file-size limit, like a full disk) exits 2 with one message,
keeps no output, and a re-run gives the same bytes; a failed cache write keeps the cache intact."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import EMBEDDINGS, ENCODE_OUTPUTS, SCORE_OUTPUTS, assert_user_error, read_bytes, set_params, tool_env

pytestmark = pytest.mark.stage  # every test here runs stage scripts as subprocesses


def _limited(limit_bytes: int):
    """preexec_fn: a file-size limit like `ulimit -f`; Python ignores SIGXFSZ, so writes fail with EFBIG."""
    import resource

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, resource.RLIM_INFINITY))
    return apply


def _stage(project: Path, stage: str, env: dict[str, str], limit: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"stages.{stage}"], cwd=project, env=env, capture_output=True,
                          text=True, preexec_fn=None if limit is None else _limited(limit))


@pytest.mark.parametrize("stage, limit, outs", [
    # score: the per-query table is the largest output; nothing of the four may survive
    ("score", 1024, SCORE_OUTPUTS),
    # encode: the embedding matrix exceeds the limit (the cache lives elsewhere, filled beforehand without a limit)
    ("encode", 64 * 1024, ENCODE_OUTPUTS),
])
def test_a_failed_write_leaves_no_output_and_says_what_happened(scored_project: Path, stage: str, limit: int,
                                                                  outs) -> None:
    env = tool_env(RECALLK_CACHE_DIR=str(scored_project / ".cache" / "recallk"))  # where scored_base encoded
    good = read_bytes(scored_project, outs)
    proc = _stage(scored_project, stage, env, limit)
    assert_user_error(proc, "could not write", "ulimit -f")
    assert not any((scored_project / rel).exists() for rel in outs) and list(scored_project.rglob("*.tmp")) == []
    assert _stage(scored_project, stage, env).returncode == 0
    assert read_bytes(scored_project, outs) == good


def test_a_failed_cache_write_keeps_the_cache_intact(split_project: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = tool_env(RECALLK_CACHE_DIR=str(cache))
    set_params(split_project, {"encode.batch_size": 8})
    proc = _stage(split_project, "encode", env, limit=96 * 1024)  # the cache file outgrows it mid-run
    assert_user_error(proc, "embedding cache")
    assert not (split_project / EMBEDDINGS).exists()
    with contextlib.closing(sqlite3.connect(cache / "embeddings.sqlite")) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        kept = db.execute("SELECT count(*) FROM embedding").fetchone()[0]
    assert 0 < kept < 200  # some batches committed before the limit hit, not all
    assert _stage(split_project, "encode", env).returncode == 0
    resumed = read_bytes(split_project, (EMBEDDINGS,))
    assert _stage(split_project, "encode", tool_env(RECALLK_CACHE_DIR=str(tmp_path / "fresh"))).returncode == 0
    assert read_bytes(split_project, (EMBEDDINGS,)) == resumed
