"""The metric-learning benchmarks: CUB-200-2011, Cars196, Stanford Online Products (leave-one-out over the
test classes) and In-shop Clothes (query against gallery).

Each reader returns the manifest rows (``path`` relative to the root, ``label``, ``split``: ``train`` or
``gallery`` under leave-one-out, ``val`` for queries under query_gallery) and the counts measured."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from recallk.datasets.base import Dataset, check_files, need, read_rows
from recallk.errors import InputError, clip, quote


def read_cub(root: Path, ds: Dataset) -> tuple[pd.DataFrame, dict[str, int]]:
    """``images.txt`` (``<id> <class folder>/<file>``), ``image_class_labels.txt`` (``<id> <class>``),
    ``images/``: classes 1-100 train, 101-200 evaluated."""
    images = {m[1]: m[2] for m in read_rows(need(root, ds, "images.txt"), ds, r"(\d+)\s+(\S.*)")}
    classes = {m[1]: int(m[2]) for m in read_rows(need(root, ds, "image_class_labels.txt"), ds, r"(\d+)\s+(\d+)")}
    need(root, ds, "images")
    unlabelled = [i for i in images if i not in classes]
    if unlabelled:
        raise InputError(f"{ds.name}: image id {unlabelled[0]} of images.txt has no line in "
                         f"image_class_labels.txt ({len(unlabelled)} such). Expected layout: {ds.layout}")
    paths = [f"images/{images[i]}" for i in images]
    check_files(root, paths, ds)
    label = np.array([classes[i] for i in images])
    frame = pd.DataFrame({"path": paths, "label": [str(c) for c in label],
                          "split": np.where(label <= 100, "train", "gallery")})
    return frame, _counts(frame, label, 100)


def _counts(frame: pd.DataFrame, label: np.ndarray, last_train: int) -> dict[str, int]:
    test = label > last_train
    return {"images": len(frame), "train": int((~test).sum()), "test": int(test.sum()),
            "classes": int(np.unique(label).size)}


def read_cars(root: Path, ds: Dataset) -> tuple[pd.DataFrame, dict[str, int]]:
    """``cars_annos.mat`` (``annotations``: ``relative_im_path``, ``class``) with ``car_ims/``, or the
    folder re-packaging ``names.csv`` (one class name a line, in class order) with
    ``car_data/{train,test}/<class name>/``: classes 1-98 train, 99-196 evaluated."""
    if (root / "cars_annos.mat").exists() or not (root / "names.csv").exists():
        paths, label = _cars_annos(need(root, ds, "cars_annos.mat"), ds)
    else:
        paths, label = _cars_folders(root, ds)
    check_files(root, paths, ds)
    frame = pd.DataFrame({"path": paths, "label": [str(c) for c in label],
                          "split": np.where(label <= 98, "train", "gallery")})
    return frame, _counts(frame, label, 98)


def _cars_annos(path: Path, ds: Dataset) -> tuple[list[str], np.ndarray]:
    from scipy.io import loadmat

    try:
        annos = loadmat(path, squeeze_me=True)["annotations"]
        paths = [str(p) for p in np.atleast_1d(annos["relative_im_path"])]
        label = np.atleast_1d(annos["class"]).astype(np.int64)
    except (KeyError, ValueError, TypeError, OSError) as exc:
        raise InputError(f"{ds.name}: {quote(str(path))} is not the release's annotation file (an "
                         f"`annotations` struct with `relative_im_path` and `class`; {clip(str(exc))}). "
                         f"Expected layout: {ds.layout}") from None
    return paths, label


def _cars_folders(root: Path, ds: Dataset) -> tuple[list[str], np.ndarray]:
    names = [line.strip() for line in (root / "names.csv").read_text(encoding="utf-8").splitlines() if line.strip()]
    index = {name: i + 1 for i, name in enumerate(names)}
    paths, label = [], []
    for part in ("train", "test"):
        base = need(root, ds, f"car_data/{part}")
        for folder in sorted(p for p in base.iterdir() if p.is_dir()):
            if folder.name not in index:
                raise InputError(f"{ds.name}: folder {quote(str(folder))} is not a class of names.csv. "
                                 f"Expected layout: {ds.layout}")
            for f in sorted(folder.iterdir()):
                if f.suffix.lower() in (".jpg", ".jpeg", ".png"):
                    paths.append(f.relative_to(root).as_posix())
                    label.append(index[folder.name])
    return paths, np.array(label, dtype=np.int64)


def read_sop(root: Path, ds: Dataset) -> tuple[pd.DataFrame, dict[str, int]]:
    """``Ebay_train.txt`` / ``Ebay_test.txt`` (header ``image_id class_id super_class_id path``): the test
    file's classes evaluated, the super-class kept as column ``superclass``."""
    parts, counts = [], {}
    for name, split in (("train", "train"), ("test", "gallery")):
        rows = read_rows(need(root, ds, f"Ebay_{name}.txt"), ds, r"(\d+)\s+(\d+)\s+(\d+)\s+(\S+)", skip=1)
        frame = pd.DataFrame({"path": [m[4] for m in rows], "label": [m[2] for m in rows], "split": split,
                              "superclass": [m[3] for m in rows]})
        counts[name], counts[f"{name}_classes"] = len(frame), int(frame["label"].nunique())
        parts.append(frame)
    frame = pd.concat(parts, ignore_index=True)
    check_files(root, frame["path"].tolist(), ds)
    return frame, counts


def read_inshop(root: Path, ds: Dataset) -> tuple[pd.DataFrame, dict[str, int]]:
    """``list_eval_partition.txt`` (a count, a header, then ``<img/...> <item_id> <train|query|gallery>``),
    at the root or under ``Eval/``; the images under the root or ``Img/``."""
    listing = need(root, ds, "list_eval_partition.txt", "Eval/list_eval_partition.txt")
    rows = read_rows(listing, ds, r"(\S+)\s+(id_\d+)\s+(train|query|gallery)", skip=2)
    base = "" if (root / "img").is_dir() or not (root / "Img").is_dir() else "Img/"
    status = np.array([m[3] for m in rows])
    frame = pd.DataFrame({"path": [base + m[1] for m in rows], "label": [m[2] for m in rows],
                          "split": pd.Series(status).map({"train": "train", "query": "val", "gallery": "gallery"})})
    check_files(root, frame["path"].tolist(), ds)
    test = frame["split"] != "train"
    counts = {"train": int((status == "train").sum()), "query": int((status == "query").sum()),
              "gallery": int((status == "gallery").sum()), "train_items": int(frame.loc[~test, "label"].nunique()),
              "test_items": int(frame.loc[test, "label"].nunique())}
    return frame, counts
