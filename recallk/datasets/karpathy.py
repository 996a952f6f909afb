"""The caption benchmarks: Flickr30k and MSCOCO through Andrej Karpathy's split files (``dataset_flickr30k.json``,
``dataset_coco.json``), text <-> image retrieval over the test images and their captions.

A split file is ``{"images": [{"filename", "filepath" (COCO: ``train2014``/``val2014``), "split"
(``train``/``val``/``restval``/``test``), "sentences": [{"raw", ...}], ...}], "dataset": ...}``. Each reader
returns the manifest rows (``image_id``: the file name without its extension, ``path``, ``label`` = the image
id, ``split``: ``gallery`` for the test images, ``train`` for the others) and internal columns that
:func:`recallk.datasets.prepare` drops: ``captions`` (the image's captions, in the file's order), ``karpathy``
(the image's split in the file) and, for the 5-fold COCO 1K, ``fold`` (1-5: the test images in the file's order,
1,000 a fold; 0 for the others)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from recallk.data.contract import CONTROL_CHARACTERS, MAX_CAPTION_LENGTH
from recallk.datasets.base import Dataset, listed_once, need, read_lines
from recallk.errors import InputError, clip, quote

#: The splits of a Karpathy file; ``test`` is evaluated.
KARPATHY_SPLITS = ("train", "val", "restval", "test")
#: COCO 1K: the test images in the file's order, in folds of this many.
FOLD_SIZE, FOLDS = 1000, 5
#: Whitespace inside a caption (a line break, a tab, a run of spaces) becomes one space: one caption is one line.
_SPACES = re.compile(r"\s+")
_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")


def read_flickr30k(root: Path, ds: Dataset) -> tuple[pd.DataFrame, dict[str, int]]:
    """``dataset_flickr30k.json`` and ``flickr30k-images/<filename>``."""
    need(root, ds, "flickr30k-images")
    return _read(root, ds, "dataset_flickr30k.json", lambda entry, place: f"flickr30k-images/{entry['filename']}")


def read_coco(root: Path, ds: Dataset) -> tuple[pd.DataFrame, dict[str, int]]:
    """``dataset_coco.json`` and ``<filepath>/<filename>`` (``train2014/``, ``val2014/``)."""
    need(root, ds, "val2014")
    return _read(root, ds, "dataset_coco.json", lambda entry, place: f"{_text(entry, 'filepath', place, ds)}/"
                                                                      f"{entry['filename']}")


def read_coco1k(root: Path, ds: Dataset) -> tuple[pd.DataFrame, dict[str, int]]:
    """:func:`read_coco`, each test image with its fold (1-5, the file's order); the fold itself is chosen by
    :func:`recallk.datasets.prepare` (``fold=``)."""
    frame, counts = read_coco(root, ds)
    test = frame["karpathy"].eq("test")
    frame["fold"] = 0
    frame.loc[test, "fold"] = [1 + n // FOLD_SIZE for n in range(int(test.sum()))]
    return frame, counts


def select_fold(frame: pd.DataFrame, counts: dict[str, int], fold: int | None, ds: Dataset) -> None:
    """COCO 1K: fold ``fold``'s test images evaluated (``gallery``), the other test images ``train`` (not
    evaluated; their captions stay in the captions file, counted, never scored); its sizes into ``counts``."""
    if fold is None or not 1 <= fold <= FOLDS:
        got = "no fold" if fold is None else f"fold {fold}"
        raise InputError(f"{ds.name}: {got} given; choose one of the {FOLDS} folds of {FOLD_SIZE:,} test images "
                         f"(--fold N, N from 1 to {FOLDS}; fold N is test images {FOLD_SIZE:,}(N-1)+1 to "
                         f"{FOLD_SIZE:,}N in the file's order). Run the five and average their metrics.")
    chosen = frame["fold"].eq(fold)
    frame["split"] = chosen.map({True: "gallery", False: "train"})
    counts["fold_images"] = int(chosen.sum())
    counts["fold_captions"] = int(frame.loc[chosen, "captions"].map(len).sum())


def _read(root: Path, ds: Dataset, file_name: str, path_of) -> tuple[pd.DataFrame, dict[str, int]]:
    listing = need(root, ds, file_name, f"caption_datasets/{file_name}")
    entries = _entries(listing, ds)
    rows = []
    for number, entry in enumerate(entries, start=1):
        place = f"image {number} of {quote(str(listing))}"
        if not isinstance(entry, dict):
            raise ds.refuse(place, f"is {quote(clip(json.dumps(entry)))}", "each entry of `images` is an object "
                            "with `filename`, `split` and `sentences`")
        name = _text(entry, "filename", place, ds)
        split = _text(entry, "split", place, ds)
        if split not in KARPATHY_SPLITS:
            raise ds.refuse(place, f"({quote(name)}) has split {quote(split)}", f"a Karpathy split is one of "
                            f"{', '.join(KARPATHY_SPLITS)}")
        rows.append({"image_id": Path(name).stem, "path": path_of(entry, place), "karpathy": split,
                     "captions": _captions(entry, f"{place} ({quote(name)})", ds), "source": place})
    frame = pd.DataFrame(rows)
    listed_once(frame["image_id"].tolist(), frame["source"].tolist(), ds, "the image",
                "one entry per image (its file name, without the extension, is its image_id)")
    frame.insert(2, "label", frame["image_id"])
    frame.insert(3, "split", frame["karpathy"].map(lambda s: "gallery" if s == "test" else "train"))
    counts = {"images": len(frame), **{s: int(frame["karpathy"].eq(s).sum()) for s in KARPATHY_SPLITS}}
    if not counts["restval"] and "restval" not in ds.official:
        del counts["restval"]
    counts["test_captions"] = int(frame.loc[frame["karpathy"].eq("test"), "captions"].map(len).sum())
    if not counts["test"]:
        raise InputError(f"{ds.name}: {quote(str(listing))} lists no test image (`\"split\": \"test\"`): it is "
                         f"not Karpathy's split file. Expected layout: {ds.layout}")
    return frame, counts


def _entries(listing: Path, ds: Dataset) -> list[Any]:
    """The ``images`` list of a Karpathy file, or the error naming the file and what is wrong with it."""
    text = "\n".join(read_lines(listing, ds))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{ds.name}: line {exc.lineno} of {quote(str(listing))} is not valid JSON ({exc.msg}, "
                         f"column {exc.colno}): re-extract Karpathy's split file. Expected layout: "
                         f"{ds.layout}") from None
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, list) or not images:
        raise InputError(f"{ds.name}: {quote(str(listing))} has no `images` list: it is not Karpathy's split file "
                         f"(an object with `images`: [{{filename, split, sentences}}, ...]). Expected layout: "
                         f"{ds.layout}")
    return images


def _text(entry: dict, key: str, place: str, ds: Dataset) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip():
        what = f"has `{key}` {quote(clip(json.dumps(value)))}" if key in entry else f"has no `{key}`"
        raise ds.refuse(place, what, f"each image of the Karpathy file has a `{key}` (text)")
    return value


def _captions(entry: dict, place: str, ds: Dataset) -> list[str]:
    """The image's captions (each sentence's ``raw`` text, whitespace runs made one space), in the file's order;
    refused: an image without a caption, a caption that is not text, is empty, holds a control character or is
    longer than the split stage allows."""
    sentences = entry.get("sentences")
    if not isinstance(sentences, list) or not sentences:
        raise ds.refuse(place, "has no caption (`sentences` is empty or missing)", "every image of the Karpathy "
                        "file has its captions; an image without one cannot be scored under text <-> image")
    out = []
    for n, sentence in enumerate(sentences, start=1):
        raw = sentence.get("raw") if isinstance(sentence, dict) else None
        caption = _SPACES.sub(" ", raw).strip() if isinstance(raw, str) else ""
        bad = ("is empty" if not caption else "holds a control character" if _CONTROL.search(caption) else
               f"is over {MAX_CAPTION_LENGTH:,} characters" if len(caption) > MAX_CAPTION_LENGTH else None)
        if bad:
            raise ds.refuse(f"sentence {n} of {place}", f"{bad} ({quote(clip(json.dumps(raw)))})",
                            "each caption is one line of text (the `raw` of each sentence)")
        out.append(caption)
    return out
