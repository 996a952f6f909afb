"""Content-addressed embedding cache: (backbone fingerprint, image sha256) -> float32 vector.

One SQLite file outside the DVC outs, shared by every run on the machine:

* Only content and the backbone fingerprint form the key, so a split change,
  a renamed file or an added image never re-encodes what was already encoded.
* Each batch is committed in one transaction: a run killed midway (even by
  SIGKILL) keeps every finished batch and never leaves a half-written entry.
* SQLite's own locking serialises concurrent writers (two ``dvc repro`` at once).

The location is ``$RECALLK_CACHE_DIR/embeddings.sqlite`` (a relative path is read from the
stage's working directory), by default a per-user folder shared by every workspace, queued or
temporary experiment (``dvc exp run --queue`` / ``--temp`` run in a copy of the workspace) and
Ray worker on the machine, as the Hugging Face and torch hub caches are:
``$XDG_CACHE_HOME/recallk`` when ``XDG_CACHE_HOME`` is an absolute path, else
``~/.cache/recallk``. Concurrent writers are safe: WAL journal, one ``BEGIN IMMEDIATE``
transaction per batch, a 600 s busy timeout, and the file's set-up retried while another
process creates it. Deleting it is always safe: it only costs
re-encoding.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from recallk.errors import InputError, sqlite_advice

_CHUNK = 500  # keys per SELECT, well under SQLite's variable limit
#: How long a connection waits for another writer (SQLite's busy timeout, and the set-up's retries).
_BUSY_SECONDS = 600


def _set_up(db: sqlite3.Connection) -> None:
    """WAL journal and the table, retried while another process holds the lock: two processes creating the
    file at once can get "database is locked" at once, without SQLite's busy timeout (switching the journal
    mode, or a read lock upgraded to a write lock, is refused immediately to avoid a deadlock)."""
    deadline, pause = time.monotonic() + _BUSY_SECONDS, 0.01
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS embedding (fingerprint TEXT NOT NULL, sha256 TEXT NOT NULL, "
                       "dim INTEGER NOT NULL, vector BLOB NOT NULL, PRIMARY KEY (fingerprint, sha256))")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(pause)
            pause = min(2 * pause, 0.5)


def default_dir() -> Path:
    """The cache folder: ``$RECALLK_CACHE_DIR``, else ``$XDG_CACHE_HOME/recallk`` (an absolute
    ``XDG_CACHE_HOME`` only, as the XDG spec says), else ``~/.cache/recallk``: one per user, shared by
    every workspace and experiment on the machine."""
    chosen = os.environ.get("RECALLK_CACHE_DIR")
    if chosen:
        return Path(chosen)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache") / "recallk"


def default_path() -> Path:
    """The cache file, ``embeddings.sqlite`` in :func:`default_dir`."""
    return default_dir() / "embeddings.sqlite"


class EmbeddingCache:
    """Embeddings of one backbone (``fingerprint``), keyed by image sha256."""

    def __init__(self, path: str | os.PathLike, fingerprint: str):
        self.path = Path(path)
        self.fingerprint = fingerprint
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=_BUSY_SECONDS, isolation_level=None)
            _set_up(self._db)
        except (OSError, sqlite3.Error) as exc:
            raise InputError(f"cannot open the embedding cache {str(self.path)!r} ({exc}); delete it or set "
                            "RECALLK_CACHE_DIR to a writable folder.") from None

    def get_many(self, shas: Iterable[str]) -> dict[str, np.ndarray]:
        """Return the cached vectors among ``shas`` (entries of the wrong size are ignored)."""
        found: dict[str, np.ndarray] = {}
        keys = list(dict.fromkeys(shas))
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start:start + _CHUNK]
            rows = self._db.execute(
                f"SELECT sha256, dim, vector FROM embedding WHERE fingerprint = ? AND sha256 IN "
                f"({','.join('?' * len(chunk))})", [self.fingerprint, *chunk])
            for sha, dim, blob in rows:
                if len(blob) == 4 * dim:
                    found[sha] = np.frombuffer(blob, dtype="<f4")
        return found

    def put_many(self, shas: Sequence[str], vectors: np.ndarray) -> None:
        """Store ``vectors[i]`` for ``shas[i]`` in one transaction."""
        vectors = np.ascontiguousarray(vectors, dtype="<f4")
        try:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT OR REPLACE INTO embedding VALUES (?, ?, ?, ?)",
                    [(self.fingerprint, sha, vectors.shape[1], vectors[i].tobytes()) for i, sha in enumerate(shas)])
        except sqlite3.Error as exc:
            raise InputError(f"cannot write the embedding cache {str(self.path)!r} ({exc}); to fix: "
                             f"{sqlite_advice(exc)}, then re-run.") from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "EmbeddingCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
