"""Stage ``encode``: embed every catalog image once with the chosen backbone.

argv -> the ``encode`` section of params.yaml (:class:`~recallk.encode.settings.EncodeSettings`)
-> :func:`recallk.encode.embed.embed_all`
-> one folder (``data/embeddings``, one DVC out): float32 embeddings (``embeddings.npy``, one row per catalog
row, in catalog order), the aligned image ids (``ids.npy``, strings), with captions (``captions.csv`` has rows) their
embeddings (``text_embeddings.npy``, caption order) and ids (``text_ids.npy``), and what made them
(``provenance.json``: backbone, fingerprint and, with captions, text fingerprint), all or none (a
:class:`~recallk.atomic.Folder` of :func:`~recallk.atomic.write_all`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from recallk.atomic import Folder, write_all
from recallk.encode.batches import EncodeInterrupted
from recallk.encode.embed import embed_all
from recallk.encode.settings import EncodeSettings
from stages.params import load_settings
from stages.runner import (
    EMBEDDING_FILES,
    background_of,
    data_root_of,
    json_file,
    output_paths,
    parse_stage_args,
    read_captions,
    read_catalog,
    read_provenance,
    remove_outputs,
    run_stage,
)

#: What the stage reads and writes, by option name (``--catalog PATH`` ...): dvc.yaml's deps and outs
#: (tests/test_dvc_yaml.py; the split provenance's data_root and background by their params, split.data_root and
#: split.background). The output is one
#: folder of :data:`~stages.runner.EMBEDDING_FILES`.
INPUTS = {"catalog": "data/prepared/catalog.csv", "captions": "data/prepared/captions.csv",
          "split-provenance": "data/prepared/provenance.json"}
OUTPUTS = {"embeddings": "data/embeddings"}


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
    split_provenance = read_provenance(args.split_provenance)
    catalog = read_catalog(args.catalog, data_root_of(split_provenance))
    captions = read_captions(args.captions)
    try:  # transparency composited over the colour split hashed the images with (split.background, a params dep)
        out = embed_all(catalog, settings, background_of(split_provenance), captions)
    except EncodeInterrupted as exc:  # Ctrl-C: say what is kept, exit 130 as a shell does for SIGINT
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(130)
    ids = np.asarray(catalog["image_id"].tolist(), dtype=str)
    files = {EMBEDDING_FILES["embeddings"]: npy(out.images), EMBEDDING_FILES["ids"]: npy(ids),
             EMBEDDING_FILES["provenance"]: json_file(out.provenance)}
    if out.texts is not None:  # with captions: their embeddings and ids, in captions.csv's order
        files[EMBEDDING_FILES["text_embeddings"]] = npy(out.texts)
        files[EMBEDDING_FILES["text_ids"]] = npy(np.asarray(captions["caption_id"].tolist(), dtype=str))
    write_all([(args.embeddings, Folder(files))])  # the folder whole, or not at all


if __name__ == "__main__":
    run_stage(main)
