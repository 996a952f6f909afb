"""Split strategies and evaluation protocols, as pure functions over the image table.

Assignment is stable: every label and every file gets a rank from
``sha256(seed, key)``, where the key is the label (``class_disjoint``) or the
file's content hash. Cuts are made on those ranks, so adding images never
reshuffles the existing ones; at most the one image (or label) at each cut moves
when the rounded cut position shifts. Identical files (same sha256) of a label
always land in the same split.
"""

from __future__ import annotations

import hashlib
import math
from typing import Mapping

import pandas as pd

from recallk.data.contract import EVAL_SPLITS, SPLITS
from recallk.errors import InputError


def stable_rank_key(seed: int, key: str) -> tuple[int, str]:
    """Sort key from ``sha256(f"{seed}:{key}")``; the key itself breaks (astronomically rare) ties."""
    digest = hashlib.sha256(f"{seed}:{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big"), key


def _round(x: float) -> int:
    return math.floor(x + 0.5)


def _unit_keys(frame: pd.DataFrame) -> pd.Series:
    """The content key of each row: its sha256, or its image_id when the file was unreadable."""
    ids = "id:" + frame["image_id"].astype(str)
    return frame["sha256"].where(frame["sha256"].notna(), ids).astype(str)


def _cut_label(units: list[str], seed: int, counts: tuple[int, int]) -> dict[str, str]:
    """Rank a label's units and give the first ``counts[0]`` to train, the next ``counts[1]`` to val."""
    ordered = sorted(set(units), key=lambda u: stable_rank_key(seed, u))
    n_train, n_val = counts
    return {u: "train" if i < n_train else "val" if i < n_train + n_val else "gallery"
            for i, u in enumerate(ordered)}


def _counts(n: int, train: float, val: float, gallery: float) -> tuple[int, int]:
    """Units to train and to val for a label of ``n`` units (the rest go to gallery).

    Cumulative rounding keeps the three counts summing to ``n``. When ``gallery``
    is positive, a label that gets val queries keeps at least one gallery unit.
    """
    n_train = _round(train * n)
    n_val = _round((train + val) * n) - n_train
    if gallery > 0 and n_val > 0 and n_train + n_val == n:
        n_val -= 1
    return n_train, n_val


def assign_splits(frame: pd.DataFrame, *, strategy: str, protocol: str,
                  fractions: Mapping[str, float], seed: int) -> pd.Series:
    """Return the split (``train``/``val``/``gallery``) of every row of ``frame``.

    ``frame`` needs ``image_id, label, sha256`` (and ``split`` for ``given``).
    Under ``leave_one_out`` the val and gallery fractions merge into gallery.
    """
    if strategy == "given":
        if "split" not in frame.columns:
            raise InputError("`split.strategy: given` needs a `split` column in the manifest CSV "
                            "(train, val or gallery per row); add it or choose another strategy.")
        return frame["split"].copy()
    train, val, gallery = (float(fractions[k]) for k in SPLITS)
    if protocol == "leave_one_out":
        val, gallery = 0.0, val + gallery
    units = _unit_keys(frame)
    labels = frame["label"].fillna("").astype(str)
    result = pd.Series("gallery", index=frame.index, dtype=object)
    if strategy == "class_disjoint":  # whole labels to train; each eval label's files to val / gallery
        ordered = sorted(labels.unique(), key=lambda lab: stable_rank_key(seed, lab))
        train_labels = set(ordered[:_round(train * len(ordered))])
        share = val / (val + gallery) if val + gallery > 0 else 0.0
        within = (0.0, share, 1.0 - share)
    elif strategy == "per_class":  # each label's files to train / val / gallery
        train_labels, within = set(), (train, val, gallery)
    else:  # pragma: no cover - params validation rejects other names
        raise InputError(f"unknown split strategy {strategy!r}")
    for label, idx in labels.groupby(labels, sort=True).groups.items():
        if label in train_labels:
            result[idx] = "train"
            continue
        label_units = units[idx].tolist()
        mapping = _cut_label(label_units, seed, _counts(len(set(label_units)), *within))
        result[idx] = [mapping[u] for u in label_units]
    return result


def roles(split: pd.Series, protocol: str) -> tuple[pd.Series, pd.Series]:
    """Return ``(query, gallery)`` flags for each row.

    ``query_gallery``: val rows are queries, gallery rows are the gallery.
    ``leave_one_out``: every val or gallery row is both a query and a gallery item
    (at score time a query never retrieves its own image).
    """
    if protocol == "leave_one_out":
        both = split.isin(EVAL_SPLITS)
        return both, both.copy()
    return split.eq("val"), split.eq("gallery")


def queries_without_positive(labels: pd.Series, query: pd.Series, gallery: pd.Series) -> pd.Series:
    """Flag queries whose label has no gallery image other than the query itself."""
    in_gallery = labels[gallery].value_counts()
    count = labels.map(in_gallery).fillna(0).astype(int) - (query & gallery).astype(int)
    return query & (count <= 0)
