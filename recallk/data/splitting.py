"""Split strategies and evaluation protocols, as pure functions over the image table.

Assignment is stable: every label and every file gets a rank from
``sha256(seed, key)``, where the key is the label (``class_disjoint``) or the
file's content hash. Cuts are made on those ranks, so adding images never
reshuffles the existing ones; at most the one image (or label) at each cut moves
when the rounded cut position shifts. Identical files (same sha256) of a label
always land in the same split; with ``groups`` (``split.near_duplicates.policy: group``),
so does every near-duplicate cluster: its key replaces each member's content key, and a
cluster that spans labels follows its home label (the one holding most of its images, the
first by name on a tie); under ``class_disjoint`` the labels it spans go to the same side.
"""

from __future__ import annotations

import hashlib
import math
from typing import Mapping

import pandas as pd

from recallk.data.contract import EVAL_SPLITS, SPLITS
from recallk.errors import InputError

#: Protocols under which every eval image (val or gallery) plays both roles: ``leave_one_out`` (each against the
#: others) and ``text_image`` (each an image -> text query and a text -> image gallery item). The split merges the
#: val and gallery fractions into gallery for them.
BOTH_ROLES = ("leave_one_out", "text_image")


def stable_rank_key(seed: int, key: str) -> tuple[int, str]:
    """Sort key from ``sha256(f"{seed}:{key}")``; the key itself breaks (astronomically rare) ties."""
    digest = hashlib.sha256(f"{seed}:{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big"), key


def _round(x: float) -> int:
    return math.floor(x + 0.5)


def unit_keys(frame: pd.DataFrame) -> pd.Series:
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


def _spanning(labels: pd.Series, units: pd.Series) -> pd.DataFrame:
    """``unit, label`` once per pair, for the units found under more than one label."""
    pairs = pd.DataFrame({"unit": units.to_numpy(), "label": labels.to_numpy()}).drop_duplicates()
    return pairs[pairs["unit"].duplicated(keep=False)]


def _label_groups(labels: pd.Series, units: pd.Series) -> dict[str, str]:
    """Each label's group: labels that share a unit (a near-duplicate cluster) are one group, named
    after its first label by name (union-find over the labels)."""
    parent: dict[str, str] = {lab: lab for lab in labels.unique()}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for _, labs in _spanning(labels, units).groupby("unit", sort=False)["label"]:
        first, *rest = labs.tolist()
        for other in rest:
            a, b = find(first), find(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return {lab: find(lab) for lab in parent}


def _train_labels(labels: pd.Series, units: pd.Series | None, seed: int, train: float) -> set[str]:
    """``class_disjoint``: the labels ranked first by their stable key, ``round(train * n)`` of them; labels
    joined by a cluster (``units`` shared across labels) are taken together, when the group's first label
    comes up. Without shared units this is the plain cut."""
    ordered = sorted(labels.unique(), key=lambda lab: stable_rank_key(seed, lab))
    target = _round(train * len(ordered))
    if units is None:
        return set(ordered[:target])
    group = _label_groups(labels, units)
    members: dict[str, list[str]] = {}
    for lab in ordered:
        members.setdefault(group[lab], []).append(lab)
    chosen: set[str] = set()
    for lab in ordered:
        if len(chosen) >= target:
            break
        chosen.update(members[group[lab]])
    return chosen


def _home_labels(labels: pd.Series, units: pd.Series) -> dict[str, str]:
    """The home label of each unit that spans labels: the one with most of its rows, then the first by name."""
    frame = pd.DataFrame({"unit": units.to_numpy(), "label": labels.to_numpy()})
    frame = frame[frame["unit"].isin(_spanning(labels, units)["unit"])]
    counts = frame.value_counts().reset_index()
    counts = counts.sort_values(["unit", "count", "label"], ascending=[True, False, True], kind="stable")
    return dict(counts.drop_duplicates("unit")[["unit", "label"]].itertuples(index=False))


def assign_splits(frame: pd.DataFrame, *, strategy: str, protocol: str,
                  fractions: Mapping[str, float], seed: int, groups: pd.Series | None = None) -> pd.Series:
    """Return the split (``train``/``val``/``gallery``) of every row of ``frame``.

    ``frame`` needs ``image_id, label, sha256`` (and ``split`` for ``given``).
    Under ``leave_one_out`` and ``text_image`` (:data:`BOTH_ROLES`) the val and gallery fractions merge into
    gallery.
    ``groups`` (aligned with ``frame``): each row's near-duplicate cluster key, which then replaces
    its content key; every cluster lands in one split (module docstring).
    """
    if strategy == "given":
        if "split" not in frame.columns:
            raise InputError("`split.strategy: given` needs a `split` column in the manifest CSV "
                            "(train, val or gallery per row); add it or choose another strategy.")
        return frame["split"].copy()
    train, val, gallery = (float(fractions[k]) for k in SPLITS)
    if protocol in BOTH_ROLES:
        val, gallery = 0.0, val + gallery
    units = unit_keys(frame) if groups is None else groups.astype(str)
    labels = frame["label"].fillna("").astype(str)
    result = pd.Series("gallery", index=frame.index, dtype=object)
    if strategy == "class_disjoint":  # whole labels to train; each eval label's files to val / gallery
        train_labels = _train_labels(labels, units if groups is not None else None, seed, train)
        share = val / (val + gallery) if val + gallery > 0 else 0.0
        within = (0.0, share, 1.0 - share)
    elif strategy == "per_class":  # each label's files to train / val / gallery
        train_labels, within = set(), (train, val, gallery)
    else:  # pragma: no cover - params validation rejects other names
        raise InputError(f"unknown split strategy {strategy!r}")
    home = _home_labels(labels, units) if groups is not None else {}
    decided: dict[str, str] = {}  # the split of each unit that spans labels, from its home label
    for label, idx in labels.groupby(labels, sort=True).groups.items():
        if label in train_labels:
            result[idx] = "train"
            continue
        label_units = units[idx].tolist()
        mapping = _cut_label(label_units, seed, _counts(len(set(label_units)), *within))
        decided.update({u: split for u, split in mapping.items() if home.get(u) == label})
        result[idx] = [mapping[u] for u in label_units]
    if home:
        spans = units.isin(list(home)) & ~labels.isin(train_labels)
        result[spans] = units[spans].map(decided)
    return result


def roles(split: pd.Series, protocol: str) -> tuple[pd.Series, pd.Series]:
    """Return ``(query, gallery)`` flags for each row.

    ``query_gallery``: val rows are queries, gallery rows are the gallery.
    ``leave_one_out``: every val or gallery row is both a query and a gallery item
    (at score time a query never retrieves its own image).
    ``text_image``: the same flags (every eval image is an image -> text query and a text -> image gallery item;
    its captions are the other side).
    """
    if protocol in BOTH_ROLES:
        both = split.isin(EVAL_SPLITS)
        return both, both.copy()
    return split.eq("val"), split.eq("gallery")


def queries_without_positive(labels: pd.Series, query: pd.Series, gallery: pd.Series) -> pd.Series:
    """Flag queries whose label has no gallery image other than the query itself."""
    in_gallery = labels[gallery].value_counts()
    count = labels.map(in_gallery).fillna(0).astype(int) - (query & gallery).astype(int)
    return query & (count <= 0)
