"""Hostile corpus, part 3 (issue 25): the embedding cache and what the encode stage trusts.

Classes, as in test_hostile_messages.py: ``silent`` (a wrong number with exit 0), ``traceback`` (a user
error that ended in a traceback), ``message`` (a message that blamed the wrong thing or said nothing).
Every case failed on the code before this file and passes after. Most run the library function the
encode stage calls (:func:`recallk.encode.batches.encode_catalog`) on real PNG files and a real SQLite
cache; the Ctrl-C case runs the real stage and sends it a real SIGINT.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import image_catalog, run_module, save_image, set_params, tiny_project
from recallk.encode import verify
from recallk.encode.batches import encode_catalog
from recallk.encode.cache import EmbeddingCache, cache_key, row_digest
from recallk.encode.precomputed import align
from recallk.encode.registry import get_backbone
from recallk.errors import InputError


def backbone():
    return get_backbone("pixels", {"resolution": 4})


def warm(tmp_path: Path, n: int = 6) -> tuple[pd.DataFrame, Path, np.ndarray]:
    """A catalog of ``n`` random 12 x 12 PNGs, every one in a fresh cache; returns the catalog, the cache
    file and the embeddings of a run without a cache."""
    cat = image_catalog(tmp_path / "img", range(n))
    db = tmp_path / "cache" / "embeddings.sqlite"
    with EmbeddingCache(db, backbone().fingerprint) as cache:
        fresh, _, _ = encode_catalog(cat, backbone(), batch_size=4, num_workers=1, cache=cache)
    return cat, db, fresh


def rerun(cat: pd.DataFrame, db: Path, verify_cache: int = 0) -> tuple[np.ndarray, int, int]:
    with EmbeddingCache(db, backbone().fingerprint) as cache:
        return encode_catalog(cat, backbone(), batch_size=4, num_workers=1, cache=cache, verify_cache=verify_cache)


def sql(db: Path, statement: str, *args: object) -> None:
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(statement, args)


# ==================================================================== silent: a warm cache served vanished content

def _edit(paths: list[Path]) -> None:
    save_image(paths[1], seed=99)  # new pixels, same name and size


def _delete(paths: list[Path]) -> None:
    paths[1].unlink()


def _swap(paths: list[Path]) -> None:  # two files of the same size trade contents
    a, b = paths[1].read_bytes(), paths[2].read_bytes()
    paths[1].write_bytes(b)
    paths[2].write_bytes(a)


def _truncate(paths: list[Path]) -> None:  # sibling: half a file (a copy cut short)
    paths[1].write_bytes(paths[1].read_bytes()[:40])


@pytest.mark.parametrize("change, named", [
    (_edit, ["id1"]),            # edited after split: its old vector was served, exit 0
    (_delete, ["id1"]),          # deleted after split: served, exit 0
    (_swap, ["id1", "id2"]),     # swapped with an image of the same size: both served, exit 0
    (_truncate, ["id1"]),        # sibling: cut short
])
def test_a_changed_file_is_refused_even_when_every_image_is_cached(tmp_path, change, named):
    cat, db, _ = warm(tmp_path)
    change([Path(p) for p in cat["path"]])
    with pytest.raises(InputError, match=r"changed, moved or deleted since the catalog was built") as info:
        rerun(cat, db)
    for name in named:
        assert f"{name} (" in str(info.value)
    assert "id0 (" not in str(info.value)


def test_a_changed_second_copy_of_an_encoded_file_is_refused(tmp_path):
    # sibling: two paths of one content, the first a cache miss: only the first was ever read
    cat = image_catalog(tmp_path / "img", [5, 5])
    save_image(Path(cat["path"][1]), seed=6)
    with EmbeddingCache(tmp_path / "c.sqlite", backbone().fingerprint) as cache, \
            pytest.raises(InputError, match=r"1 image\(s\) changed.*id1 \("):
        encode_catalog(cat, backbone(), batch_size=4, num_workers=1, cache=cache)


# ==================================================================== silent: a poisoned cache row was served

def _other_vector(db: Path, cat: pd.DataFrame) -> None:
    # the attack: another image's finite vector written over rows, the digest column left alone
    sql(db, "UPDATE embedding SET vector = (SELECT vector FROM embedding WHERE sha256 = ?) WHERE sha256 = ?",
        cat["sha256"][0], cat["sha256"][1])


def _swap_rows(db: Path, cat: pd.DataFrame) -> None:  # sibling: vector and digest copied together
    sql(db, "UPDATE embedding SET (vector, digest) = (SELECT vector, digest FROM embedding WHERE sha256 = ?) "
            "WHERE sha256 = ?", cat["sha256"][0], cat["sha256"][1])


def _flip_byte(db: Path, cat: pd.DataFrame) -> None:  # sibling: one flipped byte (a damaged page)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        row = conn.execute("SELECT vector FROM embedding WHERE sha256 = ?", (cat["sha256"][1],)).fetchone()
    blob = bytearray(row[0])
    blob[5] ^= 0x10
    sql(db, "UPDATE embedding SET vector = ? WHERE sha256 = ?", bytes(blob), cat["sha256"][1])


def _old_writer(db: Path, cat: pd.DataFrame) -> None:  # sibling: a stale writer (no digest, as recallk wrote before)
    sql(db, "UPDATE embedding SET vector = (SELECT vector FROM embedding WHERE sha256 = ?), digest = NULL "
            "WHERE sha256 = ?", cat["sha256"][0], cat["sha256"][1])


def _foreign_key(db: Path, cat: pd.DataFrame) -> None:  # sibling: a writer without this cache's key
    vector = np.ones(48, "<f4").tobytes()
    sql(db, "UPDATE embedding SET vector = ?, digest = ? WHERE sha256 = ?", vector,
        row_digest(b"k" * 32, backbone().fingerprint, cat["sha256"][1], 48, vector), cat["sha256"][1])


@pytest.mark.parametrize("poison", [_other_vector, _swap_rows, _flip_byte, _old_writer, _foreign_key])
def test_a_row_failing_its_integrity_check_is_encoded_again(tmp_path, poison, caplog):
    cat, db, fresh = warm(tmp_path)
    poison(db, cat)
    out, n_enc, n_hit = rerun(cat, db)
    assert out.tobytes() == fresh.tobytes() and (n_enc, n_hit) == (1, 5)
    assert "ignored 1 row(s) of the embedding cache" in caplog.text
    assert rerun(cat, db)[1:] == (0, 6)  # healed: the row was replaced


def _forge_with_the_key(db: Path, cat: pd.DataFrame, sha: str, vector: np.ndarray) -> None:
    """What only someone who can read the key can do: a row with a valid digest and a wrong vector."""
    blob = np.asarray(vector, "<f4").tobytes()
    sql(db, "UPDATE embedding SET vector = ?, digest = ? WHERE sha256 = ?", blob,
        row_digest(cache_key(db), backbone().fingerprint, sha, len(blob) // 4, blob), sha)


def test_the_verification_sample_catches_a_forged_row(tmp_path):
    cat, db, fresh = warm(tmp_path)
    _forge_with_the_key(db, cat, cat["sha256"][3], fresh[0])  # another image's vector, a valid digest
    assert rerun(cat, db, verify_cache=0)[0][3].tobytes() == fresh[0].tobytes()  # the documented limit: off
    with pytest.raises(InputError, match=r"served 1 of 6 sampled vectors unlike a fresh encoding .*id3\.png"):
        rerun(cat, db, verify_cache=6)


def test_the_verification_sample_tolerates_float_noise(tmp_path):
    cat, db, fresh = warm(tmp_path)
    _forge_with_the_key(db, cat, cat["sha256"][2], fresh[2] * np.float32(1 + 1e-5))  # noise, not another image
    assert rerun(cat, db, verify_cache=6)[1:] == (0, 6)


def test_the_verification_sample_is_deterministic_and_keyed():
    shas = [f"{i:064x}" for i in range(50)]
    picked = verify.sample(shas, b"a" * 32, 5)
    assert picked == verify.sample(shas[::-1], b"a" * 32, 5)  # the catalog's order does not matter
    assert len(set(picked)) == 5 and set(picked) <= set(shas)
    assert picked != verify.sample(shas, b"b" * 32, 5)  # another key, another sample (50 choose 5 orders)


# ==================================================================== traceback: a vector stored as text

@pytest.mark.parametrize("column, value", [
    ("vector", "0.5 0.5 0.5"),  # TypeError in np.frombuffer before
    ("dim", "forty-eight"),     # sibling: the dimension as text
    ("digest", "abc"),          # sibling: the digest as text
])
def test_a_row_stored_as_text_is_an_unusable_row(tmp_path, column, value, caplog):
    cat, db, fresh = warm(tmp_path)
    sql(db, f"UPDATE embedding SET {column} = ? WHERE sha256 = ?", value, cat["sha256"][2])
    out, n_enc, _ = rerun(cat, db)
    assert out.tobytes() == fresh.tobytes() and n_enc == 1
    assert "fail their integrity check" in caplog.text


# ==================================================================== message: a cache file that is no cache

def _scramble_pages(db: Path) -> None:
    data = bytearray(db.read_bytes())
    rng = np.random.default_rng(0)
    data[4096:] = rng.integers(0, 256, len(data) - 4096, dtype=np.uint8).tobytes()  # page 1 (the header) intact
    db.write_bytes(bytes(data))


@pytest.mark.parametrize("make, said", [
    (lambda db: sql(db, "CREATE TABLE embedding (key TEXT, value BLOB)"),  # another program's table
     "is not a recallk embedding cache: its table `embedding` has columns ['key', 'value']"),
    (lambda db: db.write_bytes(os.urandom(8192)), "is damaged or not an SQLite database"),  # not a database
    (_scramble_pages, "is damaged or not an SQLite database"),  # scrambled pages: "last committed batch is intact"
])
def test_a_cache_file_that_is_no_cache_says_what_is_wrong(tmp_path, make, said):
    cat = image_catalog(tmp_path / "img", range(40))
    db = tmp_path / "embeddings.sqlite"
    if make is _scramble_pages:
        with EmbeddingCache(db, "fp") as cache:
            cache.put_many([f"{i:064x}" for i in range(400)], np.ones((400, 48), np.float32))
        with contextlib.closing(sqlite3.connect(db)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    make(db)
    with pytest.raises(InputError, match="delete it") as info:
        with EmbeddingCache(db, backbone().fingerprint) as cache:
            cache.get_many([f"{i:064x}" for i in range(400)] + cat["sha256"].tolist())
    assert said in str(info.value) and "free disk space" not in str(info.value)


def test_a_damaged_key_file_says_so(tmp_path):
    cat, db, _ = warm(tmp_path)
    db.with_suffix(".key").write_bytes(b"short")
    with pytest.raises(InputError, match=r"key file .* holds 5 bytes, not 32"):
        rerun(cat, db)


def test_a_format_1_cache_gains_the_digest_column_and_is_re_encoded(tmp_path):
    # sibling of the layout case: a cache written by recallk before the digest is no error, only untrusted
    cat = image_catalog(tmp_path / "img", range(3))
    db = tmp_path / "embeddings.sqlite"
    sql(db, "CREATE TABLE embedding (fingerprint TEXT NOT NULL, sha256 TEXT NOT NULL, dim INTEGER NOT NULL, "
            "vector BLOB NOT NULL, PRIMARY KEY (fingerprint, sha256))")
    for sha in cat["sha256"]:
        sql(db, "INSERT INTO embedding VALUES (?, ?, ?, ?)", backbone().fingerprint, sha, 48,
            np.ones(48, "<f4").tobytes())
    assert rerun(cat, db)[1:] == (3, 0)
    assert rerun(cat, db)[1:] == (0, 3)


# ==================================================================== traceback: byte-string ids in an .npz

def test_byte_string_ids_that_are_not_utf8_are_named():
    with pytest.raises(InputError, match=r"x\.npz: id 1 is the byte string b'b\\xff', which is not UTF-8"):
        align(np.array([b"a", b"b\xff"]), np.ones((2, 3)), ["a"], source="x.npz")  # UnicodeDecodeError before


def test_utf8_byte_string_ids_are_decoded():
    # sibling: numpy's own cast decoded ASCII only, so a UTF-8 id failed as well
    out = align(np.array(["é".encode(), b"a"]), np.eye(2), ["a", "é"], source="x.npz")
    assert out.tolist() == [[0, 1], [1, 0]]


# ==================================================================== message: Ctrl-C in encode said nothing

SIGINT_AFTER_ONE_BATCH = """
import os, signal
import numpy as np
calls = []
def embed(images):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C during the second batch
    return np.array([np.asarray(i, float).mean((0, 1)) + 1 for i in images])
"""


@pytest.mark.stage
def test_ctrl_c_in_encode_says_what_is_cached_and_that_a_rerun_resumes(tmp_path):
    proj = tiny_project(tmp_path)
    assert run_module("stages.split", cwd=proj).returncode == 0
    (proj / "sigint_enc.py").write_text(SIGINT_AFTER_ONE_BATCH)
    set_params(proj, {"encode.backbone": "callable:sigint_enc:embed", "encode.callable.module_file": "sigint_enc.py",
                      "encode.batch_size": 4})
    proc = run_module("stages.encode", cwd=proj)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "error: interrupted (Ctrl-C) while encoding with 'sigint_enc:embed': 4 of the 12 distinct images are " \
           "in the embedding cache" in proc.stderr
    assert "a re-run resumes from them; no output was written." in proc.stderr
    assert not (proj / "data" / "embeddings" / "embeddings.npy").exists()
