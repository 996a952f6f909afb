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
from recallk.compare import family, leaderboard, outputs, paired, sources, systems
from recallk.compare.outputs import strict
from recallk.errors import InputError
from recallk.stats import fixed
from recallk.stats.inference import MAX_ASKED
from recallk.tables_contract import DIRECTIONS


def _f(x: float | None, signed: bool = False) -> str:
    return "" if x is None else fixed(x, signed=signed)


def _p(x: float | None) -> str:
    return "" if x is None else (f"{x:.4f}" if x >= 1e-4 else f"{x:.1e}")


#: The table's columns; the group letters' column and the adjusted p's are named by their procedures
#: (:func:`header`), as the two may come from different families (issue 38).
HEADER = ["rank", "system", "mean", "interval", "run SD", "Tukey group", "Δ vs ref", "interval of Δ", "Δ run SD", "p",
          "p adj"]
#: The adjusted p's column, named by the family it is adjusted in (``vs_reference``).
P_ADJ = {"holm": "p Holm", "bh": "p BH", "tukey": "p Tukey"}


def header(result: dict[str, Any]) -> list[str]:
    """:data:`HEADER` with the adjusted p named by its family: ``p Holm`` or ``p BH`` (leaderboard: the vs-reference
    family, one comparison per system), ``p Tukey`` (track: the letters' family)."""
    return HEADER[:-1] + [P_ADJ[result.get("vs_reference", result["adjust"])]]


def family_notes(entry: dict[str, Any], result: dict[str, Any]) -> list[str]:
    """One line per system whose group letters and adjusted p against the reference say different things (only
    where the two come from different families: leaderboard, not track), naming which procedure says what."""
    if result.get("vs_reference") == "tukey":
        return []
    column, alpha = header(result)[-1], result["alpha"]
    ref_letters = set(next(row["group"] for row in entry["rows"] if row["system"] == entry["reference"]))
    notes = []
    for row in entry["rows"]:
        if "p_adjusted" not in row:
            continue
        shares, apart = bool(set(row["group"]) & ref_letters), row["p_adjusted"] < alpha
        if shares == apart:
            said = (f"shares a Tukey group with {entry['reference']} (not told apart over every pair) but {column} "
                    f"{_p(row['p_adjusted'])} < {alpha} (told apart against {entry['reference']} alone)" if shares else
                    f"has no Tukey group in common with {entry['reference']} (told apart over every pair) but "
                    f"{column} {_p(row['p_adjusted'])} >= {alpha} (not told apart against {entry['reference']} alone)")
            notes.append(f"note: {row['system']} {said}: two families, two questions (docs/leaderboard.md)")
    return notes


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
    groups = (f"Tukey group: systems sharing a letter are not told apart by the randomized Tukey HSD over every pair "
              f"({result['permutations']} permutations, α = {result['alpha']})")
    if result.get("vs_reference") == "tukey":  # track: Δ vs the best in the groups' family
        vs = (f"Δ vs {ref}: in the family of the groups, its interval the Tukey HSD simultaneous one (Δ ± the "
              "critical range) and p Tukey the pair's Tukey p (a point shares a letter with the best exactly when p "
              f"Tukey >= α and that interval holds 0); p: the paired sign-flip p, unadjusted; {groups}")
    else:
        vs = (f"Δ vs {ref}: paired bootstrap interval, sign-flip p, and {P_ADJ[result['adjust']]}: that p adjusted "
              f"by {result['adjust']} over all {sum(len(e['rows']) - 1 for e in result['metrics'].values())} "
              f"comparisons with the reference (one family); {groups} (another family, every pair: a system may "
              f"share the reference's letter and still have {P_ADJ[result['adjust']]} < α, or the reverse; a note "
              "under the table says where)")
    lines += [f"case: {case}", f"{result['queries']} queries ({result['excluded']} without a positive left out); "
              f"resampling {unit}; {result['confidence']:.0%} bootstrap intervals; run SD = between-run standard "
              "deviation of the per-run means (of Δ: runs paired by position)", vs]
    return lines


#: Pairs of systems never told apart that the summary names (the rest are counted).
SUMMARY_PAIRS = 4


def _names(names: Sequence[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def summary(result: dict[str, Any]) -> str:
    """One paragraph: which system is best on how many metrics, whether the best is told apart from every other
    system, and which pairs are not told apart on any metric, all from the groups (randomized Tukey HSD), e.g.
    ``effnet best on all 10 metrics, told apart from every other system on 8 of them; pixels and pixels8 not told
    apart on any metric (groups: randomized Tukey HSD, α = 0.05).``"""
    metrics = result["metrics"]
    n = len(metrics)
    best_of: dict[str, list[str]] = {}
    for metric, entry in metrics.items():
        best_of.setdefault(entry["best"], []).append(metric)
    winners = sorted(best_of.items(), key=lambda item: -len(item[1]))  # stable: first best first among equals
    mates = {}  # per metric: the systems sharing a letter with the best
    for metric, entry in metrics.items():
        letters = {row["system"]: set(row["group"]) for row in entry["rows"]}
        mates[metric] = [row["system"] for row in entry["rows"]
                         if row["system"] != entry["best"] and letters[row["system"]] & letters[entry["best"]]]
    alone = [metric for metric in metrics if not mates[metric]]
    if n == 1:
        (metric, entry), = metrics.items()
        lead = (f"{entry['best']} best on {metric}, " + ("told apart from every other system" if not mates[metric]
                                                         else f"not told apart from {_names(mates[metric])}"))
    else:
        first, *rest = winners
        lead = (f"{first[0]} best on {'both metrics' if n == 2 else f'all {n} metrics'}" if not rest else
                f"{first[0]} best on {len(first[1])} of {n} metrics, "
                + ", ".join(f"{name} on {len(ms)} ({', '.join(ms)})" for name, ms in rest))
        shared = [m for m in metrics if m not in alone]
        if rest:
            lead += f"; the best told apart from every other system on {len(alone)} of them"
        elif not shared:
            lead += ", told apart from every other system on each"
        elif not alone:
            lead += ", on each sharing its group with another system"
        else:
            lead += (f", told apart from every other system on {len(alone)} of them (not on "
                     + (_names(shared) if len(shared) <= SUMMARY_PAIRS else f"the other {len(shared)}") + ")")
    told: dict[frozenset, tuple[tuple[str, str], bool]] = {}  # every pair: as first listed, told apart on some metric
    for entry in metrics.values():
        for pair in entry["pairs"]:
            key = frozenset((pair["a"], pair["b"]))
            named, apart = told.get(key, ((pair["a"], pair["b"]), False))
            told[key] = named, apart or pair["significant"]
    if n == 1:  # the pairs with the best are said above
        told = {key: value for key, value in told.items() if entry["best"] not in key}
    never = [pair for pair, apart in told.values() if not apart]
    where, among = ("", " of the others") if n == 1 else (" on any metric", "")
    if not told:
        tail = ""
    elif not never:
        tail = f"every two{among} systems told apart{'' if n == 1 else ' on at least one metric'}"
    elif len(never) == len(told) and len(told) > 1:
        tail = f"no two{among} systems told apart{where}"
    elif len(never) == 1:
        tail = f"{never[0][0]} and {never[0][1]} not told apart{where}"
    else:
        more = f" and {len(never) - SUMMARY_PAIRS} more" if len(never) > SUMMARY_PAIRS else ""
        tail = (f"{len(never)} pairs not told apart{where}: "
                + ", ".join(f"{a} / {b}" for a, b in never[:SUMMARY_PAIRS]) + more)
    return f"{lead}{'; ' + tail if tail else ''} (groups: randomized Tukey HSD, α = {result['alpha']})."


def text_report(result: dict[str, Any]) -> str:
    """The printed tables, opening with the one-paragraph :func:`summary`."""
    lines = [summary(result), ""] + preamble(result)
    for metric, entry in result["metrics"].items():
        lines += ["", metric] + _aligned_table(header(result), board_rows(entry)) + family_notes(entry, result)
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
    table = [["point", "mean", "Δ vs previous", "adj. interval", "p adj"]] + rows
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    lines = ["  series: " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(table[0],
                                                                                                    widths)))]
    lines += ["          " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
              for r in rows]
    lines.append("  (Δ vs previous: its interval and its p both adjusted over the steps)")
    lines.append(f"  best: {entry['best']}; indistinguishable from it (sharing its group): "
                 f"{', '.join(entry['indistinguishable'])}")
    return lines


def markdown(result: dict[str, Any]) -> str:
    """The tables as markdown (for a pull request or a notebook), opening with the one-paragraph :func:`summary`."""
    lines = [summary(result), ""] + [line + "  " for line in preamble(result)]
    for metric, entry in result["metrics"].items():
        lines += ["", f"**{metric}**", "", "| " + " | ".join(header(result)) + " |", "|" + "---|" * len(HEADER)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in board_rows(entry)]
        notes = family_notes(entry, result)
        lines += ["", *notes] if notes else []
        if "series" in entry:
            lines += ["", f"best: {entry['best']}; indistinguishable from it (sharing its group): "
                          f"{', '.join(entry['indistinguishable'])}"]
    return "\n".join(lines) + "\n"


def check_targets(targets: Sequence[tuple[str, str | None]], specs: Sequence[systems.SystemSpec]) -> None:
    """Before any table is read or statistic computed (so an error writes nothing): every output's folder exists,
    and the outputs are files, none named twice, none an input of ``specs``
    (:func:`recallk.compare.outputs.check_targets`). ``targets``: (option, path or None)."""
    for _, path in targets:
        if path and not Path(path).parent.is_dir():
            raise InputError(f"cannot write {path}: folder {str(Path(path).parent)!r} does not exist.")
    outputs.check_targets(targets, [(spec.name, path) for spec in specs for run in spec.runs
                                    for path in sources.input_files(run)])


def write_outputs(files: Sequence[tuple[str | None, str | bytes]]) -> None:
    """Write every named output (``None`` paths skipped; :func:`check_targets` passed) through
    recallk.atomic.write_all: temp files, fsync and renames, all or nothing, a killed run's temporaries removed
    first."""
    def writer(data: str | bytes):
        if isinstance(data, bytes):
            return lambda tmp: tmp.write_bytes(data)
        return lambda tmp: tmp.write_text(data, encoding="utf-8", newline="\n")

    write_all([(path, writer(data)) for path, data in files if path])


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("systems", nargs="*", help="[NAME=]SPEC[+SPEC...]: a per-query CSV, a folder, a revision or an "
                                              "experiment; several runs of one system joined by +")
    p.add_argument("--experiments", metavar="PATTERN", help="add every DVC experiment whose name matches PATTERN "
                                                            "('*': all experiments of the repository)")
    p.add_argument("--repo", default=".", help="the git/DVC repository of revisions and experiments (default: .)")
    p.add_argument("--by", choices=("query", "label"), help="resampling and permutation unit (default: query; label "
                                                           "with --direction text_to_image: a caption's image)")
    p.add_argument("--direction", choices=DIRECTIONS, help="of text <-> image runs (split.protocol: text_image): "
                                                          "the queries of this direction")
    p.add_argument("--adjust", choices=tuple(family.ADJUSTMENTS), default="holm",
                   help="adjustment of the vs-reference family: holm (family-wise error) or bh (false discovery rate)")
    p.add_argument("--intersect", action="store_true", help="keep the queries every run shares")
    p.add_argument("--resamples", type=int, default=10_000,
                   help=f"bootstrap resamples (default 10000, at most {MAX_ASKED:,})")
    p.add_argument("--permutations", type=int, default=10_000,
                   help=f"sign flips and Tukey permutations (default 10000, at most {MAX_ASKED:,})")
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--alpha", type=float, default=0.05, help="level of the letters and the indistinguishable set")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metric", action="append", default=[], help="only these metrics (repeatable; default all)")
    p.add_argument("--json", metavar="FILE", help="write the whole result (every pair, adjusted p) as JSON")
    p.add_argument("--md", metavar="FILE", help="write the tables as markdown")
    return p


def specs_of(args: argparse.Namespace) -> list[systems.SystemSpec]:
    """The command line's systems, then every experiment matching --experiments (by name). A training evaluator's
    log folder (:func:`recallk.training.layout.run_epochs`) stands for its epochs, one system each, in order."""
    from recallk.training.layout import run_epochs

    specs = []
    for arg in args.systems:
        epochs = run_epochs(arg)
        specs += ([systems.SystemSpec(name, (path,)) for name, path in epochs] if epochs
                  else [systems.parse_system(arg)])
    if args.experiments:
        names = systems.experiment_names(args.repo, args.experiments)
        failed = systems.failed_experiment_names(args.repo, args.experiments)
        if failed:  # `dvc exp run --run-all` exits 0 when a queued experiment fails: say so, once
            print(f"warning: {len(failed)} queued DVC experiment(s) matching {args.experiments!r} failed and are "
                  f"not on the board: {', '.join(failed)} (why: `dvc queue logs {failed[0]}`; all: "
                  "`dvc queue status`)", file=sys.stderr)
        if not names:
            raise InputError(f"no DVC experiment of {Path(args.repo).resolve()} matches {args.experiments!r}"
                             f"{' but the failed ones' if failed else ''}; list them with `dvc exp list`.")
        specs += [systems.SystemSpec(name, (name,)) for name in names if name not in {s.name for s in specs}]
    return specs


def gather(args: argparse.Namespace, specs: list[systems.SystemSpec] | None = None) -> systems.Panel:
    """The panel of the command line's systems (and --experiments), restricted to --metric."""
    specs = specs_of(args) if specs is None else specs
    board = systems.panel(systems.load_systems(specs, args.repo, args.direction), intersect=args.intersect)
    if args.metric:
        unknown = [m for m in args.metric if m not in board.metrics]
        if unknown:
            raise InputError(f"--metric names {unknown[0]!r}, which the systems do not all hold; they hold: "
                             f"{', '.join(board.metrics)}.")
        board.metrics = [m for m in board.metrics if m in args.metric]
    return board


def settings_of(args: argparse.Namespace, baseline: str | None = None) -> leaderboard.BoardSettings:
    return leaderboard.BoardSettings(baseline=baseline, adjust=args.adjust,
                                     by=paired.default_unit(args.by, args.direction), resamples=args.resamples,
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
        settings = settings_of(args, None if series else args.baseline)
        specs = specs_of(args)
        check_targets([("--json", args.json), ("--md", args.md), ("--png", png)], specs)
        board = gather(args, specs)
        result = leaderboard.track(board, settings) if series else leaderboard.leaderboard(board, settings)
        files: list[tuple[str | None, str | bytes]] = [(args.json, json_text(result)), (args.md, markdown(result))]
        if series:
            from recallk.compare import track_plot  # matplotlib: only for the plot

            files.append((png, track_plot.png_bytes(result)))
        write_outputs(files)
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
