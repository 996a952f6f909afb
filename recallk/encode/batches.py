"""Encode catalog images with a backbone, never twice: the logic under the encode stage.

Unique files (by sha256) are looked up in the :class:`~recallk.encode.cache.EmbeddingCache`;
only the misses are decoded and encoded, in catalog order, in batches. Decoding
runs in threads a bounded number of batches ahead of the backbone, so loading
overlaps inference and memory stays bounded. Every finished batch is committed
to the cache before the next one, so a killed run resumes where it stopped.

The run through the cache (drop unusable hits, encode the misses batch by batch, verify a sample of the
hits) serves captions too (:mod:`recallk.encode.captions`, keyed by the sha256 of their text): a
:class:`CacheRun` says what is encoded (its :class:`Kind`: images or captions, for the messages) and how.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

import numpy as np
import pandas as pd
from PIL import Image

from recallk.checks import unusable_rows
from recallk.encode import verify
from recallk.encode.base import Backbone
from recallk.encode.cache import EmbeddingCache
from recallk.errors import InputError, clip, quote
from recallk.images import DECODE_ERRORS, DEFAULT_BACKGROUND, decode
from recallk.progress import Progress

log = logging.getLogger(__name__)


def read_checked(path: str, sha256: str, min_side: int | None = None, shown: str | None = None,
                 background: str = DEFAULT_BACKGROUND) -> Image.Image:
    """Load one catalog image, refusing a file that changed since the catalog was built; its transparency
    composited over ``background`` (the backbone's, ``split.background``).
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
        return decode(data, min_side=min_side, name=shown if shown is not None else path, background=background)
    except DECODE_ERRORS as exc:
        raise InputError(f"image {name} no longer decodes ({exc}); rebuild the catalog "
                         "(the split stage).") from None


#: Bytes of decoded images held at once by :func:`decoded_batches` (the batch the backbone works on and
#: those decoded ahead of it), estimated from each image's size as 4 bytes per pixel.
MAX_DECODED_BYTES = 1 << 30


def byte_bounded_chunks(sizes: Sequence[int], batch_size: int, max_bytes: int) -> list[tuple[int, int, int]]:
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
                    read: Callable[[str, str], Image.Image] | None = None, prefetch: int = 2,
                    sizes: Sequence[int] | None = None,
                    max_bytes: int = MAX_DECODED_BYTES) -> Iterator[tuple[int, list[Image.Image]]]:
    """Yield ``(start, images)`` batches in order, decoding up to ``prefetch`` batches ahead in threads with
    ``read(path, sha256)`` (default :func:`read_checked`; the local engine binds the backbone's ``min_side`` and
    ``background``, transparency composited over it).

    Memory is bounded in bytes, not only in images: with ``sizes`` (each image's decoded bytes, e.g.
    4 x width x height from the catalog), a batch holds at most ``batch_size`` images and
    ``max_bytes / (prefetch + 1)`` bytes, and batches are decoded ahead only while every batch held
    (yielded and pending) fits in ``max_bytes``. A batch may then have fewer than ``batch_size`` images;
    each image's embedding does not depend on its batch.
    """
    read = read_checked if read is None else read
    sizes = list(sizes) if sizes is not None else [0] * len(paths)
    chunks = deque(byte_bounded_chunks(sizes, batch_size, max(1, max_bytes // (prefetch + 1))))
    pending: deque[tuple[int, int, list[Future]]] = deque()
    with ThreadPoolExecutor(max_workers=num_workers) as pool:
        while chunks or pending:
            held = sum(b for _, b, _ in pending)
            while chunks and len(pending) <= prefetch and (not pending or held + chunks[0][2] <= max_bytes):
                s, e, b = chunks.popleft()
                held += b
                pending.append((s, b, [pool.submit(read, p, h)
                                       for p, h in zip(paths[s:e], shas[s:e])]))
            start, _, futures = pending.popleft()
            yield start, [f.result() for f in futures]


T = TypeVar("T")


def guarded(backbone: Backbone, call: Callable[[], T], failed: Callable[[str], str]) -> T:
    """``call()``; when ``backbone`` runs user code, its error (or sys.exit) is an InputError saying
    ``failed(what)`` (``what``: "raised ValueError: ..." or "called sys.exit(...)"), never a silent exit."""
    try:
        return call()
    except (KeyboardInterrupt, MemoryError):
        raise
    except BaseException as exc:  # noqa: BLE001 - a user callable's error (or sys.exit) is a message, never a silent exit
        if not backbone.user_code:
            raise
        what = (f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit)
                else f"raised {type(exc).__name__}: {clip(str(exc))}")
        raise InputError(failed(what)) from None


def run_backbone(backbone: Backbone, images: list[Image.Image], dim: int | None) -> np.ndarray:
    out = guarded(backbone, lambda: backbone.encode(images),
                  lambda what: f"backbone {backbone.name!r} {what} on a batch of {len(images)} image(s); fix the "
                               "function (it must return an (n, d) array of floats, one row per image).")
    try:
        emb = np.asarray(out, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InputError(f"backbone {backbone.name!r} did not return numbers for a batch of {len(images)} "
                        f"({clip(str(exc))}); return an (n, d) array of floats.") from None
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
#: Captions have one too (:func:`recallk.encode.captions.text_source`): ``todo`` their text hashes, ``paths``
#: their texts.
BatchSource = Callable[[list[str], list[str], "int | None"], Iterable[tuple[Sequence[str], np.ndarray]]]


def local_source(backbone: Backbone, *, batch_size: int, num_workers: int,
                 sizes: dict[str, int] | None = None) -> BatchSource:
    """The local engine: batches in order, decoded in ``num_workers`` threads ahead of the backbone, holding
    at most :data:`MAX_DECODED_BYTES` of images by ``sizes`` (sha256 -> decoded bytes; unknown: 0)."""
    def source(todo: list[str], paths: list[str], dim: int | None) -> Iterator[tuple[Sequence[str], np.ndarray]]:
        read = functools.partial(read_checked, min_side=backbone.input_size, background=backbone.background)
        for start, images in decoded_batches(paths, todo, batch_size=batch_size, num_workers=num_workers, read=read,
                                             sizes=[(sizes or {}).get(sha, 0) for sha in todo]):
            emb = run_backbone(backbone, images, dim)
            dim = emb.shape[1]
            yield todo[start:start + len(images)], emb
    return source


@dataclass(frozen=True)
class Kind:
    """What a :class:`CacheRun` encodes, in its messages: ``noun`` (``"image"``), ``qualifier`` (before
    "embedding(s)" and "vectors": ``""`` or ``"caption "``), ``desc`` and ``unit`` of the progress bar,
    ``encoder`` (what may be not deterministic) and ``show`` (how an item is named: a path clipped, a text quoted)."""
    noun: str
    qualifier: str
    desc: str
    unit: str
    encoder: str
    show: Callable[[str], str]


#: Catalog images, keyed by their file's sha256, shown by path.
IMAGES = Kind("image", "", "encode", "img", "backbone", clip)
#: Captions, keyed by the sha256 of their UTF-8 text, shown quoted.
CAPTIONS = Kind("caption", "caption ", "encode text", "caption", "text tower", quote)


@dataclass
class CacheRun:
    """One encoding through the embedding cache: ``source`` encodes the misses with the backbone called
    ``name`` into ``cache`` (None: no cache); ``kind`` words the messages; ``committed`` collects the keys
    put in the cache, in order (what a Ctrl-C leaves there)."""
    name: str
    source: BatchSource
    cache: EmbeddingCache | None
    kind: Kind = IMAGES
    committed: list[str] = field(default_factory=list)


def drop_unusable_hits(known: dict[str, np.ndarray], dim: int | None, kind: Kind = IMAGES) -> int:
    """Remove cache hits that a fresh vector could never be: NaN, inf, all zero (the rule of fresh
    vectors, :func:`recallk.checks.unusable_rows`) or, when ``dim`` is known, another dimension.
    Returns how many were removed (they are encoded again, and their cache entries replaced)."""
    bad = [sha for sha, v in known.items() if (dim is not None and v.size != dim) or unusable_rows(v[None, :])[0]]
    for sha in bad:
        del known[sha]
    if bad:
        log.warning("dropped %d unusable cached %sembedding(s) (NaN, inf, all zero%s); encoding them again",
                    len(bad), kind.qualifier, f" or not of dimension {dim}" if dim is not None else "")
    return len(bad)


class EncodeInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) during :func:`encode_catalog`; ``str()`` says how many images are cached and that a
    re-run resumes from them (the encode stage prints it)."""


def encode_into(run: CacheRun, known: dict[str, np.ndarray], todo: list[str], items: list[str],
                dim: int | None) -> tuple[int | None, set[str]]:
    """Encode ``todo`` (keys; ``items``: the files' paths, or the texts) into ``known`` and the cache with
    ``run.source``, committing each batch as it arrives (its keys appended to ``run.committed``); return the
    dimension and the keys whose embedding was NaN, inf or all zero (kept out of both)."""
    failed_shas: set[str] = set()
    if not todo:
        return dim, failed_shas
    with Progress(len(todo), f"{run.kind.desc} {run.name}", run.kind.unit, log) as bar:
        for batch, emb in run.source(todo, items, dim):
            emb = check_shape(run.name, emb, len(batch), dim)
            dim = emb.shape[1]
            bad = unusable_rows(emb)
            failed_shas.update(sha for sha, b in zip(batch, bad) if b)
            good, good_emb = [sha for sha, b in zip(batch, bad) if not b], emb[~bad]
            known.update(zip(good, good_emb))
            if run.cache is not None and good:
                run.cache.put_many(good, good_emb)
                run.committed.extend(good)
            bar.update(len(batch))
    return dim, failed_shas


def refuse_unusable(name: str, failed: list[str], kind: Kind = IMAGES) -> None:
    """An InputError naming the ``failed`` items (ids, first 10) whose fresh embedding is NaN, inf or all
    zero (:func:`encode_into`'s second value), if any."""
    if failed:
        raise InputError(f"backbone {name!r} gave NaN, inf or all-zero embeddings for {len(failed)} "
                         f"{kind.noun}(s): {', '.join(map(kind.show, failed[:10]))}; check those {kind.noun}s or the "
                         "backbone.")


def verify_sample(run: CacheRun, known: dict[str, np.ndarray], served: dict[str, str], dim: int | None,
                  n: int) -> None:
    """Re-encode ``n`` of the ``served`` cache hits (key -> path or text; :func:`recallk.encode.verify.sample`)
    with ``run.source`` and raise an InputError when one differs from its cached vector beyond
    :data:`recallk.encode.verify.TOLERANCE`. ``run.cache`` must not be None."""
    cache, kind = run.cache, run.kind
    if cache is None:  # nothing was served
        return
    picked = verify.sample(list(served), cache.key, n)
    if not picked:
        return
    fresh: dict[str, np.ndarray] = {}
    for batch, emb in run.source(picked, [served[sha] for sha in picked], dim):
        fresh.update(zip(batch, np.asarray(emb, dtype=np.float32)))
    bad = verify.mismatches({sha: known[sha] for sha in picked}, fresh)
    log.info("verified %d cached %sembedding(s) against a fresh encoding: %d mismatch(es)", len(picked),
             kind.qualifier, len(bad))
    if bad:
        sha, diff = bad[0]
        raise InputError(
            f"the embedding cache {quote(str(cache.path))} served {len(bad)} of {len(picked)} sampled "
            f"{kind.qualifier}vectors unlike a fresh encoding (e.g. {kind.noun} {kind.show(served[sha])}: max "
            f"difference {diff:.3g} of its largest value, above {verify.TOLERANCE}): rows written by another model "
            f"or code, a {kind.encoder} whose output is not deterministic, or rows tampered with by someone who can "
            "write the cache; delete the file (that only costs re-encoding) and re-run, and keep the cache folder "
            "writable only by you (docs/backbones.md#the-embedding-cache).")


def _checked_encode(catalog: pd.DataFrame, backbone: Backbone, known: dict[str, np.ndarray],
                    first_row: dict[str, int], run: CacheRun, *, num_workers: int,
                    verify_cache: int) -> tuple[int | None, list[str]]:
    """:func:`encode_catalog`'s work after the cache read: check the files, encode the misses into ``known``,
    verify a sample of the hits; returns the dimension and the shas encoded."""
    shas = catalog["sha256"].tolist()
    names, paths = catalog["image_id"].tolist(), catalog["path"].tolist()
    read_by_encoder = {first_row[sha] for sha in first_row if sha not in known}
    rest = [i for i in range(len(shas)) if i not in read_by_encoder]
    verify.check_unchanged([names[i] for i in rest], [paths[i] for i in rest], [shas[i] for i in rest],
                           workers=num_workers)

    def encode(todo: list[str], dim: int | None) -> tuple[int | None, set[str]]:
        return encode_into(run, known, todo, [paths[first_row[sha]] for sha in todo], dim)

    todo = [sha for sha in first_row if sha not in known]
    dim, failed_shas = encode(todo, backbone.dim)
    if backbone.dim is None and drop_unusable_hits(known, dim):  # hits of another dimension than the fresh ones
        again = [sha for sha in first_row if sha not in known and sha not in failed_shas]
        dim, more = encode(again, dim)
        failed_shas |= more
        todo += again
    refuse_unusable(backbone.name, [name for name, sha in zip(names, shas) if sha in failed_shas])
    if run.cache is not None:
        encoded = set(todo)
        served = {sha: paths[row] for sha, row in first_row.items() if sha not in encoded}
        # on the engine that encodes the misses: a backbone may run only where that engine runs it (a Ray
        # worker's environment), so the sample costs one more (small) Ray job when every image was a hit
        verify_sample(run, known, served, dim, verify_cache)
    return dim, todo


def encode_catalog(catalog: pd.DataFrame, backbone: Backbone, *, batch_size: int, num_workers: int,
                   cache: EmbeddingCache | None = None, source: BatchSource | None = None,
                   verify_cache: int = verify.SAMPLE) -> tuple[np.ndarray, int, int]:
    """Embed the catalog's images in catalog order.

    Returns ``(embeddings, n_encoded, n_cached)``: float32 array (n_images, dim),
    the number of files encoded now and the number served from ``cache``.
    Every file the encoder does not read itself (cache hits, second paths of identical content) is
    hashed against the catalog's sha256 first (:func:`recallk.encode.verify.check_unchanged`): an image
    edited, deleted or swapped since the split stage is an InputError, cached or not.
    Cache hits pass the cache's integrity check (:meth:`EmbeddingCache.get_many`) and the checks of
    fresh vectors: a NaN, inf, all-zero or wrong-dimension entry (a damaged or shared cache) is dropped,
    logged and encoded again, so the output is what a run without the cache gives. Then
    ``verify_cache`` of the hits (a deterministic sample, :func:`recallk.encode.verify.sample`) are
    encoded again and compared; a mismatch is an InputError. For a backbone of unknown dimension
    (a user callable) at least one file is encoded, and its dimension judges the hits.
    Raises a InputError naming every image whose fresh embedding is NaN, inf or zero.
    ``source`` encodes the misses (:data:`BatchSource`; default :func:`local_source` with
    ``batch_size`` and ``num_workers``); its batches may come in any order: each is keyed by
    sha256, committed to the cache as it arrives, and the output is assembled in catalog order.
    Ctrl-C raises :class:`EncodeInterrupted`, saying how many images the cache holds.
    """
    shas = catalog["sha256"].tolist()
    if source is None:
        sides = [pd.to_numeric(catalog[c], errors="coerce").fillna(0) if c in catalog
                 else pd.Series(0, index=catalog.index) for c in ("width", "height")]  # none: bounded in images only
        pixels = (sides[0] * sides[1]).astype("int64").tolist()
        source = local_source(backbone, batch_size=batch_size, num_workers=num_workers,
                              sizes={sha: 4 * px for sha, px in zip(shas, pixels)})
    first_row: dict[str, int] = {}  # sha -> first catalog row, in catalog order
    for i, sha in enumerate(shas):
        first_row.setdefault(sha, i)
    known = cache.get_many(first_row) if cache is not None else {}
    drop_unusable_hits(known, backbone.dim)
    if backbone.dim is None and known and len(known) == len(first_row):
        del known[next(iter(first_row))]  # encode one file: its dimension is the truth the hits are judged by
    hits = set(known)
    run = CacheRun(backbone.name, source, cache)
    committed = run.committed
    try:
        dim, todo = _checked_encode(catalog, backbone, known, first_row, run, num_workers=num_workers,
                                    verify_cache=verify_cache)
    except KeyboardInterrupt:
        cached = len({sha for sha in hits if sha in known} | set(committed))
        where = (f"{cached} of the {len(first_row)} distinct images are in the embedding cache {cache.path} "
                 f"({len(set(committed))} encoded in this run); a re-run resumes from them" if cache is not None
                 else "no cache was used, so a re-run starts again")
        raise EncodeInterrupted(f"interrupted (Ctrl-C) while encoding with {backbone.name!r}: {where}; no output "
                                "was written.") from None
    out = np.empty((len(catalog), dim if dim is not None else 0), dtype=np.float32)
    for i, sha in enumerate(shas):
        out[i] = known[sha]
    return out, len(todo), len(first_row) - len(todo)
