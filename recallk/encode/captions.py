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
import logging
from typing import Sequence

import numpy as np

from recallk.checks import unusable_rows
from recallk.encode import precomputed, verify
from recallk.encode.base import Backbone, file_sha256
from recallk.encode.cache import EmbeddingCache
from recallk.errors import InputError, clip, quote
from recallk.progress import Progress

log = logging.getLogger(__name__)

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
    try:
        out = backbone.encode_text(list(texts))
        emb = np.asarray(out, dtype=np.float32)
    except (KeyboardInterrupt, MemoryError):
        raise
    except BaseException as exc:  # noqa: BLE001 - a user callable's error (or sys.exit) is a message
        if not backbone.user_code:
            raise
        what = (f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit)
                else f"raised {type(exc).__name__}: {clip(str(exc))}")
        raise InputError(f"the text function of backbone {backbone.name!r} (encode.callable.text_function) {what} "
                         f"on {len(texts)} caption(s); fix it (it must return an (n, d) array of floats, one row per "
                         "caption).") from None
    if emb.shape != (len(texts), dim):
        raise InputError(f"backbone {backbone.name!r} embedded {len(texts)} caption(s) as shape {emb.shape}; expected "
                         f"{(len(texts), dim)}: one row per caption, of the image embeddings' dimension {dim} (one "
                         "space for both).")
    return emb


def encode_texts(captions: Sequence[str], caption_ids: Sequence[str], backbone: Backbone, cache: EmbeddingCache,
                 *, dim: int, batch_size: int, verify_cache: int) -> tuple[np.ndarray, int, int]:
    """Embed ``captions`` (named by ``caption_ids`` in messages) with ``backbone``'s text tower, each distinct text
    once, through ``cache`` (keyed by the backbone's text fingerprint and :func:`caption_sha256`), in batches of
    ``batch_size`` committed one at a time; ``verify_cache`` hits are embedded again and compared.

    Returns ``(embeddings, n_encoded, n_cached)``: float32 ``(len(captions), dim)`` in caption order, the distinct
    texts embedded now and those served by the cache.
    """
    keys = [caption_sha256(c) for c in captions]
    text = dict(zip(keys, captions))  # distinct texts, in caption order
    known = cache.get_many(text)
    for sha in [sha for sha, v in known.items() if v.size != dim or unusable_rows(v[None, :])[0]]:
        del known[sha]  # a vector a fresh one could never be: embedded again, and replaced
    hits = list(known)
    todo = [sha for sha in text if sha not in known]
    failed: set[str] = set()
    with Progress(len(todo), f"encode text {backbone.name}", "caption", log) as bar:
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            emb = run_text_tower(backbone, [text[sha] for sha in batch], dim)
            bad = unusable_rows(emb)
            failed.update(sha for sha, b in zip(batch, bad) if b)
            good = [sha for sha, b in zip(batch, bad) if not b]
            known.update(zip(good, emb[~bad]))
            if good:
                cache.put_many(good, emb[~bad])
            bar.update(len(batch))
    if failed:
        named = [cid for cid, sha in zip(caption_ids, keys) if sha in failed]
        raise InputError(f"backbone {backbone.name!r} gave NaN, inf or all-zero embeddings for {len(named)} "
                         f"caption(s): {', '.join(map(quote, named[:10]))}; check those captions or the backbone.")
    _verify(known, {sha: text[sha] for sha in hits}, backbone, cache, dim, verify_cache)
    return np.stack([known[sha] for sha in keys]).astype(np.float32, copy=False), len(todo), len(hits)


def _verify(known: dict[str, np.ndarray], served: dict[str, str], backbone: Backbone, cache: EmbeddingCache,
            dim: int, n: int) -> None:
    """Embed ``n`` of the ``served`` hits (sha256 -> caption) again; an InputError when one differs from its cached
    vector beyond :data:`recallk.encode.verify.TOLERANCE` (as for images)."""
    picked = verify.sample(list(served), cache.key, n)
    if not picked:
        return
    fresh = dict(zip(picked, run_text_tower(backbone, [served[sha] for sha in picked], dim)))
    bad = verify.mismatches({sha: known[sha] for sha in picked}, fresh)
    log.info("verified %d cached caption embedding(s) against a fresh encoding: %d mismatch(es)", len(picked),
             len(bad))
    if bad:
        sha, diff = bad[0]
        raise InputError(
            f"the embedding cache {quote(str(cache.path))} served {len(bad)} of {len(picked)} sampled caption vectors "
            f"unlike a fresh encoding (e.g. caption {quote(served[sha])}: max difference {diff:.3g} of its largest "
            f"value, above {verify.TOLERANCE}): rows written by another model or code, a text tower whose output is "
            "not deterministic, or rows tampered with; delete the file (that only costs re-encoding) and re-run "
            "(docs/backbones.md#the-embedding-cache).")


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
