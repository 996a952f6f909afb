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
from typing import Any, Sequence

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


def pareto_png(points: Sequence[dict[str, Any]], exact: dict[str, float], axes: Sequence[str]) -> Image.Image:
    """The Pareto plot of ``points`` (each with ``kind``, ``queries_per_second`` and the ``axes`` metrics);
    ``exact`` holds the exact run's value of each axis. A 1×1 white image when there is no point."""
    if not points or not axes:
        return Image.new("RGB", (1, 1), "white")
    font = ImageFont.load_default()
    kinds = list(dict.fromkeys(p["kind"] for p in points))
    legend_h = 16 * len(kinds) + 10
    image = Image.new("RGB", (PANEL_W * len(axes), PANEL_H + legend_h), "white")
    draw = ImageDraw.Draw(image)
    qps = [max(p["queries_per_second"], 1e-9) for p in points]
    y_lo, y_hi = math.floor(math.log10(min(qps))), math.ceil(math.log10(max(qps)) + 1e-9)
    y_hi = max(y_hi, y_lo + 1)
    for a, axis in enumerate(axes):
        values = [p[axis] for p in points] + [exact[axis]]
        x_lo = max(0.0, math.floor(min(values) * 10) / 10 - 0.05)
        x_hi = max(min(1.0, max(values) + 0.02), x_lo + 0.05)
        box = (a * PANEL_W + MARGIN, 20, (a + 1) * PANEL_W - 15, PANEL_H - 35)
        panel(draw, font, box, (x_lo, x_hi), (y_lo, y_hi), axis, exact[axis], points, kinds)
    for c, kind in enumerate(kinds):
        y = PANEL_H + 4 + 16 * c
        draw.rectangle([MARGIN, y + 3, MARGIN + 12, y + 11], fill=PALETTE[c % len(PALETTE)])
        draw.text((MARGIN + 18, y + 1), kind, fill=(0, 0, 0), font=font)
    return image


def panel(draw: ImageDraw.ImageDraw, font: Any, box: tuple[float, float, float, float], x_range: tuple[float, float],
          y_range: tuple[int, int], axis: str, exact: float, points: Sequence[dict[str, Any]],
          kinds: Sequence[str]) -> None:
    """One panel: ``axis`` against log10 queries/s in ``box`` (left, top, right, bottom)."""
    left, top, right, bottom = box
    (x_lo, x_hi), (y_lo, y_hi) = x_range, y_range

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


def _cell(v: Any) -> str:
    if v is None or isinstance(v, float) and math.isnan(v):
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def page(summary: dict[str, Any], points: Sequence[dict[str, Any]], keys: Sequence[str], plot: Image.Image) -> str:
    """``reports/ann_index.html``: what was compared, every point's speed, k-NN recall and Δ per metric."""
    facts = "".join(f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(_cell(v))}</dd>" for k, v in summary.items()
                    if not isinstance(v, (list, dict)))
    if not points:
        body = f"<p>{html.escape(str(summary.get('skipped', 'no operating point')))}</p>"
    else:
        knn = sorted({k for p in points for k in p if k.startswith("knn_recall@")})
        head = ["point", "trained on", "queries/s", "queries/s (1 thread)", "build s", "memory MB",
                "short lists", *knn] + [f"Δ {k} [interval]" for k in keys] + ["non-inferior"]
        rows = []
        for p in points:
            cells = [p["point"], p["trained_on"], p["queries_per_second"], p["queries_per_second_one_thread"],
                     p["build_seconds"], p["memory_bytes"] / 2**20, p["short_lists"], *[p[k] for k in knn]]
            cells += [f"{p[k]:.4f}: {fixed(p[f'delta_{k}'], signed=True)} "
                      f"[{fixed(p[f'delta_{k}_ci_low'], signed=True)}, {fixed(p[f'delta_{k}_ci_high'], signed=True)}]"
                      for k in keys]
            rows.append(cells + [p["non_inferior"]])
        table = ("<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr></thead><tbody>"
                 + "".join("<tr>" + "".join(f"<td>{html.escape(_cell(c))}</td>" for c in r) + "</tr>" for r in rows)
                 + "</tbody></table>")
        body = (f"{table}<h2>Pareto plot</h2><img alt=\"queries/s against the label metrics, one curve per kind\" "
                f"src=\"{png_data_uri(plot)}\">")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Index report</title>"
            f"<style>{STYLE}</style></head><body><h1>Approximate index against exact</h1><dl>{facts}</dl>"
            f"<h2>Operating points</h2>{body}</body></html>\n")
