"""What the encode stage checks before it serves a cached embedding: the file still holds the content
the catalog recorded, and a sample of the cache's answers matches a fresh encoding.

* :func:`check_unchanged` hashes files the encoder will not read itself (cache hits, and second paths
  of an identical file) against the catalog's sha256, in threads: an image edited, deleted or swapped
  with another after the split stage is an InputError, cached or not. Its cost is reading and hashing
  every such file once per run (bench/cache_trust_bench.py measures it against a cold encode).
* :func:`sample` picks a deterministic sample of hits, ordered by an HMAC of each sha256 under the
  cache's secret key (:func:`recallk.encode.cache.cache_key`): the same catalog and cache give the same
  sample, and someone who cannot read the key cannot tell which rows will be checked;
* :func:`mismatches` compares the cached and the fresh vectors of that sample within :data:`TOLERANCE`.
"""

from __future__ import annotations

import hashlib
import hmac
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from recallk.errors import InputError, clip

#: Largest ``max |cached - fresh|`` allowed, relative to ``max |fresh|``: float noise of another batch or
#: of a 16-bit GPU run stays far below it; another image's vector does not.
TOLERANCE = 1e-2
#: Cache hits re-encoded per run by default (``encode.verify_cache``): a fixed number, so the cost does not
#: grow with the catalog (bench/cache_trust_bench.py).
SAMPLE = 8
#: Files named in one message before "... and N more".
SHOWN = 10


def _problem(path: str, sha256: str) -> str | None:
    """Why the file at ``path`` no longer holds content ``sha256`` (missing, unreadable, changed), or None."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return None if digest.hexdigest() == sha256 else "changed"


def check_unchanged(names: Sequence[str], paths: Sequence[str], shas: Sequence[str], *, workers: int) -> None:
    """Raise one InputError naming every image whose file is missing or no longer hashes to its sha256.

    Parameters
    ----------
    names, paths, shas : sequences of str
        Catalog rows to check: ``image_id``, file path and the sha256 the split stage recorded.
    workers : int
        Threads reading files at once (hashlib releases the GIL on large reads).
    """
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        problems = list(pool.map(_problem, paths, shas))
    bad = [f"{clip(name)} ({clip(path)}: {why})" for name, path, why in zip(names, paths, problems) if why]
    if bad:
        more = f", ... and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        raise InputError(f"{len(bad)} image(s) changed, moved or deleted since the catalog was built: "
                         f"{', '.join(bad[:SHOWN])}{more}; rebuild the catalog (the split stage, `dvc repro`), "
                         "whose sha256 column the encode stage checks every file against, cached or not.")


def sample(shas: Sequence[str], key: bytes, n: int) -> list[str]:
    """``n`` of ``shas`` (all when fewer), those of the smallest HMAC-SHA256 under ``key``, in that order."""
    if n <= 0:
        return []
    ranked = sorted(dict.fromkeys(shas), key=lambda sha: hmac.new(key, sha.encode(), hashlib.sha256).digest())
    return ranked[:n]


def mismatches(cached: dict[str, np.ndarray], fresh: dict[str, np.ndarray],
               tolerance: float = TOLERANCE) -> list[tuple[str, float]]:
    """``(sha256, relative difference)`` of every sampled vector whose cached value differs from the fresh
    one by more than ``tolerance`` (``max |cached - fresh| / max |fresh|``), or is of another dimension."""
    out = []
    for sha, new in fresh.items():
        old = cached[sha]
        if old.shape != new.shape:
            out.append((sha, float("inf")))
            continue
        scale = float(np.max(np.abs(new))) or 1.0
        diff = float(np.max(np.abs(old.astype(np.float64) - new.astype(np.float64)))) / scale
        if not diff <= tolerance:
            out.append((sha, diff))
    return out
