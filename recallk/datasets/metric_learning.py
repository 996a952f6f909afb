"""The metric-learning benchmarks: CUB-200-2011, Cars196, Stanford Online Products (leave-one-out over the
test classes) and In-shop Clothes (query against gallery).

Each reader returns the manifest rows (``path`` relative to the root, ``label``, ``split``: ``train`` or
``gallery`` under leave-one-out, ``val`` for queries under query_gallery) and the counts measured."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from recallk.datasets.base import (
    COUNT_LINE,
    Dataset,
    Row,
    in_folder,
    integer_in,
    listed_once,
    need,
    one_spelling,
    read_lines,
    read_rows,
    scanned,
    where,
)
from recallk.errors import InputError, clip, quote

#: The release's class ids: CUB-200-2011 1-200, Cars196 1-196, Stanford Online Products 1-22,634 (super classes
#: 1-12).
CUB_CLASSES, CARS_CLASSES, SOP_CLASSES, SOP_SUPER_CLASSES = 200, 196, 22634, 12
#: CUB's class folders start with the class id: ``001.Black_footed_Albatross``.
_CUB_FOLDER = re.compile(r"(\d+)\.")


def read_cub(root: Path, ds: Dataset) -> tuple[pd.DataFrame, dict[str, int]]:
    """``images.txt`` (``<id> <class folder>/<file>``), ``image_class_labels.txt`` (``<id> <class>``),
    ``images/``: classes 1-100 train, 101-200 evaluated. Each id on one line of each file, each class a whole
    number 1-200, equal to the number of the image's class folder."""
    images_txt, labels_txt = need(root, ds, "images.txt"), need(root, ds, "image_class_labels.txt")
    image_rows = read_rows(images_txt, ds, r"(\d+)\s+(\S.*)")
    label_rows = read_rows(labels_txt, ds, r"(\d+)\s+(\S+)")
    need(root, ds, "images")
    image_at = [where(images_txt, r.number) for r in image_rows]
    label_at = [where(labels_txt, r.number) for r in label_rows]
    listed_once([int(r.fields[0]) for r in image_rows], image_at, ds, "image id",
                "one line per image id (each id names one file)")
    listed_once([int(r.fields[0]) for r in label_rows], label_at, ds, "image id",
                "one class per image (one line per image id)")
    images = {int(r.fields[0]): (r.fields[1], place) for r, place in zip(image_rows, image_at)}
    classes = {}
    for r, place in zip(label_rows, label_at):
        image, cls = int(r.fields[0]), integer_in(r.fields[1], 1, CUB_CLASSES, place, ds, "class")
        if image not in images:
            raise ds.refuse(place, f"gives a class to image id {image}", f"{quote(str(images_txt))} does not list "
                            "that id; every labelled image is listed there")
        folder = _CUB_FOLDER.match(images[image][0])
        if folder and int(folder[1]) != cls:
            raise ds.refuse(place, f"gives image id {image} the class {cls}", f"its file "
                            f"{quote(images[image][0])} ({images[image][1]}) is in the folder of class "
                            f"{int(folder[1])}; an image's class is its folder's")
        classes[image] = cls
    unlabelled = [i for i in images if i not in classes]
    if unlabelled:
        raise InputError(f"{ds.name}: image id {unlabelled[0]} of images.txt has no line in "
                         f"image_class_labels.txt ({len(unlabelled)} such). Expected layout: {ds.layout}")
    label = np.array([classes[i] for i in images])
    frame = pd.DataFrame({"path": [f"images/{path}" for path, _ in images.values()],
                          "label": [str(c) for c in label], "split": np.where(label <= 100, "train", "gallery"),
                          "source": [place for _, place in images.values()]})
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
        paths, label, sources = _cars_annos(need(root, ds, "cars_annos.mat"), ds)
    else:
        paths, label, sources = _cars_folders(root, ds)
    frame = pd.DataFrame({"path": paths, "label": [str(c) for c in label],
                          "split": np.where(label <= 98, "train", "gallery"), "source": sources})
    return frame, _counts(frame, label, 98)


def _cars_annos(path: Path, ds: Dataset) -> tuple[list[str], np.ndarray, list[str]]:
    """The annotations' paths and classes (whole numbers 1-196: a ``98.6`` is refused, not cut to 98)."""
    from scipy.io import loadmat

    try:
        annos = loadmat(path, squeeze_me=True)["annotations"]
        paths = [str(p) for p in np.atleast_1d(annos["relative_im_path"])]
        values = np.atleast_1d(annos["class"]).tolist()
    except (KeyError, ValueError, TypeError, OSError) as exc:
        raise InputError(f"{ds.name}: {quote(str(path))} is not the release's annotation file (an "
                         f"`annotations` struct with `relative_im_path` and `class`; {clip(str(exc))}). "
                         f"Expected layout: {ds.layout}") from None
    sources = [f"annotation {n} of {quote(str(path))}" for n in range(1, len(paths) + 1)]
    label = [integer_in(v, 1, CARS_CLASSES, place, ds, "class") for v, place in zip(values, sources)]
    return paths, np.array(label, dtype=np.int64), sources


def _cars_folders(root: Path, ds: Dataset) -> tuple[list[str], np.ndarray, list[str]]:
    """names.csv's class names (one a line, each once, at most 196) and the images of their folders."""
    names_csv = root / "names.csv"
    named = [(n, line.strip()) for n, line in enumerate(read_lines(names_csv, ds), start=1) if line.strip()]
    places = [where(names_csv, n) for n, _ in named]
    listed_once([name for _, name in named], places, ds, "the class name",
                "one line per class (a class's number is its line's rank; two lines of one name would merge them)")
    if len(named) > CARS_CLASSES:
        raise ds.refuse(places[CARS_CLASSES], f"names a class {CARS_CLASSES + 1}", f"{ds.release} has "
                        f"{CARS_CLASSES} classes (one name a line)")
    index = {name: i + 1 for i, (_, name) in enumerate(named)}
    paths, label = [], []
    for part in ("train", "test"):
        base = need(root, ds, f"car_data/{part}")
        for folder in sorted(p for p in base.iterdir() if p.is_dir()):
            if folder.name not in index:
                raise InputError(f"{ds.name}: folder {quote(str(folder))} is not a class of names.csv. "
                                 f"Expected layout: {ds.layout}")
            for f in sorted(folder.iterdir()):
                if f.suffix.lower() in (".jpg", ".jpeg", ".png"):
                    paths.append(scanned(f, root, ds))
                    label.append(index[folder.name])
    return paths, np.array(label, dtype=np.int64), [in_folder(root / p) for p in paths]


def read_sop(root: Path, ds: Dataset) -> tuple[pd.DataFrame, dict[str, int]]:
    """``Ebay_train.txt`` / ``Ebay_test.txt`` (header ``image_id class_id super_class_id path``): the test
    file's classes evaluated, the super-class kept as column ``superclass``. Each image id once per file, each
    class (1-22,634) in one file and of one super class (1-12)."""
    parts, counts, homes = [], {}, {}
    for name, split in (("train", "train"), ("test", "gallery")):
        listing = need(root, ds, f"Ebay_{name}.txt")
        rows = read_rows(listing, ds, r"(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", header=(SOP_HEADER,))
        places = [where(listing, r.number) for r in rows]
        listed_once([int(r.fields[0]) for r in rows], places, ds, "image id", "one line per image id")
        label, superclass = _sop_classes(rows, places, name, homes, ds)
        frame = pd.DataFrame({"path": [r.fields[3] for r in rows], "label": [str(c) for c in label], "split": split,
                              "superclass": [str(c) for c in superclass], "source": places})
        counts[name], counts[f"{name}_classes"] = len(frame), int(frame["label"].nunique())
        parts.append(frame)
    return pd.concat(parts, ignore_index=True), counts


def _sop_classes(rows: list[Row], places: list[str], name: str, homes: dict[int, tuple[str, int, str]],
                 ds: Dataset) -> tuple[list[int], list[int]]:
    """The class and super class of each row of ``Ebay_<name>.txt``; ``homes`` (class -> file, super class,
    first place) carries over from the other file, which must not list the class."""
    label, superclass = [], []
    for r, place in zip(rows, places):
        label.append(integer_in(r.fields[1], 1, SOP_CLASSES, place, ds, "class"))
        superclass.append(integer_in(r.fields[2], 1, SOP_SUPER_CLASSES, place, ds, "super class"))
        home = homes.setdefault(label[-1], (name, superclass[-1], place))
        if home[0] != name:
            raise ds.refuse(place, f"lists class {label[-1]}", f"{home[2]} lists it too; Ebay_train.txt and "
                            "Ebay_test.txt share no class (the protocol evaluates unseen classes)")
        if home[1] != superclass[-1]:
            raise ds.refuse(place, f"gives class {label[-1]} the super class {superclass[-1]}",
                            f"{home[2]} gives it {home[1]}; one super class per class")
    return label, superclass


#: The first line of Ebay_train.txt and Ebay_test.txt.
SOP_HEADER = "image_id class_id super_class_id path"
#: The second line of list_eval_partition.txt (the first is the number of images).
INSHOP_HEADER = "image_name item_id evaluation_status"


def read_inshop(root: Path, ds: Dataset) -> tuple[pd.DataFrame, dict[str, int]]:
    """``list_eval_partition.txt`` (a count, a header, then ``<img/...> <item_id> <train|query|gallery>``),
    at the root or under ``Eval/``; the images under the root or ``Img/``. Item ids written one way each, train
    items apart from the query and gallery ones."""
    listing = need(root, ds, "list_eval_partition.txt", "Eval/list_eval_partition.txt")
    rows = read_rows(listing, ds, r"(\S+)\s+(id_(\d+))\s+(train|query|gallery)", header=(COUNT_LINE, INSHOP_HEADER))
    places = [where(listing, r.number) for r in rows]
    one_spelling([r.fields[2] for r in rows], places, ds, "item id")
    side: dict[str, tuple[bool, str]] = {}
    for r, place in zip(rows, places):
        seen = side.setdefault(r.fields[1], (r.fields[3] == "train", place))
        if seen[0] != (r.fields[3] == "train"):
            raise ds.refuse(place, f"lists item {r.fields[1]} as {r.fields[3]}", f"{seen[1]} lists it as "
                            f"{'train' if seen[0] else 'test'}; an item is in train or in query/gallery, not both")
    base = "" if (root / "img").is_dir() or not (root / "Img").is_dir() else "Img/"
    status = np.array([r.fields[3] for r in rows])
    frame = pd.DataFrame({"path": [base + r.fields[0] for r in rows], "label": [r.fields[1] for r in rows],
                          "split": pd.Series(status).map({"train": "train", "query": "val", "gallery": "gallery"}),
                          "source": places})
    test = frame["split"] != "train"
    counts = {"train": int((status == "train").sum()), "query": int((status == "query").sum()),
              "gallery": int((status == "gallery").sum()), "train_items": int(frame.loc[~test, "label"].nunique()),
              "test_items": int(frame.loc[test, "label"].nunique())}
    return frame, counts
