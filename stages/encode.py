"""Stage ``encode``: embed every catalog image once with the chosen backbone.

argv -> the ``encode`` section of params.yaml (:class:`~recallk.settings.encode.EncodeSettings`)
-> :func:`recallk.encode.embed.embed`
-> float32 embeddings (``.npy``, one row per catalog row, in catalog order), the aligned
image ids (``.npy`` of strings) and what made them (``provenance.json``: backbone and
fingerprint), all or none.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from recallk.atomic import write_all
from recallk.encode.batches import EncodeInterrupted
from recallk.encode.embed import embed
from recallk.settings.encode import EncodeSettings
from stages.params import load_settings
from stages.runner import (
    data_root_of,
    json_file,
    output_paths,
    parse_stage_args,
    read_catalog,
    read_provenance,
    remove_outputs,
    run_stage,
)

#: What the stage reads and writes, by option name (``--catalog PATH`` ...): dvc.yaml's deps and outs
#: (tests/test_dvc_yaml.py).
INPUTS = {"catalog": "data/prepared/catalog.csv", "split-provenance": "data/prepared/provenance.json"}
OUTPUTS = {"embeddings": "data/embeddings/embeddings.npy", "ids": "data/embeddings/ids.npy",
           "provenance": "data/embeddings/provenance.json"}


def npy(array: np.ndarray) -> Callable[[Path], None]:
    """A writer of ``array`` as ``.npy`` (no pickles) for :func:`recallk.atomic.write_all`."""
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.save(fh, array, allow_pickle=False)
    return write


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_stage_args(argv, "Embed every catalog image.", INPUTS, OUTPUTS)
    remove_outputs(output_paths(args, OUTPUTS))
    settings = load_settings(EncodeSettings, args.params)
    # the split stage's path rule: a tampered catalog never makes encode open a file outside the data root
    catalog = read_catalog(args.catalog, data_root_of(read_provenance(args.split_provenance)))
    try:
        emb, provenance = embed(catalog, settings)
    except EncodeInterrupted as exc:  # Ctrl-C: say what is kept, exit 130 as a shell does for SIGINT
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(130)
    ids = np.asarray(catalog["image_id"].tolist(), dtype=str)
    write_all([(args.embeddings, npy(emb)), (args.ids, npy(ids)), (args.provenance, json_file(provenance))])


if __name__ == "__main__":
    run_stage(main)
