"""The score stage's inputs: read, check and align the catalog, the split and the embeddings.

Every problem is a :class:`~stages.common.UserError` that names the file, the rows
(by image_id) and the fix, raised before any scoring starts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from stages.common import UserError, read_input_csv


def load_inputs(catalog_csv: str, split_csv: str, embeddings_npy: str, ids_npy: str, train: bool = False):
    """Read and align the stage inputs; return (embeddings, split rows used, catalog by id, row by id).

    The split rows are the queries and gallery items, plus the train items when ``train``.
    """
    for path in (embeddings_npy, ids_npy):
        if not Path(path).is_file():
            raise UserError(f"{path} not found; run the earlier stages first (`dvc repro`).")
    catalog = read_input_csv(catalog_csv, required=["image_id", "label"])
    split = read_input_csv(split_csv, usecols=["image_id", "split", "query", "gallery"])
    for flag in ("query", "gallery"):
        odd = split.loc[~split[flag].isin(["True", "False"]), flag].unique().tolist()
        if odd:
            raise UserError(f"{split_csv}: column `{flag}` must hold True or False. Got {odd[:5]} instead; "
                            "re-run split (`dvc repro split`).")
        split[flag] = split[flag].eq("True")
    for path, frame in ((catalog_csv, catalog), (split_csv, split)):
        _unique(frame["image_id"], path, "re-run split (`dvc repro -f split`)")
    if not split["query"].any():
        raise UserError(f"{split_csv} marks no image as a query; check `split.fractions.val` (and the strategy), "
                        "then re-run split.")
    try:
        emb = np.load(embeddings_npy, allow_pickle=False)
        ids = np.load(ids_npy, allow_pickle=False)
    except (ValueError, EOFError) as exc:  # EOFError: an empty file
        raise UserError(f"cannot load embeddings {embeddings_npy} / {ids_npy} ({exc or 'empty file'}); "
                        "re-run encode (`dvc repro -f encode`).") from None
    if emb.ndim != 2 or ids.ndim != 1 or len(ids) != len(emb) or (emb.shape[0] and not emb.shape[1]):
        raise UserError(f"embeddings {embeddings_npy} {emb.shape} and ids {ids_npy} {ids.shape} do not align; "
                        "re-run encode (`dvc repro -f encode`).")
    if not np.issubdtype(emb.dtype, np.number) or np.issubdtype(emb.dtype, np.complexfloating):
        raise UserError(f"embeddings {embeddings_npy} hold {emb.dtype} values, not real numbers; "
                        "re-run encode (`dvc repro -f encode`).")
    _unique(pd.Series(ids.astype(str)), ids_npy, "re-run encode (`dvc repro -f encode`)")
    row = pd.Series(np.arange(len(ids)), index=ids.astype(str))
    split = split[split["query"] | split["gallery"] | (train & split["split"].eq("train"))]
    missing = split.loc[~split["image_id"].isin(row.index), "image_id"].tolist()
    if missing:
        raise UserError(f"{len(missing)} split images have no embedding (e.g. {', '.join(missing[:5])}); "
                        "the embeddings are stale: run `dvc repro`.")
    catalog = catalog.set_index("image_id")
    unknown = split.loc[~split["image_id"].isin(catalog.index), "image_id"].tolist()
    if unknown:
        raise UserError(f"{len(unknown)} split images are not in the catalog (e.g. {', '.join(unknown[:5])}); "
                        "the split and the catalog come from different runs: run `dvc repro`.")
    return emb, split, catalog, row


def check_finite(emb: np.ndarray, rows: np.ndarray, image_ids: np.ndarray, embeddings_npy: str) -> None:
    """Raise naming the image_ids whose embedding rows (among ``rows``) hold NaN or inf."""
    bad = np.zeros(len(rows), dtype=bool)
    for s in range(0, len(rows), 4096):  # a few MB at a time
        bad[s:s + 4096] = ~np.isfinite(emb[rows[s:s + 4096]]).all(axis=1)
    if bad.any():
        names = image_ids[bad].tolist()
        raise UserError(f"embeddings {embeddings_npy} have NaN or inf for {len(names)} image(s) "
                        f"(e.g. {', '.join(map(str, names[:5]))}); fix the encoder or the images, "
                        "then re-run encode (`dvc repro -f encode`).")


def _unique(ids: pd.Series, path: str, fix: str) -> None:
    repeated = ids[ids.duplicated()].unique().tolist()
    if repeated:
        raise UserError(f"{path} repeats image_id {', '.join(map(str, repeated[:5]))} "
                        f"({len(repeated)} in all); each image_id must appear once: {fix}.")
