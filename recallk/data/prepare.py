"""The split stage's computation: the catalog and the split assignment of a data root.

The catalog (``image_id, path, label, sha256, width, height, phash`` + extra manifest
columns) depends only on the images, never on split params (but ``split.background``, the colour
transparency is composited over before the pHash is taken: how the images look), so a split-only
change leaves it byte-identical and the encode stage is skipped. The split table
is ``image_id, split, query, gallery``; the skipped table ``path, reason``; both tables give paths as
:func:`recallk.data.catalog.location` does (relative to the working directory when inside it).

Near-duplicates (``split.near_duplicates``): every pair of images whose pHash (the catalog's
``phash``) differ in at most ``max_distance`` of 64 bits (:mod:`recallk.data.phash`) and whose grey
thumbnails and colour cells confirm it (:mod:`recallk.data.nearcopy`; images under 16 px a side are too small
to check), with ``policy`` ``report`` (listed and counted), ``group`` (each cluster kept in one split) or
``error`` (a pair across the train/eval border, or a query with a near copy in the gallery, stops the stage).
``report`` warns on pairs across train/eval and on query-gallery pairs of different labels; a same-label
query-gallery pair is a positive, counted apart (issue 38).

A manifest of ids without image files (no ``path`` column, or ``split.images: none``) gives an
embeddings-only catalog: the file columns stay empty, nothing is read or hashed, and neither
exact nor near-duplicate checks can run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from recallk.data import captions as captions_module
from recallk.data import catalog, contract, nearcopy, phash, splitting
from recallk.data.settings import TEXT_IMAGE, NearDuplicateSettings, SplitSettings
from recallk.errors import InputError, quote
from recallk.images import DEFAULT_BACKGROUND
from recallk.settings.base import as_params

log = logging.getLogger(__name__)

#: ``policy: group`` warns when one cluster holds more than this share of the images, and more than this
#: many (chained pairs).
LARGE_CLUSTER, LARGE_CLUSTER_IMAGES = 0.05, 10
#: Pairs an error message lists before summarising the rest.
MAX_LISTED = 20
#: The captions' counts of a split without captions.
NO_CAPTIONS = {"num_captions": 0, "num_captioned_images": 0, "num_eval_captions": 0, "num_ambiguous_captions": 0,
               "num_skipped_captions": 0}


@dataclass
class Prepared:
    """What the split stage writes: the tables, and what the near-duplicate check found."""

    catalog: pd.DataFrame
    split: pd.DataFrame
    skipped: pd.DataFrame
    #: ``id_a, id_b, label_a, label_b, split_a, split_b, distance``; None without image files.
    near_duplicates: pd.DataFrame | None
    #: For provenance.json: policy, max_distance, pairs and the three counts (None without image files).
    summary: dict[str, Any] | None = field(default=None)
    #: For provenance.json: how many catalog images have transparency, composited over ``split.background``
    #: (None without image files).
    transparent: int | None = None
    #: ``caption_id, image_id, caption, split`` (:mod:`recallk.data.captions`); header only without
    #: ``split.captions``.
    captions: pd.DataFrame = field(default_factory=captions_module.empty_table)
    #: For provenance.json: the captions' counts (:func:`recallk.data.captions.caption_table`; zeros without).
    caption_summary: dict[str, int] = field(default_factory=lambda: dict(NO_CAPTIONS))

    @property
    def files(self) -> bool:
        return self.near_duplicates is not None


def prepare(settings: SplitSettings) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``(catalog, split, skipped)`` of :func:`prepare_all`."""
    out = prepare_all(settings)
    return out.catalog, out.split, out.skipped


def prepare_all(settings: SplitSettings) -> Prepared:
    """The catalog, split, skipped-images and near-duplicate tables of a data root.

    Parameters
    ----------
    settings : SplitSettings
        The ``split`` section: ``data_root``, ``csv``, ``images``, ``on_bad_image``, ``strategy``,
        ``protocol``, ``seed``, ``fractions`` and ``near_duplicates`` (:mod:`recallk.data.settings`).

    Returns
    -------
    Prepared
        Each row set passed the image-table contract, and the catalog and split frames the contracts
        of their files (checked again on read).

    Raises :class:`~recallk.errors.InputError` listing every failing row (and, under
    ``near_duplicates.policy: error``, every leaking pair).
    """
    csv, images, strategy, protocol = settings.csv, settings.images, settings.strategy, settings.protocol
    near = settings.near_duplicates
    root = Path(settings.data_root)
    frame = catalog.read_source(root, csv, images, (settings.captions,) if settings.captions else ())
    # the captions file is read before any image: a missing or malformed file stops the stage at once
    raw_captions = captions_module.read_captions(root, settings.captions) if settings.captions else None
    files = "path" in frame.columns
    skipped = pd.DataFrame({"path": pd.Series(dtype=object), "reason": pd.Series(dtype=object)})
    listed = set(frame["image_id"].dropna())
    if files:
        frame, skipped = _probe(root, frame, settings.on_bad_image, settings.background)
    else:
        frame = catalog.without_files(frame)
        log.info("embeddings-only catalog: %d ids from %s, no image read (split.images: %s); exact and "
                 "near-duplicate checks are unavailable", len(frame), root / csv, images)
    same_number = contract.same_number_labels(frame["label"])  # 7, 7.0 and 07: three classes, said once
    if same_number:
        log.warning("%s", same_number)
    pairs = _near_pairs(frame, near.max_distance) if files else None
    groups = None
    if files and near.policy == "group" and strategy != "given":
        groups = cluster_keys(frame, pairs)
    frame["split"] = splitting.assign_splits(frame, strategy=strategy, protocol=protocol,
                                             fractions=as_params(settings.fractions), seed=settings.seed,
                                             groups=groups)
    source = f"{root / csv}" if csv else f"{root}/"
    contract.validate(frame, contract.image_table_schema(class_disjoint=strategy == "class_disjoint", files=files),
                      source=source, csv_lines=csv is not None)
    table = None
    if files:
        table = phash.pair_table(frame["image_id"], frame["label"], frame["split"], *pairs)

    frame = frame.sort_values("image_id", kind="stable").reset_index(drop=True)
    query, gallery = splitting.roles(frame["split"], protocol)
    if not query.any() or not gallery.any():
        counts = frame["split"].value_counts().to_dict()
        raise InputError(f"the split has {int(query.sum())} queries and {int(gallery.sum())} gallery images "
                        f"(split sizes: {counts}); adjust `split.fractions` or the manifest's split column "
                        f"so that both are non-empty.")
    summary = None
    if table is not None:
        summary = _check_pairs(table, dict(zip(frame["image_id"], query)), dict(zip(frame["image_id"], gallery)),
                               near, strategy, protocol, too_small_count(frame))
    # under text_image an image's positives are its captions, not the images of its label
    orphans = splitting.queries_without_positive(frame["label"], query, gallery) & (protocol != TEXT_IMAGE)
    if orphans.any():
        labels = sorted(frame.loc[orphans, "label"].unique())
        log.warning("%d queries (labels: %s) have no gallery image of their label other than themselves; "
                    "score will exclude and count them", int(orphans.sum()), ", ".join(labels[:10]))

    transparent = None
    if files:  # what compositing did, said once (the pHash above and encode's pixels both saw it)
        transparent = int(frame["transparent"].eq(True).sum())
        log.info("%d of %d images have transparency; composited over %s (split.background)", transparent,
                 len(frame), settings.background)
    extras = [c for c in frame.columns if c not in catalog.CATALOG_COLUMNS + catalog.PROBE_ONLY_COLUMNS + ("split",)]
    cat = frame[list(catalog.CATALOG_COLUMNS) + extras].copy()
    if files:
        cat["path"] = [catalog.location(root, p) for p in cat["path"]]
    split = pd.DataFrame({"image_id": frame["image_id"], "split": frame["split"],
                          "query": query, "gallery": gallery})
    for frame, schema in ((cat, contract.catalog_schema()), (split, contract.split_schema())):
        contract.validate(contract.as_text(frame), schema, source=f"the {schema.name} table", csv_lines=True)
    out = Prepared(cat, split, skipped, table, summary, transparent)
    if raw_captions is not None:
        out.captions, out.caption_summary = captions_module.caption_table(
            raw_captions, split, listed - set(split["image_id"]), source=str(root / settings.captions))
    return out


def _probe(root: Path, frame: pd.DataFrame, on_bad_image: str,
           background: str = DEFAULT_BACKGROUND) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read every image (:func:`recallk.data.catalog.probe`, transparency composited over ``background``); drop
    the unreadable ones under ``skip``."""
    frame = catalog.probe(root, frame, background=background)
    bad = catalog.unreadable(frame) if on_bad_image == "skip" else pd.Series(False, index=frame.index)
    # the catalog's path convention (where a stage run from the working directory finds the file)
    skipped = pd.DataFrame({"path": [catalog.location(root, p) for p in frame.loc[bad, "path"]],
                            "reason": frame.loc[bad, "problem"].to_numpy()})
    skipped = skipped.sort_values("path", kind="stable").reset_index(drop=True)
    if bad.any():
        log.warning("skipped %d unreadable image(s) (split.on_bad_image: skip), e.g. %s",
                    int(bad.sum()), ", ".join(skipped["path"].head(3)))
        frame = frame[~bad]
        if frame.empty:
            raise InputError(f"every one of the {int(bad.sum())} images is unreadable (e.g. {skipped['path'][0]}: "
                            f"{skipped['reason'][0]}); check the data root {root}.")
    return frame, skipped


def _near_pairs(frame: pd.DataFrame, max_distance: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row positions ``(i, j)`` and distance of every near-duplicate pair: pHash within ``max_distance``,
    confirmed by the thumbnails (:mod:`recallk.data.nearcopy`). Rows without a hash (the contract reports
    their files) and images too small to check take no part."""
    hashed = frame["phash"].notna().to_numpy()
    small = hashed & nearcopy.too_small(frame["width"].fillna(0).to_numpy(), frame["height"].fillna(0).to_numpy())
    rows = np.flatnonzero(hashed & ~small)
    i, j, dist = phash.near_pairs(phash.to_codes(frame["phash"].iloc[rows]), max_distance)
    thumbs = np.stack([np.frombuffer(t, dtype=np.uint8) for t in frame["thumb"].iloc[rows]]) if rows.size else None
    keep = nearcopy.confirmed(thumbs, i, j, dist)
    if (~keep).any():  # said, not listed: alike in grey levels, different in colour (red/blue circles), no copy
        colour = nearcopy.similarity(thumbs, i[~keep], j[~keep]) >= nearcopy.MIN_SIMILARITY
        if colour.any():
            log.info("near-duplicates: %d pHash pair(s) alike in grey levels but not in colour are not copies "
                     "(not listed; recallk.data.nearcopy.MAX_COLOUR_DISTANCE)", int(colour.sum()))
    return rows[i[keep]], rows[j[keep]], dist[keep]


def too_small_count(frame: pd.DataFrame) -> int:
    """How many hashed images are too small to check (:data:`recallk.data.nearcopy.MIN_SIDE`)."""
    hashed = frame["phash"].notna().to_numpy()
    return int((hashed & nearcopy.too_small(frame["width"].fillna(0).to_numpy(),
                                            frame["height"].fillna(0).to_numpy())).sum())


def cluster_keys(frame: pd.DataFrame, pairs: tuple[np.ndarray, np.ndarray, np.ndarray]) -> pd.Series:
    """``policy: group``: each row's unit key, the smallest content key of its near-duplicate cluster (a row
    in no pair keeps its own, so the assignment only changes where clusters are)."""
    own = splitting.unit_keys(frame).to_numpy()
    component = phash.clusters(len(frame), pairs[0], pairs[1])
    keys = pd.Series(own).groupby(component).transform("min")
    multi = pd.Series(component).duplicated(keep=False).to_numpy()
    if multi.any():
        log.info("split.near_duplicates.policy: group: %d images in %d near-duplicate clusters, each kept in one "
                 "split", int(multi.sum()), pd.Series(component[multi]).nunique())
        largest = int(np.bincount(component).max())
        if largest > max(LARGE_CLUSTER_IMAGES, LARGE_CLUSTER * len(frame)):
            log.warning("split.near_duplicates.policy: group: the largest near-duplicate cluster holds %d of %d images "
                        "(%.0f%%): pairs chain (a~b and b~c put a, b and c together), so the splits can be far from "
                        "split.fractions; lower split.near_duplicates.max_distance, or use policy report",
                        largest, len(frame), 100 * largest / len(frame))
    return pd.Series(np.where(multi, keys.to_numpy(), own), index=frame.index)


def _describe(table: pd.DataFrame) -> str:
    rows = [f"{quote(r.id_a)} ({r.label_a}, {r.split_a}) ~ {quote(r.id_b)} ({r.label_b}, {r.split_b}): "
            f"{r.distance} bits" for r in table.head(MAX_LISTED).itertuples(index=False)]
    more = [f"... and {len(table) - MAX_LISTED} more"] if len(table) > MAX_LISTED else []
    return "\n  - " + "\n  - ".join(rows + more)


def _check_pairs(table: pd.DataFrame, query: dict, gallery: dict, near: NearDuplicateSettings, strategy: str,
                 protocol: str, small: int = 0) -> dict[str, Any]:
    """The counts of the pairs, logged (a warning for pairs across train/eval or a query and a gallery image of
    another label; same-label query-gallery pairs are positives, said apart at info level); the ``error``
    policy (and ``group`` under ``given``, which cannot move an image) stops on a leaking pair. No hint names
    a policy the strategy refuses. ``small`` images were too small to check: said, never warned."""
    if small:
        log.info("near-duplicates: %d of %d images are under %d px a side, too small to check (a perceptual hash "
                 "of so few pixels is meaningless): they take part in no pair", small, len(query),
                 nearcopy.MIN_SIDE)
    counts = phash.counts(table, query, gallery)
    leaks = table[phash.leaking(table, query, gallery)]
    d, policy = near.max_distance, near.policy
    # where a crossing pair can go: `group` moves images, but `strategy: given` fixes every split
    keep_apart = ("put each pair in one split in the manifest's split column (`split.strategy: given` fixes "
                  "every split)" if strategy == "given" else
                  "set split.near_duplicates.policy: group to keep them in one split")
    if len(leaks) and (policy == "error" or (policy == "group" and strategy == "given")):
        why = ("`split.strategy: given` fixes every split, so `policy: group` cannot keep them together: put each "
               "pair in one split in the manifest's split column" if policy == "group" else
               "remove the copies, or put each pair in one split in the manifest's split column (`split.strategy: "
               "given` fixes every split; or `report` to list them in data/prepared/near_duplicates.csv and go on)"
               if strategy == "given" else
               "remove the copies, or set `split.near_duplicates.policy: group` to keep each cluster in one split "
               "(or `report` to list them in data/prepared/near_duplicates.csv and go on)")
        raise InputError(f"{len(leaks)} near-duplicate pair(s) (pHash within {d} of 64 bits) leak across the split: "
                         f"across train and val/gallery, or a query and a gallery image (split.near_duplicates."
                         f"policy: {policy}); {why}:{_describe(leaks)}")
    positives = counts["near_duplicates_same_label_query_gallery"]
    text = (f"near-duplicates (pHash within {d} of 64 bits): {len(table)} pair(s); "
            f"{counts['near_duplicates_train_eval']} across train and val/gallery, "
            f"{counts['near_duplicates_query_gallery'] - positives} query-gallery with different labels, "
            f"{counts['near_duplicates_cross_label']} with different labels in all; listed in "
            "data/prepared/near_duplicates.csv")
    if phash.warned(table, query, gallery).any():
        hint = (f"under {protocol} every eval image is a query, so no split keeps eval pairs apart; "
                "remove the copies or check score.embedding_copies.min_cosine" if protocol in splitting.BOTH_ROLES
                else keep_apart)
        log.warning("%s (%s)", text, hint)
    else:
        log.info("%s", text)
    if positives:
        log.info("near-duplicates: %d query-gallery pair(s) share a label: positives the query is meant to find "
                 "(another rendering or view of one thing), not counted as leaks; a true copy among them makes its "
                 "hit easy (data/prepared/near_duplicates.csv; score.embedding_copies.min_cosine flags near-exact "
                 "copies)", positives)
    return {"policy": policy, "max_distance": d, "pairs": len(table), **counts, "too_small_to_check": small}
