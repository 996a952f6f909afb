"""The report block as text (the score stage prints it: the one report the pipeline prints)."""

from __future__ import annotations

import math
from typing import Any


#: Keys that go to the second metrics file (metrics/intervals.json): each metric's interval and class mean.
DETAIL_SUFFIXES = ("_ci_low", "_ci_high", "_class_mean")


def split_metrics(metrics: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(headline, detail): the means and counts, and the intervals and class means, each in the dict's order.
    Two metrics files keep ``dvc exp show`` to a dozen columns while ``dvc metrics diff`` sees every number."""
    detail = {k: v for k, v in metrics.items() if k.endswith(DETAIL_SUFFIXES)}
    return {k: v for k, v in metrics.items() if k not in detail}, detail


def format_float(x: float) -> str:
    """Fixed 4-decimal rendering for the report; NaN as n/a."""
    return "n/a" if math.isnan(x) else f"{x:.4f}"


def provenance(split: dict[str, Any] | None, encode: dict[str, Any] | None, score: dict[str, Any]) -> dict[str, str]:
    """What was evaluated, one line each: the backbone and its fingerprint, the data, the split and
    the score settings; ``split`` / ``encode`` are those stages' ``provenance.json`` (None: unknown)."""
    out: dict[str, str] = {}
    if encode:
        out["backbone"] = f"{encode['backbone']} (fingerprint {encode['fingerprint']}, dim {encode['embedding_dim']})"
    if split:
        manifest = f", manifest {split['manifest']}" if split.get("manifest") else ""
        out["data"] = (f"{split['data_root']}{manifest}: {split['num_images']} images, {split['num_labels']} labels, "
                       f"{split['num_skipped_images']} skipped")
        out["split"] = f"{split['strategy']}, {split['protocol']}, seed {split['seed']}"
    boot = score["bootstrap"]
    intervals = (f"{boot['resamples']} bootstrap resamples by {boot['unit']}, {boot['confidence']:.0%}"
                 if boot["resamples"] else "off")
    out["scoring"] = (f"exclude_same {list(score['exclude_same'])}, whiten {score['whiten']}, "
                      f"backend {score['backend']}, intervals {intervals}")
    return out


def format_report(metrics: dict[str, Any], evaluated: dict[str, str] | None = None) -> str:
    """The report block for a metrics dict: what was evaluated (``evaluated``, from :func:`provenance`),
    the counts, then each metric.

    Each metric line shows the mean, then its bootstrap interval and class mean
    when the dict has them; ``tie_sensitive@K`` counts follow the recall lines.
    """
    suffixes = DETAIL_SUFFIXES
    headline = [k for k, v in metrics.items() if isinstance(v, float) and not k.endswith(suffixes)]
    width = max((len(k) for k in headline), default=0) + 1

    def line(key: str) -> str:
        text = f"  {(key + ':').ljust(width)}  {format_float(metrics[key])}"
        if f"{key}_ci_low" in metrics:
            text += f"  [{format_float(metrics[key + '_ci_low'])}, {format_float(metrics[key + '_ci_high'])}]"
        if f"{key}_class_mean" in metrics:
            text += f"  class mean {format_float(metrics[key + '_class_mean'])}"
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
    others = [k for k in headline if not k.startswith("recall@")]
    if others:
        lines += ["", "[metrics]"] + [line(k) for k in others]
    return "\n".join(lines)
