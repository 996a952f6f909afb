"""Stage ``split``: image catalog and split assignment, checked by the data contract.

Reads only the ``split`` section of params.yaml. Writes two files, both or neither:

* the catalog (``image_id, path, label, sha256, width, height`` + extra CSV
  columns), which depends only on the images, never on split params, so a
  split-only change leaves it byte-identical and DVC skips ``encode``;
* the split assignment (``image_id, split, query, gallery``);
* the skipped-images report (``path, reason``): images that could not be read or
  decoded, dropped under ``split.on_bad_image: skip`` (header only otherwise).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import pandas as pd

from stages import catalog, contract, splitting
from stages.common import UserError, parse_stage_args, remove_outputs, run_stage, write_all
from stages.params import load_section

log = logging.getLogger("stages.split")

CATALOG_CSV = "data/prepared/catalog.csv"
SPLIT_CSV = "data/prepared/split.csv"
SKIPPED_CSV = "data/prepared/skipped.csv"


def build(*, data_root: str, csv: str | None, on_bad_image: str, strategy: str, protocol: str, seed: int,
          fractions: dict[str, float]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Return ``(catalog, split, skipped)`` frames for a data root, or raise a UserError."""
    root = Path(data_root)
    frame = catalog.read_source(root, csv)
    frame = catalog.probe(root, frame)
    bad = catalog.unreadable(frame) if on_bad_image == "skip" else pd.Series(False, index=frame.index)
    skipped = pd.DataFrame({"path": frame.loc[bad, "path"].astype(str), "reason": frame.loc[bad, "problem"]})
    skipped = skipped.sort_values("path", kind="stable").reset_index(drop=True)
    if bad.any():
        log.warning("skipped %d unreadable image(s) (split.on_bad_image: skip), e.g. %s; the list is in %s",
                    int(bad.sum()), ", ".join(skipped["path"].head(3)), SKIPPED_CSV)
        frame = frame[~bad]
        if frame.empty:
            raise UserError(f"every one of the {int(bad.sum())} images is unreadable (e.g. {skipped['path'][0]}: "
                            f"{skipped['reason'][0]}); check the data root {root}.")
    frame["split"] = splitting.assign_splits(frame, strategy=strategy, protocol=protocol,
                                             fractions=fractions, seed=seed)
    source = f"{root / csv}" if csv else f"{root}/"
    contract.validate(frame, class_disjoint=strategy == "class_disjoint", source=source,
                      csv_lines=csv is not None)

    frame = frame.sort_values("image_id", kind="stable").reset_index(drop=True)
    query, gallery = splitting.roles(frame["split"], protocol)
    if not query.any() or not gallery.any():
        counts = frame["split"].value_counts().to_dict()
        raise UserError(f"the split has {int(query.sum())} queries and {int(gallery.sum())} gallery images "
                        f"(split sizes: {counts}); adjust `split.fractions` or the manifest's split column "
                        f"so that both are non-empty.")
    orphans = splitting.queries_without_positive(frame["label"], query, gallery)
    if orphans.any():
        labels = sorted(frame.loc[orphans, "label"].unique())
        log.warning("%d queries (labels: %s) have no gallery image of their label other than themselves; "
                    "score will exclude and count them", int(orphans.sum()), ", ".join(labels[:10]))

    extras = [c for c in frame.columns if c not in catalog.CATALOG_COLUMNS + ("problem", "split")]
    cat = frame[list(catalog.CATALOG_COLUMNS) + extras].copy()
    cat["path"] = [catalog.location(root, p) for p in cat["path"]]
    split = pd.DataFrame({"image_id": frame["image_id"], "split": frame["split"],
                          "query": query, "gallery": gallery})
    return cat, split, skipped


def write_outputs(frames: Sequence[pd.DataFrame], paths: Sequence[str]) -> None:
    """Write the CSVs to temp files, then rename them all: never one without the others."""
    write_all([(path, lambda tmp, f=frame: f.to_csv(tmp, index=False, lineterminator="\n"))
               for frame, path in zip(frames, paths)])


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_stage_args(argv, "Build the image catalog and the split assignment.",
                            {"catalog": CATALOG_CSV, "split": SPLIT_CSV, "skipped": SKIPPED_CSV})
    outputs = [args.catalog, args.split, args.skipped]
    remove_outputs(outputs)
    params = load_section("split", args.params)
    cat, split, skipped = build(**params)
    write_outputs([cat, split, skipped], outputs)
    counts = split["split"].value_counts()
    log.info("catalog: %d images, %d labels; split: %s; %d queries, %d gallery", len(cat),
             cat["label"].nunique(), ", ".join(f"{s}={int(counts.get(s, 0))}" for s in splitting.SPLITS),
             int(split["query"].sum()), int(split["gallery"].sum()))


if __name__ == "__main__":
    run_stage(main)
