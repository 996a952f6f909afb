"""Stage ``score``: recall@K of val queries against the gallery, and the Python API.

Stage: reads only the ``score`` section of params.yaml, the catalog (labels), the
split (query/gallery roles) and the embeddings; writes ``metrics/recall.json``
and prints the report block.

API for training loops::

    from stages.score import recall_at_k, evaluate
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
from PIL import Image

from stages import images
from stages.common import UserError, parse_stage_args, read_input_csv, remove_outputs, run_stage, write_text_atomic
from stages.params import load_section
from stages.retrieval import check_ks, first_positive_ranks, recall_at_k, retrieval_summary

__all__ = ["evaluate", "first_positive_ranks", "recall_at_k", "retrieval_summary", "format_report"]

log = logging.getLogger("stages.score")

CATALOG_CSV = "data/prepared/catalog.csv"
SPLIT_CSV = "data/prepared/split.csv"
EMBEDDINGS_NPY = "data/embeddings/embeddings.npy"
IDS_NPY = "data/embeddings/ids.npy"
METRICS_JSON = "metrics/recall.json"


def encode_all(items: Sequence[Any], encoder_fn: Callable[[list[Image.Image]], Any], batch: int = 32) -> np.ndarray:
    """Encode images (paths or PIL images) in batches with ``encoder_fn(list[PIL.Image]) -> (n, d)``."""
    out = []
    for start in range(0, len(items), batch):
        chunk = [x if isinstance(x, Image.Image) else images.load(x) for x in items[start:start + batch]]
        out.append(np.asarray(encoder_fn(chunk), dtype=np.float32))
    return np.concatenate(out) if out else np.empty((0, 0), dtype=np.float32)


def evaluate(query_images: Sequence[Any], query_labels: Sequence[Any], gallery_images: Sequence[Any],
             gallery_labels: Sequence[Any], encoder_fn: Callable[[list[Image.Image]], Any],
             ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """Encode both sets with ``encoder_fn`` and return :func:`recall_at_k`.

    Parameters
    ----------
    query_images, gallery_images : sequence of str, os.PathLike or PIL.Image.Image
        File paths are decoded like the pipeline (EXIF orientation applied, RGB).
    query_labels : sequence of length len(query_images)
    gallery_labels : sequence of length len(gallery_images)
    encoder_fn : callable
        ``encoder_fn(list[PIL.Image.Image]) -> array of shape (batch, d)``, called on batches of 32.
    ks : sequence of positive int, default (1, 5, 10)

    Returns
    -------
    dict
        ``{"recall@K": float}`` for each K (see :func:`recall_at_k` for the formula and tie rule).

    Notes
    -----
    When both lists are paths, a path present in both is the same image: that
    query never retrieves it (self-match exclusion by absolute path). PIL
    images carry no identity, so no self-match exclusion applies to them.
    """
    check_ks(ks)
    q_emb = encode_all(query_images, encoder_fn)
    g_emb = encode_all(gallery_images, encoder_fn)

    def ids(items: Sequence[Any]) -> list[str | None] | None:
        if not all(isinstance(x, (str, os.PathLike)) for x in items):
            return None
        return [os.path.abspath(x) for x in items]

    return recall_at_k(q_emb, g_emb, np.asarray(query_labels), np.asarray(gallery_labels), ks,
                       query_ids=ids(query_images), gallery_ids=ids(gallery_images))


def format_report(metrics: dict[str, Any]) -> str:
    """The seed's report block for a metrics dict."""
    recall = [(k, v) for k, v in metrics.items() if k.startswith("recall@")]
    width = max(len(k) for k, _ in recall) + 1
    lines = ["[evaluation]",
             f"  num queries:   {metrics['num_queries']}",
             f"  num excluded:  {metrics['num_excluded_queries']}",
             f"  num gallery:   {metrics['num_gallery']}",
             f"  embedding_dim: {metrics['embedding_dim']}",
             "",
             "[recall]"]
    lines += [f"  {(k + ':').ljust(width)}  {v:.4f}" for k, v in recall]
    return "\n".join(lines)


def load_inputs(catalog_csv: str, split_csv: str, embeddings_npy: str, ids_npy: str):
    """Read and align the stage inputs; return (embeddings, split rows scored, labels by id, row by id)."""
    for path in (embeddings_npy, ids_npy):
        if not Path(path).is_file():
            raise UserError(f"{path} not found; run the earlier stages first (`dvc repro`).")
    catalog = read_input_csv(catalog_csv, usecols=["image_id", "label"])
    split = read_input_csv(split_csv, usecols=["image_id", "query", "gallery"])
    for flag in ("query", "gallery"):
        split[flag] = split[flag].eq("True")
    try:
        emb = np.load(embeddings_npy, allow_pickle=False)
        ids = np.load(ids_npy, allow_pickle=False)
    except ValueError as exc:
        raise UserError(f"cannot load embeddings {embeddings_npy} / {ids_npy} ({exc}); re-run encode.") from None
    if emb.ndim != 2 or ids.ndim != 1 or len(ids) != len(emb):
        raise UserError(f"embeddings {embeddings_npy} {emb.shape} and ids {ids_npy} {ids.shape} do not align; "
                        "re-run encode (`dvc repro -f encode`).")
    row = pd.Series(np.arange(len(ids)), index=ids.astype(str))
    split = split[split["query"] | split["gallery"]]
    missing = split.loc[~split["image_id"].isin(row.index), "image_id"].tolist()
    if missing:
        raise UserError(f"{len(missing)} split images have no embedding (e.g. {', '.join(missing[:5])}); "
                        "the embeddings are stale: run `dvc repro`.")
    labels = catalog.set_index("image_id")["label"]
    unknown = split.loc[~split["image_id"].isin(labels.index), "image_id"].tolist()
    if unknown:
        raise UserError(f"{len(unknown)} split images are not in the catalog (e.g. {', '.join(unknown[:5])}); "
                        "the split and the catalog come from different runs: run `dvc repro`.")
    return emb, split, labels, row


def score(*, ks: list[int], max_memory_mb: float, catalog_csv: str, split_csv: str, embeddings_npy: str,
          ids_npy: str) -> dict[str, float | int]:
    emb, split, labels, row = load_inputs(catalog_csv, split_csv, embeddings_npy, ids_npy)
    queries = split.loc[split["query"], "image_id"].to_numpy()
    gallery = split.loc[split["gallery"], "image_id"].to_numpy()
    try:
        return retrieval_summary(emb[row[queries].to_numpy()], emb[row[gallery].to_numpy()],
                                 labels[queries].to_numpy(), labels[gallery].to_numpy(), ks=ks,
                                 query_ids=queries, gallery_ids=gallery, max_memory_mb=max_memory_mb)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_stage_args(argv, "Score recall@K and write the metrics JSON.",
                            {"catalog": CATALOG_CSV, "split": SPLIT_CSV, "embeddings": EMBEDDINGS_NPY, "ids": IDS_NPY,
                             "metrics": METRICS_JSON},
                            flags={"show": "only print the report of an existing metrics file"})
    if args.show:
        if not Path(args.metrics).is_file():
            raise UserError(f"{args.metrics} not found; run `make repro` first.")
        print(format_report(json.loads(Path(args.metrics).read_text(encoding="utf-8"))))
        return
    remove_outputs([args.metrics])
    params = load_section("score", args.params)
    metrics = score(**params, catalog_csv=args.catalog, split_csv=args.split, embeddings_npy=args.embeddings,
                    ids_npy=args.ids)
    write_text_atomic(args.metrics, json.dumps(metrics, indent=2) + "\n")
    print(format_report(metrics))


if __name__ == "__main__":
    run_stage(main)
