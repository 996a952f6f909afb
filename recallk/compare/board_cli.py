"""``recallk leaderboard A B C ...`` and ``recallk track A B C ...``: many systems, or an ordered series.

Each system is ``[NAME=]SPEC[+SPEC...]`` (several runs: split seeds, folds, training seeds), SPEC a
per-query CSV, a folder of score outputs, a git revision or a DVC experiment; ``--experiments
PATTERN`` adds every DVC experiment of the repository whose name matches (``'*'``: all of them).
The leaderboard ranks the systems on every metric with intervals, Δ against the best (or
``--baseline``) with paired intervals and adjusted p-values, and the randomized Tukey HSD letters;
``track`` takes the systems as an ordered series (checkpoints, epochs) and also writes a PNG.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from recallk.atomic import write_all
from recallk.compare import family, leaderboard, systems
from recallk.compare.outputs import strict
from recallk.errors import InputError


def _f(x: float | None, signed: bool = False) -> str:
    return "" if x is None else (f"{x:+.4f}" if signed else f"{x:.4f}")


def _p(x: float | None) -> str:
    return "" if x is None else (f"{x:.4f}" if x >= 1e-4 else f"{x:.1e}")


HEADER = ["rank", "system", "mean", "interval", "run SD", "group", "Δ vs ref", "interval of Δ", "Δ run SD", "p",
          "p adj"]


def board_rows(entry: dict[str, Any]) -> list[list[str]]:
    """The text cells of one metric's ranked table."""
    out = []
    for row in entry["rows"]:
        ref = row["system"] == entry["reference"]
        out.append([str(row["rank"]), row["system"], _f(row["mean"]), f"[{_f(row['ci_low'])}, {_f(row['ci_high'])}]",
                    _f(row["run_sd"]), row["group"], "reference" if ref else _f(row["delta"], True),
                    "" if ref else f"[{_f(row['delta_low'], True)}, {_f(row['delta_high'], True)}]",
                    "" if ref else _f(row["delta_run_sd"]),
                    "" if ref else _p(row["p"]), "" if ref else _p(row["p_adjusted"])])
    return out


def _aligned_table(header: list[str], rows: list[list[str]]) -> list[str]:
    table = [header] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    return ["  ".join(c.ljust(w) if i in (1, 5) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
            for r in table]


def preamble(result: dict[str, Any]) -> list[str]:
    """Where the systems came from and how they were tested."""
    lines = []
    for system in result["systems"]:
        runs = system["runs"]
        more = f" (+{len(runs) - 1} more runs)" if len(runs) > 1 else ""
        lines.append(f"{system['name']}{more}" if runs[0] == system["name"] else f"{system['name']}: {runs[0]}{more}")
    case = {"single run": "one run per system; units are the queries",
            "same queries": "repeated runs on the same queries: each query averaged over a system's runs, then "
                            "tested; units are the queries",
            "different queries": "repeated runs on different queries: each run's mean, paired by run; units are "
                                 "the runs"}[result["case"]]
    ref = f"--baseline {result['baseline']}" if result["baseline"] else "the best system on each metric"
    unit = "labels (clusters of queries)" if result["by"] == "label" else result["units"]
    lines += [f"case: {case}", f"{result['queries']} queries ({result['excluded']} without a positive left out); "
              f"resampling {unit}; {result['confidence']:.0%} bootstrap intervals; run SD = between-run standard "
              "deviation of the per-run means (of Δ: runs paired by position)",
              f"Δ vs {ref}: paired bootstrap interval, sign-flip p, {result['adjust']} over all "
              f"{sum(len(e['rows']) - 1 for e in result['metrics'].values())} comparisons; group: systems sharing a "
              f"letter are not told apart by the randomized Tukey HSD ({result['permutations']} permutations, "
              f"α = {result['alpha']})"]
    return lines


def text_report(result: dict[str, Any]) -> str:
    lines = preamble(result)
    for metric, entry in result["metrics"].items():
        lines += ["", metric] + _aligned_table(HEADER, board_rows(entry))
        if "series" in entry:
            lines += track_lines(entry)
    return "\n".join(lines)


def track_lines(entry: dict[str, Any]) -> list[str]:
    """The series view of one metric: Δ vs previous per point, the best and what cannot be told from it."""
    rows = []
    for point in entry["series"]:
        step = point.get("delta_prev")
        rows.append([point["system"], _f(point["mean"]), "" if step is None else _f(step["delta"], True),
                     "" if step is None else f"[{_f(step['delta_low'], True)}, {_f(step['delta_high'], True)}]",
                     "" if step is None else _p(step["p_adjusted"])])
    table = [["point", "mean", "Δ vs previous", "interval", "p adj"]] + rows
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    lines = ["  series: " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(table[0],
                                                                                                    widths)))]
    lines += ["          " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
              for r in rows]
    lines.append(f"  best: {entry['best']}; indistinguishable from it: {', '.join(entry['indistinguishable'])}")
    return lines


def markdown(result: dict[str, Any]) -> str:
    """The tables as markdown (for a pull request or a notebook)."""
    lines = [line + "  " for line in preamble(result)]
    for metric, entry in result["metrics"].items():
        lines += ["", f"**{metric}**", "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in board_rows(entry)]
        if "series" in entry:
            lines += ["", f"best: {entry['best']}; indistinguishable from it: {', '.join(entry['indistinguishable'])}"]
    return "\n".join(lines) + "\n"


def check_targets(*paths: str | None) -> None:
    """Every output's folder exists (checked before any statistic is computed, so an error writes nothing)."""
    for path in paths:
        if path and not Path(path).parent.is_dir():
            raise InputError(f"cannot write {path}: folder {str(Path(path).parent)!r} does not exist.")


def write_outputs(outputs: dict[str | None, str | bytes]) -> None:
    """Write every named output (``None`` keys skipped) through recallk.atomic.write_all: temp files, fsync and
    renames, all or nothing, a killed run's temporaries removed first."""
    def writer(data: str | bytes):
        if isinstance(data, bytes):
            return lambda tmp: tmp.write_bytes(data)
        return lambda tmp: tmp.write_text(data, encoding="utf-8", newline="\n")

    check_targets(*outputs)
    write_all([(path, writer(data)) for path, data in outputs.items() if path])


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("systems", nargs="*", help="[NAME=]SPEC[+SPEC...]: a per-query CSV, a folder, a revision or an "
                                              "experiment; several runs of one system joined by +")
    p.add_argument("--experiments", metavar="PATTERN", help="add every DVC experiment whose name matches PATTERN "
                                                            "('*': all experiments of the repository)")
    p.add_argument("--repo", default=".", help="the git/DVC repository of revisions and experiments (default: .)")
    p.add_argument("--by", choices=("query", "label"), default="query", help="resampling and permutation unit")
    p.add_argument("--adjust", choices=tuple(family.ADJUSTMENTS), default="holm",
                   help="adjustment of the vs-reference family: holm (family-wise error) or bh (false discovery rate)")
    p.add_argument("--intersect", action="store_true", help="keep the queries every run shares")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    p.add_argument("--permutations", type=int, default=10_000, help="sign flips and Tukey permutations (10000)")
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--alpha", type=float, default=0.05, help="level of the letters and the indistinguishable set")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metric", action="append", default=[], help="only these metrics (repeatable; default all)")
    p.add_argument("--json", metavar="FILE", help="write the whole result (every pair, adjusted p) as JSON")
    p.add_argument("--md", metavar="FILE", help="write the tables as markdown")
    return p


def specs_of(args: argparse.Namespace) -> list[systems.SystemSpec]:
    """The command line's systems, then every experiment matching --experiments (by name)."""
    specs = [systems.parse_system(arg) for arg in args.systems]
    if args.experiments:
        names = systems.experiment_names(args.repo, args.experiments)
        if not names:
            raise InputError(f"no DVC experiment of {Path(args.repo).resolve()} matches {args.experiments!r}; "
                             "list them with `dvc exp list`.")
        specs += [systems.SystemSpec(name, (name,)) for name in names if name not in {s.name for s in specs}]
    return specs


def gather(args: argparse.Namespace, specs: list[systems.SystemSpec] | None = None) -> systems.Panel:
    """The panel of the command line's systems (and --experiments), restricted to --metric."""
    specs = specs_of(args) if specs is None else specs
    board = systems.panel(systems.load_systems(specs, args.repo), intersect=args.intersect)
    if args.metric:
        unknown = [m for m in args.metric if m not in board.metrics]
        if unknown:
            raise InputError(f"--metric names {unknown[0]!r}, which the systems do not all hold; they hold: "
                             f"{', '.join(board.metrics)}.")
        board.metrics = [m for m in board.metrics if m in args.metric]
    return board


def settings_of(args: argparse.Namespace, baseline: str | None = None) -> leaderboard.BoardSettings:
    return leaderboard.BoardSettings(baseline=baseline, adjust=args.adjust, by=args.by, resamples=args.resamples,
                                     permutations=args.permutations, seed=args.seed, confidence=args.confidence,
                                     alpha=args.alpha)


def json_text(result: dict[str, Any]) -> str:
    """``result`` as strict, indented JSON: a value that is not a finite number is ``null``
    (:func:`recallk.compare.outputs.strict`, as ``recallk compare --json`` writes)."""
    return json.dumps(strict(result), indent=2, allow_nan=False) + "\n"


def run(command: str, argv: Sequence[str] | None = None) -> int:
    """``recallk leaderboard`` (``command`` "leaderboard") or ``recallk track`` ("track"): parse, gather the
    systems, compute, write --json/--md (and track's --png) all or nothing, then print the tables."""
    series = command == "track"
    if series:
        p = parser("recallk track", "An ordered series (checkpoints, epochs): the curve, Δ vs previous and vs best.")
        p.add_argument("--png", metavar="FILE", default="track.png", help="the plot (default track.png)")
    else:
        p = parser("recallk leaderboard", "Rank many systems on every metric, with family-wise statistics.")
        p.add_argument("--baseline", metavar="SYSTEM", help="compare every system with this one (default: the best)")
    args = p.parse_args(argv)
    png = args.png if series else None
    try:
        check_targets(args.json, args.md, png)
        board = gather(args)
        result = (leaderboard.track(board, settings_of(args)) if series else
                  leaderboard.leaderboard(board, settings_of(args, args.baseline)))
        outputs: dict[str | None, str | bytes] = {args.json: json_text(result), args.md: markdown(result)}
        if series:
            from recallk.compare import track_plot  # matplotlib: only for the plot

            outputs[png] = track_plot.png_bytes(result)
        write_outputs(outputs)
    except InputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    print(text_report(result))
    if png:
        print(f"\nwrote {png}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``recallk leaderboard``: see :func:`run`."""
    return run("leaderboard", argv)


def track_main(argv: Sequence[str] | None = None) -> int:
    """``recallk track``: see :func:`run`."""
    return run("track", argv)
