"""The plot of ``recallk track``: each metric's mean over the ordered points with its bootstrap band.

Drawn with Pillow (the project's image library; no plotting dependency), y from 0 to 1, one colour
per metric, the best point filled large and the points indistinguishable from it ringed. Same
result, same bytes. :func:`svg` draws the same for the HTML report,
each metric with its own dash pattern too.
"""

from __future__ import annotations

import html
import io
from typing import Any

from PIL import Image, ImageDraw, ImageFont

#: Line colours, one per metric (matplotlib's tab10).
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf"]
#: One dash pattern per metric in the SVG (after its colour), so lines that coincide stay told apart.
DASHES = ("", "6 3", "2 2", "8 3 2 3", "4 4")
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 900, 480, 56, 170, 16, 70


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def _geometry(points: int):
    span = max(points - 1, 1)

    def x(i: float) -> float:
        return LEFT + (i / span if points > 1 else 0.5) * (WIDTH - LEFT - RIGHT)

    def y(v: float) -> float:
        return TOP + (1.0 - v) * (HEIGHT - TOP - BOTTOM)

    return x, y


def png_bytes(result: dict[str, Any]) -> bytes:
    """The PNG of a :func:`recallk.compare.leaderboard.track` result."""
    metrics = list(result["metrics"].items())
    names = [p["system"] for p in metrics[0][1]["series"]]
    x, y = _geometry(len(names))
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    font = ImageFont.load_default()
    draw = ImageDraw.Draw(image)
    for v in (0.0, 0.25, 0.5, 0.75, 1.0):
        draw.line([(LEFT, y(v)), (WIDTH - RIGHT, y(v))], fill="#e6e6e6")
        draw.text((LEFT - 8, y(v)), f"{v:.2f}", fill="#333333", font=font, anchor="rm")
    for i, name in enumerate(names):
        draw.text((x(i), HEIGHT - BOTTOM + 8), name[:14], fill="#333333", font=font, anchor="mt")
    for number, (metric, entry) in enumerate(metrics):
        colour = _rgb(COLOURS[number % len(COLOURS)])
        series = entry["series"]
        band = Image.new("RGBA", image.size, (0, 0, 0, 0))
        polygon = ([(x(i), y(p["ci_high"])) for i, p in enumerate(series)]
                   + [(x(i), y(p["ci_low"])) for i, p in reversed(list(enumerate(series)))])
        ImageDraw.Draw(band).polygon(polygon, fill=(*colour, 50))
        image.paste(band, (0, 0), band)
        draw = ImageDraw.Draw(image)
        draw.line([(x(i), y(p["mean"])) for i, p in enumerate(series)], fill=colour, width=2)
        for i, p in enumerate(series):
            cx, cy = x(i), y(p["mean"])
            if p["system"] == entry["best"]:
                draw.ellipse([cx - 6, cy - 6, cx + 6, cy + 6], fill=colour)
            elif p["system"] in entry["indistinguishable"]:
                draw.ellipse([cx - 6, cy - 6, cx + 6, cy + 6], outline=colour, width=2)
            else:
                draw.ellipse([cx - 2.5, cy - 2.5, cx + 2.5, cy + 2.5], fill=colour)
        ly = TOP + 14 * number
        draw.line([(WIDTH - RIGHT + 12, ly + 6), (WIDTH - RIGHT + 32, ly + 6)], fill=colour, width=2)
        draw.text((WIDTH - RIGHT + 38, ly), metric, fill="#222222", font=font)
    legend = "filled: best; ringed: not told apart from it"
    draw.text((LEFT, HEIGHT - 20), legend, fill="#555555", font=font)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def svg(result: dict[str, Any]) -> str:
    """The same plot as inline SVG (for ``recallk report``)."""
    metrics = list(result["metrics"].items())
    names = [p["system"] for p in metrics[0][1]["series"]]
    x, y = _geometry(len(names))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-size="11" role="img" '
             'aria-label="trend over the ordered points">']
    for v in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e6e6e6"/>'
                     f'<text x="{LEFT - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    for i, name in enumerate(names):
        parts.append(f'<text x="{x(i):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">'
                     f'{html.escape(name[:14])}</text>')
    for number, (metric, entry) in enumerate(metrics):
        colour, series = COLOURS[number % len(COLOURS)], entry["series"]
        band = (" ".join(f"{x(i):.1f},{y(p['ci_high']):.1f}" for i, p in enumerate(series)) + " "
                + " ".join(f"{x(i):.1f},{y(p['ci_low']):.1f}" for i, p in reversed(list(enumerate(series)))))
        line = " ".join(f"{x(i):.1f},{y(p['mean']):.1f}" for i, p in enumerate(series))
        dash = DASHES[number % len(DASHES)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<polygon points="{band}" fill="{colour}" fill-opacity="0.2"/>'
                     f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"{dash_attr}/>')
        for i, p in enumerate(series):
            best, near = p["system"] == entry["best"], p["system"] in entry["indistinguishable"]
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y(p["mean"]):.1f}" r="{6 if best or near else 2.5}" '
                         f'fill="{colour if best or not near else "white"}" stroke="{colour}" stroke-width="2"/>')
        ly = TOP + 14 * number
        parts.append(f'<line x1="{WIDTH - RIGHT + 12}" x2="{WIDTH - RIGHT + 32}" y1="{ly + 6}" y2="{ly + 6}" '
                     f'stroke="{colour}" stroke-width="2"{dash_attr}/><text x="{WIDTH - RIGHT + 38}" '
                     f'y="{ly + 10}">{html.escape(metric)}</text>')
    parts.append(f'<text x="{LEFT}" y="{HEIGHT - 8}">filled: best; ringed: not told apart from it</text></svg>')
    return "".join(parts)
