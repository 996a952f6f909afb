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

Integrity (the trust boundary, docs/backbones.md#the-embedding-cache): every row carries an HMAC-SHA256
(:func:`row_digest`) over the format version, the backbone fingerprint, the image sha256, the dimension and
the vector bytes, keyed by a random per-cache secret in ``embeddings.key`` beside the file (created once,
mode 0600; anything but a regular file there is refused, and a key others can read is used with a warning).
A row whose digest does not match (a flipped byte, a vector stored as text, a row written by an older
recallk or by anyone who cannot read the key) is not served: it is encoded again and replaced.
Whoever can read the key and write the file can still forge a row; the encode stage's sample check
(``encode.verify_cache``, :mod:`recallk.encode.verify`) re-encodes a sample of hits to catch that too.
A file that is not a cache (another table layout) or whose pages are damaged is an InputError saying so.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import sqlite3
import stat
import tempfile
import time
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from recallk.errors import InputError, quote, sqlite_advice

log = logging.getLogger(__name__)
_CHUNK = 500  # keys per SELECT, well under SQLite's variable limit
#: How long a connection waits for another writer (SQLite's busy timeout, and the set-up's retries).
_BUSY_SECONDS = 600
#: The row format the digest covers: rows of another format (an older recallk's) are never trusted.
FORMAT = b"recallk-embedding-cache-v2"
#: The table's columns; ``digest`` was added in format 2 (an older file gets the column, its rows untrusted).
COLUMNS = ("fingerprint", "sha256", "dim", "vector", "digest")
#: SQLite's codes for a file that is not a database or whose pages are damaged.
_DAMAGED_CODES = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB
_DELETE = "delete it (that only costs re-encoding) or set RECALLK_CACHE_DIR to another folder"


def row_digest(key: bytes, fingerprint: str, sha256: str, dim: int, vector: bytes) -> bytes:
    """HMAC-SHA256 under ``key`` of :data:`FORMAT`, the fingerprint, the image sha256, the dimension and
    the vector's bytes (little-endian float32): the integrity check of one cache row."""
    msg = b"\0".join([FORMAT, fingerprint.encode(), sha256.encode(), str(dim).encode(), vector])
    return hmac.new(key, msg, hashlib.sha256).digest()


def damaged(path: Path, exc: sqlite3.Error) -> InputError | None:
    """The InputError for a cache file that is not a database or has damaged pages, else None."""
    code = getattr(exc, "sqlite_errorcode", None)
    if not isinstance(code, int) or code & 0xFF not in _DAMAGED_CODES:
        return None
    return InputError(f"the embedding cache {quote(str(path))} is damaged or not an SQLite database ({exc}); "
                      f"{_DELETE}.")


def cache_key(path: Path) -> bytes:
    """The secret of the cache at ``path``: 32 random bytes in ``<path>.key`` (``embeddings.key``), created
    once with mode 0600 (written to a temporary file, then linked into place, so two processes starting
    at once agree on one key). It must be a regular file (:func:`read_key`: a FIFO there is refused, not read,
    which would block); a key its group or other users can read is used with a warning naming the mode and
    ``chmod 600``."""
    key_file = path.with_suffix(".key")
    if not os.path.lexists(key_file):
        fd, tmp = tempfile.mkstemp(dir=key_file.parent, prefix=".key.")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(32))
            try:
                os.link(tmp, key_file)
            except FileExistsError:
                pass  # another process made it first: use that one
        finally:
            os.unlink(tmp)
    key, mode = read_key(key_file, path)
    if len(key) != 32:
        held = "more than 32" if len(key) > 32 else str(len(key))
        raise InputError(f"the embedding cache's key file {quote(str(key_file))} holds {held} bytes, not 32 "
                         f"(damaged); delete it and {quote(str(path))} (that only costs re-encoding).")
    if os.name == "posix" and mode & 0o044 and (str(key_file), mode) not in _WARNED:  # Windows has no such bits
        _WARNED.add((str(key_file), mode))
        who = " and ".join(w for w, bit in (("its group", 0o040), ("every user", 0o004)) if mode & bit)
        log.warning("the embedding cache's key file %s has mode %04o: %s can read it, and whoever can read the key "
                    "and write the cache can forge cached embeddings; run `chmod 600 %s` (the key is the cache's "
                    "trust boundary, docs/backbones.md#the-embedding-cache)", key_file, mode, who, key_file)
    return key


#: (key file, mode) pairs already warned about in this process: one warning per cache, not one per opening.
_WARNED: set[tuple[str, int]] = set()
#: What a key file that is not a regular file is, by its type bits (for the refusal).
_NOT_REGULAR = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFDIR: "a folder", stat.S_IFCHR: "a character device",
                stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def read_key(key_file: Path, path: Path) -> tuple[bytes, int]:
    """The first 33 bytes of ``key_file`` (enough to tell a 32-byte key from a longer file) and its permission
    bits; InputError when it is not a regular file (a FIFO, a folder, a device: opened without blocking and
    refused, never read) or cannot be opened."""
    try:
        fd = os.open(key_file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"cannot read the embedding cache's key file {quote(str(key_file))} ({exc.strerror}); "
                         f"delete it and {quote(str(path))} (that only costs re-encoding) or set RECALLK_CACHE_DIR "
                         "to another folder.") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            what = _NOT_REGULAR.get(stat.S_IFMT(info.st_mode), "not a regular file")
            raise InputError(f"the embedding cache's key file {quote(str(key_file))} is {what}, not a regular file; "
                             f"delete it and {quote(str(path))} (that only costs re-encoding): the next run makes a "
                             "new key.")
        chunks, size = [], 0
        while size < 33 and (chunk := os.read(fd, 33 - size)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks), stat.S_IMODE(info.st_mode)


def _check_layout(db: sqlite3.Connection, path: Path) -> None:
    """Add the ``digest`` column to a format-1 table; refuse a table ``embedding`` of any other layout."""
    columns = [row[1] for row in db.execute("PRAGMA table_info(embedding)")]
    if columns == list(COLUMNS[:4]):
        try:
            db.execute("ALTER TABLE embedding ADD COLUMN digest BLOB")
        except sqlite3.OperationalError as exc:  # another process added it meanwhile
            if "duplicate column" not in str(exc):
                raise
    elif columns != list(COLUMNS):
        raise InputError(f"{quote(str(path))} is not a recallk embedding cache: its table `embedding` has columns "
                         f"{quote(columns)}, not {quote(list(COLUMNS))}; {_DELETE}.")


def _set_up(db: sqlite3.Connection) -> None:
    """WAL journal and the table, retried while another process holds the lock: two processes creating the
    file at once can get "database is locked" at once, without SQLite's busy timeout (switching the journal
    mode, or a read lock upgraded to a write lock, is refused immediately to avoid a deadlock)."""
    deadline, pause = time.monotonic() + _BUSY_SECONDS, 0.01
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS embedding (fingerprint TEXT NOT NULL, sha256 TEXT NOT NULL, "
                       "dim INTEGER NOT NULL, vector BLOB NOT NULL, digest BLOB, PRIMARY KEY (fingerprint, sha256))")
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
        #: Rows the last :meth:`get_many` left out for failing their integrity check.
        self.untrusted = 0
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a new folder: only its owner writes
            self._db = sqlite3.connect(self.path, timeout=_BUSY_SECONDS, isolation_level=None)
            _set_up(self._db)
            _check_layout(self._db, self.path)
            self._key = cache_key(self.path)
        except sqlite3.DatabaseError as exc:
            raise damaged(self.path, exc) or InputError(
                f"cannot open the embedding cache {str(self.path)!r} ({exc}); delete it or set "
                "RECALLK_CACHE_DIR to a writable folder.") from None
        except OSError as exc:
            raise InputError(f"cannot open the embedding cache {str(self.path)!r} ({exc}); delete it or set "
                            "RECALLK_CACHE_DIR to a writable folder.") from None

    def get_many(self, shas: Iterable[str]) -> dict[str, np.ndarray]:
        """Return the cached vectors among ``shas``.

        A row is served only if it is well formed (an integer dimension, a blob of 4 bytes per value) and
        its digest (:func:`row_digest`) matches; other rows (damaged, stored as text, written by an older
        recallk or without this cache's key) are left out, counted in :attr:`untrusted` and logged once,
        so they are encoded again and replaced.
        """
        found: dict[str, np.ndarray] = {}
        untrusted = 0
        keys = list(dict.fromkeys(shas))
        try:
            for start in range(0, len(keys), _CHUNK):
                chunk = keys[start:start + _CHUNK]
                rows = self._db.execute(
                    f"SELECT sha256, dim, vector, digest FROM embedding WHERE fingerprint = ? AND sha256 IN "
                    f"({','.join('?' * len(chunk))})", [self.fingerprint, *chunk])
                for sha, dim, blob, digest in rows:
                    if (isinstance(blob, bytes) and isinstance(dim, int) and isinstance(digest, bytes)
                            and len(blob) == 4 * dim and hmac.compare_digest(
                                digest, row_digest(self._key, self.fingerprint, sha, dim, blob))):
                        found[sha] = np.frombuffer(blob, dtype="<f4")
                    else:
                        untrusted += 1
        except sqlite3.DatabaseError as exc:
            raise damaged(self.path, exc) or InputError(
                f"cannot read the embedding cache {quote(str(self.path))} ({exc}); to fix: {sqlite_advice(exc)}, "
                "then re-run.") from None
        self.untrusted = untrusted
        if untrusted:
            log.warning("ignored %d row(s) of the embedding cache %s that fail their integrity check (damaged, "
                        "stored as text, written by an older recallk or without this cache's key); encoding them "
                        "again", untrusted, self.path)
        return found

    def put_many(self, shas: Sequence[str], vectors: np.ndarray) -> None:
        """Store ``vectors[i]`` for ``shas[i]`` in one transaction."""
        vectors = np.ascontiguousarray(vectors, dtype="<f4")
        try:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT OR REPLACE INTO embedding VALUES (?, ?, ?, ?, ?)",
                    [(self.fingerprint, sha, dim, blob, row_digest(self._key, self.fingerprint, sha, dim, blob))
                     for sha, dim, blob in ((sha, vectors.shape[1], vectors[i].tobytes())
                                            for i, sha in enumerate(shas))])
        except sqlite3.Error as exc:
            if damaged(self.path, exc):
                raise damaged(self.path, exc) from None
            raise InputError(f"cannot write the embedding cache {str(self.path)!r} ({exc}); to fix: "
                             f"{sqlite_advice(exc)}, then re-run.") from None

    @property
    def key(self) -> bytes:
        """This cache's secret (:func:`cache_key`): it keys the row digests and the verification sample."""
        return self._key

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "EmbeddingCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
