"""``recallk compare A B``: is B better than A on the same queries, and where did it change?

A and B are each a per-query CSV, a folder of score outputs, a git revision or a DVC
experiment name. Prints a table (Δ = B − A with a paired bootstrap interval, a paired
sign-flip p-value, Holm-adjusted p-values, exact McNemar for recall@K, Cohen's d_z and
win/tie/loss counts), the queries whose hit flipped, and optionally writes JSON and a
markdown table. ``--fail-if-worse METRIC`` exits 1 when B is significantly worse on it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from recallk.compare import outputs, paired, sources
from recallk.errors import InputError

#: Flipped queries listed per K and direction in the text output (all of them go to --json).
SHOWN_FLIPS = 10


def _signed(x: float) -> str:
    return f"{x:+.4f}"


def _p(x: float | None) -> str:
    return "" if x is None else (f"{x:.4f}" if x >= 1e-4 else f"{x:.1e}")


def rows(result: dict[str, Any]) -> list[list[str]]:
    """One row of text cells per metric: the table both outputs print."""
    out = []
    for name, m in result["metrics"].items():
        dz = "" if m["dz"] is None else f"{m['dz']:.2f}"
        out.append([name, f"{m['mean_a']:.4f}", f"{m['mean_b']:.4f}", _signed(m["delta"]),
                    f"[{_signed(m['ci_low'])}, {_signed(m['ci_high'])}]", _p(m["p"]), _p(m["p_holm"]),
                    _p(m.get("p_mcnemar")), dz, f"{m['wins']}/{m['ties']}/{m['losses']}"])
    return out


HEADER = ["metric", "A", "B", "Δ (B−A)", "CI of Δ", "p", "p Holm", "McNemar p", "d_z", "win/tie/loss"]


def text_report(result: dict[str, Any], origin: Sequence[str]) -> str:
    table = [HEADER] + rows(result)
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    unit = "labels (clusters of queries)" if result["by"] == "label" else "queries"
    lines = [f"A: {origin[0]}", f"B: {origin[1]}"]
    for side, facts in zip("AB", result.get("evaluated", ({}, {}))):
        lines += [f"   {side} {key}: {value}" for key, value in facts.items()]
    lines += [f"{result['queries']} queries compared ({result['excluded']} without a positive left out"
              + "".join(f"; {n} only in {side} dropped" for side, n in result["dropped"].items() if n)
              + f"); resampling {unit}; {result['confidence']:.0%} paired bootstrap interval; two-sided paired "
              "sign-flip p; Holm over the metrics below", ""]
    lines += ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths)))
              for r in table]
    for name, flips in result["flips"].items():
        lost, gained = flips["lost"], flips["gained"]
        lines += ["", f"{name}: {len(gained)} queries miss -> hit, {len(lost)} hit -> miss"]
        for kind, items in (("miss -> hit", gained), ("hit -> miss", lost)):
            if items:
                shown = ", ".join(f"{q['image_id']} ({q['label']})" for q in items[:SHOWN_FLIPS])
                more = f", ... {len(items) - SHOWN_FLIPS} more" if len(items) > SHOWN_FLIPS else ""
                lines.append(f"  {kind}: {shown}{more}")
    return "\n".join(lines)


def markdown(result: dict[str, Any], origin: Sequence[str]) -> str:
    """A markdown table to paste into a pull request."""
    lines = [f"**A**: `{origin[0]}`  ", f"**B**: `{origin[1]}`  ",
             f"{result['queries']} queries, resampling {result['by']}s, {result['confidence']:.0%} paired bootstrap "
             "interval of Δ = B − A, sign-flip p with Holm adjustment", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(result)]
    return "\n".join(lines) + "\n"


def worse(result: dict[str, Any], metric: str, alpha: float) -> bool:
    """B is significantly worse than A on ``metric``: Δ < 0 and its Holm-adjusted p below ``alpha``."""
    if metric not in result["metrics"]:
        raise InputError(f"--fail-if-worse names {metric!r}, which both tables do not hold; compared metrics: "
                         f"{', '.join(result['metrics'])}.")
    m = result["metrics"][metric]
    return m["delta"] < 0 and m["p_holm"] < alpha


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="recallk compare", description=__doc__.splitlines()[0])
    p.add_argument("a", help="baseline: a per-query CSV, a folder of score outputs, a git revision or an experiment")
    p.add_argument("b", help="candidate, the same kinds")
    p.add_argument("--repo", default=".", help="the git/DVC repository of revisions and experiments (default: .)")
    p.add_argument("--by", choices=("query", "label"), default="query",
                   help="resampling unit: queries, or labels (their queries together; use it for leave-one-out)")
    p.add_argument("--intersect", action="store_true", help="compare the common queries when the query sets differ")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)")
    p.add_argument("--permutations", type=int, default=10_000, help="random sign-flip patterns (default 10000)")
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of --fail-if-worse")
    p.add_argument("--json", metavar="FILE", help="write the whole result (every flipped query, per label) as JSON")
    p.add_argument("--md", metavar="FILE", help="write the table as markdown (for a pull request)")
    p.add_argument("--fail-if-worse", metavar="METRIC", action="append", default=[],
                   help="exit 1 when B is significantly worse than A on METRIC after Holm (repeatable)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        for name, value in (("--resamples", args.resamples), ("--permutations", args.permutations)):
            if value < 1:
                raise InputError(f"`{name}` must be a positive integer. Got {value!r} instead.")
        for name, value in (("--confidence", args.confidence), ("--alpha", args.alpha)):
            if not 0 < value < 1:
                raise InputError(f"`{name}` must be strictly between 0 and 1. Got {value!r} instead.")
        (table_a, origin_a), (table_b, origin_b) = sources.load(args.a, args.repo), sources.load(args.b, args.repo)
        settings = paired.CompareSettings(by=args.by, intersect=args.intersect, resamples=args.resamples,
                                          permutations=args.permutations, confidence=args.confidence, seed=args.seed)
        result = paired.compare(table_a, table_b, settings)
        failed = [m for m in args.fail_if_worse if worse(result, m, args.alpha)]
        result["sources"] = [origin_a, origin_b]
        result["evaluated"] = [sources.evaluated(args.a, args.repo), sources.evaluated(args.b, args.repo)]
        outputs.write(args.json, args.md, result, markdown(result, (origin_a, origin_b)))  # atomic, before the text
    except InputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    print(text_report(result, (origin_a, origin_b)))
    for metric in failed:
        m = result["metrics"][metric]
        sys.stderr.write(f"B is significantly worse than A on {metric}: Δ {m['delta']:+.4f}, Holm p {_p(m['p_holm'])} "
                         f"< {args.alpha}\n")
    return 1 if failed else 0
