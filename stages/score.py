"""Stage ``score``: the metric suite of the val queries against the gallery.

argv -> the ``score`` section of params.yaml -> :func:`recallk.score.suite.score_split`
-> the metrics JSON (recall@K's means; the counts, and the other means with every interval, beside it), the
per-class table, the recall@K curve, the per-query table and its compact copy kept in git for ``recallk compare``
(all or none), then the report block on stdout. ``--show`` prints the report of an existing metrics file.
"""

from __future__ import annotations

import json
import os
from argparse import Namespace
from pathlib import Path
from typing import Callable, Sequence

from PIL import Image

from recallk.atomic import Folder, write_all
from recallk.data.contract import has_files
from recallk.errors import InputError
from recallk.report import failure_sheet, html
from recallk.report.block import PAIR_COUNTS, format_report, format_text_image_report, split_metrics
from recallk.report.provenance import provenance
from recallk.score.registry import metric_keys
from recallk.score.settings import ScoreSettings
from recallk.score.suite import score_split
from recallk.score.tables import compact_per_query
from recallk.score.text_image import failure_rows, report_tables, score_text_image
from recallk.settings.base import as_params
from recallk.tables_contract import csv_file
from stages.params import load_settings
from stages.runner import (
    EMBEDDING_FILES,
    SCORE_FILES,
    background_of,
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
from stages.score_inputs import SCORE_INPUTS, SCORE_RESULTS, ScoreInputs, load_inputs, load_text_image, verified_loader

#: What the stage reads and writes, by option name (``--catalog PATH`` ...): dvc.yaml's deps and outs
#: (tests/test_dvc_yaml.py).
#: ``embeddings`` is the encode stage's folder (:data:`~stages.runner.EMBEDDING_FILES`); ``scores`` a folder output
#: of :data:`~stages.runner.SCORE_FILES` (the full per-query table, the neighbours, the near-duplicate pairs).
INPUTS = {**SCORE_INPUTS, "split-provenance": "data/prepared/provenance.json",
          "skipped": "data/prepared/skipped.csv", "captions": "data/prepared/captions.csv"}
OUTPUTS = {"metrics": "metrics/recall.json", "counts": "metrics/counts.json",
           "intervals": "metrics/intervals.json", "evaluated": SCORE_RESULTS["evaluated"],
           "per-class": "metrics/per_class.csv", "curve": "metrics/recall_curve.csv",
           "compact": "metrics/per_query.csv", "confusions": "metrics/confusions.csv",
           "scores": SCORE_RESULTS["scores"],
           "failures": "plots/failures.png", "report": "reports/index.html"}


#: The tables written as CSV files of their own, by their argument name (the others go into ``scores``).
TABLES = ("per_class", "curve", "compact", "confusions")


def off_sheet() -> Image.Image:
    """The failure gallery's placeholder when ``score.failures.queries`` is 0 (DVC needs the file)."""
    return Image.new("RGB", (1, 1), "white")


def show(metrics_json: str, counts_json: str, intervals_json: str, evaluated: dict) -> None:
    """Print the report block of existing metrics files (recall@K's means, the counts; the intervals file, with the
    other means, is optional)."""
    for path in (metrics_json, counts_json):
        if not Path(path).is_file():
            raise InputError(f"{path} not found; run `make repro` first.")
    try:
        means = json.loads(Path(metrics_json).read_text(encoding="utf-8"))
        if not means:
            raise ValueError("no metric in it")
        counts = json.loads(Path(counts_json).read_text(encoding="utf-8"))
        intervals = json.loads(Path(intervals_json).read_text(encoding="utf-8")) if Path(intervals_json).is_file() \
            else {}
        if TEXT_IMAGE in means:  # text <-> image: each file nested by direction
            text = format_text_image_report({"recall": means, "counts": counts, "intervals": intervals}, evaluated)
        else:
            text = format_report({**means, **counts, **intervals}, evaluated)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not JSON, or not this stage's metrics
        raise InputError(f"{metrics_json} is not a metrics file written by this stage ({type(exc).__name__}: "
                         f"{exc}); re-create it with `dvc repro score`.") from None
    print(text)


#: The first key of a text <-> image run's metrics files (``--show`` tells the two layouts apart by it).
TEXT_IMAGE = "text_to_image"


def score_text_image_stage(args: Namespace, inputs: ScoreInputs, settings: ScoreSettings, evaluated: dict,
                           load: Callable[[str], Image.Image] | None) -> None:
    """The stage under ``split.protocol: text_image``: both directions' metrics files (nested by direction), the
    per-query tables (a ``direction`` column), the recall@K curve of both, the failure gallery (captions drawn as
    text, the images by ``load``) and the page; the per-class, confusions, neighbours and embedding-copies tables
    header only (docs/outputs.md)."""
    sets = load_text_image(inputs, args.captions, inside(args.embeddings, EMBEDDING_FILES["text_embeddings"]),
                           inside(args.embeddings, EMBEDDING_FILES["text_ids"]))
    files, per_query = score_text_image(sets, settings)
    rows = failure_rows(sets, per_query, settings.failures, settings.max_memory_mb) if settings.failures.queries else []
    texts = dict(zip(sets.caption_ids, sets.captions))  # a caption is drawn as text where an image would be
    sheet = (failure_sheet.draw(rows, lambda i: failure_sheet.text_tile(texts[i]) if i in texts else load(i),
                                failure_sheet.TEXT_IMAGE_LEGEND) if rows and load is not None else None)
    tables = report_tables(per_query, settings.ks)
    page = html.text_image_page(files, evaluated, tables["curve"], per_query, sheet)
    write_all([(args.metrics, json_file(files["recall"])), (args.counts, json_file(files["counts"])),
               (args.intervals, json_file(files["intervals"])), (args.evaluated, json_file(evaluated))]
              + [(getattr(args, name), csv_file(tables[name], evaluated["id"])) for name in TABLES]
              + [(args.scores, Folder({file: csv_file(tables[name], evaluated["id"], exact=name == "per_query")
                                       for name, file in SCORE_FILES.items()}))]
              + [(args.failures, lambda tmp: (sheet or off_sheet()).save(tmp, format="PNG")),
                 (args.report, lambda tmp: tmp.write_text(page, encoding="utf-8", newline="\n"))])
    if not os.environ.get("RECALLK_NO_REPORT"):
        print(format_text_image_report(files, evaluated))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_stage_args(argv, "Score the metric suite and write the metrics, tables and curve.", INPUTS, OUTPUTS,
                            flags={"show": "only print the report of an existing metrics file"})
    if not args.show:
        remove_outputs(output_paths(args, OUTPUTS))  # first: a failed run never leaves an old result looking current
    settings = load_settings(ScoreSettings, args.params)
    split_provenance = read_provenance(args.split_provenance)
    evaluated = provenance(split_provenance, read_provenance(inside(args.embeddings, EMBEDDING_FILES["provenance"])),
                           as_params(settings))
    if args.show:
        return show(args.metrics, args.counts, args.intervals, evaluated)
    inputs = load_inputs(args.catalog, args.split, inside(args.embeddings, EMBEDDING_FILES["embeddings"]),
                         inside(args.embeddings, EMBEDDING_FILES["ids"]), train=settings.whiten == "pca",
                         data_root=data_root_of(split_provenance))
    # an embeddings-only catalog has no image to draw: the failure gallery stays a placeholder; each drawn
    # image is checked against the catalog's sha256
    load = verified_loader(inputs.catalog, background_of(split_provenance)) if has_files(inputs.catalog) else None
    if (split_provenance or {}).get("protocol") == "text_image":
        return score_text_image_stage(args, inputs, settings, evaluated, load)
    metrics, tables = score_split(inputs.sets, inputs.catalog, settings)
    pair_counts = (split_provenance or {}).get("near_duplicates") or {}  # the split stage's pHash pairs
    metrics.update({k: pair_counts[k] for k in PAIR_COUNTS if k in pair_counts})
    if Path(args.skipped).is_file():  # written by split; absent only when scoring by hand
        metrics["num_skipped_images"] = len(read_input_csv(args.skipped, required=["path", "reason"]))
    tables["compact"] = compact_per_query(tables["per_query"])  # every metric per query, kept in git
    sheet = failure_sheet.draw(tables["failures"], load) if tables["failures"] and load is not None else None
    page = html.page(metrics, metric_keys(settings.metrics, settings.ks), evaluated, tables["curve_band"],
                     tables["per_class"], sheet)
    headline, counts, detail = split_metrics(metrics)
    write_all([(args.metrics, json_file(headline)), (args.counts, json_file(counts)),
               (args.intervals, json_file(detail)),
               (args.evaluated, json_file(evaluated))]
              + [(getattr(args, name), csv_file(tables[name], evaluated["id"])) for name in TABLES]
              + [(args.scores, Folder({file: csv_file(tables[name], evaluated["id"], exact=name == "per_query")
                                       for name, file in SCORE_FILES.items()}))]
              + [(args.failures, lambda tmp: (sheet or off_sheet()).save(tmp, format="PNG")),
                 (args.report, lambda tmp: tmp.write_text(page, encoding="utf-8", newline="\n"))])
    if not os.environ.get("RECALLK_NO_REPORT"):  # `make repro` prints it once, with --show
        print(format_report(metrics, evaluated))


if __name__ == "__main__":
    run_stage(main)
