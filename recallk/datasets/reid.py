"""The person re-identification benchmarks of the Market-1501 naming (Market-1501, DukeMTMC-reID):
``query/`` against ``bounding_box_test/``, ``bounding_box_train/`` the train split.

A file name starts with the person id and the camera: ``0002_c1s1_000451_03.jpg`` (Market),
``0001_c2_f0046182.jpg`` (Duke). Columns written: ``label`` (the person id as written, ``0002``),
``camera`` (``1``) and ``junk`` (``True`` for the ``-1`` files: junk for every query). The protocol's
params (:data:`REID_SCORE`): the same person under the same camera is junk for its query
(``score.exclude_same_all: [label, camera]``), the junk files are hidden from every query
(``score.junk: junk``); the ``0000`` files keep their label, which no query has: distractors, negatives
for every query."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from recallk.datasets.base import Dataset, in_folder, need, one_spelling, scanned
from recallk.errors import InputError, quote

#: ``<person id>_c<camera>`` at the start of a file name; the person id may be -1 (junk).
NAME = re.compile(r"(-1|\d+)_c(\d+)")
#: The three folders and their splits.
FOLDERS = (("bounding_box_train", "train"), ("query", "val"), ("bounding_box_test", "gallery"))
#: The protocol's score params.
REID_SCORE = {"exclude_same": [], "exclude_same_all": ["label", "camera"], "junk": "junk"}


def read_reid(root: Path, ds: Dataset) -> tuple[pd.DataFrame, dict[str, int]]:
    """Every ``.jpg`` of the three folders, the person id and camera parsed from its name; each id written one
    way in every folder (``c1`` or ``c01``, ``0010`` or ``10``: not both)."""
    rows = []
    for folder, split in FOLDERS:
        base = need(root, ds, folder)
        for f in sorted(base.iterdir()):
            if f.suffix.lower() != ".jpg":
                continue  # Thumbs.db and the like
            match = NAME.match(f.name)
            if match is None:
                raise InputError(f"{ds.name}: {quote(str(f))} is not named <person id>_c<camera>_... (e.g. "
                                 f"0002_c1s1_000451_03.jpg). Expected layout: {ds.layout}")
            rows.append({"path": scanned(f, root, ds), "label": match[1], "split": split, "camera": match[2],
                         "junk": match[1] == "-1", "source": in_folder(f)})
    frame = pd.DataFrame(rows, columns=["path", "label", "split", "camera", "junk", "source"])
    people = frame[~frame["junk"]]
    one_spelling(people["label"].tolist(), people["source"].tolist(), ds, "person id")
    one_spelling(frame["camera"].tolist(), frame["source"].tolist(), ds, "camera")
    known = ~frame["junk"] & frame["label"].map(int).ne(0)  # neither junk (-1) nor a distractor (0000)
    ids = {split: frame.loc[frame["split"].eq(split) & known, "label"] for _, split in FOLDERS}
    counts = {"train": int(frame["split"].eq("train").sum()), "query": int(frame["split"].eq("val").sum()),
              "gallery": int(frame["split"].eq("gallery").sum()),
              "gallery_junk": int((frame["split"].eq("gallery") & frame["junk"]).sum()),
              "train_ids": int(ids["train"].nunique()), "query_ids": int(ids["val"].nunique())}
    if not counts["query"] or not counts["gallery"]:
        raise InputError(f"{ds.name}: {quote(str(root))} has {counts['query']} query and {counts['gallery']} "
                         f"gallery images (.jpg). Expected layout: {ds.layout}")
    return frame, counts
