"""Stage ``score``: the metric suite of val queries against the gallery.

Reads only the ``score`` section of params.yaml, the catalog (labels and any
``exclude_same`` columns), the split and the embeddings. Writes the flat metrics
JSON, the per-class table, the recall@K curve (``dvc plots``) and the per-query
table, then prints the report block. The ranking and the formulas live in
:mod:`stages.ranking` and :mod:`stages.metrics`; tables and intervals in :mod:`stages.report`.

API for training loops::

    from stages.score import evaluate, retrieval_metrics, recall_at_k
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from stages import report
from stages.api import encode_all, evaluate, format_report
from stages.common import (UserError, did_you_mean, parse_stage_args, read_input_csv, remove_outputs, run_stage,
                           write_all)
from stages.metrics import (first_positive_ranks, metric_keys, rank, recall_at_k, retrieval_metrics,
                            retrieval_summary, summarize)
from stages.params import load_section
from stages.score_inputs import check_finite, load_inputs

__all__ = ["evaluate", "encode_all", "first_positive_ranks", "recall_at_k", "retrieval_metrics",
           "retrieval_summary", "format_report"]

log = logging.getLogger("stages.score")

CATALOG_CSV = "data/prepared/catalog.csv"
SPLIT_CSV = "data/prepared/split.csv"
EMBEDDINGS_NPY = "data/embeddings/embeddings.npy"
IDS_NPY = "data/embeddings/ids.npy"
METRICS_JSON = "metrics/recall.json"
PER_CLASS_CSV = "metrics/per_class.csv"
CURVE_CSV = "metrics/recall_curve.csv"
PER_QUERY_CSV = "data/scores/per_query.csv"
SKIPPED_CSV = "data/prepared/skipped.csv"
#: The recall curve runs to K = max(ks, CURVE_K).
CURVE_K = 20


def score(*, ks: list[int], metrics: list[str], max_memory_mb: float, backend: str, exclude_same: list[str],
          whiten: str, bootstrap: dict[str, Any], catalog_csv: str, split_csv: str, embeddings_npy: str,
          ids_npy: str) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """Score the split; return the flat metrics and the tables (per_class, curve, per_query)."""
    emb, split, catalog, row = load_inputs(catalog_csv, split_csv, embeddings_npy, ids_npy, train=whiten == "pca")
    reserved = [c for c in exclude_same if c in ("label", "image_id")]
    if reserved:
        raise UserError(f"`score.exclude_same` names {reserved}: the label decides the positives and the query's "
                        "own image (image_id) is always excluded, so neither is an exclusion column; name another "
                        f"catalog column ({', '.join(c for c in catalog.columns if c != 'label')}).")
    missing = [c for c in exclude_same if c not in catalog.columns]
    if missing:
        raise UserError(f"`score.exclude_same` names {missing}, which the catalog does not have."
                        f"{did_you_mean(missing[0], [c for c in catalog.columns if c != 'label'])} Catalog columns: "
                        f"{', '.join(catalog.columns)}.")
    queries = split.loc[split["query"], "image_id"].to_numpy()
    gallery = split.loc[split["gallery"], "image_id"].to_numpy()
    train = split.loc[split["split"].eq("train") & ~split["query"] & ~split["gallery"], "image_id"].to_numpy()
    used = np.concatenate([queries, gallery] + ([train] if whiten == "pca" else []))
    check_finite(emb, row[used].to_numpy(), used, embeddings_npy)
    q_emb, g_emb = emb[row[queries].to_numpy()], emb[row[gallery].to_numpy()]
    if whiten == "pca":
        if train.size < 2:
            raise UserError(f"`score.whiten: pca` fits on the train split, which has {train.size} image(s); "
                            "give it at least 2 (split.fractions.train) or set `score.whiten: none`.")
        try:
            q_emb, g_emb = report.pca_whitening(emb[row[train].to_numpy()], q_emb, g_emb)
        except ValueError as exc:
            raise UserError(f"`score.whiten: pca`: {exc} Set `score.whiten: none`.") from None
        log.info("whitening fitted on %d train images (%d dims kept)", train.size, q_emb.shape[1])
    labels = catalog["label"]
    exclude = [(catalog.loc[queries, c].to_numpy(), catalog.loc[gallery, c].to_numpy()) for c in exclude_same]
    try:
        ranking = rank(q_emb, g_emb, labels[queries].to_numpy(), labels[gallery].to_numpy(), queries, gallery,
                       metrics, exclude, max_memory_mb, backend)
        if exclude_same and not ranking.n_positives.any():
            raise UserError(f"every query is excluded: with `score.exclude_same: {exclude_same}` no query keeps a "
                            "same-label gallery item it may retrieve. Remove those columns from score.exclude_same.")
        summary, values = summarize(ranking, ks, metrics)
    except ImportError:
        raise UserError("`score.backend: faiss` needs faiss-cpu; install it with `pip install -e .[faiss]` "
                        "or set `score.backend: numpy`.") from None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    keys = metric_keys(metrics, ks)
    table, class_means = report.per_class({k: values[k] for k in keys}, labels[queries].to_numpy())
    out: dict[str, Any] = {k: summary[k] for k in keys}
    out.update(class_means)
    out.update(report.bootstrap_ci({k: values[k] for k in keys}, **bootstrap))
    out.update({k: v for k, v in summary.items() if k not in out})
    out.update(num_gallery=int(g_emb.shape[0]), embedding_dim=int(g_emb.shape[1]))
    tables = {"per_class": table, "curve": report.recall_curve(ranking, max(max(ks), CURVE_K)),
              "per_query": report.per_query(queries, labels[queries].to_numpy(), ranking, values)}
    return out, tables


def write_outputs(metrics: dict[str, Any], tables: dict[str, pd.DataFrame], paths: Sequence[str]) -> None:
    """Write the metrics JSON and the three tables to temp files, then rename all: all or nothing."""
    def table(name: str) -> Callable[[Path], None]:
        return lambda tmp: tables[name].to_csv(tmp, index=False, float_format="%.10g", lineterminator="\n")

    write_all([(paths[0], lambda tmp: tmp.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8",
                                                     newline="\n"))]
              + [(path, table(name)) for path, name in zip(paths[1:], ("per_class", "curve", "per_query"))])


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_stage_args(argv, "Score the metric suite and write the metrics, tables and curve.",
                            {"catalog": CATALOG_CSV, "split": SPLIT_CSV, "embeddings": EMBEDDINGS_NPY, "ids": IDS_NPY,
                             "metrics": METRICS_JSON, "per-class": PER_CLASS_CSV, "curve": CURVE_CSV,
                             "per-query": PER_QUERY_CSV, "skipped": SKIPPED_CSV},
                            flags={"show": "only print the report of an existing metrics file"})
    if args.show:
        if not Path(args.metrics).is_file():
            raise UserError(f"{args.metrics} not found; run `make repro` first.")
        try:
            report_text = format_report(json.loads(Path(args.metrics).read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not JSON, or not this stage's metrics
            raise UserError(f"{args.metrics} is not a metrics file written by this stage ({type(exc).__name__}: "
                            f"{exc}); re-create it with `dvc repro score`.") from None
        print(report_text)
        return
    outputs = [args.metrics, args.per_class, args.curve, args.per_query]
    remove_outputs(outputs)
    params = load_section("score", args.params)
    metrics, tables = score(**params, catalog_csv=args.catalog, split_csv=args.split, embeddings_npy=args.embeddings,
                            ids_npy=args.ids)
    if Path(args.skipped).is_file():  # written by split; absent only when scoring by hand
        metrics["num_skipped_images"] = len(read_input_csv(args.skipped, required=["path", "reason"]))
    write_outputs(metrics, tables, outputs)
    print(format_report(metrics))


if __name__ == "__main__":
    run_stage(main)
