"""``recallk report A B C ...``: one self-contained offline HTML page comparing many runs (no CDN, nothing fetched).

The page opens with a one-paragraph summary (:func:`recallk.compare.board_cli.summary`: the best system on
how many metrics, and what is not told apart), then holds the overlaid recall@K curves of every system with
their bootstrap bands (inline SVG; each system its own colour, dash pattern and marker, later ones shifted by a
pixel or two, so coinciding curves stay visible), the leaderboard of every metric (ranks, intervals, between-run
SD, a column left out when no system has one, Tukey letters, Δ against the reference), the trend over the points
when ``--ordered`` (the systems are a series: checkpoints, epochs), the per-label Δ against the reference on one
metric, and each run's provenance (its
source and the score stage's ``evaluated.json``). Same inputs, same bytes.
"""

from __future__ import annotations

import html
import re
import sys
from typing import Any, Sequence

from recallk.compare import board_cli, leaderboard, sources, systems, track_plot
from recallk.errors import InputError
from recallk.report.page import STYLE
from recallk.stats import fixed

#: Labels listed in the per-label table (those with the widest spread of Δ first); the rest are counted.
SHOWN_LABELS = 100
RECALL = re.compile(r"recall@(\d+)$")
#: Per system, after its colour: a dash pattern and a marker, so curves that coincide stay told apart.
DASHES = ("", "6 3", "2 2", "8 3 2 3", "4 4")
MARKERS = ("circle", "square", "triangle", "diamond", "cross")
#: Curves of later systems are shifted this many pixels right (and down) each, so identical ones stay visible.
OFFSET = 1.5


def curves_svg(result: dict[str, Any], width: int = 640, height: int = 320) -> str:
    """Every system's recall@K over K with its interval band, one colour per system, y from 0 to 1."""
    ks = sorted(int(m.group(1)) for m in map(RECALL.match, result["metrics"]) if m)
    left, right, top, bottom = 48, 190, 12, 36
    k_max = max(max(ks), 2)

    def x(k: float) -> float:
        return left + (k - 1) / (k_max - 1) * (width - left - right)

    def y(v: float) -> float:
        return top + (1.0 - v) * (height - top - bottom)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="11" '
             'role="img" aria-label="recall@K curves">']
    for v in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    parts += [f'<text x="{x(k):.1f}" y="{height - bottom + 16}" text-anchor="middle">{k}</text>' for k in ks]
    for number, system in enumerate(result["systems"]):
        colour = track_plot.COLOURS[number % len(track_plot.COLOURS)]
        rows = [next(r for r in result["metrics"][f"recall@{k}"]["rows"] if r["system"] == system["name"]) for k in ks]
        shift = OFFSET * (number % 4)
        line = " ".join(f"{x(k) + shift:.1f},{y(r['mean']) + shift:.1f}" for k, r in zip(ks, rows))
        dash = DASHES[number % len(DASHES)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        shape = MARKERS[number % len(MARKERS)]
        marks = "".join(marker(shape, x(k) + shift, y(r["mean"]) + shift, colour) for k, r in zip(ks, rows))
        band = (" ".join(f"{x(k):.1f},{y(r['ci_high']):.1f}" for k, r in zip(ks, rows)) + " "
                + " ".join(f"{x(k):.1f},{y(r['ci_low']):.1f}" for k, r in zip(ks[::-1], rows[::-1])))
        ly = top + 14 * number
        parts.append(f'<polygon points="{band}" fill="{colour}" fill-opacity="0.15"/>'
                     f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"{dash_attr}/>'
                     f'{marks}<line x1="{width - right + 10}" x2="{width - right + 30}" y1="{ly + 6}" y2="{ly + 6}" '
                     f'stroke="{colour}" stroke-width="2"{dash_attr}/>'
                     f'{marker(shape, width - right + 20, ly + 6, colour)}'
                     f'<text x="{width - right + 36}" y="{ly + 10}">'
                     f'{html.escape(system["name"][:24])}</text>')
    parts.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 4}" text-anchor="middle">K</text></svg>')
    return "".join(parts)


def marker(shape: str, cx: float, cy: float, colour: str) -> str:
    """One SVG marker of ``shape`` (:data:`MARKERS`) centred at ``cx, cy``."""
    if shape == "circle":
        return f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="{colour}"/>'
    if shape == "square":
        return f'<rect x="{cx - 3.5:.1f}" y="{cy - 3.5:.1f}" width="7" height="7" fill="{colour}"/>'
    if shape == "cross":
        return (f'<path d="M{cx - 4:.1f},{cy - 4:.1f}L{cx + 4:.1f},{cy + 4:.1f}M{cx - 4:.1f},{cy + 4:.1f}'
                f'L{cx + 4:.1f},{cy - 4:.1f}" stroke="{colour}" stroke-width="2"/>')
    corners = ([(0, -4.5), (4, 3.5), (-4, 3.5)] if shape == "triangle" else [(0, -4.5), (4.5, 0), (0, 4.5), (-4.5, 0)])
    points = " ".join(f"{cx + dx:.1f},{cy + dy:.1f}" for dx, dy in corners)
    return f'<polygon points="{points}" fill="{colour}"/>'


def non_empty_columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> tuple[list[str], list[list[str]]]:
    """``header`` and ``rows`` without the columns whose every cell is empty (e.g. "run SD" with one run each)."""
    keep = [c for c in range(len(header)) if any(r[c] for r in rows)] if rows else list(range(len(header)))
    return [header[c] for c in keep], [[r[c] for c in keep] for r in rows]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def per_label(board: systems.Panel, result: dict[str, Any], metric: str) -> tuple[list[str], list[list[str]], int]:
    """Per label: its queries, the reference's mean and each other system's Δ on ``metric``; the labels
    with the widest spread of Δ first, at most :data:`SHOWN_LABELS`; and how many were left out."""
    reference = result["metrics"][metric]["reference"]
    ref = board.names.index(reference)
    others = [s for s in range(len(board.names)) if s != ref]
    frames = board.frames
    labels = sorted(set(board.labels.tolist()))
    rows = []
    for label in labels:
        mask = board.labels == label
        base = float(frames[ref][metric].to_numpy()[mask].mean())
        deltas = [float(frames[s][metric].to_numpy()[mask].mean()) - base for s in others]
        rows.append((-(max(deltas) - min(deltas) if len(deltas) > 1 else abs(deltas[0])), label, int(mask.sum()),
                     base, deltas))
    rows.sort(key=lambda r: (r[0], r[1]))
    header = ["label", "queries", f"{reference} (reference)"] + [f"Δ {board.names[s]}" for s in others]
    cells = [[label, str(n), fixed(base), *(fixed(d, signed=True) for d in deltas)]
             for _, label, n, base, deltas in rows[:SHOWN_LABELS]]
    return header, cells, max(0, len(rows) - SHOWN_LABELS)


def page(board: systems.Panel, result: dict[str, Any], provenance: list[list[tuple[str, dict[str, str]]]],
         label_metric: str) -> str:
    """The whole page as one string."""
    parts = ["<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>recallk report: "
             f"{len(board.names)} systems</title><style>{STYLE}</style></head><body>",
             f"<h1>{len(board.names)} systems compared</h1>",
             f'<p class="summary">{html.escape(board_cli.summary(result))}</p>',
             "".join(f"<p>{html.escape(line)}</p>" for line in board_cli.preamble(result))]
    if any(RECALL.match(m) for m in result["metrics"]):
        parts += ["<h2>recall@K curves</h2>", curves_svg(result)]
    parts.append("<h2>Leaderboard</h2>")
    for metric, entry in result["metrics"].items():
        header, rows = non_empty_columns(board_cli.header(result), board_cli.board_rows(entry))
        parts += [f"<h3>{html.escape(metric)}</h3>", _table(header, rows)]
        parts += [f"<p>{html.escape(note)}</p>" for note in board_cli.family_notes(entry, result)]
    if "series" in next(iter(result["metrics"].values())):
        parts += ["<h2>Trend over the ordered points</h2>", track_plot.svg(result)]
        parts += [f"<p>{html.escape(m)}: best {html.escape(e['best'])}; not told apart from it: "
                  f"{html.escape(', '.join(e['indistinguishable']))}</p>" for m, e in result["metrics"].items()]
    if board.labels is not None:
        header, rows, more = per_label(board, result, label_metric)
        parts += [f"<h2>Per label: Δ on {html.escape(label_metric)}</h2>", _table(header, rows)]
        if more:
            parts.append(f"<p>{more} more labels with a narrower spread of Δ are left out.</p>")
    parts.append("<h2>Provenance</h2>")
    for name, runs in zip(board.names, provenance):
        parts.append(f"<h3>{html.escape(name)}</h3>")
        for origin, facts in runs:
            items = "".join(f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(str(v))}</dd>" for k, v in facts.items())
            parts.append(f"<p>{html.escape(origin)}</p><dl>{items or '<dd>no evaluated.json beside it</dd>'}</dl>")
    parts.append("</body></html>\n")
    return "".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    p = board_cli.parser("recallk report", "One offline HTML page comparing many runs.")
    p.add_argument("--out", default="report.html", help="the page (default report.html)")
    p.add_argument("--ordered", action="store_true", help="the systems are a series (checkpoints): add the trend")
    p.add_argument("--baseline", metavar="SYSTEM", help="compare every system with this one (default: the best)")
    p.add_argument("--label-metric", default="recall@1", help="the metric of the per-label table (recall@1)")
    args = p.parse_args(argv)
    try:
        if args.ordered and args.baseline:
            raise InputError("--ordered compares each point with the best and the previous one; drop --baseline.")
        settings = board_cli.settings_of(args, None if args.ordered else args.baseline)
        specs = board_cli.specs_of(args)
        board_cli.check_targets([("--out", args.out)], specs)
        board = board_cli.gather(args, specs)
        if args.label_metric not in board.metrics:
            raise InputError(f"--label-metric names {args.label_metric!r}; the systems hold "
                             f"{', '.join(board.metrics)}.")
        result = (leaderboard.track if args.ordered else leaderboard.leaderboard)(board, settings)
        provenance = [[(origin, sources.evaluated(run, args.repo)) for run, origin in zip(spec.runs, origins)]
                      for spec, origins in zip(specs, board.origins)]
        board_cli.write_outputs([(args.out, page(board, result, provenance, args.label_metric))])
    except InputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    print(f"wrote {args.out}: {len(board.names)} systems, {len(board.metrics)} metrics ({board.case})")
    return 0


