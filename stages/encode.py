"""Stage ``encode``: embed every catalog image once with the chosen backbone.

Reads only the ``encode`` section of params.yaml and the catalog. Writes float32
embeddings (``.npy``, one row per catalog row, in catalog order) and the aligned
image ids (``.npy`` of strings), both or neither.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np
import pandas as pd
from PIL import Image
from tqdm import tqdm

from stages.backbones import Backbone, get_backbone
from stages.common import UserError, atomic_path, parse_stage_args, remove_outputs, run_stage
from stages.images import DECODE_ERRORS, decode
from stages.params import load_section

log = logging.getLogger("stages.encode")

CATALOG_CSV = "data/prepared/catalog.csv"
EMBEDDINGS_NPY = "data/embeddings/embeddings.npy"
IDS_NPY = "data/embeddings/ids.npy"


def read_checked(path: str, sha256: str) -> Image.Image:
    """Load one catalog image, refusing a file that changed since the catalog was built."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise UserError(f"cannot read image {path!r} ({exc.strerror}); run `dvc repro` to rebuild the catalog.") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise UserError(f"image {path!r} changed since the catalog was built; run `dvc repro` to rebuild it.")
    try:
        return decode(data)
    except DECODE_ERRORS as exc:
        raise UserError(f"image {path!r} no longer decodes ({exc}); run `dvc repro`.") from None


def encode_catalog(catalog: pd.DataFrame, backbone: Backbone, *, batch_size: int, num_workers: int,
                   prefetch: int = 2) -> np.ndarray:
    """Embed the catalog's images in order.

    Decoding runs in ``num_workers`` threads, at most ``prefetch`` batches ahead
    of the encoder, so memory stays bounded whatever the dataset size.
    """
    out = np.empty((len(catalog), backbone.dim), dtype=np.float32)
    paths, shas = catalog["path"].tolist(), catalog["sha256"].tolist()
    starts = deque(range(0, len(paths), batch_size))
    pending: deque = deque()
    with ThreadPoolExecutor(max_workers=num_workers) as pool, \
            tqdm(total=len(paths), desc=f"encode {backbone.name}", unit="img", disable=None) as bar:
        while starts or pending:
            while starts and len(pending) <= prefetch:
                s = starts.popleft()
                pending.append((s, [pool.submit(read_checked, p, h)
                                    for p, h in zip(paths[s:s + batch_size], shas[s:s + batch_size])]))
            start, futures = pending.popleft()
            batch = [f.result() for f in futures]
            emb = np.asarray(backbone.encode(batch), dtype=np.float32)
            if emb.shape != (len(batch), backbone.dim):
                raise UserError(f"backbone {backbone.name!r} returned shape {emb.shape} for a batch of "
                                f"{len(batch)}; expected ({len(batch)}, {backbone.dim}).")
            out[start:start + len(batch)] = emb
            bar.update(len(batch))
    bad = ~np.isfinite(out).all(axis=1)
    if bad.any():
        names = catalog.loc[bad, "image_id"].tolist()
        raise UserError(f"backbone {backbone.name!r} produced NaN or inf for {len(names)} image(s): "
                        f"{', '.join(names[:10])}; check those images or the backbone.")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_stage_args(argv, "Embed every catalog image.",
                            {"catalog": CATALOG_CSV, "embeddings": EMBEDDINGS_NPY, "ids": IDS_NPY})
    remove_outputs([args.embeddings, args.ids])
    params = load_section("encode", args.params)
    backbone = get_backbone(params["backbone"], params.get(params["backbone"]))
    try:
        catalog = pd.read_csv(args.catalog, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise UserError(f"catalog {args.catalog!r} not found; run the split stage first (`dvc repro`).") from None
    emb = encode_catalog(catalog, backbone, batch_size=params["batch_size"], num_workers=params["num_workers"])
    ids = np.asarray(catalog["image_id"].tolist(), dtype=str)
    with atomic_path(args.embeddings) as tmp_emb, atomic_path(args.ids) as tmp_ids:
        with open(tmp_emb, "wb") as fh:
            np.save(fh, emb, allow_pickle=False)
        with open(tmp_ids, "wb") as fh:
            np.save(fh, ids, allow_pickle=False)
    log.info("encoded %d images with %s (dim %d, fingerprint %s)", len(catalog), backbone.name,
             backbone.dim, backbone.fingerprint)


if __name__ == "__main__":
    run_stage(main)
