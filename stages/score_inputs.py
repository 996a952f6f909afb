"""The score stage's inputs: read, check and align the catalog, the split and the embeddings.

Every problem is an :class:`~recallk.errors.InputError` that names the file, the rows
(by image_id) and the fix, raised before any scoring starts. The catalog and the split
are checked by the contracts the split stage wrote them under.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
from PIL import Image

from recallk import images
from recallk.data.contract import EVAL_SPLITS
from recallk.errors import InputError, quote
from recallk.score.suite import SplitSets
from recallk.score.text_image import TextImageSets
from stages.runner import read_captions, read_catalog, read_split

REENCODE = "re-run encode (`dvc repro -f encode`)"
#: What :func:`load_inputs` reads, by option name (``--catalog PATH`` ...): the score stage's inputs, and those
#: of every stage that reads the split's embeddings as score does (``index``).
SCORE_INPUTS = {"catalog": "data/prepared/catalog.csv", "split": "data/prepared/split.csv",
                "embeddings": "data/embeddings"}
#: The score stage's outputs that a later stage reads (``index``: the exact run), by the score stage's option name:
#: the folder of :data:`stages.runner.SCORE_FILES` and what was evaluated.
SCORE_RESULTS = {"scores": "data/scores", "evaluated": "metrics/evaluated.json"}


@dataclass(frozen=True)
class ScoreInputs:
    """What :func:`recallk.score.suite.score_split` needs, aligned by image_id."""

    sets: SplitSets          # image_ids by role (split order) and their embeddings, as stored
    catalog: pd.DataFrame    # indexed by image_id: label and extra columns


def load_inputs(catalog_csv: str, split_csv: str, embeddings_npy: str, ids_npy: str,
                train: bool = False, data_root: str | None = None) -> ScoreInputs:
    """Read and align the stage inputs; the train rows are read only when ``train`` (whitening). The
    catalog's paths must lie inside ``data_root`` (:func:`recallk.data.contract.check_catalog_paths`)."""
    for path in (embeddings_npy, ids_npy):
        if not Path(path).is_file():
            raise InputError(f"{path} not found; run the earlier stages first (`dvc repro`).")
    catalog = read_catalog(catalog_csv, data_root)
    split = read_split(split_csv)
    for flag in ("query", "gallery"):
        split[flag] = split[flag].eq("True")
    if not split["query"].any():
        raise InputError(f"{split_csv} marks no image as a query; check `split.fractions.val` (and the strategy), "
                         "then re-run split.")
    emb, ids = _arrays(embeddings_npy, ids_npy)
    text_ids = pd.Series(ids.astype(str))
    repeated = text_ids[text_ids.duplicated()].unique().tolist()
    if repeated:
        raise InputError(f"{ids_npy} repeats image_id {', '.join(map(str, repeated[:5]))} "
                         f"({len(repeated)} in all); each image_id must appear once: {REENCODE}.")
    row = pd.Series(np.arange(len(ids)), index=text_ids)
    used = split[split["query"] | split["gallery"] | (train & split["split"].eq("train"))]
    missing = used.loc[~used["image_id"].isin(row.index), "image_id"].tolist()
    if missing:
        raise InputError(f"{len(missing)} split images have no embedding (e.g. {', '.join(missing[:5])}); "
                         "the embeddings are stale: run `dvc repro`.")
    catalog = catalog.set_index("image_id")
    unknown = used.loc[~used["image_id"].isin(catalog.index), "image_id"].tolist()
    if unknown:
        raise InputError(f"{len(unknown)} split images are not in the catalog (e.g. {', '.join(unknown[:5])}); "
                         "the split and the catalog come from different runs: run `dvc repro`.")
    queries = used.loc[used["query"], "image_id"].to_numpy()
    gallery = used.loc[used["gallery"], "image_id"].to_numpy()
    train_ids = used.loc[used["split"].eq("train") & ~used["query"] & ~used["gallery"], "image_id"].to_numpy()
    chosen = np.concatenate([queries, gallery] + ([train_ids] if train else []))
    check_finite(emb, row[chosen].to_numpy(), chosen, embeddings_npy)
    same_set = bool(used["query"].eq(used["gallery"]).all())  # leave_one_out: every eval image plays both roles
    return ScoreInputs(SplitSets(emb, row, queries, gallery, train_ids, same_set), catalog)


def _arrays(embeddings_npy: str, ids_npy: str) -> tuple[np.ndarray, np.ndarray]:
    """An embeddings file and its ids file, loaded and checked: one row per id, real numbers."""
    try:
        emb = np.load(embeddings_npy, allow_pickle=False)
        ids = np.load(ids_npy, allow_pickle=False)
    except (ValueError, EOFError) as exc:  # EOFError: an empty file
        raise InputError(f"cannot load embeddings {embeddings_npy} / {ids_npy} ({exc or 'empty file'}); "
                         f"{REENCODE}.") from None
    if emb.ndim != 2 or ids.ndim != 1 or len(ids) != len(emb) or (emb.shape[0] and not emb.shape[1]):
        raise InputError(f"embeddings {embeddings_npy} {emb.shape} and ids {ids_npy} {ids.shape} do not align; "
                         f"{REENCODE}.")
    if not np.issubdtype(emb.dtype, np.number) or np.issubdtype(emb.dtype, np.complexfloating):
        raise InputError(f"embeddings {embeddings_npy} hold {emb.dtype} values, not real numbers; {REENCODE}.")
    return emb, ids


def check_finite(emb: np.ndarray, rows: np.ndarray, image_ids: np.ndarray, embeddings_npy: str) -> None:
    """Raise naming the image_ids whose embedding rows (among ``rows``) hold NaN or inf."""
    bad = np.zeros(len(rows), dtype=bool)
    for s in range(0, len(rows), 4096):  # a few MB at a time
        bad[s:s + 4096] = ~np.isfinite(emb[rows[s:s + 4096]]).all(axis=1)
    if bad.any():
        names = image_ids[bad].tolist()
        raise InputError(f"embeddings {embeddings_npy} have NaN or inf for {len(names)} image(s) "
                         f"(e.g. {', '.join(map(str, names[:5]))}); fix the encoder or the images, "
                         f"then {REENCODE}.")


def verified_loader(catalog: pd.DataFrame,
                    background: str = images.DEFAULT_BACKGROUND) -> Callable[[str], Image.Image]:
    """``image_id -> image`` for the failure sheet: each file is read once, its sha256 checked against the
    catalog's (what split saw and encode embedded) before it is decoded and drawn, its transparency composited
    over ``background`` (``split.background``: as the backbone saw it); a changed file is an InputError naming it."""
    def load(image_id: str) -> Image.Image:
        path, want = catalog.at[image_id, "path"], catalog.at[image_id, "sha256"]
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read image {quote(path)} (image_id {quote(image_id)}) for the failure sheet "
                             f"({exc.strerror or exc}); it moved since split: run `dvc repro`.") from None
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            raise InputError(f"image {quote(path)} (image_id {quote(image_id)}) changed since split: its sha256 is "
                             f"{got[:12]}…, the catalog's {str(want)[:12]}…; the scores describe the old file. "
                             "Run `dvc repro` (split and encode see the new file).")
        return images.decode(data, background=background)
    return load


def load_text_image(inputs: ScoreInputs, captions_csv: str, text_embeddings_npy: str,
                    text_ids_npy: str) -> TextImageSets:
    """The eval images of ``inputs`` (:func:`load_inputs` under ``split.protocol: text_image``: each both a query
    and a gallery item) and their captions (the rows of ``captions_csv`` of an eval split), with the captions'
    embeddings aligned by caption_id (the encode stage's ``text_embeddings.npy`` and ``text_ids.npy``)."""
    sets = inputs.sets
    captions = read_captions(captions_csv)
    captions = captions[captions["split"].isin(EVAL_SPLITS)].reset_index(drop=True)
    if captions.empty:
        raise InputError(f"{captions_csv} holds no caption of an eval image (val or gallery), but split.protocol is "
                         "text_image; the split and its captions come from different runs: run `dvc repro`.")
    for path in (text_embeddings_npy, text_ids_npy):
        if not Path(path).is_file():
            raise InputError(f"{path} not found: the captions have no embeddings; {REENCODE} with a backbone that "
                             "embeds text (docs/backbones.md).")
    emb, ids = _arrays(text_embeddings_npy, text_ids_npy)
    row = pd.Series(np.arange(len(ids)), index=pd.Index(ids.astype(str)))
    if row.index.duplicated().any():
        raise InputError(f"{text_ids_npy} repeats caption_id {row.index[row.index.duplicated()][0]}; {REENCODE}.")
    missing = captions.loc[~captions["caption_id"].isin(row.index), "caption_id"].tolist()
    if missing:
        raise InputError(f"{len(missing)} captions of {captions_csv} have no embedding in {text_embeddings_npy} "
                         f"(e.g. {', '.join(missing[:5])}); the embeddings are stale: run `dvc repro`.")
    image_ids = sets.queries
    position = pd.Series(np.arange(len(image_ids)), index=image_ids)
    outside = captions.loc[~captions["image_id"].isin(position.index), "image_id"].tolist()
    if outside:
        raise InputError(f"{captions_csv} captions {len(outside)} image(s) that are not eval images of the split "
                         f"(e.g. {', '.join(outside[:5])}); the split and its captions come from different runs: "
                         "run `dvc repro`.")
    chosen = captions["caption_id"].to_numpy()
    check_finite(emb, row[chosen].to_numpy(), chosen, text_embeddings_npy)
    return TextImageSets(image_ids, sets.embeddings(image_ids), chosen, captions["caption"].to_numpy(),
                         position[captions["image_id"]].to_numpy(), emb[row[chosen].to_numpy()])
