"""recallk.encode.cache: the content-addressed embedding cache, and encode_catalog with a cache."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import sqlite3

import numpy as np
import pandas as pd

from helpers import image_catalog
from recallk.encode.batches import encode_catalog
from recallk.encode.cache import EmbeddingCache, row_digest
from recallk.encode.registry import get_backbone

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

