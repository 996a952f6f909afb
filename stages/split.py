"""Stage ``split``: the image catalog and the split assignment, checked by the data contracts.

argv -> the ``split`` section of params.yaml (:class:`~recallk.data.settings.SplitSettings`)
-> :func:`recallk.data.prepare.prepare_all`
-> the catalog, the split, the skipped-images, the near-duplicate and the captions CSVs (the captions header
only without ``split.captions``), and what they describe (``provenance.json``: data root, strategy, protocol,
counts, the background transparency is composited over and how many images have any, the near-duplicate counts,
``split.captions`` and the captions' counts), all or none.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import pandas as pd

from recallk.atomic import write_all
from recallk.data.catalog import benchmark_protocol
from recallk.data.phash import PAIR_COLUMNS
from recallk.data.prepare import prepare_all
from recallk.data.settings import SplitSettings
from recallk.data.splitting import SPLITS
from stages.params import load_settings
from stages.runner import json_file, output_paths, parse_stage_args, remove_outputs, run_stage

log = logging.getLogger("stages.split" if __name__ == "__main__" else __name__)

#: What the stage reads and writes, by option name (``--catalog PATH`` ...): dvc.yaml's deps and outs
#: (tests/test_dvc_yaml.py). It reads no earlier stage's file: its images are under the ``split.data_root`` param.
INPUTS: dict[str, str] = {}
OUTPUTS = {"catalog": "data/prepared/catalog.csv", "split": "data/prepared/split.csv",
           "skipped": "data/prepared/skipped.csv", "near-duplicates": "data/prepared/near_duplicates.csv",
           "captions": "data/prepared/captions.csv", "provenance": "data/prepared/provenance.json"}


def write_outputs(frames: Sequence[pd.DataFrame], paths: Sequence[str], provenance: dict | None = None) -> None:
    """Write the CSVs (and the provenance JSON, after them) to temp files, then rename them all:
    never one without the others."""
    write_all([(path, lambda tmp, f=frame: f.to_csv(tmp, index=False, lineterminator="\n"))
               for frame, path in zip(frames, paths)]
              + ([(paths[len(frames)], json_file(provenance))] if provenance is not None else []))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_stage_args(argv, "Build the image catalog and the split assignment.", INPUTS, OUTPUTS)
    outputs = output_paths(args, OUTPUTS)
    remove_outputs(outputs)
    settings = load_settings(SplitSettings, args.params)
    out = prepare_all(settings)
    cat, split, skipped = out.catalog, out.split, out.skipped
    pairs = out.near_duplicates if out.files else pd.DataFrame(columns=PAIR_COLUMNS)
    provenance = {"data_root": settings.data_root, "manifest": settings.csv, "strategy": settings.strategy,
                  "protocol": settings.protocol, "seed": settings.seed, "num_images": len(cat),
                  "num_labels": int(cat["label"].nunique()), "num_skipped_images": len(skipped),
                  "images": "files" if out.files else "none",
                  # how transparency was shown (split.background, copied verbatim: encode and score decode with it,
                  # as data_root) and how many images it changed (null for an embeddings-only catalog)
                  "background": settings.background, "num_transparent_images": out.transparent,
                  # null for an embeddings-only catalog: no file, so no exact or near-duplicate check
                  "near_duplicates": out.summary,
                  # split.captions (copied verbatim) and its counts: all, of eval images (scored), the eval captions
                  # whose exact text another eval image has too, those of skipped images (dropped); zeros without
                  "captions": settings.captions, **out.caption_summary}
    benchmark = benchmark_protocol(Path(settings.data_root), settings.csv)
    if benchmark is not None:  # a `recallk datasets prepare` manifest: the protocol it was written for
        provenance["benchmark"] = benchmark
    write_outputs([cat, split, skipped, pairs, out.captions], outputs, provenance)
    if len(skipped):
        log.warning("the %d skipped images and their reasons are listed in %s", len(skipped), args.skipped)
    counts = split["split"].value_counts()
    log.info("catalog: %d images, %d labels; split: %s; %d queries, %d gallery", len(cat),
             cat["label"].nunique(), ", ".join(f"{s}={int(counts.get(s, 0))}" for s in SPLITS),
             int(split["query"].sum()), int(split["gallery"].sum()))


if __name__ == "__main__":
    run_stage(main)
