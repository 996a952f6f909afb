"""The split stage's computation: the catalog and the split assignment of a data root.

The catalog (``image_id, path, label, sha256, width, height`` + extra manifest
columns) depends only on the images, never on split params, so a split-only
change leaves it byte-identical and the encode stage is skipped. The split table
is ``image_id, split, query, gallery``; the skipped table ``path, reason``; both tables give paths as
:func:`recallk.data.catalog.location` does (relative to the working directory when inside it).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from recallk.data import catalog, contract, splitting
from recallk.errors import InputError

log = logging.getLogger(__name__)


def prepare(*, data_root: str, csv: str | None, on_bad_image: str, strategy: str, protocol: str, seed: int,
          fractions: dict[str, float]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The catalog, split and skipped-images tables of a data root (the ``split`` params).

    Returns ``(catalog, split, skipped)``; each row set passed the image-table contract, and
    the catalog and split frames the contracts of their files (checked again on read).
    Raises :class:`~recallk.errors.InputError` listing every failing row.
    """
    root = Path(data_root)
    frame = catalog.read_source(root, csv)
    frame = catalog.probe(root, frame)
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
    frame["split"] = splitting.assign_splits(frame, strategy=strategy, protocol=protocol,
                                             fractions=fractions, seed=seed)
    source = f"{root / csv}" if csv else f"{root}/"
    contract.validate(frame, contract.image_table_schema(class_disjoint=strategy == "class_disjoint"),
                      source=source, csv_lines=csv is not None)

    frame = frame.sort_values("image_id", kind="stable").reset_index(drop=True)
    query, gallery = splitting.roles(frame["split"], protocol)
    if not query.any() or not gallery.any():
        counts = frame["split"].value_counts().to_dict()
        raise InputError(f"the split has {int(query.sum())} queries and {int(gallery.sum())} gallery images "
                        f"(split sizes: {counts}); adjust `split.fractions` or the manifest's split column "
                        f"so that both are non-empty.")
    orphans = splitting.queries_without_positive(frame["label"], query, gallery)
    if orphans.any():
        labels = sorted(frame.loc[orphans, "label"].unique())
        log.warning("%d queries (labels: %s) have no gallery image of their label other than themselves; "
                    "score will exclude and count them", int(orphans.sum()), ", ".join(labels[:10]))

    extras = [c for c in frame.columns if c not in catalog.CATALOG_COLUMNS + catalog.PROBE_ONLY_COLUMNS + ("split",)]
    cat = frame[list(catalog.CATALOG_COLUMNS) + extras].copy()
    cat["path"] = [catalog.location(root, p) for p in cat["path"]]
    split = pd.DataFrame({"image_id": frame["image_id"], "split": frame["split"],
                          "query": query, "gallery": gallery})
    for frame, schema in ((cat, contract.catalog_schema()), (split, contract.split_schema())):
        contract.validate(contract.as_text(frame), schema, source=f"the {schema.name} table", csv_lines=True)
    return cat, split, skipped
