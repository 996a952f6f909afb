"""The encode stage's computation: the embeddings of every catalog image, in catalog order."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from recallk.data.contract import has_files
from recallk.encode import captions as captions_module
from recallk.encode import precomputed
from recallk.encode.base import file_sha256
from recallk.encode.batches import encode_catalog
from recallk.encode.cache import EmbeddingCache, default_path
from recallk.encode.device import Request
from recallk.encode.registry import get_backbone, options_key
from recallk.encode.settings import EncodeSettings
from recallk.errors import InputError, clip
from recallk.images import DEFAULT_BACKGROUND

log = logging.getLogger(__name__)


@dataclass
class Embedded:
    """What the encode stage writes: the image embeddings (catalog order), what made them, and with captions their
    embeddings (caption order; None without captions)."""

    images: np.ndarray
    provenance: dict[str, Any]
    texts: np.ndarray | None = None


def embed(catalog: pd.DataFrame, settings: EncodeSettings,
          background: str = DEFAULT_BACKGROUND) -> tuple[np.ndarray, dict[str, Any]]:
    """``(embeddings, provenance)`` of the catalog's images: :func:`embed_all` without captions."""
    out = embed_all(catalog, settings, background)
    return out.images, out.provenance


def embed_all(catalog: pd.DataFrame, settings: EncodeSettings, background: str = DEFAULT_BACKGROUND,
              captions: pd.DataFrame | None = None) -> Embedded:
    """Embeddings of the catalog's images in catalog order, for the ``encode`` settings.

    Parameters
    ----------
    catalog : DataFrame
        ``image_id, path, sha256`` per image (the catalog file).
    settings : EncodeSettings
        The ``encode`` section (:mod:`recallk.encode.settings`): ``backbone`` (a registered backbone,
        ``precomputed`` or ``callable:package.module:function``) and its options
        (``settings.<backbone>``; a family's, ``timm`` for ``timm:<model>``, go to each of its models);
        ``batch_size`` and ``num_workers`` (images per backbone call; threads decoding ahead of it);
        ``device``, ``dtype``, ``reproducible`` (where and how torch backbones run,
        :mod:`recallk.encode.device`; other backbones ignore them); ``engine``: where the cache misses
        are encoded, this process or Ray Data actors (:mod:`recallk.encode.ray_engine`, with
        ``settings.ray``). Both engines give the same bytes. ``verify_cache``: cache hits encoded again
        and compared (:func:`recallk.encode.batches.encode_catalog`).
    background : str
        The colour each image's transparency is composited over (``split.background``, as the split stage
        recorded it: its pHash saw the same pixels); part of the backbone's fingerprint, so cached embeddings
        of another background are never served. A ``precomputed`` backbone decodes nothing and ignores it.

    captions : DataFrame, optional
        ``caption_id, caption`` per caption (``data/prepared/captions.csv``); with rows, the backbone must embed
        text too (:mod:`recallk.encode.captions`: refused before any image is encoded otherwise).

    Returns
    -------
    Embedded
        ``images``: float32 array of shape (n_images, dim): images already encoded by the same backbone
        (same fingerprint, same sha256) come from the embedding cache (:mod:`recallk.encode.cache`);
        ``provenance``, what made them: ``backbone``, ``fingerprint`` (for ``precomputed``: the file and its
        sha256), ``embedding_dim``, ``num_images``, and with captions ``text_fingerprint`` (for ``precomputed``:
        the text file and its sha256) and ``num_captions``; ``texts``: the captions' float32 (n_captions, dim), or
        None without captions.
    """
    texts = captions if captions is not None and len(captions) else None
    backbone = settings.backbone
    if backbone != precomputed.NAME and not has_files(catalog):
        raise InputError(f"the catalog lists ids without image files (an embeddings-only manifest: no path column, or "
                         f"`split.images: none`), so `encode.backbone: {clip(backbone)}` has nothing to encode; set "
                         "`encode.backbone: precomputed` and `encode.precomputed.path` to your embeddings (an .npz "
                         "with arrays ids and embeddings), or give the manifest a path column.")
    if backbone == precomputed.NAME:
        path, ids_path = settings.precomputed.path, settings.precomputed.ids
        ids, emb = precomputed.read_precomputed(path, ids_path)
        out = precomputed.align(ids, emb, catalog["image_id"].tolist(), source=str(path))
        log.info("loaded %d precomputed embeddings (dim %d)", len(out), out.shape[1])
        result = Embedded(out, _provenance(backbone, f"{path} sha256 {file_sha256(path)[:16]}", out))
        if texts is not None:
            result.texts, made_by = captions_module.read_precomputed_texts(
                settings.precomputed.text, texts["caption_id"].tolist(), out.shape[1])
            result.provenance.update(text_fingerprint=made_by, num_captions=len(texts))
            log.info("loaded %d precomputed caption embeddings", len(texts))
        return result
    runtime = Request(device=settings.device, dtype=settings.dtype, reproducible=settings.reproducible,
                      batch_size=settings.batch_size)
    options = settings.backbone_options(options_key(backbone))
    model = get_backbone(backbone, options, runtime=runtime, background=background)
    if texts is not None and model.encode_text is None:
        raise captions_module.no_text_tower(backbone)
    source = None
    if settings.engine == "ray":
        from recallk.encode.ray_engine import ray_source

        source = ray_source(model, backbone, options, settings.ray, runtime=runtime)
    with EmbeddingCache(default_path(), model.fingerprint) as cache:
        out, n_encoded, n_cached = encode_catalog(catalog, model, batch_size=settings.batch_size,
                                                  num_workers=settings.num_workers, cache=cache, source=source,
                                                  verify_cache=settings.verify_cache)
    log.info("%s (fingerprint %s, dim %d): encoded %d images, served %d from the cache (%s)", model.name,
             model.fingerprint, out.shape[1], n_encoded, n_cached, cache.path)
    result = Embedded(out, _provenance(model.name, model.fingerprint, out))
    if texts is not None:  # one cache file; the text fingerprint keys the captions apart from any image
        with EmbeddingCache(default_path(), model.text_fingerprint) as cache:
            result.texts, n_encoded, n_cached = captions_module.encode_texts(
                texts["caption"].tolist(), texts["caption_id"].tolist(), model, cache, dim=out.shape[1],
                batch_size=settings.batch_size, verify_cache=settings.verify_cache)
        log.info("%s (text fingerprint %s): encoded %d distinct captions, served %d from the cache", model.name,
                 model.text_fingerprint, n_encoded, n_cached)
        result.provenance.update(text_fingerprint=model.text_fingerprint, num_captions=len(texts))
    return result


def _provenance(backbone: str, fingerprint: str, emb: np.ndarray) -> dict[str, Any]:
    return {"backbone": backbone, "fingerprint": fingerprint, "embedding_dim": int(emb.shape[1]),
            "num_images": int(emb.shape[0])}
