"""``reports/index.html``: one self-contained page of a score run (no CDN, nothing fetched).

It shows what was evaluated (the provenance), the headline metrics with their intervals and
class means, the recall@K curve as inline SVG with its interval band and the y axis from 0,
the failure gallery as an embedded PNG and the per-class table (worst class first, the first rows open, the
rest folded). It opens with one summary paragraph: what was evaluated and the headline numbers. Same inputs,
same bytes.
"""

from __future__ import annotations

import html
import math
from typing import Any

import pandas as pd
from PIL import Image

from recallk.report.block import CAPPED_MARK, DIRECTION_WORDS, PAIR_COUNTS, WITHOUT_SUFFIX
from recallk.report.page import STYLE, png_data_uri
from recallk.score.text_image import INTERVAL_NOTE

#: Counts shown besides the four of every run: the split stage's pairs and the embedding check's queries.
NEAR_DUPLICATE_KEYS = (*PAIR_COUNTS, "num_embedding_copy_queries")

def _number(x: Any) -> str:
    if x is None or isinstance(x, float) and math.isnan(x):
        return "n/a"
    return f"{x:.4f}" if isinstance(x, float) else str(x)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_number(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def curve_svg(curve: pd.DataFrame, width: int = 560, height: int = 300) -> str:
    """The recall@K curve (``k, recall, ci_low, ci_high``) as SVG: a line, its interval band, y from 0 to 1."""
    left, right, top, bottom = 48, 16, 12, 36
    ks = curve["k"].tolist()
    k_max = max(max(ks), 2)

    def x(k: float) -> float:
        return left + (k - 1) / (k_max - 1) * (width - left - right)

    def y(v: float) -> float:
        return top + (1.0 - v) * (height - top - bottom)

    line = " ".join(f"{x(k):.1f},{y(v):.1f}" for k, v in zip(ks, curve["recall"]))
    band = (" ".join(f"{x(k):.1f},{y(v):.1f}" for k, v in zip(ks, curve["ci_high"]))
            + " " + " ".join(f"{x(k):.1f},{y(v):.1f}" for k, v in zip(ks[::-1], curve["ci_low"][::-1])))
    ticks = "".join(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>'
                    f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>'
                    for v in (0.0, 0.25, 0.5, 0.75, 1.0))
    kticks = "".join(f'<text x="{x(k):.1f}" y="{height - bottom + 16}" text-anchor="middle">{k}</text>'
                     for k in ks if k in (1, k_max) or k % 5 == 0)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="11" '
            f'role="img" aria-label="recall@K curve">{ticks}{kticks}'
            f'<polygon points="{band}" fill="#1f77b4" fill-opacity="0.2"/>'
            f'<polyline points="{line}" fill="none" stroke="#1f77b4" stroke-width="2"/>'
            f'<text x="{(left + width - right) / 2:.0f}" y="{height - 4}" text-anchor="middle">K</text></svg>')


def gallery_html(failures: Image.Image | None) -> str:
    """The failure gallery embedded as a PNG, or why there is none."""
    return (f'<img alt="failure gallery" src="{png_data_uri(failures)}">' if failures is not None
            else "<p>off (score.failures.queries: 0, or an embeddings-only catalog: no image to show)</p>")


#: Rows of the per-class table shown open (the worst classes); the rest are folded in a ``<details>``.
SHOWN_CLASSES = 20


def summary(metrics: dict[str, Any], keys: list[str], provenance: dict[str, Any], per_class: pd.DataFrame) -> str:
    """The opening paragraph: what was evaluated and the headline numbers (the first metrics with intervals,
    the worst class)."""
    what = [str(provenance[k]) for k in ("backbone", "data", "split") if k in provenance]
    text = f"Evaluated {what[0]}" if what else "Evaluated"
    text += f" on {what[1]}" if len(what) > 1 else ""
    text += f" (split: {what[2]})" if len(what) > 2 else ""
    if "num_queries" in metrics and "num_gallery" in metrics:
        text += f": {metrics['num_queries']} queries against {metrics['num_gallery']} gallery items"
    numbers = []
    for k in keys[:3]:
        interval = (f" [{metrics[k + '_ci_low']:.4f}, {metrics[k + '_ci_high']:.4f}]"
                    if k + "_ci_low" in metrics else "")
        numbers.append(f"{k} {_number(metrics.get(k))}{interval}")
    text += ". " + "; ".join(numbers) + "." if numbers else "."
    if keys and keys[0] in per_class.columns and len(per_class):
        worst = worst_first(per_class, keys).iloc[0]
        text += f" Worst class: {worst['label']} ({keys[0]} {_number(float(worst[keys[0]]))})."
    return text


def worst_first(per_class: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The per-class table, the lowest first metric first (ties by label)."""
    if not keys or keys[0] not in per_class.columns or "label" not in per_class.columns:
        return per_class
    order = pd.to_numeric(per_class[keys[0]], errors="coerce")
    frame = per_class.assign(_order=order, _label=per_class["label"].astype(str))
    return frame.sort_values(["_order", "_label"], kind="mergesort", na_position="first").drop(
        columns=["_order", "_label"])


def classes_table(per_class: pd.DataFrame, keys: list[str]) -> str:
    """The per-class table worst first: the first :data:`SHOWN_CLASSES` rows open, the rest folded."""
    frame = worst_first(per_class, keys)
    header, rows = list(frame.columns), frame.values.tolist()
    order = f"sorted by {keys[0]}, worst first" if keys and keys[0] in frame.columns else "in label order"
    text = f"<p>{len(rows)} classes, {order}.</p>" + _table(header, rows[:SHOWN_CLASSES])
    if len(rows) > SHOWN_CLASSES:
        text += (f"<details><summary>{len(rows) - SHOWN_CLASSES} more classes</summary>"
                 f"{_table(header, rows[SHOWN_CLASSES:])}</details>")
    return text


def page(metrics: dict[str, Any], keys: list[str], provenance: dict[str, Any], curve: pd.DataFrame,
         per_class: pd.DataFrame, failures: Image.Image | None) -> str:
    """The whole page as one string: the summary paragraph first, then the details."""
    facts = "".join(f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(str(v))}</dd>" for k, v in provenance.items())
    capped = {str(k) for k in metrics.get("capped_ks") or ()}  # at or above every query's gallery

    def named(key: str) -> str:
        return f"{key} {CAPPED_MARK}" if key.rpartition("@")[2] in capped else key

    headline = _table(["metric", "value", "interval", "class mean"],
                      [[named(k), metrics[k], (f"[{metrics[k + '_ci_low']:.4f}, {metrics[k + '_ci_high']:.4f}]"
                                        if k + "_ci_low" in metrics else ""), metrics.get(k + "_class_mean", "")]
                       for k in keys])
    counts = _table(["count", "value"], [[k, metrics[k]] for k in ("num_queries", "num_excluded_queries",
                                                                   "num_gallery", "embedding_dim", *NEAR_DUPLICATE_KEYS)
                                         if k in metrics])
    without = [[k, metrics[k], metrics[k + WITHOUT_SUFFIX]] for k in keys if k + WITHOUT_SUFFIX in metrics]
    if without:
        headline += _table(["metric", "all queries", "without the queries with an embedding copy "
                                                      "(score.embedding_copies)"], without)
    gallery = gallery_html(failures)
    lead = html.escape(summary(metrics, keys, provenance, per_class))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Recall@K report</title>"
            f"<style>{STYLE}</style></head><body><h1>Recall@K report</h1><p id=\"summary\">{lead}</p>"
            f"<h2>What was evaluated</h2><dl>{facts}</dl><h2>Metrics</h2>{headline}{counts}<h2>recall@K</h2>"
            f"{curve_svg(curve)}<h2>Failure gallery</h2>{gallery}<h2>Per class</h2>"
            f"{classes_table(per_class, keys)}</body></html>\n")


#: Queries of each direction the text <-> image page lists, the deepest first positive first.
SHOWN_QUERIES = 20


def hardest(per_query: pd.DataFrame, direction: str) -> pd.DataFrame:
    """The :data:`SHOWN_QUERIES` queries of ``direction`` with the deepest first positive (ties by query id)."""
    rows = per_query[per_query["direction"].eq(direction) & per_query["first_positive_rank"].notna()]
    order = rows.assign(_rank=-rows["first_positive_rank"].astype("int64"))
    return order.sort_values(["_rank", "image_id"], kind="mergesort").head(SHOWN_QUERIES)


def text_image_page(files: dict[str, dict[str, Any]], provenance: dict[str, Any], curve: pd.DataFrame,
                    per_query: pd.DataFrame, failures: Image.Image | None) -> str:
    """The page of a text <-> image run: what was evaluated, each direction's metrics with their intervals (by
    image), the recall@K curve of text -> image, the failure gallery (captions drawn as text) and the hardest
    queries of each direction with the caption text (``files``: the metrics files' contents,
    :func:`recallk.score.text_image.score_text_image`)."""
    facts = "".join(f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(str(v))}</dd>" for k, v in provenance.items())
    parts, lead = [], []
    for direction, (heading, queries, gallery) in DIRECTION_WORDS.items():
        counts, detail = files["counts"][direction], files["intervals"].get(direction, {})
        means = {**files["recall"][direction], **{k: v for k, v in detail.items() if not k.endswith(("_ci_low",
                                                                                                   "_ci_high"))}}
        rows = [[k, v, f"[{detail[k + '_ci_low']:.4f}, {detail[k + '_ci_high']:.4f}]" if k + "_ci_low" in detail
                 else ""] for k, v in means.items()]
        first = next(iter(means))
        lead.append(f"{heading.strip('[]')} {first} {_number(means[first])} ({counts['num_queries']} {queries} "
                    f"against {counts['num_gallery']} {gallery})")
        parts.append(f"<h3>{html.escape(heading.strip('[]'))}</h3>"
                     + _table(["metric", "value", "interval"], rows)
                     + _table(["count", "value"], [[k, counts[k]] for k in ("num_queries", "num_excluded_queries",
                                                                            "num_gallery", "tie_sensitive")]))
    t2i = hardest(per_query, "text_to_image")
    captions = _table(["caption", "caption_id", "its image", "rank of its image"],
                      [[c, q, i, int(r)] for c, q, i, r in zip(t2i["caption"], t2i["image_id"], t2i["label"],
                                                               t2i["first_positive_rank"])])
    i2t = hardest(per_query, "image_to_text")
    texts = per_query[per_query["direction"].eq("text_to_image")].groupby("label", sort=False)["caption"].agg(
        " | ".join)
    images = _table(["image", "rank of its first caption", "its captions"],
                    [[i, int(r), texts.get(i, "")] for i, r in zip(i2t["image_id"], i2t["first_positive_rank"])])
    band = curve.assign(ci_low=curve["recall"], ci_high=curve["recall"])
    backbone = f" {provenance['backbone']}" if "backbone" in provenance else ""
    summary = html.escape(f"Evaluated{backbone}: " + "; ".join(lead) + ".")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Text-image retrieval report"
            f"</title><style>{STYLE}</style></head><body><h1>Text &#8596; image retrieval report</h1>"
            f"<p id=\"summary\">{summary}</p><h2>What was evaluated</h2><dl>{facts}</dl><h2>Metrics</h2>"
            f"{''.join(parts)}<p>{html.escape(INTERVAL_NOTE)}.</p><h2>recall@K, text -&gt; image</h2>{curve_svg(band)}"
            f"<h2>Failure gallery</h2>{gallery_html(failures)}<h2>Hardest captions (text -&gt; image)</h2>{captions}"
            f"<h2>Hardest images (image -&gt; text)</h2>{images}</body></html>\n")
