"""Stage ``encode``: embed every catalog image once with the chosen backbone.

Reads only the ``encode`` section of params.yaml and the catalog. Writes float32
embeddings (``.npy``, one row per catalog row, in catalog order) and the aligned
image ids (``.npy`` of strings), both or neither. Images already encoded by the
same backbone (same fingerprint, same file content) come from the embedding
cache (:mod:`stages.embedding_cache`), so only new or changed files are encoded.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np
import pandas as pd

from stages import precomputed
from stages.backbones import get_backbone
from stages.common import parse_stage_args, read_input_csv, remove_outputs, run_stage, write_all
from stages.embedding_cache import EmbeddingCache, default_path
from stages.encoding import encode_catalog
from stages.params import load_section

log = logging.getLogger("stages.encode")

CATALOG_CSV = "data/prepared/catalog.csv"
EMBEDDINGS_NPY = "data/embeddings/embeddings.npy"
IDS_NPY = "data/embeddings/ids.npy"


def embed(catalog: pd.DataFrame, *, backbone: str, batch_size: int, num_workers: int,
          **backbone_options: Any) -> np.ndarray:
    """Embeddings of the catalog's images in catalog order, for the ``encode`` params."""
    if backbone == precomputed.NAME:
        opts = backbone_options[precomputed.NAME]
        ids, emb = precomputed.read_precomputed(opts.get("path"), opts.get("ids"))
        out = precomputed.align(ids, emb, catalog["image_id"].tolist(), source=str(opts.get("path")))
        log.info("loaded %d precomputed embeddings (dim %d)", len(out), out.shape[1])
        return out
    model = get_backbone(backbone, backbone_options.get(backbone))
    with EmbeddingCache(default_path(), model.fingerprint) as cache:
        out, n_encoded, n_cached = encode_catalog(catalog, model, batch_size=batch_size,
                                                  num_workers=num_workers, cache=cache)
    log.info("%s (fingerprint %s, dim %d): encoded %d images, served %d from the cache (%s)", model.name,
             model.fingerprint, out.shape[1], n_encoded, n_cached, cache.path)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_stage_args(argv, "Embed every catalog image.",
                            {"catalog": CATALOG_CSV, "embeddings": EMBEDDINGS_NPY, "ids": IDS_NPY})
    remove_outputs([args.embeddings, args.ids])
    params = load_section("encode", args.params)
    catalog = read_input_csv(args.catalog, usecols=["image_id", "path", "sha256"])
    emb = embed(catalog, **params)
    ids = np.asarray(catalog["image_id"].tolist(), dtype=str)
    def npy(array: np.ndarray):
        def write(tmp):
            with open(tmp, "wb") as fh:
                np.save(fh, array, allow_pickle=False)
        return write

    write_all([(args.embeddings, npy(emb)), (args.ids, npy(ids))])


if __name__ == "__main__":
    run_stage(main)
