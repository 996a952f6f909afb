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
from typing import Callable, Iterable, Iterator, Sequence

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


def read_checked(path: str, sha256: str, min_side: int | None = None, shown: str | None = None) -> Image.Image:
    """Load one catalog image, refusing a file that changed since the catalog was built.
    Messages name it ``shown`` (default ``path``): the catalog's path when ``path`` was made absolute."""
    name = quote(shown if shown is not None else path)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise InputError(f"cannot read image {name} ({exc.strerror}); it was moved or deleted since the catalog "
                         "was built: rebuild the catalog (the split stage).") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise InputError(f"image {name} changed since the catalog was built; rebuild the catalog "
                         "(the split stage).")
    try:
        return decode(data, min_side=min_side)
    except DECODE_ERRORS as exc:
        raise InputError(f"image {name} no longer decodes ({exc}); rebuild the catalog "
                         "(the split stage).") from None


def decoded_batches(paths: Sequence[str], shas: Sequence[str], *, batch_size: int, num_workers: int,
                    min_side: int | None = None, prefetch: int = 2) -> Iterator[tuple[int, list[Image.Image]]]:
    """Yield ``(start, images)`` batches in order, decoding up to ``prefetch`` batches ahead in threads."""
    starts = deque(range(0, len(paths), batch_size))
    pending: deque[tuple[int, list[Future]]] = deque()
    with ThreadPoolExecutor(max_workers=num_workers) as pool:
        while starts or pending:
            while starts and len(pending) <= prefetch:
                s = starts.popleft()
                pending.append((s, [pool.submit(read_checked, p, h, min_side)
                                    for p, h in zip(paths[s:s + batch_size], shas[s:s + batch_size])]))
            start, futures = pending.popleft()
            yield start, [f.result() for f in futures]


def _run_backbone(backbone: Backbone, images: list[Image.Image], dim: int | None) -> np.ndarray:
    try:
        emb = np.asarray(backbone.encode(images), dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InputError(f"backbone {backbone.name!r} did not return numbers for a batch of {len(images)} "
                        f"({exc}); return an (n, d) array of floats.") from None
    return check_shape(backbone.name, emb, len(images), dim)


def check_shape(name: str, emb: np.ndarray, n: int, dim: int | None) -> np.ndarray:
    """``emb`` if it is ``(n, dim)`` (any dimension when ``dim`` is None), else an InputError."""
    want = (n, dim if dim is not None else (emb.shape[1] if emb.ndim == 2 else -1))
    if emb.ndim != 2 or emb.shape != want:
        raise InputError(f"backbone {name!r} returned shape {emb.shape} for a batch of {n}; "
                        f"expected {want} (one row per image, the same dimension for every batch).")
    return emb


#: An engine's encoder: ``source(todo, paths, dim)`` yields ``(shas, embeddings)`` batches of the files
#: ``todo`` (sha256s, at ``paths``), each embedding (n, dim) float32, in any order and any batch sizes.
BatchSource = Callable[[list[str], list[str], "int | None"], Iterable[tuple[Sequence[str], np.ndarray]]]


def local_source(backbone: Backbone, *, batch_size: int, num_workers: int) -> BatchSource:
    """The local engine: batches in order, decoded in ``num_workers`` threads ahead of the backbone."""
    def source(todo: list[str], paths: list[str], dim: int | None) -> Iterator[tuple[Sequence[str], np.ndarray]]:
        for start, images in decoded_batches(paths, todo, batch_size=batch_size, num_workers=num_workers,
                                             min_side=backbone.input_size):
            emb = _run_backbone(backbone, images, dim)
            dim = emb.shape[1]
            yield todo[start:start + len(images)], emb
    return source


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
                 dim: int | None, source: BatchSource, cache: EmbeddingCache | None) -> tuple[int | None, set[str]]:
    """Encode the files ``todo`` (at ``paths``) into ``known`` and the cache with ``source``, committing
    each batch as it arrives; return the dimension and the shas whose embedding was NaN, inf or all
    zero (kept out of both)."""
    failed_shas: set[str] = set()
    if not todo:
        return dim, failed_shas
    with Progress(len(todo), f"encode {backbone.name}", "img", log) as bar:
        for batch, emb in source(todo, paths, dim):
            emb = check_shape(backbone.name, emb, len(batch), dim)
            dim = emb.shape[1]
            bad = unusable_rows(emb)
            failed_shas.update(sha for sha, b in zip(batch, bad) if b)
            good, good_emb = [sha for sha, b in zip(batch, bad) if not b], emb[~bad]
            known.update(zip(good, good_emb))
            if cache is not None and good:
                cache.put_many(good, good_emb)
            bar.update(len(batch))
    return dim, failed_shas


def encode_catalog(catalog: pd.DataFrame, backbone: Backbone, *, batch_size: int, num_workers: int,
                   cache: EmbeddingCache | None = None, source: BatchSource | None = None,
                   ) -> tuple[np.ndarray, int, int]:
    """Embed the catalog's images in catalog order.

    Returns ``(embeddings, n_encoded, n_cached)``: float32 array (n_images, dim),
    the number of files encoded now and the number served from ``cache``.
    Cache hits pass the checks of fresh vectors: a NaN, inf, all-zero or wrong-dimension
    entry (a damaged or shared cache) is dropped, logged and encoded again, so the
    output is what a run without the cache gives. For a backbone of unknown dimension
    (a user callable) at least one file is encoded, and its dimension judges the hits.
    Raises a InputError naming every image whose fresh embedding is NaN, inf or zero.
    ``source`` encodes the misses (:data:`BatchSource`; default :func:`local_source` with
    ``batch_size`` and ``num_workers``); its batches may come in any order: each is keyed by
    sha256, committed to the cache as it arrives, and the output is assembled in catalog order.
    """
    if source is None:
        source = local_source(backbone, batch_size=batch_size, num_workers=num_workers)
    shas = catalog["sha256"].tolist()
    first_row: dict[str, int] = {}  # sha -> first catalog row, in catalog order
    for i, sha in enumerate(shas):
        first_row.setdefault(sha, i)
    known = cache.get_many(first_row) if cache is not None else {}
    _drop_unusable_hits(known, backbone.dim)
    if backbone.dim is None and known and len(known) == len(first_row):
        del known[next(iter(first_row))]  # encode one file: its dimension is the truth the hits are judged by
    names, paths = catalog["image_id"].tolist(), catalog["path"].tolist()

    def encode(todo: list[str], dim: int | None) -> tuple[int | None, set[str]]:
        return _encode_into(known, todo, [paths[first_row[sha]] for sha in todo], backbone, dim, source, cache)

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
