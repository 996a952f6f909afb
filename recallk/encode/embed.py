"""The encode stage's computation: the embeddings of every catalog image, in catalog order."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pandas as pd

from recallk.errors import clip
from recallk.data.contract import has_files
from recallk.encode import precomputed
from recallk.encode.base import file_sha256
from recallk.encode.batches import encode_catalog
from recallk.encode.cache import EmbeddingCache, default_path
from recallk.encode.device import Request
from recallk.encode.registry import get_backbone, options_key
from recallk.errors import InputError

log = logging.getLogger(__name__)


def embed(catalog: pd.DataFrame, *, backbone: str, batch_size: int, num_workers: int, device: str = "auto",
          dtype: str = "float32", reproducible: bool = True, engine: str = "local",
          ray: dict[str, Any] | None = None, **backbone_options: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """Embeddings of the catalog's images in catalog order, for the ``encode`` params.

    Parameters
    ----------
    catalog : DataFrame
        ``image_id, path, sha256`` per image (the catalog file).
    backbone : str
        A registered backbone, ``precomputed`` or ``callable:package.module:function``.
    batch_size, num_workers : int
        Images per backbone call; threads decoding ahead of it (the local engine).
    device, dtype, reproducible
        Where and how torch backbones run (:mod:`recallk.encode.device`); other backbones ignore them.
    engine : {"local", "ray"}
        Where the cache misses are encoded: this process, or Ray Data actors
        (:mod:`recallk.encode.ray_engine`) with ``ray``: ``address``, ``concurrency``, ``num_gpus``,
        ``batch_size``. Both give the same bytes.
    **backbone_options
        ``{name: options}`` per backbone; the chosen backbone's options are passed to it (a family's,
        ``encode.timm`` for ``timm:<model>``, to each of its models).

    Returns
    -------
    (embeddings, provenance)
        float32 array of shape (n_images, dim): images already encoded by the same backbone
        (same fingerprint, same sha256) come from the embedding cache (:mod:`recallk.encode.cache`);
        and what made them: ``backbone``, ``fingerprint`` (for ``precomputed``: the file and its
        sha256), ``embedding_dim``, ``num_images``.
    """
    if backbone != precomputed.NAME and not has_files(catalog):
        raise InputError(f"the catalog lists ids without image files (an embeddings-only manifest: no path column, or "
                         f"`split.images: none`), so `encode.backbone: {clip(backbone)}` has nothing to encode; set "
                         "`encode.backbone: precomputed` and `encode.precomputed.path` to your embeddings (an .npz "
                         "with arrays ids and embeddings), or give the manifest a path column.")
    if backbone == precomputed.NAME:
        opts = backbone_options[precomputed.NAME]
        ids, emb = precomputed.read_precomputed(opts.get("path"), opts.get("ids"))
        out = precomputed.align(ids, emb, catalog["image_id"].tolist(), source=str(opts.get("path")))
        log.info("loaded %d precomputed embeddings (dim %d)", len(out), out.shape[1])
        return out, _provenance(backbone, f"{opts.get('path')} sha256 {file_sha256(opts.get('path'))[:16]}", out)
    runtime = Request(device=device, dtype=dtype, reproducible=reproducible, batch_size=batch_size)
    options = backbone_options.get(options_key(backbone))
    model = get_backbone(backbone, options, runtime=runtime)
    source = None
    if engine == "ray":
        from recallk.encode.ray_engine import ray_source

        source = ray_source(model, backbone, options, runtime=runtime, **(ray or {}))
    with EmbeddingCache(default_path(), model.fingerprint) as cache:
        out, n_encoded, n_cached = encode_catalog(catalog, model, batch_size=batch_size,
                                                  num_workers=num_workers, cache=cache, source=source)
    log.info("%s (fingerprint %s, dim %d): encoded %d images, served %d from the cache (%s)", model.name,
             model.fingerprint, out.shape[1], n_encoded, n_cached, cache.path)
    return out, _provenance(model.name, model.fingerprint, out)


def _provenance(backbone: str, fingerprint: str, emb: np.ndarray) -> dict[str, Any]:
    return {"backbone": backbone, "fingerprint": fingerprint, "embedding_dim": int(emb.shape[1]),
            "num_images": int(emb.shape[0])}
