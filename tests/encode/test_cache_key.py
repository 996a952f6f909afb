"""Issue 39, the embedding cache's key file (``embeddings.key``, the cache's trust boundary): a regular file or a
refusal, never a blocking read (a FIFO there hung every encode using the folder), and a warning when its group
or other users can read it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import ENCODE_OUTPUTS, assert_no_outputs, assert_user_error, run_ok, tiny_project
from recallk.encode import cache as cache_mod
from recallk.encode.cache import EmbeddingCache
from recallk.errors import InputError

FP = "fp-a"


def test_a_fifo_as_the_key_is_refused_at_once(tmp_path) -> None:
    # In a subprocess with a timeout: before the fix, reading the FIFO blocked for good (no writer ever came).
    db = tmp_path / "embeddings.sqlite"
    os.mkfifo(db.with_suffix(".key"))
    code = textwrap.dedent(f"""
        from recallk.encode.cache import EmbeddingCache
        from recallk.errors import InputError
        try:
            EmbeddingCache({str(db)!r}, "fp")
        except InputError as exc:
            print(exc)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    with pytest.raises(InputError, match=r"key file '.*embeddings\.key' is a FIFO \(named pipe\), not a regular "
                                         r"file; delete it and '.*embeddings\.sqlite' \(that only costs re-encoding\)"):
        raise InputError(proc.stdout.strip())


@pytest.mark.stage
def test_the_encode_stage_refuses_a_fifo_key_in_one_line(tmp_path, embedding_cache) -> None:
    # The whole stage, in a subprocess with a timeout (it hung before): one error line, exit 2, no output.
    proj = tiny_project(tmp_path)
    run_ok(proj, "split")
    embedding_cache.mkdir(parents=True, exist_ok=True)
    os.mkfifo(embedding_cache / "embeddings.key")
    proc = subprocess.run([sys.executable, "-m", "stages.encode"], cwd=proj, capture_output=True, text=True,
                          timeout=300)
    assert_user_error(proc, "embeddings.key' is a FIFO (named pipe), not a regular file; delete it")
    assert_no_outputs(proj, ENCODE_OUTPUTS)


@pytest.mark.parametrize("make, said", [
    (lambda key: key.mkdir(), "is a folder, not a regular file"),  # a folder where the key belongs
    (lambda key: key.symlink_to("/dev/zero"), "is a character device, not a regular file"),  # an endless read
    (lambda key: key.symlink_to(key.parent / "nowhere"), r"cannot read the embedding cache's key file .*No such "
                                                          r"file or directory\); delete it"),  # a dangling link
    (lambda key: key.write_bytes(b"k" * 4096), "holds more than 32 bytes, not 32"),  # read no further than 33
])
def test_a_key_that_is_no_key_file_is_one_error(tmp_path, make, said) -> None:
    db = tmp_path / "embeddings.sqlite"
    make(db.with_suffix(".key"))
    with pytest.raises(InputError, match=said):
        EmbeddingCache(db, FP)


@pytest.mark.parametrize("mode, who", [
    (0o600, None),  # the mode the cache makes: no warning
    (0o400, None),  # read-only for its owner: no warning
    (0o620, None),  # group-writable but not readable: no one else learns the key
    (0o640, "its group can read it"),  # group-readable
    (0o604, "every user can read it"),  # world-readable
    (0o644, "its group and every user can read it"),  # the usual umask's mode, e.g. a key copied by hand
])
def test_a_key_others_can_read_is_used_with_a_warning(tmp_path, caplog, mode, who) -> None:
    db = tmp_path / "embeddings.sqlite"
    with EmbeddingCache(db, FP) as cache:
        key = cache.key
    assert (db.with_suffix(".key").stat().st_mode & 0o777) == 0o600  # made private
    db.with_suffix(".key").chmod(mode)
    with caplog.at_level(logging.WARNING, logger=cache_mod.__name__):
        with EmbeddingCache(db, FP) as cache:
            assert cache.key == key  # used all the same
        with EmbeddingCache(db, FP):
            pass  # opened again: warned once
    warnings = [r.getMessage() for r in caplog.records if "key file" in r.getMessage()]
    if who is None:
        assert warnings == []
    else:
        assert len(warnings) == 1, warnings
        assert f"has mode {mode:04o}: {who}" in warnings[0] and f"`chmod 600 {db.with_suffix('.key')}`" in warnings[0]
