"""Stage ``index``: approximate indexes (``index.kinds``, ``index.sweep``) scored against the exact run.

argv -> the ``index`` section (and the score settings its lists follow: ks, metrics, the exclusion rules, whiten,
bootstrap) -> :func:`recallk.index.sweep.score_index` on the split's embeddings, paired with the score stage's
per-query table and neighbours (the exact run, read, not recomputed) -> the results, ``metrics/index.json`` and
one per-query table per point (``metrics/index/``, readable by ``recallk compare``): the DVC outs, the same bytes
for the same inputs; and the measurements (``MEASURED``: the timings file, the points CSV, the Pareto PNG and
``reports/ann_index.html``), which are not DVC outs (dvc.lock never holds a timing); all or none.
``index.kinds: []`` (the default) builds nothing and writes placeholders, without reading the embeddings.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import pandas as pd

from recallk.atomic import Folder, write_all
from recallk.errors import InputError
from recallk.index import page as index_page
from recallk.index.inputs import RESCORE, problem_from_split, read_neighbors, read_per_query
from recallk.index.settings import IndexSettings
from recallk.index.sweep import TIMING_KEYS, Exact, cheapest, score_index, split_timings, summary_rows
from recallk.report.provenance import provenance
from recallk.score.registry import metric_keys
from recallk.score.settings import ScoreSettings
from recallk.settings.base import as_params
from recallk.stats import mean
from recallk.tables_contract import csv_file, per_query_column
from stages.params import load_settings
from stages.runner import (
    EMBEDDING_FILES,
    SCORE_FILES,
    data_root_of,
    inside,
    json_file,
    output_paths,
    parse_stage_args,
    read_provenance,
    remove_outputs,
    run_stage,
)
from stages.score_inputs import SCORE_INPUTS, SCORE_RESULTS, load_inputs

#: ``embeddings``: the encode stage's folder (:data:`~stages.runner.EMBEDDING_FILES`); ``exact``: the score
#: stage's (:data:`~stages.runner.SCORE_FILES`: its per-query table and neighbours are read); the split
#: provenance's data_root is a dep by its param, split.data_root (dvc.yaml).
INPUTS = {**SCORE_INPUTS, "exact": SCORE_RESULTS["scores"],
          "split-provenance": "data/prepared/provenance.json"}
#: The DVC outs: results, the same bytes for the same inputs (dvc.lock does not churn when the stage re-runs).
OUTPUTS = {"index-metrics": "metrics/index.json", "tables": "metrics/index"}
#: What the stage measures (timings differ run to run): written with the outs, all or none, but not DVC outs,
#: so that their bytes never enter dvc.lock; dvc.yaml's top-level ``metrics`` and ``plots`` read them.
MEASURED = {"index-speed": "metrics/index_speed.json", "speed-points": "metrics/index_speed.csv",
            "pareto": "plots/index_pareto.png", "index-report": "reports/ann_index.html"}
#: The points table inside ``metrics/index/``: one row per point, its results (the timed copy, for ``dvc plots``:
#: ``MEASURED["speed-points"]``).
POINTS_CSV = "points.csv"
#: What the timings file says of itself.
TIMINGS_NOTE = ("measurements of this run on this machine (they differ run to run); every result is in "
                "metrics/index.json, the same bytes for the same inputs")
SKIPPED = "index.kinds is empty: no index was built (list FAISS factory strings or hnswlib there)"


def table_name(number: int, point: str) -> str:
    """``03-IVF64_Flat-nprobe_8.csv``: a point's per-query table, numbered in sweep order (so names never clash)."""
    return f"{number:02d}-{re.sub(r'[^A-Za-z0-9=]+', '_', point).replace('=', '_').strip('_')}.csv"


def tables_folder(tables: dict[str, pd.DataFrame], evaluated_id: str) -> Folder:
    """The ``metrics/index`` folder output: every table of ``tables`` (file name -> frame) as a CSV, as
    :func:`recallk.tables_contract.csv_file` writes it."""
    return Folder({name: csv_file(frame, evaluated_id) for name, frame in tables.items()})


def evaluated_id(per_query: pd.DataFrame, path: str) -> str:
    """What the exact run evaluated: the ``evaluated`` column of the score stage's per-query table (the ``id`` of
    metrics/evaluated.json, the same on every row), so the index stage needs no other score output."""
    ids = per_query["evaluated"].unique() if "evaluated" in per_query.columns else []
    if len(ids) != 1:
        raise InputError(f"{path}: column evaluated holds {len(ids)} different ids, not one; {RESCORE}.")
    return str(ids[0])


def check_current(found: str, path: str, split: dict | None, encode: dict | None, score: ScoreSettings,
                  embeddings: str) -> None:
    """The exact run ``found`` (:func:`evaluated_id`) must be of these embeddings: the id the score stage would
    give them now (:func:`recallk.report.provenance.provenance`: the split, the encode provenance's backbone and
    fingerprint, the score params). A mismatch (re-encoded, re-split, or score params changed since) is one
    InputError naming both ids and the fingerprint, and the fix."""
    expected = provenance(split, encode, as_params(score))["id"]
    if found != expected:
        backbone = (f"backbone {encode.get('backbone')}, fingerprint {encode.get('fingerprint')}" if encode
                    else "no provenance.json")
        raise InputError(f"{path} is a stale exact run: it evaluated {found} (column evaluated), but the embeddings "
                         f"in {embeddings} ({backbone}) with this split and these score params are evaluated "
                         f"{expected}, so the indexes would be scored against other embeddings' neighbours; {RESCORE}.")


def run(args: Any, settings: IndexSettings, score: ScoreSettings) -> tuple[dict[str, Any], list, list, str]:
    """Score every point; the summary (index.json without the points), the points, their tables and what the exact
    run evaluated (:func:`evaluated_id`), after the exact run is checked against the embeddings
    (:func:`check_current`) and read through its contracts (:mod:`recallk.index.inputs`)."""
    split = read_provenance(args.split_provenance)
    if (split or {}).get("protocol") == "text_image":  # the exact run is text <-> image: no image neighbours
        raise InputError("`index.kinds` builds image retrieval indexes, but split.protocol is text_image (captions "
                         "against images), which the index stage does not score; set `index.kinds: []`.")
    inputs = load_inputs(args.catalog, args.split, inside(args.embeddings, EMBEDDING_FILES["embeddings"]),
                         inside(args.embeddings, EMBEDDING_FILES["ids"]), train=True, data_root=data_root_of(split))
    keys = metric_keys(score.metrics, score.ks)
    queries, gallery = inputs.sets.queries, inputs.sets.gallery
    per_query_csv = inside(args.exact, SCORE_FILES["per_query"])
    table = read_per_query(per_query_csv, queries, keys)
    ident = evaluated_id(table, per_query_csv)
    check_current(ident, per_query_csv, split, read_provenance(inside(args.embeddings, EMBEDDING_FILES["provenance"])),
                  score, args.embeddings)
    rows, scores = read_neighbors(inside(args.exact, SCORE_FILES["neighbors"]), queries, gallery,
                                  table["num_retrievable"].to_numpy(), score.depth, ident)
    exact = Exact(table, rows, scores)
    problem = problem_from_split(inputs.sets, inputs.catalog, score)
    points, tables = score_index(problem, exact, settings, score)
    exact_means = {k: mean(exact.table[per_query_column(k)].to_numpy()) for k in keys}
    summary = {"num_queries": int(problem.queries.shape[0]), "num_gallery": int(problem.gallery.shape[0]),
               "margin": settings.margin, "exact": exact_means}
    return summary, points, tables, ident


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_stage_args(argv, "Score approximate indexes against the exact run.", INPUTS, {**OUTPUTS, **MEASURED})
    remove_outputs(output_paths(args, {**OUTPUTS, **MEASURED}))  # first: a failed run never leaves an old result
    settings = load_settings(IndexSettings, args.params)
    score = load_settings(ScoreSettings, args.params)
    points: list[dict[str, Any]] = []
    per_point: list[pd.DataFrame] = []
    if settings.kinds:
        summary, points, per_point, ident = run(args, settings, score)
    else:
        summary, ident = {"skipped": SKIPPED}, ""
    names = [table_name(i, p["point"]) for i, p in enumerate(points)]
    results, timings = split_timings(points)
    speed = {**({"skipped": SKIPPED} if not points else {}), "cheapest_non_inferior": cheapest(points),
             "note": TIMINGS_NOTE, "points": {name: {**t, "table": n} for (name, t), n in zip(timings.items(), names)}}
    document = {**summary, "points": {p["point"]: {**p, "table": n} for p, n in zip(results, names)}}
    rows = summary_rows(points, score.metrics, score.ks).assign(table=names)
    axes = index_page.plotted_metrics(score.ks, score.metrics)
    plot = index_page.pareto_png(points, summary.get("exact", {}), axes, speed["cheapest_non_inferior"])
    page = index_page.page({**summary, "cheapest_non_inferior": speed["cheapest_non_inferior"]}, points,
                       metric_keys(score.metrics, score.ks), plot)
    results_rows = rows.drop(columns=[c for c in TIMING_KEYS if c in rows.columns])
    tables = {POINTS_CSV: results_rows, **dict(zip(names, per_point))}
    # all or none, the folder of tables too (killed at any point, the next run leaves exactly these outputs)
    write_all([(args.index_metrics, json_file(document)), (args.tables, tables_folder(tables, ident)),
               (args.index_speed, json_file(speed)), (args.speed_points, csv_file(rows, ident)),
               (args.pareto, lambda tmp: plot.save(tmp, format="PNG")),
               (args.index_report, lambda tmp: tmp.write_text(page, encoding="utf-8", newline="\n"))])
    # the verdict first (issue 38): a short table of the points and the cheapest non-inferior one
    print(index_page.terminal_table(points, metric_keys(score.metrics, score.ks), settings.margin,
                                    speed["cheapest_non_inferior"]) if points else SKIPPED)


if __name__ == "__main__":
    run_stage(main)
