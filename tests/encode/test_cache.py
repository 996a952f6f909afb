"""recallk.encode.cache: the content-addressed embedding cache, and encode_catalog with a cache."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import image_catalog, save_image
from recallk.encode import verify
from recallk.encode.batches import encode_catalog
from recallk.encode.cache import EmbeddingCache, cache_key, row_digest
from recallk.encode.registry import get_backbone
from recallk.errors import InputError

FP = "fp-a"


def _vectors(n, dim=5, seed=0):
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def _sha(i):
    return hashlib.sha256(str(i).encode()).hexdigest()


def _counting(resolution=4):
    """The pixels backbone, recording how many images it was asked to encode."""
    base, seen = get_backbone("pixels", {"resolution": resolution}), []

    def encode(imgs):
        seen.append(len(imgs))
        return base.encode(imgs)

    return dataclasses.replace(base, encode=encode), seen


# --- EmbeddingCache -----------------------------------------------------------------------------------------------

def test_cache_round_trip_is_byte_exact_and_survives_reopening(tmp_path):
    vecs = _vectors(4)
    vecs[0, 0] = np.float32(1e-45)  # a subnormal survives too
    with EmbeddingCache(tmp_path / "c.sqlite", FP) as cache:
        cache.put_many([_sha(i) for i in range(4)], vecs)
    with EmbeddingCache(tmp_path / "c.sqlite", FP) as cache:
        got = cache.get_many([_sha(i) for i in range(5)])  # _sha(4) was never stored
    assert sorted(got) == sorted(_sha(i) for i in range(4))
    for i in range(4):
        assert got[_sha(i)].dtype == np.float32 and got[_sha(i)].tobytes() == vecs[i].tobytes()


def test_cache_entries_of_another_fingerprint_are_invisible(tmp_path):
    with EmbeddingCache(tmp_path / "c.sqlite", FP) as cache:
        cache.put_many([_sha(0)], _vectors(1))
    with EmbeddingCache(tmp_path / "c.sqlite", "fp-b") as other:
        assert other.get_many([_sha(0)]) == {}


def test_cache_ignores_a_blob_of_the_wrong_length(tmp_path):
    path = tmp_path / "c.sqlite"
    with EmbeddingCache(path, FP) as cache:
        cache.put_many([_sha(0)], _vectors(1))
        blob = np.ones(3, "<f4").tobytes()
        digest = row_digest(cache.key, FP, _sha(1), 5, blob)  # a valid digest: the length check alone refuses it
    with contextlib.closing(sqlite3.connect(path)) as db, db:  # dim 5 but only 3 floats: a damaged entry
        db.execute("INSERT INTO embedding VALUES (?, ?, ?, ?, ?)", (FP, _sha(1), 5, blob, digest))
    with EmbeddingCache(path, FP) as cache:
        assert list(cache.get_many([_sha(0), _sha(1)])) == [_sha(0)]


def test_cache_get_many_chunks_beyond_500_keys(tmp_path):
    n = 1234
    vecs = _vectors(n, dim=3)
    with EmbeddingCache(tmp_path / "c.sqlite", FP) as cache:
        cache.put_many([_sha(i) for i in range(n)], vecs)
        got = cache.get_many([_sha(i) for i in range(n + 10)] + [_sha(0)])  # repeated key too
    assert len(got) == n
    np.testing.assert_array_equal(np.stack([got[_sha(i)] for i in range(n)]), vecs)


# --- encode_catalog with a cache -------------------------------------------------------------------------------

def test_encode_catalog_encodes_each_file_once(tmp_path):
    # verify_cache=0: only the encodes of misses are counted here (test_cache_trust.py counts the sample's)
    backbone, seen = _counting()
    cat6 = image_catalog(tmp_path, range(6))
    with EmbeddingCache(tmp_path / "c.sqlite", backbone.fingerprint) as cache:
        first, n_enc, n_hit = encode_catalog(cat6, backbone, batch_size=4, num_workers=2, cache=cache, verify_cache=0)
        assert (n_enc, n_hit, sum(seen)) == (6, 0, 6)
        again, n_enc, n_hit = encode_catalog(cat6, backbone, batch_size=4, num_workers=2, cache=cache, verify_cache=0)
        assert (n_enc, n_hit, sum(seen)) == (0, 6, 6)
        assert again.dtype == np.float32 and again.tobytes() == first.tobytes()
        cat8 = pd.concat([cat6, image_catalog(tmp_path, [100, 101], prefix="new")], ignore_index=True)
        grown, n_enc, n_hit = encode_catalog(cat8.sample(frac=1, random_state=0), backbone, batch_size=4,
                                             num_workers=2, cache=cache, verify_cache=0)
        assert (n_enc, n_hit, sum(seen)) == (2, 6, 8)
    uncached, _, _ = encode_catalog(cat8.sample(frac=1, random_state=0), get_backbone("pixels", {"resolution": 4}),
                                    batch_size=3, num_workers=1)
    assert grown.tobytes() == uncached.tobytes()


def test_encode_catalog_identical_files_are_encoded_once(tmp_path):
    backbone, seen = _counting()
    cat = image_catalog(tmp_path, [7, 8, 7])  # rows 0 and 2: same content, different files and ids
    with EmbeddingCache(tmp_path / "c.sqlite", backbone.fingerprint) as cache:
        out, n_enc, n_hit = encode_catalog(cat, backbone, batch_size=8, num_workers=1, cache=cache)
    assert (n_enc, n_hit, sum(seen)) == (2, 0, 2)
    np.testing.assert_array_equal(out[0], out[2])
    assert not np.array_equal(out[0], out[1])


# --- what a warm cache may serve (issue 25) --------------------------------------------------------------------
# Moved from the hostile corpus (test_hostile_cache.py); classes: `silent` (a wrong number with exit 0),
# `traceback` (a user error that ended in a traceback), `message` (a message that blamed the wrong thing or said
# nothing). Every case failed before; each runs encode_catalog, the encode stage's, on real PNG files and a
# real SQLite cache.


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
