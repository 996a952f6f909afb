"""The encode stage's computation: the embeddings of every catalog image, in catalog order."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pandas as pd

from recallk.data.contract import has_files
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


def embed(catalog: pd.DataFrame, settings: EncodeSettings,
          background: str = DEFAULT_BACKGROUND) -> tuple[np.ndarray, dict[str, Any]]:
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

    Returns
    -------
    (embeddings, provenance)
        float32 array of shape (n_images, dim): images already encoded by the same backbone
        (same fingerprint, same sha256) come from the embedding cache (:mod:`recallk.encode.cache`);
        and what made them: ``backbone``, ``fingerprint`` (for ``precomputed``: the file and its
        sha256), ``embedding_dim``, ``num_images``.
    """
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
        return out, _provenance(backbone, f"{path} sha256 {file_sha256(path)[:16]}", out)
    runtime = Request(device=settings.device, dtype=settings.dtype, reproducible=settings.reproducible,
                      batch_size=settings.batch_size)
    options = settings.backbone_options(options_key(backbone))
    model = get_backbone(backbone, options, runtime=runtime, background=background)
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
    return out, _provenance(model.name, model.fingerprint, out)


def _provenance(backbone: str, fingerprint: str, emb: np.ndarray) -> dict[str, Any]:
    return {"backbone": backbone, "fingerprint": fingerprint, "embedding_dim": int(emb.shape[1]),
            "num_images": int(emb.shape[0])}
