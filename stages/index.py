"""Stage ``index``: approximate indexes (``index.kinds``, ``index.sweep``) scored against the exact run.

argv -> the ``index`` section (and the score settings its lists follow: ks, metrics, the exclusion rules, whiten,
bootstrap) -> :func:`recallk.index.sweep.score_index` on the split's embeddings, paired with the score stage's
per-query table and neighbours (the exact run, read, not recomputed) -> ``metrics/index.json``, the points CSV
and one per-query table per point (``metrics/index/``, readable by ``recallk compare``), the Pareto PNG and
``reports/ann_index.html``, all or none. ``index.kinds: []`` (the default) builds nothing and writes
placeholders, without reading the embeddings.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import pandas as pd

from recallk.atomic import Folder, write_all
from recallk.compare.stats import fsum_mean
from recallk.errors import InputError
from recallk.index import report
from recallk.index.exact import exact_from_tables, problem_from_split
from recallk.index.sweep import cheapest, score_index, summary_rows
from recallk.score.registry import metric_keys
from recallk.settings.index import IndexSettings
from recallk.settings.score import ScoreSettings
from recallk.tables_contract import neutralise_formulas, per_query_column
from stages.params import load_settings
from stages.runner import (
    EMBEDDING_FILES,
    SCORE_FILES,
    data_root_of,
    inside,
    json_file,
    output_paths,
    parse_stage_args,
    read_input_csv,
    read_provenance,
    remove_outputs,
    run_stage,
)
from stages.score_inputs import load_inputs

#: ``embeddings``: the encode stage's folder (:data:`~stages.runner.EMBEDDING_FILES`); ``exact``: the score
#: stage's (:data:`~stages.runner.SCORE_FILES`: its per-query table and neighbours are read); the split
#: provenance's data_root is a dep by its param, split.data_root (dvc.yaml).
INPUTS = {"catalog": "data/prepared/catalog.csv", "split": "data/prepared/split.csv",
          "embeddings": "data/embeddings", "exact": "data/scores",
          "split-provenance": "data/prepared/provenance.json"}
OUTPUTS = {"index-metrics": "metrics/index.json", "tables": "metrics/index",
           "pareto": "plots/index_pareto.png", "index-report": "reports/ann_index.html"}
#: The file of the points table inside ``metrics/index/`` (``dvc plots``).
POINTS_CSV = "points.csv"
SKIPPED = "index.kinds is empty: no index was built (list FAISS factory strings or hnswlib there)"


def table_name(number: int, point: str) -> str:
    """``03-IVF64_Flat-nprobe_8.csv``: a point's per-query table, numbered in sweep order (so names never clash)."""
    return f"{number:02d}-{re.sub(r'[^A-Za-z0-9=]+', '_', point).replace('=', '_').strip('_')}.csv"


def tables_folder(tables: dict[str, pd.DataFrame], evaluated_id: str) -> Folder:
    """The ``metrics/index`` folder output: every table of ``tables`` (file name -> frame) as a CSV, text a
    spreadsheet would run as a formula quoted, the id of what was evaluated in a last column."""
    def csv(frame: pd.DataFrame):
        safe = neutralise_formulas(frame).assign(evaluated=evaluated_id)
        return lambda path: safe.to_csv(path, index=False, float_format="%.10g", lineterminator="\n")
    return Folder({name: csv(frame) for name, frame in tables.items()})


def evaluated_id(per_query: pd.DataFrame, path: str) -> str:
    """What the exact run evaluated: the ``evaluated`` column of the score stage's per-query table (the ``id`` of
    metrics/evaluated.json, the same on every row), so the index stage needs no other score output."""
    ids = per_query["evaluated"].unique()
    if len(ids) != 1:
        raise InputError(f"{path}: column evaluated holds {len(ids)} different ids, not one; re-run the score stage "
                         "(`dvc repro score`).")
    return str(ids[0])


def run(args: Any, settings: IndexSettings, score: ScoreSettings) -> tuple[dict[str, Any], list, list, str]:
    """Score every point; the summary (index.json without the points), the points, their tables and what the exact
    run evaluated (:func:`evaluated_id`)."""
    inputs = load_inputs(args.catalog, args.split, inside(args.embeddings, EMBEDDING_FILES["embeddings"]),
                         inside(args.embeddings, EMBEDDING_FILES["ids"]), train=True,
                         data_root=data_root_of(read_provenance(args.split_provenance)))
    problem = problem_from_split(inputs.sets, inputs.catalog, score)
    per_query_csv = inside(args.exact, SCORE_FILES["per_query"])
    per_query = read_input_csv(per_query_csv, required=["image_id", "num_positives", "evaluated"])
    exact = exact_from_tables(per_query,
                              read_input_csv(inside(args.exact, SCORE_FILES["neighbors"]),
                                             required=["image_id", "rank", "gallery_id", "score"]),
                              inputs.sets.queries, inputs.sets.gallery, score.depth, per_query_csv)
    points, tables = score_index(problem, exact, settings, score)
    keys = metric_keys(score.metrics, score.ks)
    exact_means = {k: fsum_mean(pd.to_numeric(exact.table[per_query_column(k)]).dropna().to_numpy()) for k in keys}
    summary = {"num_queries": int(problem.queries.shape[0]), "num_gallery": int(problem.gallery.shape[0]),
               "margin": settings.margin, "cheapest_non_inferior": cheapest(points), "exact": exact_means}
    return summary, points, tables, evaluated_id(per_query, per_query_csv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_stage_args(argv, "Score approximate indexes against the exact run.", INPUTS, OUTPUTS)
    remove_outputs(output_paths(args, OUTPUTS))  # first: a failed run never leaves an old result looking current
    settings = load_settings(IndexSettings, args.params)
    score = load_settings(ScoreSettings, args.params)
    points: list[dict[str, Any]] = []
    per_point: list[pd.DataFrame] = []
    if settings.kinds:
        summary, points, per_point, ident = run(args, settings, score)
    else:
        summary, ident = {"skipped": SKIPPED, "cheapest_non_inferior": None}, ""
    names = [table_name(i, p["point"]) for i, p in enumerate(points)]
    rows = summary_rows(points, score.metrics, score.ks).assign(table=names)
    tables = {POINTS_CSV: rows, **dict(zip(names, per_point))}
    axes = report.plotted_metrics(score.ks, score.metrics)
    plot = report.pareto_png(points, summary.get("exact", {}), axes)
    page = report.page(summary, points, metric_keys(score.metrics, score.ks), plot)
    document = {**summary, "points": {p["point"]: {**p, "table": n} for p, n in zip(points, names)}}
    # all or none, the folder of tables too (killed at any point, the next run leaves exactly these outputs)
    write_all([(args.index_metrics, json_file(document)), (args.tables, tables_folder(tables, ident)),
               (args.pareto, lambda tmp: plot.save(tmp, format="PNG")),
               (args.index_report, lambda tmp: tmp.write_text(page, encoding="utf-8", newline="\n"))])


if __name__ == "__main__":
    run_stage(main)
