"""Encode catalog images with a backbone, never twice: the logic under the encode stage.

Unique files (by sha256) are looked up in the :class:`~recallk.encode.cache.EmbeddingCache`;
only the misses are decoded and encoded, in catalog order, in batches. Decoding
runs in threads a bounded number of batches ahead of the backbone, so loading
overlaps inference and memory stays bounded. Every finished batch is committed
to the cache before the next one, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
from PIL import Image

from recallk.checks import clip, quote, unusable_rows
from recallk.encode.base import Backbone
from recallk.encode.cache import EmbeddingCache
from recallk.errors import InputError
from recallk.images import DECODE_ERRORS, decode
from recallk.progress import Progress

log = logging.getLogger(__name__)


def read_checked(path: str, sha256: str, min_side: int | None = None) -> Image.Image:
    """Load one catalog image, refusing a file that changed since the catalog was built."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise InputError(f"cannot read image {quote(path)} ({exc.strerror}); it was moved or deleted since the catalog "
                         "was built: rebuild the catalog (the split stage).") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise InputError(f"image {quote(path)} changed since the catalog was built; rebuild the catalog "
                         "(the split stage).")
    try:
        return decode(data, min_side=min_side)
    except DECODE_ERRORS as exc:
        raise InputError(f"image {quote(path)} no longer decodes ({exc}); rebuild the catalog "
                         "(the split stage).") from None


#: Bytes of decoded images held at once by :func:`decoded_batches` (the batch the backbone works on and
#: those decoded ahead of it), estimated from each image's size as 4 bytes per pixel.
MAX_DECODED_BYTES = 1 << 30


def _chunks(sizes: Sequence[int], batch_size: int, max_bytes: int) -> list[tuple[int, int, int]]:
    """``(start, stop, bytes)`` of consecutive batches of at most ``batch_size`` images and ``max_bytes``
    bytes each (a single larger image is a batch of its own)."""
    out, start, held = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and (i - start == batch_size or held + size > max_bytes):
            out.append((start, i, held))
            start, held = i, 0
        held += size
    if start < len(sizes):
        out.append((start, len(sizes), held))
    return out


def decoded_batches(paths: Sequence[str], shas: Sequence[str], *, batch_size: int, num_workers: int,
                    min_side: int | None = None, prefetch: int = 2, sizes: Sequence[int] | None = None,
                    max_bytes: int = MAX_DECODED_BYTES) -> Iterator[tuple[int, list[Image.Image]]]:
    """Yield ``(start, images)`` batches in order, decoding up to ``prefetch`` batches ahead in threads.

    Memory is bounded in bytes, not only in images: with ``sizes`` (each image's decoded bytes, e.g.
    4 x width x height from the catalog), a batch holds at most ``batch_size`` images and
    ``max_bytes / (prefetch + 1)`` bytes, and batches are decoded ahead only while every batch held
    (yielded and pending) fits in ``max_bytes``. A batch may then have fewer than ``batch_size`` images;
    each image's embedding does not depend on its batch.
    """
    sizes = list(sizes) if sizes is not None else [0] * len(paths)
    chunks = deque(_chunks(sizes, batch_size, max(1, max_bytes // (prefetch + 1))))
    pending: deque[tuple[int, int, list[Future]]] = deque()
    with ThreadPoolExecutor(max_workers=num_workers) as pool:
        while chunks or pending:
            held = sum(b for _, b, _ in pending)
            while chunks and len(pending) <= prefetch and (not pending or held + chunks[0][2] <= max_bytes):
                s, e, b = chunks.popleft()
                held += b
                pending.append((s, b, [pool.submit(read_checked, p, h, min_side)
                                       for p, h in zip(paths[s:e], shas[s:e])]))
            start, _, futures = pending.popleft()
            yield start, [f.result() for f in futures]


def _run_backbone(backbone: Backbone, images: list[Image.Image], dim: int | None) -> np.ndarray:
    try:
        out = backbone.encode(images)
    except (KeyboardInterrupt, MemoryError):
        raise
    except BaseException as exc:  # noqa: BLE001 - a user callable's error (or sys.exit) is a message, never a silent exit
        if not backbone.user_code:
            raise
        what = (f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit)
                else f"raised {type(exc).__name__}: {clip(str(exc))}")
        raise InputError(f"backbone {backbone.name!r} {what} on a batch of {len(images)} image(s); fix the function "
                         "(it must return an (n, d) array of floats, one row per image).") from None
    try:
        emb = np.asarray(out, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InputError(f"backbone {backbone.name!r} did not return numbers for a batch of {len(images)} "
                        f"({clip(str(exc))}); return an (n, d) array of floats.") from None
    want = (len(images), dim if dim is not None else (emb.shape[1] if emb.ndim == 2 else -1))
    if emb.ndim != 2 or emb.shape != want:
        raise InputError(f"backbone {backbone.name!r} returned shape {emb.shape} for a batch of {len(images)}; "
                        f"expected {want} (one row per image, the same dimension for every batch).")
    return emb


def _drop_unusable_hits(known: dict[str, np.ndarray], dim: int | None) -> int:
    """Remove cache hits that a fresh vector could never be: NaN, inf, all zero (the rule of fresh
    vectors, :func:`recallk.checks.unusable_rows`) or, when ``dim`` is known, another dimension.
    Returns how many were removed (they are encoded again, and their cache entries replaced)."""
    bad = [sha for sha, v in known.items() if (dim is not None and v.size != dim) or unusable_rows(v[None, :])[0]]
    for sha in bad:
        del known[sha]
    if bad:
        log.warning("dropped %d unusable cached embedding(s) (NaN, inf, all zero%s); encoding them again",
                    len(bad), f" or not of dimension {dim}" if dim is not None else "")
    return len(bad)


def _encode_into(known: dict[str, np.ndarray], todo: list[str], paths: list[str], backbone: Backbone,
                 dim: int | None, *, batch_size: int, num_workers: int, cache: EmbeddingCache | None,
                 sizes: list[int] | None = None) -> tuple[int | None, set[str]]:
    """Encode the files ``todo`` (at ``paths``) into ``known`` and the cache, batch by batch; return
    the dimension and the shas whose embedding was NaN, inf or all zero (kept out of both)."""
    failed_shas: set[str] = set()
    with Progress(len(todo), f"encode {backbone.name}", "img", log) as bar:
        for start, images in decoded_batches(paths, todo, batch_size=batch_size, num_workers=num_workers,
                                             min_side=backbone.input_size, sizes=sizes):
            emb = _run_backbone(backbone, images, dim)
            dim = emb.shape[1]
            batch = todo[start:start + len(images)]
            bad = unusable_rows(emb)
            failed_shas.update(sha for sha, b in zip(batch, bad) if b)
            good, good_emb = [sha for sha, b in zip(batch, bad) if not b], emb[~bad]
            known.update(zip(good, good_emb))
            if cache is not None and good:
                cache.put_many(good, good_emb)
            bar.update(len(images))
    return dim, failed_shas


def encode_catalog(catalog: pd.DataFrame, backbone: Backbone, *, batch_size: int, num_workers: int,
                   cache: EmbeddingCache | None = None) -> tuple[np.ndarray, int, int]:
    """Embed the catalog's images in catalog order.

    Returns ``(embeddings, n_encoded, n_cached)``: float32 array (n_images, dim),
    the number of files encoded now and the number served from ``cache``.
    Cache hits pass the checks of fresh vectors: a NaN, inf, all-zero or wrong-dimension
    entry (a damaged or shared cache) is dropped, logged and encoded again, so the
    output is what a run without the cache gives. For a backbone of unknown dimension
    (a user callable) at least one file is encoded, and its dimension judges the hits.
    Raises a InputError naming every image whose fresh embedding is NaN, inf or zero.
    """
    shas = catalog["sha256"].tolist()
    first_row: dict[str, int] = {}  # sha -> first catalog row, in catalog order
    for i, sha in enumerate(shas):
        first_row.setdefault(sha, i)
    known = cache.get_many(first_row) if cache is not None else {}
    _drop_unusable_hits(known, backbone.dim)
    if backbone.dim is None and known and len(known) == len(first_row):
        del known[next(iter(first_row))]  # encode one file: its dimension is the truth the hits are judged by
    names, paths = catalog["image_id"].tolist(), catalog["path"].tolist()
    sides = [pd.to_numeric(catalog[c], errors="coerce").fillna(0) if c in catalog else pd.Series(0, index=catalog.index)
             for c in ("width", "height")]  # a table without sizes is bounded in images only
    pixels = (sides[0] * sides[1]).astype("int64").tolist()

    def encode(todo: list[str], dim: int | None) -> tuple[int | None, set[str]]:
        rows = [first_row[sha] for sha in todo]
        return _encode_into(known, todo, [paths[i] for i in rows], backbone, dim, batch_size=batch_size,
                            num_workers=num_workers, cache=cache, sizes=[4 * pixels[i] for i in rows])

    todo = [sha for sha in first_row if sha not in known]
    dim, failed_shas = encode(todo, backbone.dim)
    if backbone.dim is None and _drop_unusable_hits(known, dim):  # hits of another dimension than the fresh ones
        again = [sha for sha in first_row if sha not in known and sha not in failed_shas]
        dim, more = encode(again, dim)
        failed_shas |= more
        todo += again
    failed_names = [name for name, sha in zip(names, shas) if sha in failed_shas]
    if failed_names:
        raise InputError(f"backbone {backbone.name!r} gave NaN, inf or all-zero embeddings for {len(failed_names)} "
                        f"image(s): {', '.join(map(clip, failed_names[:10]))}; check those images or the backbone.")
    out = np.empty((len(catalog), dim if dim is not None else 0), dtype=np.float32)
    for i, sha in enumerate(shas):
        out[i] = known[sha]
    return out, len(todo), len(first_row) - len(todo)
