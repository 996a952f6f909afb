"""stages/runner.py: a stage whose write fails (a file-size limit, like a full disk) exits 2 with one message,
keeps no output, and a re-run gives the same bytes; a failed cache write keeps the cache intact; an OSError's
message gives the advice of its errno. These stage runs are subprocesses: the command line's error exit."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import EMBEDDINGS, ENCODE_OUTPUTS, SCORE_OUTPUTS, assert_user_error, read_bytes, set_params, tool_env
from recallk.errors import os_advice
from stages import runner

# The tests that run stage scripts take a stage project (conftest.STAGE_PROJECTS), which marks them `stage`.


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


# ---------------------------------------------------------------- the advice of an OSError (issue 25)
# A too-long name or a permission error was reported as "free disk space" (moved from the hostile corpus,
# test_hostile_messages.py).


@pytest.mark.parametrize("code, advice, not_advice", [
    (errno.ENAMETOOLONG, "too long for the file system", "free disk space"),
    (errno.EACCES, "fix the permissions", "free disk space"),
    (errno.EROFS, "read-only", "free disk space"),
    (errno.ENOSPC, "free disk space", "permissions"),
    (errno.EFBIG, "ulimit -f", "permissions"),
])
def test_os_errors_get_the_advice_of_their_errno(code, advice, not_advice):
    """message: a too-long name or a permission error was reported as 'free disk space'."""
    got = os_advice(OSError(code, os.strerror(code)))
    assert advice in got and not_advice not in got


def test_permission_error_raised_in_a_stage_gets_the_permission_advice(capsys):
    """run_stage's last resort: an OSError EACCES says permissions (as root, a real one cannot be made)."""
    def main(argv):
        raise PermissionError(errno.EACCES, "Permission denied", "data/prepared/catalog.csv")

    with pytest.raises(SystemExit) as stop:
        runner.run_stage(main, [])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "fix the permissions" in err and "disk space" not in err
