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
import warnings
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


# ---------------------------------------------------------------- warnings, one line each (issue 38)
# A library warning was printed as Python prints it: `stages/score.py:105: UserWarning: ...` and the code line.


def test_a_library_warning_in_a_stage_run_is_one_line(scored_project: Path) -> None:
    """The real stderr of `python -m stages.score` with a K above the gallery: one `warning:` line, no source
    line, no category, no code."""
    set_params(scored_project, {"score.ks": [1, 5000]})
    proc = _stage(scored_project, "score", tool_env(RECALLK_CACHE_DIR=str(scored_project / ".cache" / "recallk")))
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "5000" in line]
    assert len(said) == 1 and said[0].startswith("warning: K = 5000 is larger than every query's gallery"), proc.stderr
    assert "UserWarning" not in proc.stderr and "score.py:" not in proc.stderr and "score_split(" not in proc.stderr


def test_run_stage_names_the_origin_of_another_package_s_warning_and_restores_showwarning(capsys) -> None:
    """Ours: the message alone; another package's (Pillow, torch): on the same one line, its category and where.
    Outside run_stage, Python's own warnings are back (the library API warns as ever)."""
    before = warnings.showwarning

    def main(argv):
        warnings.warn_explicit("K = 9 is larger than every query's gallery", UserWarning, runner.__file__, 1)
        warnings.warn_explicit("Corrupt EXIF data", UserWarning, "/venv/site-packages/PIL/TiffImagePlugin.py", 9)

    runner.run_stage(main, [])
    assert capsys.readouterr().err.splitlines() == [
        "warning: K = 9 is larger than every query's gallery",
        "warning: Corrupt EXIF data (UserWarning from /venv/site-packages/PIL/TiffImagePlugin.py:9)"]
    assert warnings.showwarning is before
    with pytest.warns(UserWarning, match="larger than every query's gallery"):
        from recallk import retrieval_metrics
        retrieval_metrics([[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], [0], [0, 1], ks=[1, 5])
