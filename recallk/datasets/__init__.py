"""``recallk datasets prepare NAME ROOT``: the field's standard benchmarks from their official releases.

:func:`prepare` reads an extracted copy of a release under ``root`` (never downloading), writes a manifest
CSV (``path,label,split`` and the protocol's extra columns; for the caption benchmarks also a captions CSV,
``image_id,caption``) and a protocol file naming the protocol and its sizes, and returns the params that select
the official protocol (``split.strategy: given``, ``split.protocol``, ``split.captions``, the ``score`` exclusion
rules); :func:`apply_params` writes them into a params.yaml, keeping its comments. The datasets, their layouts,
counts and sources: :data:`DATASETS`, docs/datasets.md.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from recallk.atomic import write_all
from recallk.data.catalog import PROTOCOL_SUFFIX
from recallk.data.settings import TEXT_IMAGE
from recallk.datasets.base import Dataset, check_paths, differences
from recallk.datasets.karpathy import read_coco, read_coco1k, read_flickr30k, select_fold
from recallk.datasets.metric_learning import read_cars, read_cub, read_inshop, read_sop
from recallk.datasets.params_file import apply_params, params_write
from recallk.datasets.reid import REID_SCORE, read_reid
from recallk.errors import InputError, did_you_mean, quote

log = logging.getLogger(__name__)

__all__ = ["DATASETS", "PreparedDataset", "apply_params", "prepare"]

#: The score params of the leave-one-out benchmarks: no exclusion beyond the query's own image.
LOO_SCORE = {"exclude_same": [], "exclude_same_all": [], "junk": None}
_REID_LAYOUT = ("ROOT/bounding_box_train/, ROOT/query/ and ROOT/bounding_box_test/ holding <person id>_c<camera>_"
                "....jpg files")
_COCO_RELEASE = "MSCOCO 2014 (train2014.zip, val2014.zip) with Karpathy's split file dataset_coco.json"
_COCO_LAYOUT = ("ROOT/dataset_coco.json (or ROOT/caption_datasets/dataset_coco.json), ROOT/train2014/ and "
                "ROOT/val2014/ holding COCO_<train|val>2014_<id>.jpg")
_COCO_COUNTS = {"images": 123287, "train": 82783, "val": 5000, "restval": 30504, "test": 5000,
                "test_captions": 25010}
_KARPATHY = "Karpathy and Fei-Fei, Deep Visual-Semantic Alignments for Generating Image Descriptions, CVPR 2015"

DATASETS: dict[str, Dataset] = {d.name: d for d in (
    Dataset("cub200", "CUB-200-2011 (CUB_200_2011.tgz, Caltech)",
            "ROOT/images.txt, ROOT/image_class_labels.txt and ROOT/images/<class folder>/<file>.jpg (the "
            "CUB_200_2011 folder of the archive)",
            read_cub, {"images": 11788, "train": 5864, "test": 5924, "classes": 200}, "leave_one_out", LOO_SCORE,
            "Oh Song et al., Deep Metric Learning via Lifted Structured Feature Embedding, CVPR 2016: classes "
            "1-100 train, 101-200 test", "cub200-classes-101-200-loo"),
    Dataset("cars196", "Stanford Cars (car_ims.tgz with cars_annos.mat, or the names.csv + car_data/ folder "
                       "re-packaging)",
            "ROOT/cars_annos.mat and ROOT/car_ims/<file>.jpg, or ROOT/names.csv and "
            "ROOT/car_data/{train,test}/<class name>/<file>.jpg",
            read_cars, {"images": 16185, "train": 8054, "test": 8131, "classes": 196}, "leave_one_out",
            LOO_SCORE, "Oh Song et al., CVPR 2016: classes 1-98 train, 99-196 test", "cars196-classes-99-196-loo"),
    Dataset("sop", "Stanford Online Products (Stanford_Online_Products.zip)",
            "ROOT/Ebay_train.txt, ROOT/Ebay_test.txt and ROOT/<super class>_final/<file>.JPG",
            read_sop, {"train": 59551, "test": 60502, "train_classes": 11318, "test_classes": 11316},
            "leave_one_out", LOO_SCORE, "Oh Song et al., CVPR 2016: Ebay_train.txt / Ebay_test.txt",
            "sop-ebay-test-loo"),
    Dataset("inshop", "DeepFashion In-shop Clothes Retrieval (img.zip and list_eval_partition.txt)",
            "ROOT/list_eval_partition.txt (or ROOT/Eval/) and ROOT/img/... (or ROOT/Img/img/...)",
            read_inshop, {"train": 25882, "query": 14218, "gallery": 12612, "train_items": 3997,
                          "test_items": 3985}, "query_gallery", LOO_SCORE,
            "Liu et al., DeepFashion, CVPR 2016: list_eval_partition.txt", "inshop-query-gallery"),
    Dataset("market1501", "Market-1501 (Market-1501-v15.09.15.zip)", _REID_LAYOUT, read_reid,
            {"train": 12936, "query": 3368, "gallery": 19732, "gallery_junk": 3819, "train_ids": 751,
             "query_ids": 750}, "query_gallery", REID_SCORE,
            "Zheng et al., Scalable Person Re-identification: A Benchmark, ICCV 2015, and its evaluation code "
            "(torchreid's eval_market1501)", "market1501-query-gallery-reid"),
    Dataset("dukemtmc", "DukeMTMC-reID (DukeMTMC-reID.zip)", _REID_LAYOUT, read_reid,
            {"train": 16522, "query": 2228, "gallery": 17661, "gallery_junk": 0, "train_ids": 702,
             "query_ids": 702}, "query_gallery", REID_SCORE,
            "Zheng, Zheng and Yang, Unlabeled Samples Generated by GAN Improve the Person Re-identification "
            "Baseline in vitro, ICCV 2017 (Market-1501's protocol)", "dukemtmc-query-gallery-reid"),
    Dataset("flickr30k", "Flickr30k (flickr30k-images) with Karpathy's split file dataset_flickr30k.json",
            "ROOT/dataset_flickr30k.json (or ROOT/caption_datasets/dataset_flickr30k.json) and "
            "ROOT/flickr30k-images/<file>.jpg",
            read_flickr30k, {"images": 31014, "train": 29000, "val": 1014, "test": 1000, "test_captions": 5000},
            TEXT_IMAGE, LOO_SCORE, f"{_KARPATHY}: the test split of dataset_flickr30k.json",
            "flickr30k-karpathy-test"),
    Dataset("coco", _COCO_RELEASE, _COCO_LAYOUT, read_coco, _COCO_COUNTS, TEXT_IMAGE, LOO_SCORE,
            f"{_KARPATHY}: the test split of dataset_coco.json (5K)", "coco-karpathy-5k-test"),
    Dataset("coco1k", _COCO_RELEASE, _COCO_LAYOUT, read_coco1k, {**_COCO_COUNTS, "fold_images": 1000}, TEXT_IMAGE,
            LOO_SCORE, "Faghri et al., VSE++: Improving Visual-Semantic Embeddings with Hard Negatives, BMVC 2018: "
            f"the 5K test images of {_KARPATHY} in 5 folds of 1K, metrics averaged", "coco-karpathy-1k-fold{fold}"),
)}


@dataclass(frozen=True)
class PreparedDataset:
    """What :func:`prepare` wrote and found: the manifest, the params of the official protocol, the counts
    measured and the official ones, a phrase per count that differs, the captions file (caption benchmarks) and
    the protocol (its name and sizes: what the protocol file holds)."""

    manifest: Path
    params: dict[str, dict[str, Any]]
    counts: dict[str, int]
    official: dict[str, int]
    differences: list[str]
    captions: Path | None = None
    protocol: dict[str, Any] = field(default_factory=dict)


#: Columns of the readers' rows that are not the manifest's: where a row comes from, an image's captions, its
#: Karpathy split and its COCO 1K fold.
INTERNAL = ("source", "captions", "karpathy", "fold")


def prepare(name: str, root: str | os.PathLike, *, out: str | os.PathLike | None = None, strict: bool = False,
            apply_to: str | os.PathLike | None = None, fold: int | None = None,
            with_train: bool = False) -> PreparedDataset:
    """Write the manifest of benchmark ``name`` from its extracted release under ``root``.

    Parameters
    ----------
    name : str
        One of :data:`DATASETS` (``cub200``, ``cars196``, ``sop``, ``inshop``, ``market1501``, ``dukemtmc``,
        ``flickr30k``, ``coco``, ``coco1k``).
    root : path
        The extracted release (the layout of ``DATASETS[name].layout``); nothing is downloaded.
    out : path, optional
        The folder of the manifest and the ``split.data_root`` of the params: ``root`` (default) or a folder
        that contains it (the manifest's paths then start with ``root`` relative to it).
    strict : bool
        Counts that differ from the official release raise instead of warning.
    apply_to : path, optional
        A params.yaml to write the params into (:func:`apply_params`), with the manifest: both or neither.
    fold : int, optional
        ``coco1k`` only, and required there: the fold evaluated (1-5: test images 1-1,000, 1,001-2,000, ... in
        the split file's order).
    with_train : bool
        Caption benchmarks only: list the images that are not evaluated too (Karpathy's train, val and restval,
        COCO 1K's other folds) as ``train``, e.g. for the near-duplicate check across train and test. By default
        the manifest holds the evaluated images alone, so the encode stage embeds 1,000 (Flickr30k) or 5,000
        (COCO) images, not 31,014 or 123,287; the counts checked against the release read the whole split file
        either way.

    Returns
    -------
    PreparedDataset
        The manifest (``<out>/recallk_<name>.csv``; ``recallk_coco1k_fold<N>.csv``), the captions
        (``<manifest's name>_captions.csv``, caption benchmarks), the protocol file beside the manifest
        (``recallk_<name>.protocol.json``: the protocol's name and sizes, the counts), all written atomically,
        and the params.

    Raises
    ------
    InputError
        An unknown name, a layout missing a file (named, with the expected layout), a malformed line, a
        damaged release (a relation between its lines broken: an id listed twice, an image with two classes,
        a class outside the release's range, a header or count line missing or wrong, an id written two ways,
        an image without a caption), a listed image missing or outside the data root (the split stage's path
        rule), ``out`` not above ``root``, ``fold`` missing or out of range (``coco1k``) or given to another
        dataset, ``apply_to`` not a params file with ``split`` and ``score`` sections, or (``strict``) a count
        off the official one. Nothing is written then.
    """
    if name not in DATASETS:
        raise InputError(f"unknown dataset {quote(name)}.{did_you_mean(name, list(DATASETS))} "
                         f"Known: {', '.join(DATASETS)}.")
    ds = DATASETS[name]
    folded = "{fold}" in ds.protocol_name
    if with_train and ds.protocol != TEXT_IMAGE:
        raise InputError(f"{name}: --with-train is for the caption benchmarks (flickr30k, coco, coco1k), whose "
                         f"manifests list the evaluated images alone by default; {name}'s lists every image.")
    if fold is not None and not folded:
        raise InputError(f"{name}: --fold {fold} given, but {name} has no folds (only coco1k does: the 5 folds of "
                         "COCO 1K).")
    root_path = Path(root)
    if not root_path.is_dir():
        raise InputError(f"{name}: {quote(str(root_path))} is not a folder. Expected layout: {ds.layout}")
    base = Path(out) if out is not None else root_path
    try:
        prefix = Path(os.path.relpath(root_path.resolve(), base.resolve())).as_posix()
    except ValueError:
        prefix = ".."
    if prefix.startswith(".."):
        raise InputError(f"{name}: the manifest's folder {quote(str(base))} must be {quote(str(root_path))} or "
                         "a folder that contains it (split.data_root must hold the images).")
    frame, counts = ds.read(root_path, ds)
    if folded:
        select_fold(frame, counts, fold, ds)
    if ds.protocol == TEXT_IMAGE and not with_train:  # what is scored, not 118K train images encoded for nothing
        frame = frame[frame["split"].eq("gallery")].reset_index(drop=True)
    check_paths(frame, root_path, base, ds)
    captions = caption_rows(frame)
    frame = frame.drop(columns=[c for c in INTERNAL if c in frame.columns])
    if prefix != ".":
        frame["path"] = prefix + "/" + frame["path"]
    found = differences(counts, ds.official)
    if found and strict:
        raise InputError(count_message(name, found, strict=True))
    manifest = base / f"recallk_{name}{f'_fold{fold}' if folded else ''}.csv"
    captions_file = base / f"{manifest.stem}_captions.csv" if captions is not None else None
    params = {"split": {"data_root": str(base), "csv": manifest.name, "strategy": "given", "protocol": ds.protocol,
                        "images": "files", "captions": captions_file.name if captions_file else None},
              "score": dict(ds.score)}
    protocol = {"name": ds.protocol_name.format(fold=fold), "dataset": name, "split_protocol": ds.protocol,
                "sizes": protocol_sizes(frame, captions, ds.protocol), "manifest": manifest.name,
                "captions": params["split"]["captions"], "counts": counts, "official": dict(ds.official),
                "differences": found, "release": ds.release, "source": ds.source}
    writes = [(manifest, lambda tmp: frame.to_csv(tmp, index=False, lineterminator="\n"))]
    if captions is not None:
        writes.append((captions_file, lambda tmp: captions.to_csv(tmp, index=False, lineterminator="\n")))
    writes.append((manifest.with_suffix(PROTOCOL_SUFFIX), lambda tmp: tmp.write_text(
        json.dumps(protocol, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")))
    if apply_to is not None:  # renamed last: a failure before it takes the manifest back too
        writes.append(params_write(params, apply_to))
    # through the stages' writer: temp files, fsync, rename; never a partial manifest, never one without params
    write_all(writes)
    if found:
        log.warning("%s", count_message(name, found))
    return PreparedDataset(manifest, params, counts, dict(ds.official), found, captions_file, protocol)


def caption_rows(frame: pd.DataFrame) -> pd.DataFrame | None:
    """The captions file of a caption benchmark (``image_id,caption``, the split file's order): the captions of
    the manifest's test images (with ``with_train``, COCO 1K's other folds too: listed, counted by the split
    stage, not scored); None for the others."""
    if "captions" not in frame.columns:
        return None
    test = frame[frame["karpathy"].eq("test")]
    return test[["image_id", "captions"]].explode("captions").rename(columns={"captions": "caption"})


def protocol_sizes(frame: pd.DataFrame, captions: pd.DataFrame | None, protocol: str) -> dict[str, int]:
    """What the protocol evaluates, from the manifest written: text <-> image, the eval images and their
    captions; leave-one-out, the eval images (each a query against the others) and their classes; query ->
    gallery, the queries, the gallery and the queries' classes."""
    evaluated = frame[frame["split"].isin(("val", "gallery"))]
    if protocol == TEXT_IMAGE:
        scored = captions["image_id"].isin(set(evaluated["image_id"])) if captions is not None else []
        return {"images": len(evaluated), "captions": int(sum(scored))}
    if protocol == "leave_one_out":
        return {"queries": len(evaluated), "gallery": len(evaluated), "classes": int(evaluated["label"].nunique())}
    queries = evaluated[evaluated["split"].eq("val")]
    return {"queries": len(queries), "gallery": len(evaluated) - len(queries),
            "classes": int(queries["label"].nunique())}


def describe(protocol: dict[str, Any]) -> str:
    """The protocol in one line: "coco-karpathy-5k-test (text_image): 5,000 images, 25,010 captions"."""
    sizes = ", ".join(f"{v:,} {k}" for k, v in protocol["sizes"].items())
    return f"{protocol['name']} ({protocol['split_protocol']}): {sizes}"


def count_message(name: str, found: list[str], strict: bool = False) -> str:
    """The line of counts that differ from the official release (:func:`~recallk.datasets.base.differences`):
    the error under ``strict``, else the warning, which says when it is expected."""
    advice = (". Re-extract the release, or drop --strict to go on." if strict else
              " (expected for a part of the release; for the whole release, re-extract it: --strict makes this an "
              "error)")
    return f"{name}: counts differ from the official release ({DATASETS[name].release}): {'; '.join(found)}{advice}"
