"""The index stage's pictures and page: the Pareto plot (``plots/index_pareto.png``) and
``reports/ann_index.html`` (the table of every operating point and the plot, self-contained).

The plot has one panel per label metric on its x axis (recall@K at the smallest K, and MAP@R when scored),
queries/s (every thread, log scale) on its y axis, one curve per index kind through its operating points in
sweep order, and the exact run's value as a dashed vertical line: up and to the right is better. Drawn with
Pillow and its built-in font, like the failure gallery.
"""

from __future__ import annotations

import html
import math
from typing import Any, Callable, Sequence

from PIL import Image, ImageDraw, ImageFont

from recallk.report.page import STYLE, png_data_uri
from recallk.stats import fixed

#: One colour per kind, in ``index.kinds`` order (tab10).
PALETTE = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207))
PANEL_W, PANEL_H, MARGIN = 420, 320, 50


def plotted_metrics(ks: Sequence[int], metrics: Sequence[str]) -> list[str]:
    """The x axes: recall@min(ks) (when recall is scored) and map@r (when scored)."""
    out = [f"recall@{min(ks)}"] if "recall" in metrics else []
    return out + (["map@r"] if "map@r" in metrics else [])


def pareto_png(points: Sequence[dict[str, Any]], exact: dict[str, float], axes: Sequence[str],
               chosen: str | None = None) -> Image.Image:
    """The Pareto plot of ``points`` (each with ``kind``, ``queries_per_second`` and the ``axes`` metrics);
    ``exact`` holds the exact run's value of each axis; the ``chosen`` point (the cheapest non-inferior one) is
    ringed and named. A 1×1 white image when there is no point."""
    if not points or not axes:
        return Image.new("RGB", (1, 1), "white")
    font = ImageFont.load_default()
    kinds = list(dict.fromkeys(p["kind"] for p in points))
    legend_h = 16 * (len(kinds) + (chosen is not None)) + 10
    image = Image.new("RGB", (PANEL_W * len(axes), PANEL_H + legend_h), "white")
    draw = ImageDraw.Draw(image)
    qps = [max(p["queries_per_second"], 1e-9) for p in points]
    y_lo, y_hi = math.floor(math.log10(min(qps))), math.ceil(math.log10(max(qps)) + 1e-9)
    y_hi = max(y_hi, y_lo + 1)
    for a, axis in enumerate(axes):
        shown = [p for p in points if axis in p]  # a point whose lists cannot give the metric has none
        values = [p[axis] for p in shown] + [exact[axis]]
        x_lo = max(0.0, math.floor(min(values) * 10) / 10 - 0.05)
        x_hi = max(min(1.0, max(values) + 0.02), x_lo + 0.05)
        box = (a * PANEL_W + MARGIN, 20, (a + 1) * PANEL_W - 15, PANEL_H - 35)
        to_xy = panel(draw, font, box, ((x_lo, x_hi), (y_lo, y_hi)), axis, exact[axis], shown, kinds)
        for p in shown:  # the chosen point, ringed
            if p["point"] == chosen:
                x, y = to_xy(p[axis], p["queries_per_second"])
                draw.ellipse([x - 7, y - 7, x + 7, y + 7], outline=(0, 0, 0), width=2)
    for c, kind in enumerate(kinds):
        y = PANEL_H + 4 + 16 * c
        draw.rectangle([MARGIN, y + 3, MARGIN + 12, y + 11], fill=PALETTE[c % len(PALETTE)])
        draw.text((MARGIN + 18, y + 1), kind, fill=(0, 0, 0), font=font)
    if chosen is not None:
        y = PANEL_H + 4 + 16 * len(kinds)
        draw.ellipse([MARGIN, y + 1, MARGIN + 12, y + 13], outline=(0, 0, 0), width=2)
        draw.text((MARGIN + 18, y + 1), f"cheapest non-inferior: {chosen}", fill=(0, 0, 0), font=font)
    return image


def panel(draw: ImageDraw.ImageDraw, font: Any, box: tuple[float, float, float, float],
          ranges: tuple[tuple[float, float], tuple[int, int]], axis: str, exact: float,
          points: Sequence[dict[str, Any]], kinds: Sequence[str]) -> Callable[[float, float], tuple[float, float]]:
    """One panel: ``axis`` against log10 queries/s in ``box`` (left, top, right, bottom), over ``ranges`` (the
    axis's range, the powers of ten of queries/s); returns its map from (value, queries/s) to pixels."""
    left, top, right, bottom = box
    (x_lo, x_hi), (y_lo, y_hi) = ranges

    def to_xy(v: float, q: float) -> tuple[float, float]:
        x = left + (v - x_lo) / (x_hi - x_lo) * (right - left)
        return x, bottom - (math.log10(max(q, 1e-9)) - y_lo) / (y_hi - y_lo) * (bottom - top)

    draw.rectangle([left, top, right, bottom], outline=(0, 0, 0))
    for e in range(y_lo, y_hi + 1):
        y = to_xy(x_lo, 10.0 ** e)[1]
        draw.line([left, y, right, y], fill=(235, 235, 235))
        draw.text((left - 6, y), f"1e{e}", fill=(0, 0, 0), font=font, anchor="rm")
    for i in range(6):
        v = x_lo + (x_hi - x_lo) * i / 5
        draw.text((to_xy(v, 1.0)[0], bottom + 4), f"{v:.3f}", fill=(0, 0, 0), font=font, anchor="ma")
    ex = to_xy(exact, 1.0)[0]
    for y in range(int(top), int(bottom), 8):  # dashed: the exact run
        draw.line([ex, y, ex, min(y + 4, bottom)], fill=(90, 90, 90))
    draw.text(((left + right) / 2, bottom + 18), f"{axis} (dashed: exact)", fill=(0, 0, 0), font=font, anchor="ma")
    draw.text((left, 4), "queries/s (log)", fill=(0, 0, 0), font=font)
    for c, kind in enumerate(kinds):
        colour = PALETTE[c % len(PALETTE)]
        xy = [to_xy(p[axis], p["queries_per_second"]) for p in points if p["kind"] == kind]
        if len(xy) > 1:
            draw.line(xy, fill=colour, width=2)
        for x, y in xy:
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
    return to_xy


def _cell(v: Any) -> str:
    if v is None or isinstance(v, float) and math.isnan(v):
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def _measure(v: float) -> str:
    """A timing, a rate or a size: whole numbers with thousands separators from 100 up, else 2 decimals (a metric
    keeps its 4, :func:`_cell`)."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"


def _delta(p: dict[str, Any], key: str) -> str:
    """``0.9100: -0.0100 [-0.0300, +0.0050]``: the point's value, its Δ against exact and the interval; ``not
    reported`` for a metric the point's lists cannot give exactly (``unreported_metrics``)."""
    if key not in p:
        return UNREPORTED
    return (f"{p[key]:.4f}: {fixed(p[f'delta_{key}'], signed=True)} "
            f"[{fixed(p[f'delta_{key}_ci_low'], signed=True)}, {fixed(p[f'delta_{key}_ci_high'], signed=True)}]")


#: The cell of a metric a point does not report.
UNREPORTED = "not reported (lists too shallow)"


def knn_header(key: str) -> str:
    """``knn_recall@10_big_ann_benchmarks`` -> ``k-NN recall@10 (big-ann-benchmarks)``."""
    for suffix in ("_big_ann_benchmarks", "_ann_benchmarks"):
        if key.startswith("knn_") and key.endswith(suffix):
            return f"k-NN {key[4:-len(suffix)]} ({suffix[1:].replace('_', '-')})"
    return key


def verdict(points: Sequence[dict[str, Any]], margin: Any, chosen: str | None) -> str:
    """The one-line verdict: the cheapest non-inferior point, or that none is."""
    if not points:
        return "no operating point was scored"
    if chosen is None:
        return f"none is non-inferior within index.margin {margin}"
    p = next(p for p in points if p["point"] == chosen)
    return f"cheapest non-inferior point: {chosen} ({_measure(p['queries_per_second'])} queries/s)"


def truncation_note(points: Sequence[dict[str, Any]]) -> str:
    """Which metrics some point does not report: those its lists, cut at the depth, cannot give exactly (a deeper
    list of the same index could change them; ``unreported_metrics``)."""
    if not points:
        return ""
    depth = points[0].get("depth")
    cut = sorted({m for p in points for m in p.get("unreported_metrics", [])})
    where = f"Each index list is cut at depth {depth}" if depth is not None else "Each index list is cut short"
    if not cut:
        return f"{where}, deep enough for every metric reported."
    verb = "is" if len(cut) == 1 else "are"
    return (f"{where}: {', '.join(cut)} {verb} not reported for the points whose lists cannot give "
            f"{'it' if len(cut) == 1 else 'them'} exactly (a deeper list could change the value); raise index.depth "
            "to have them.")


def terminal_table(points: Sequence[dict[str, Any]], keys: Sequence[str], margin: Any,
                   chosen: str | None) -> str:
    """The stage's terminal summary: point, the first metric with its Δ and interval, queries/s, non-inferior;
    then the verdict line."""
    if not points:
        return verdict(points, margin, chosen)
    key = keys[0]
    rows = [["point", key + ": Δ [interval]", "queries/s", "non-inferior"]]
    rows += [[("* " if p["point"] == chosen else "  ") + p["point"], _delta(p, key), _measure(p["queries_per_second"]),
              _cell(p["non_inferior"])] for p in points]
    rows[0][0] = "  " + rows[0][0]
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    lines = ["  ".join(c.ljust(w) if i in (0, 1) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    return "\n".join(lines + [verdict(points, margin, chosen)])


CHOSEN_STYLE = ("tr.chosen td{background:#fff3bf;font-weight:600}.verdict{font-size:16px;font-weight:600}"
                "td:nth-child(2),th:nth-child(2){text-align:left}")


def page(summary: dict[str, Any], points: Sequence[dict[str, Any]], keys: Sequence[str], plot: Image.Image) -> str:
    """``reports/ann_index.html``: the verdict first, then every point (verdict and name first, human headers,
    the chosen point highlighted), the Pareto plot and what was compared."""
    facts = "".join(f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(_cell(v))}</dd>" for k, v in summary.items()
                    if not isinstance(v, (list, dict)))
    chosen = summary.get("cheapest_non_inferior")
    if not points:
        skipped = html.escape(str(summary.get("skipped", "no operating point")))
        lead = f"<p class=\"verdict\" id=\"verdict\">{skipped}</p>"
        body = ""
    else:
        lead = (f"<p class=\"verdict\" id=\"verdict\">{html.escape(verdict(points, summary.get('margin'), chosen))}"
                "</p><p>Non-inferior: every judged metric's Δ interval has its low end above −index.margin "
                f"({html.escape(_cell(summary.get('margin')))}). {html.escape(truncation_note(points))}</p>")
        knn = sorted({k for p in points for k in p if k.startswith("knn_recall@")})
        cut = {m for p in points for m in p.get("unreported_metrics", [])}
        head = (["non-inferior", "point"] + [f"{k} Δ vs exact [interval]" + (" (not reported for some points)"
                                                                                if k in cut else "")
                                             for k in keys]
                + ["queries/s", "queries/s (1 thread)", "build s", "memory MiB", "trained on", "short lists",
                   *[knn_header(k) for k in knn]])
        rows = []
        for p in points:
            cells = [p["non_inferior"], p["point"], *[_delta(p, k) for k in keys],
                     *[_measure(v) for v in (p["queries_per_second"], p["queries_per_second_one_thread"],
                                             p["build_seconds"], p["memory_bytes"] / 2**20)],
                     p["trained_on"], p["short_lists"], *[p[k] for k in knn]]
            rows.append(("<tr class=\"chosen\">" if p["point"] == chosen else "<tr>")
                        + "".join(f"<td>{html.escape(_cell(c))}</td>" for c in cells) + "</tr>")
        table = ("<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr></thead><tbody>"
                 + "".join(rows) + "</tbody></table>")
        body = (f"<h2>Operating points</h2>{table}<h2>Pareto plot</h2>"
                "<img alt=\"queries/s against the label metrics, one curve per kind; the chosen point ringed\" "
                f"src=\"{png_data_uri(plot)}\">")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Index report</title>"
            f"<style>{STYLE}{CHOSEN_STYLE}</style></head><body><h1>Approximate index against exact</h1>{lead}"
            f"{body}<h2>What was compared</h2><dl>{facts}</dl></body></html>\n")
