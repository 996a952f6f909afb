"""Caption embeddings for text <-> image retrieval: the backbone's text tower, or vectors computed elsewhere.

The encode stage embeds every caption of ``data/prepared/captions.csv`` (in its order) when the file has rows:

* a model backbone with a text tower (:attr:`~recallk.encode.base.Backbone.encode_text`: ``open_clip:<model>``,
  ``hf:<dir>`` of a CLIP-style model with ``pooling: pooler``, ``callable:`` with
  ``encode.callable.text_function``) embeds them, each caption once, through the embedding cache keyed by
  (text fingerprint, sha256 of the caption's UTF-8): the text fingerprint covers the weights and the tokenizer, so
  a caption is never served another model's vector. Hits pass the cache's integrity check, and
  ``encode.verify_cache`` of them are embedded again and compared, as images are;
* ``precomputed`` reads them from ``encode.precomputed.text`` (an ``.npz`` of ``ids``, the caption ids, and
  ``embeddings``), checked as the image embeddings are.

Either way the text embeddings must have the images' dimension (one space), and none may be NaN, inf or zero.
"""

from __future__ import annotations

import hashlib
from typing import Iterator, Sequence

import numpy as np

from recallk.encode import batches, precomputed
from recallk.encode.base import Backbone, file_sha256
from recallk.encode.batches import CAPTIONS, BatchSource, CacheRun
from recallk.encode.cache import EmbeddingCache
from recallk.errors import InputError, clip, quote

#: The backbones that embed text, for the refusal of one that does not.
TEXT_BACKBONES = ("`open_clip:<model>` of a model with a text tower (CLIP, SigLIP, CoCa); `hf:<dir>` of a CLIP-style "
                  "model with `encode.hf.pooling: pooler`; `callable:...` with `encode.callable.text_function`; "
                  "`precomputed` with `encode.precomputed.text`")


def no_text_tower(backbone: str) -> InputError:
    """The refusal of a backbone without a text tower while there are captions to embed."""
    return InputError(f"data/prepared/captions.csv has captions (split.captions, split.protocol: text_image), but "
                      f"`encode.backbone: {clip(backbone)}` embeds images only, so the captions cannot be put in the "
                      f"images' space. Choose a backbone that embeds text too: {TEXT_BACKBONES}; or set "
                      "`split.captions: null` and another split.protocol to evaluate image retrieval.")


def caption_sha256(caption: str) -> str:
    """The cache key of a caption: the sha256 of its UTF-8 bytes."""
    return hashlib.sha256(caption.encode("utf-8")).hexdigest()


def run_text_tower(backbone: Backbone, texts: Sequence[str], dim: int) -> np.ndarray:
    """``backbone.encode_text(texts)`` as float32 ``(len(texts), dim)``; a user callable's failure (or a wrong
    shape) is an InputError naming it."""
    emb = batches.guarded(
        backbone, lambda: np.asarray(backbone.encode_text(list(texts)), dtype=np.float32),
        lambda what: f"the text function of backbone {backbone.name!r} (encode.callable.text_function) {what} on "
                     f"{len(texts)} caption(s); fix it (it must return an (n, d) array of floats, one row per "
                     "caption).")
    if emb.shape != (len(texts), dim):
        raise InputError(f"backbone {backbone.name!r} embedded {len(texts)} caption(s) as shape {emb.shape}; expected "
                         f"{(len(texts), dim)}: one row per caption, of the image embeddings' dimension {dim} (one "
                         "space for both).")
    return emb


def text_source(backbone: Backbone, *, dim: int, batch_size: int) -> BatchSource:
    """The captions' :data:`~recallk.encode.batches.BatchSource`: ``source(keys, texts, _)`` yields batches of
    ``batch_size`` texts, in order, embedded by :func:`run_text_tower` of the images' dimension ``dim``."""
    def source(todo: list[str], texts: list[str], _: int | None) -> Iterator[tuple[Sequence[str], np.ndarray]]:
        for start in range(0, len(todo), batch_size):
            yield todo[start:start + batch_size], run_text_tower(backbone, texts[start:start + batch_size], dim)
    return source


def encode_texts(captions: Sequence[str], caption_ids: Sequence[str], backbone: Backbone, cache: EmbeddingCache,
                 *, dim: int, batch_size: int, verify_cache: int) -> tuple[np.ndarray, int, int]:
    """Embed ``captions`` (named by ``caption_ids`` in messages) with ``backbone``'s text tower, each distinct text
    once, through ``cache`` (keyed by the backbone's text fingerprint and :func:`caption_sha256`), in batches of
    ``batch_size`` committed one at a time; ``verify_cache`` hits are embedded again and compared. The images'
    run through the cache does it (:mod:`recallk.encode.batches`), with the same rules: an unusable hit (NaN, inf,
    all zero, another dimension) is dropped with a warning and embedded again, an unusable fresh vector is an error.

    Returns ``(embeddings, n_encoded, n_cached)``: float32 ``(len(captions), dim)`` in caption order, the distinct
    texts embedded now and those served by the cache.
    """
    keys = [caption_sha256(c) for c in captions]
    text = dict(zip(keys, captions))  # distinct texts, in caption order
    known = cache.get_many(text)
    batches.drop_unusable_hits(known, dim, CAPTIONS)
    hits = list(known)
    todo = [sha for sha in text if sha not in known]
    run = CacheRun(backbone.name, text_source(backbone, dim=dim, batch_size=batch_size), cache, CAPTIONS)
    _, failed = batches.encode_into(run, known, todo, [text[sha] for sha in todo], dim)
    batches.refuse_unusable(backbone.name, [cid for cid, sha in zip(caption_ids, keys) if sha in failed], CAPTIONS)
    batches.verify_sample(run, known, {sha: text[sha] for sha in hits}, dim, verify_cache)
    return np.stack([known[sha] for sha in keys]).astype(np.float32, copy=False), len(todo), len(hits)


def read_precomputed_texts(path: str, caption_ids: Sequence[str], dim: int) -> tuple[np.ndarray, str]:
    """The caption embeddings of ``encode.precomputed.text`` (``path``: an ``.npz`` of ``ids``, caption ids, and
    ``embeddings``) in the order of ``caption_ids``, checked as image embeddings are (every caption present, ids
    once, finite and non-zero) and of the images' dimension ``dim``; and what made them (the file and its sha256)."""
    file = precomputed.named_file(path, "text", "precomputed caption embeddings",
                                  "data/prepared/captions.csv has captions, so `encode.backbone: precomputed` needs "
                                  "their embeddings: set `encode.precomputed.text` to an .npz with arrays ids (the "
                                  "caption ids, <image_id>#<n> as in data/prepared/captions.csv) and embeddings")
    with open(file, "rb") as fh:
        if fh.read(4) != b"PK\x03\x04":
            raise InputError(f"`encode.precomputed.text` {quote(path)} is not an .npz archive; save it with "
                             "numpy.savez(path, ids=caption_ids, embeddings=vectors).")
    ids, emb = precomputed.load_npz(path)
    out = precomputed.align(ids, emb, list(caption_ids), source=str(path), what="caption")
    if out.shape[1] != dim:
        raise InputError(f"{quote(path)} (encode.precomputed.text): caption embeddings of dimension {out.shape[1]}, "
                         f"but the image embeddings have {dim}; both must be in one space (the same model's image "
                         "and text towers).")
    return out, f"{path} sha256 {file_sha256(path)[:16]}"
