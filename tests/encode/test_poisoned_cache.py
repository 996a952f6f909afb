"""A poisoned embedding cache, refused at the root: NaN, inf, all-zero or wrong-dimension entries (another
run's, or a damaged shared cache's) get the checks of fresh vectors and are encoded again."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import image_catalog, run_in_process
from recallk.encode.batches import encode_catalog
from recallk.encode.cache import EmbeddingCache, cache_key, row_digest
from recallk.encode.registry import get_backbone


def poison(path: Path, fingerprint: str, vectors: dict[str, np.ndarray]) -> None:
    """Overwrite cache entries as another run holding the cache's key could have left them (valid digests:
    the checks of fresh vectors, not the integrity check, must refuse them)."""
    key = cache_key(path)
    rows = [(fingerprint, sha, v.size, np.asarray(v, "<f4").tobytes()) for sha, v in vectors.items()]
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.executemany("INSERT OR REPLACE INTO embedding VALUES (?, ?, ?, ?, ?)",
                       [(*row, row_digest(key, *row)) for row in rows])


BAD_VECTORS = {
    "nan": lambda dim: np.full(dim, np.nan),
    "inf": lambda dim: np.r_[np.inf, np.ones(dim - 1)],
    "zero": lambda dim: np.zeros(dim),
    "short": lambda dim: np.ones(dim - 1),
    "long": lambda dim: np.ones(dim + 7),
}


@pytest.mark.parametrize("kind", BAD_VECTORS)
def test_poisoned_cache_hits_are_encoded_again(tmp_path, kind, caplog):
    """NaN, inf, all-zero or wrong-dimension cache entries were served as they were (exit 0, a wrong
    embeddings.npy). They get the checks of fresh vectors: dropped, logged, encoded again, replaced."""
    backbone = get_backbone("pixels", {"resolution": 4})
    cat = image_catalog(tmp_path / "img", range(5))
    fresh, _, _ = encode_catalog(cat, backbone, batch_size=2, num_workers=1)
    db = tmp_path / "c.sqlite"
    with EmbeddingCache(db, backbone.fingerprint) as cache:
        encode_catalog(cat, backbone, batch_size=2, num_workers=1, cache=cache)
    poison(db, backbone.fingerprint, {cat["sha256"][1]: BAD_VECTORS[kind](backbone.dim),
                                      cat["sha256"][3]: BAD_VECTORS[kind](backbone.dim)})
    with EmbeddingCache(db, backbone.fingerprint) as cache:
        out, n_enc, n_hit = encode_catalog(cat, backbone, batch_size=2, num_workers=1, cache=cache)
        healed = cache.get_many(cat["sha256"])
    assert out.tobytes() == fresh.tobytes()
    assert (n_enc, n_hit) == (2, 3)
    assert "dropped 2 unusable cached embedding(s)" in caplog.text
    assert all(healed[sha].tobytes() == fresh[i].tobytes() for i, sha in enumerate(cat["sha256"]))


def test_cache_hits_of_a_callable_are_judged_by_a_fresh_vector(tmp_path, monkeypatch):
    """A user callable declares no dimension: every file cached with the wrong one used to come back
    as it was. One file is encoded again; its dimension judges the hits."""
    (tmp_path / "mod_integrity_mean.py").write_text(
        "import numpy as np\n"
        "def embed(images):\n    return np.array([np.asarray(i, float).mean((0, 1)) for i in images])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    backbone = get_backbone("callable:mod_integrity_mean:embed")
    cat = image_catalog(tmp_path / "img", range(4))
    fresh, _, _ = encode_catalog(cat, backbone, batch_size=3, num_workers=1)
    db = tmp_path / "c.sqlite"
    with EmbeddingCache(db, backbone.fingerprint) as cache:
        cache.put_many(cat["sha256"].tolist(), np.ones((4, 5), np.float32))  # every entry: dimension 5, not 3
    with EmbeddingCache(db, backbone.fingerprint) as cache:
        out, n_enc, n_hit = encode_catalog(cat, backbone, batch_size=3, num_workers=1, cache=cache)
    assert out.tobytes() == fresh.tobytes() and (n_enc, n_hit) == (4, 0)
    with EmbeddingCache(db, backbone.fingerprint) as cache:  # healed: now every file is served from the cache
        again, n_enc, n_hit = encode_catalog(cat, backbone, batch_size=3, num_workers=1, cache=cache)
    assert again.tobytes() == fresh.tobytes() and (n_enc, n_hit) == (1, 3)


@pytest.mark.stage
def test_encode_stage_output_does_not_depend_on_a_poisoned_cache(project, tmp_path, monkeypatch):
    monkeypatch.setenv("RECALLK_CACHE_DIR", str(tmp_path / "cache"))
    assert run_in_process("split", cwd=project).returncode == 0
    assert run_in_process("encode", cwd=project).returncode == 0
    fresh = (project / "data/embeddings/embeddings.npy").read_bytes()
    cat = pd.read_csv(project / "data/prepared/catalog.csv", dtype=str)
    backbone = get_backbone("pixels", {"resolution": 16})
    db = tmp_path / "cache" / "embeddings.sqlite"
    poison(db, backbone.fingerprint,
           {cat["sha256"][0]: np.full(backbone.dim, np.nan), cat["sha256"][1]: np.zeros(backbone.dim)})
    # issue 25's attack: 6 rows overwritten with another image's finite vector (recall@1 0.125 -> 0.375, exit 0)
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.executemany("UPDATE embedding SET vector = (SELECT vector FROM embedding WHERE sha256 = ?) "
                         "WHERE sha256 = ?", [(cat["sha256"][2], sha) for sha in cat["sha256"][3:9]])
    proc = run_in_process("encode", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert "dropped 2 unusable cached embedding(s)" in proc.stderr
    assert "ignored 6 row(s) of the embedding cache" in proc.stderr
    assert "encoded 8 images, served 192 from the cache" in proc.stderr
    assert (project / "data/embeddings/embeddings.npy").read_bytes() == fresh
