"""The report block as text (the score stage prints it: the one report the pipeline prints)."""

from __future__ import annotations

import math
from typing import Any

from recallk.score.embedding_copies import SUGGESTED_MIN_COSINE
from recallk.score.text_image import INTERVAL_NOTE
from recallk.stats import fixed

#: Keys that go to metrics/intervals.json: each metric's interval and class mean (and, with
#: score.embedding_copies.min_cosine, its value without the flagged queries, ``WITHOUT_SUFFIX``).
DETAIL_SUFFIXES = ("_ci_low", "_ci_high", "_class_mean")
#: Each metric over the queries the embedding check did not flag (score.embedding_copies.min_cosine).
WITHOUT_SUFFIX = "_without_embedding_copies"
#: The split stage's near-duplicate counts, copied into metrics/counts.json.
PAIR_COUNTS = {"near_duplicates_train_eval": "train-eval pairs",        # one in train, one in val/gallery
               "near_duplicates_query_gallery": "query-gallery pairs",   # a query, and an image of the gallery
               "near_duplicates_cross_label": "cross-label pairs",
               # the query-gallery pairs whose two images share a label: positives, not leaks
               "near_duplicates_same_label_query_gallery": "same-label query-gallery pairs (positives, not leaks)"}
#: Keys that go to metrics/counts.json: what was counted (queries, gallery, dimension, ties, skipped
#: images, near-duplicates), not a metric.
COUNT_PREFIXES = ("num_", "tie_sensitive@", "embedding_dim", "capped_ks", *PAIR_COUNTS)
#: How the report marks a metric at a K of ``capped_ks`` (at or above every query's gallery: it measures nothing).
CAPPED_MARK = "(K >= gallery: every query's whole gallery)"


def split_metrics(metrics: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(declared, counts, detail), each in the dict's order: what the three metrics files hold.

    * declared (metrics/recall.json, the one declared metrics file): recall@K's means, so ``dvc exp show
      --only-changed`` has a column per K (within 25 columns after 16 experiments with index runs:
      bench/exp_table_columns.py) and ``dvc metrics diff``, which sorts a file's keys as text (``map`` before
      ``recall@1``), lists recall@K; without recall scored, every mean;
    * counts (metrics/counts.json);
    * detail (metrics/intervals.json): the other means first, in the suite's order, then each metric's interval,
      class mean and value without embedding copies (``--targets`` reaches them).
    """
    detail = {k: v for k, v in metrics.items() if k.endswith((*DETAIL_SUFFIXES, WITHOUT_SUFFIX))}
    counts = {k: v for k, v in metrics.items() if k not in detail and k.startswith(COUNT_PREFIXES)}
    means = {k: v for k, v in metrics.items() if k not in detail and k not in counts}
    declared = {k: v for k, v in means.items() if k.startswith("recall@")} or means
    return declared, counts, {**{k: v for k, v in means.items() if k not in declared}, **detail}


def format_float(x: float) -> str:
    """Fixed 4-decimal rendering for the report; NaN as n/a."""
    return "n/a" if math.isnan(x) else f"{x:.4f}"


def format_report(metrics: dict[str, Any], evaluated: dict[str, str] | None = None) -> str:
    """The report block for a metrics dict: what was evaluated (``evaluated``, from :func:`provenance`),
    the counts, then each metric.

    Each metric line shows the mean, then its bootstrap interval and class mean
    when the dict has them; ``tie_sensitive@K`` counts follow the recall lines. A metric at a K of
    ``capped_ks`` (at or above every query's gallery) is marked :data:`CAPPED_MARK`, and one line names those Ks.
    """
    suffixes = DETAIL_SUFFIXES + (WITHOUT_SUFFIX,)
    capped = {str(k) for k in metrics.get("capped_ks") or ()}  # absent in a counts.json of an older run
    headline = [k for k, v in metrics.items() if isinstance(v, float) and not k.endswith(suffixes)]
    width = max((len(k) for k in headline), default=0) + 1

    def line(key: str) -> str:
        text = f"  {(key + ':').ljust(width)}  {format_float(metrics[key])}"
        if f"{key}_ci_low" in metrics:
            text += f"  [{format_float(metrics[key + '_ci_low'])}, {format_float(metrics[key + '_ci_high'])}]"
        if f"{key}_class_mean" in metrics:
            text += f"  class mean {format_float(metrics[key + '_class_mean'])}"
        if key.rpartition("@")[2] in capped:  # recall@500 of a 449-image gallery: 1.0 by construction
            text += f"  {CAPPED_MARK}"
        return text

    lines = []
    if evaluated:
        lines += ["[evaluated]"] + [f"  {(k + ':').ljust(14)} {v}" for k, v in evaluated.items()] + [""]
    lines += ["[evaluation]",
             f"  num queries:   {metrics['num_queries']}",
             f"  num excluded:  {metrics['num_excluded_queries']}",
             f"  num gallery:   {metrics['num_gallery']}",
             f"  embedding_dim: {metrics['embedding_dim']}",
             "",
             "[recall]"]
    lines += [line(k) for k in headline if k.startswith("recall@")]
    ties = {k: v for k, v in metrics.items() if k.startswith("tie_sensitive@")}
    if ties:
        lines.append("  queries whose hit flips under the opposite tie rule: "
                     + ", ".join(f"@{k.split('@')[1]} {v}" for k, v in ties.items()))
    if capped:
        lines.append(f"  K = {', '.join(map(str, metrics['capped_ks']))}: at or above every query's gallery, recall@K "
                     "is 1.0 by construction; use a smaller K (score.ks)")
    others = [k for k in headline if not k.startswith("recall@")]
    if others:
        lines += ["", "[metrics]"] + [line(k) for k in others]
    lines += near_duplicate_lines(metrics, [k for k in headline if k.startswith("recall@")
                                            and f"{k}{WITHOUT_SUFFIX}" in metrics])
    return "\n".join(lines)


def near_duplicate_lines(metrics: dict[str, Any], keys: list[str]) -> list[str]:
    """The ``[near-duplicates]`` block: the split stage's pair counts (a warning when a pair crosses
    train/eval or pairs a query with a gallery image of another label; same-label query-gallery pairs are
    positives, counted on their own line) and the embedding check's flagged queries, recall@K with and
    without them (every metric's ``<key>_without_embedding_copies`` is in the metrics file)."""
    lines: list[str] = []
    if any(k in metrics for k in PAIR_COUNTS):
        lines += [f"  {(what + ':').ljust(20)} {metrics.get(k, 0)}" for k, what in PAIR_COUNTS.items()
                  if k != "near_duplicates_same_label_query_gallery" or k in metrics]
        # a same-label query-gallery pair is a positive the query should find (counted apart, no warning)
        positives = metrics.get("near_duplicates_same_label_query_gallery", 0)
        query_gallery = metrics.get("near_duplicates_query_gallery", 0) - positives
        crossing = metrics.get("near_duplicates_train_eval", 0) + query_gallery
        if crossing:
            lines += [f"  warning: {metrics.get('near_duplicates_train_eval', 0)} near-duplicate pair(s) cross train "
                      f"and val/gallery, {query_gallery} pair a query with a gallery image of another label:",
                      "           the numbers may be inflated (data/prepared/near_duplicates.csv; keep each pair in "
                      "one split: split.near_duplicates.policy: group, or the manifest's split column under "
                      "split.strategy: given)"]
    if "num_embedding_copy_queries" in metrics:
        # a count, not a verdict: at a loose min_cosine clean positives pass too (issue 38); the pairs say
        flagged = metrics["num_embedding_copy_queries"]
        lines.append(f"  queries with a near copy (embeddings): {flagged} of "
                     f"{metrics['num_queries'] + metrics['num_excluded_queries']}"
                     + ("; copies only if the pairs in data/scores/embedding_copies.csv look like copies" if flagged
                        else ""))
        width = max((len(k) for k in keys), default=0) + 1
        for key in keys:
            without = metrics[f"{key}{WITHOUT_SUFFIX}"]
            rest = ("n/a (every query is flagged)" if without is None else
                    f"{format_float(without)} without them ({fixed(without - metrics[key], signed=True)})")
            lines.append(f"  {(key + ':').ljust(width)}  {format_float(metrics[key])} with them, {rest}")
        if flagged:
            lines.append("  (a near-exact copy of a query makes its hit easy; a positive at that cosine is not a leak: "
                         f"score.embedding_copies.min_cosine {SUGGESTED_MIN_COSINE:g} flags near-exact copies only)")
    return ["", "[near-duplicates]"] + lines if lines else []


#: The heading and the query and gallery words of each text <-> image direction, in report order.
DIRECTION_WORDS = {"text_to_image": ("[text -> image]", "captions", "images"),
                   "image_to_text": ("[image -> text]", "images", "captions")}


def format_text_image_report(files: dict[str, dict[str, Any]], evaluated: dict[str, str] | None = None) -> str:
    """The report block of a text <-> image run (``split.protocol: text_image``): what was evaluated, then per
    direction its counts and every mean with its interval (``files``: the three metrics files' contents,
    ``recall``, ``counts`` and ``intervals``, each nested by direction; :func:`recallk.score.text_image.
    score_text_image`), then what the intervals resample."""
    lines = []
    if evaluated:
        lines += ["[evaluated]"] + [f"  {(k + ':').ljust(14)} {v}" for k, v in evaluated.items()] + [""]
    for direction, (heading, queries, gallery) in DIRECTION_WORDS.items():
        counts, detail = files["counts"][direction], files["intervals"].get(direction, {})
        means = {**files["recall"][direction], **{k: v for k, v in detail.items() if not k.endswith(DETAIL_SUFFIXES)}}
        excluded = counts["num_excluded_queries"]
        lines += [heading, f"  num queries:   {counts['num_queries']} {queries}"
                  + (f" ({excluded} without a caption, left out)" if excluded else ""),
                  f"  num gallery:   {counts['num_gallery']} {gallery}"]
        width = max(len(k) for k in means) + 1
        for key, value in means.items():
            text = f"  {(key + ':').ljust(width)}  {format_float(value) if key != 'median_rank' else f'{value:g}'}"
            if f"{key}_ci_low" in detail:
                text += f"  [{format_float(detail[key + '_ci_low'])}, {format_float(detail[key + '_ci_high'])}]"
            if key.rpartition("@")[2] in {str(k) for k in counts.get("capped_ks") or ()}:
                text += f"  {CAPPED_MARK}"
            lines.append(text)
        lines += [f"  queries whose first positive moves under the opposite tie rule: {counts['tie_sensitive']}", ""]
    lines.append(f"  {INTERVAL_NOTE}" if "interval_unit" in files["intervals"] and any(
        k.endswith("_ci_low") for d in DIRECTION_WORDS for k in files["intervals"].get(d, {})) else "  intervals: off")
    lines.append(f"  embedding_dim: {files['counts']['embedding_dim']}")
    return "\n".join(lines)
