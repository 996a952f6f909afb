"""``recallk compare A B``: is B better than A on the same queries, and where did it change?

A and B are each a per-query CSV, a folder of score outputs, a git revision or a DVC
experiment name. Prints a table (Δ = B − A with a paired bootstrap interval, a paired
sign-flip p-value, Holm-adjusted p-values, exact McNemar for recall@K, Cohen's d_z and
win/tie/loss counts, the minimum detectable Δ at 80% power), one verdict line per metric (from
the Holm p and the interval adjusted for the metrics as that p is, both printed in the line), the
queries whose hit flipped, and optionally writes JSON and a markdown table.

Gates (``--fail-if-worse``, repeatable) and exit codes (stable; docs/compare.md):

- ``--fail-if-worse METRIC``: B fails when it is significantly worse on METRIC (Δ < 0 and Holm p
  below ``--alpha``); otherwise it passes (a regression that is merely not significant passes).
- ``--fail-if-worse METRIC:MARGIN`` (non-inferiority): B passes only when the interval's lower end is
  above ``-MARGIN``; it fails when the whole interval is below ``-MARGIN``; otherwise it is inconclusive.
  MARGIN is from 0 to below 1 (every metric lies from 0 to 1: a larger margin makes a gate that cannot fail).

Every gate's outcome is printed with its rule: ``pass: …`` on stdout (so a CI log shows the gate ran), the
others on stderr; all of them in ``--md`` and ``--json``.

Exit 0: every gate passes (or none given); 1: some gate fails; 2: an input error (one ``error:``
line); 3: no gate fails but some is inconclusive (more queries would decide it).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Sequence

from recallk.compare import outputs, paired, sources
from recallk.errors import InputError
from recallk.stats import fixed
from recallk.stats import inference as stats
from recallk.tables_contract import DIRECTIONS

#: Flipped queries listed per K and direction in the text output (all of them go to --json).
SHOWN_FLIPS = 10
#: Exit codes (stable): every gate passes; some gate fails; an input error; no gate fails, some inconclusive.
EXIT_PASS, EXIT_WORSE, EXIT_INPUT, EXIT_INCONCLUSIVE = 0, 1, 2, 3
#: What the resampling unit is called in the outputs.
UNIT_WORDS = {"query": "queries", "label": "labels (clusters of queries)",
              "two-level": "labels, then queries within labels (two-level)"}


def _signed(x: float) -> str:
    return fixed(x, signed=True)


def _p(x: float | None) -> str:
    return "" if x is None else (f"{x:.4f}" if x >= 1e-4 else f"{x:.1e}")


def rows(result: dict[str, Any]) -> list[list[str]]:
    """One row of text cells per metric: the table both outputs print."""
    out = []
    for name, m in result["metrics"].items():
        dz = "undefined" if m["dz"] is None else fixed(m["dz"], 2)
        row = [name, fixed(m["mean_a"]), fixed(m["mean_b"]), _signed(m["delta"]),
               f"[{_signed(m['ci_low'])}, {_signed(m['ci_high'])}]", _p(m["p"]), _p(m["p_holm"]),
               _p(m.get("p_mcnemar")), dz, f"{m['wins']}/{m['ties']}/{m['losses']}",
               "" if m["wins"] == m["losses"] == 0 else fixed(m["mde"])]
        if "queries_needed" in m:
            row.append("" if m["queries_needed"] is None else str(m["queries_needed"]))
        out.append(row)
    return out


HEADER = ["metric", "A", "B", "Δ (B−A)", "CI of Δ", "p", "p Holm", "McNemar p", "d_z", "win/tie/loss", "MDE"]


def header(result: dict[str, Any]) -> list[str]:
    """The table's column names (``queries for Δ=D`` with ``--delta``)."""
    delta = result.get("power", {}).get("delta")
    return HEADER + ([f"queries for Δ={delta:g}"] if delta is not None else [])


def _level(confidence: float) -> str:
    """A confidence level as a percentage: 0.995 -> '99.5%', 0.98333 -> '98.33%'."""
    return f"{100 * confidence:.4g}%"


def verdict(name: str, m: dict[str, Any], alpha: float, family: int = 1) -> str:
    """One line per metric, from the two adjusted numbers it prints: the Holm-adjusted p and the interval at
    the metric's level in Holm's procedure (``ci_holm_*``, adjusted for the ``family`` metrics as the p is).

    B better or worse when Holm p is below ``alpha`` and that interval excludes 0; no detectable difference
    when Holm p is at least ``alpha`` and the interval holds 0; inconclusive when the two disagree (the
    sign-flip test and the bootstrap part ways near the boundary), saying which says what."""
    if m.get("wins") == m.get("losses") == 0 and "wins" in m:
        return f"{name}: the same on every query"
    low, high = m["ci_holm_low"], m["ci_holm_high"]
    interval = f"[{_signed(low)}, {_signed(high)}]"
    which = f"{_level(m['ci_holm_level'])} interval, Holm-adjusted for {family} metric{'s' if family != 1 else ''}"
    significant, excludes = m["p_holm"] < alpha, low > 0 or high < 0
    if significant and excludes:
        word = "better" if low > 0 else "worse"
        return f"B {word} on {name}: {_signed(m['delta'])} {interval} ({which}), Holm p {_p(m['p_holm'])}"
    if not significant and not excludes:
        return (f"{name}: no detectable difference: the {which}, allows {_signed(low)} to {_signed(high)} "
                f"(Holm p {_p(m['p_holm'])}; detectable at 80% power: ±{fixed(m['mde'])})")
    said = (f"Holm p {_p(m['p_holm'])} < {alpha} but the {which}, {interval}, holds 0" if significant else
            f"the {which}, {interval}, excludes 0 but Holm p {_p(m['p_holm'])} >= {alpha}")
    return (f"{name}: inconclusive: {said} (the sign-flip test and the bootstrap disagree this close to the "
            "boundary; more queries would decide)")


def verdicts(result: dict[str, Any]) -> list[str]:
    """The verdict of every metric (:func:`verdict`), each adjusted for all of them."""
    return [verdict(name, m, result["power"]["alpha"], len(result["metrics"])) for name, m in result["metrics"].items()]


def verdict_rule(result: dict[str, Any]) -> str:
    """What the verdicts rest on (said once above them)."""
    m = len(result["metrics"])
    return (f"verdicts: better or worse when Holm p < {result['power']['alpha']} and the interval Holm-adjusted "
            f"for the {m} metric{'s' if m != 1 else ''} (at 1 - alpha/(m - i + 1) for the i-th smallest p) "
            "excludes 0, inconclusive when the two disagree; the table's CI is not adjusted")


def draws_line(result: dict[str, Any]) -> str:
    """How many resamples and sign patterns were drawn, and whether a cap cut them."""
    d = result["draws"]
    parts = []
    for kind, word in (("resamples", "bootstrap resamples"), ("permutations", "sign-flip patterns")):
        cut = (f" (capped from {d[kind + '_asked']:,}: {d['units']:,} {d['unit']} units x draws within "
               f"--max-draws {d['max_draws']:,})" if d[kind] < d[kind + "_asked"] else "")
        parts.append(f"{d[kind]:,} {word}{cut}")
    exact = any(m["p_exact"] for m in result["metrics"].values())
    return "; ".join(parts) + ("; every sign pattern enumerated (exact p)" if exact else "")


def text_report(result: dict[str, Any], origin: Sequence[str]) -> str:
    """The printed report: both sources, what was compared and drawn, a verdict per metric, the table, the flips."""
    columns = header(result)
    table = [columns] + rows(result)
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    unit = UNIT_WORDS[result["by"]]
    if result.get("direction") and result["by"] != "query":  # text <-> image: a query's label is its image
        unit = "images (each with its queries: a caption's label is its image)"
    lines = [f"A: {origin[0]}", f"B: {origin[1]}"]
    for side, facts in zip("AB", result.get("evaluated", ({}, {}))):
        lines += [f"   {side} {key}: {value}" for key, value in facts.items()]
    lines += [f"{result['queries']} queries compared ({result['excluded']} without a positive left out"
              + "".join(f"; {n} only in {side} dropped" for side, n in result["dropped"].items() if n)
              + f"); resampling {unit}; {result['confidence']:.0%} paired bootstrap interval; two-sided paired "
              "sign-flip p; Holm over the metrics below; MDE: the minimum detectable |Δ| at 80% power "
              f"(alpha {result['power']['alpha']})", draws_line(result), verdict_rule(result), ""]
    lines += verdicts(result) + [""]
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
    """A markdown table to paste into a pull request: the gates' outcomes, a verdict per metric, the table."""
    columns = header(result)
    lines = [f"**A**: `{origin[0]}`  ", f"**B**: `{origin[1]}`  ",
             f"{result['queries']} queries, resampling {UNIT_WORDS[result['by']]}, {result['confidence']:.0%} paired "
             "bootstrap interval of Δ = B − A, sign-flip p with Holm adjustment; " + draws_line(result), ""]
    lines += [verdict_rule(result), ""]
    lines += [f"- **{g['outcome']}**: {g['rule']}" for g in result.get("gates", [])]
    lines += [f"- {line}" for line in verdicts(result)]
    lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(result)]
    return "\n".join(lines) + "\n"


#: Every metric lies from 0 to 1, so Δ = B − A from -1 to +1: a non-inferiority margin must stay below this range,
#: or its gate could never fail (the interval can never lie below -1).
METRIC_RANGE = 1.0


def parse_gate(spec: str) -> tuple[str, float | None]:
    """``METRIC`` or ``METRIC:MARGIN`` (0 <= MARGIN < :data:`METRIC_RANGE`) -> (metric, margin or None)."""
    metric, sep, margin = spec.rpartition(":")
    if not sep:
        return spec, None
    try:
        value = float(margin)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and 0 <= value < METRIC_RANGE) or not metric:
        raise InputError(f"`--fail-if-worse` takes METRIC or METRIC:MARGIN with a margin >= 0 and below "
                         f"{METRIC_RANGE:g} (e.g. map@r:0.005): every metric lies from 0 to {METRIC_RANGE:g}, so B is "
                         f"never worse by {METRIC_RANGE:g} or more and a larger margin makes a gate that cannot fail. "
                         f"Got {spec!r} instead.")
    return metric, value


def gate(result: dict[str, Any], spec: str, alpha: float) -> dict[str, Any]:
    """The outcome of one ``--fail-if-worse`` gate: ``pass``, ``worse`` or ``inconclusive``, and the rule.

    ``METRIC``: worse when Δ < 0 and its Holm-adjusted p is below ``alpha``, else pass. ``METRIC:MARGIN``:
    pass when the interval's lower end is above ``-MARGIN``, worse when its upper end is below ``-MARGIN``,
    else inconclusive.
    """
    metric, margin = parse_gate(spec)
    if metric not in result["metrics"]:
        raise InputError(f"--fail-if-worse names {metric!r}, which both tables do not hold; compared metrics: "
                         f"{', '.join(result['metrics'])}.")
    m = result["metrics"][metric]
    interval = f"[{_signed(m['ci_low'])}, {_signed(m['ci_high'])}]"
    if margin is None:
        outcome = "worse" if m["delta"] < 0 and m["p_holm"] < alpha else "pass"
        rule = (f"{'B is significantly worse than A' if outcome == 'worse' else 'B is not significantly worse'} on "
                f"{metric} (no margin: fails when Δ < 0 and Holm p < {alpha}): Δ {_signed(m['delta'])}, Holm p "
                f"{_p(m['p_holm'])} {'<' if m['p_holm'] < alpha else '>='} {alpha}")
    else:
        bound = _signed(-margin)
        outcome = ("pass" if m["ci_low"] > -margin else "worse" if m["ci_high"] < -margin else "inconclusive")
        said = {"pass": f"B is not worse by more than the margin {margin:g} on {metric}: the interval's lower end "
                        f"{_signed(m['ci_low'])} is above the bound {bound}",
                "worse": f"B is worse by more than the margin {margin:g} on {metric}: the interval's upper end "
                         f"{_signed(m['ci_high'])} is below the bound {bound}",
                "inconclusive": f"cannot tell whether B is worse by more than the margin {margin:g} on {metric}: "
                                f"the interval holds the bound {bound}"}[outcome]
        rule = f"{said} (the {_level(result.get('confidence', 0.95))} interval of Δ, {interval})"
    return {"gate": spec, "metric": metric, "margin": margin, "outcome": outcome, "rule": rule}


def exit_code(gates: Sequence[dict[str, Any]]) -> int:
    """1 when a gate is worse, else 3 when one is inconclusive, else 0."""
    outcomes = {g["outcome"] for g in gates}
    return EXIT_WORSE if "worse" in outcomes else EXIT_INCONCLUSIVE if "inconclusive" in outcomes else EXIT_PASS


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="recallk compare", description=__doc__.splitlines()[0])
    p.add_argument("a", help="baseline: a per-query CSV, a folder of score outputs, a git revision or an experiment")
    p.add_argument("b", help="candidate, the same kinds")
    p.add_argument("--repo", default=".", help="the git/DVC repository of revisions and experiments (default: .)")
    p.add_argument("--by", choices=paired.UNITS,
                   help="resampling unit: queries (the default), labels (their queries together; use it for "
                        "leave-one-out; the default with --direction text_to_image, where a caption's label is its "
                        "image), or two-level (the bootstrap draws labels, then queries within them; the sign flips "
                        "flip labels)")
    p.add_argument("--direction", choices=DIRECTIONS, help="of text <-> image runs (split.protocol: text_image): "
                                                          "compare the queries of this direction")
    p.add_argument("--intersect", action="store_true", help="compare the common queries when the query sets differ")
    p.add_argument("--resamples", type=int, default=10_000,
                   help=f"bootstrap resamples (default 10000, at most {stats.MAX_ASKED:,})")
    p.add_argument("--permutations", type=int, default=10_000,
                   help=f"random sign-flip patterns (default 10000, at most {stats.MAX_ASKED:,})")
    p.add_argument("--max-draws", type=int, default=stats.MAX_DRAWS,
                   help=f"cap: units x resamples (and units x patterns) at most this (default {stats.MAX_DRAWS:,})")
    p.add_argument("--delta", type=float, help="a Δ to detect: print about how many queries detect it at 80%% power")
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--alpha", type=float, default=0.05, help="significance level of --fail-if-worse")
    p.add_argument("--json", metavar="FILE", help="write the whole result (every flipped query, per label) as JSON")
    p.add_argument("--md", metavar="FILE", help="write the table as markdown (for a pull request)")
    p.add_argument("--fail-if-worse", metavar="METRIC[:MARGIN]", action="append", default=[],
                   help="METRIC: exit 1 when B is significantly worse on it after Holm; METRIC:MARGIN (0 <= MARGIN "
                        "< 1): pass only when the interval's lower end is above -MARGIN, exit 1 when its upper end is "
                        "below, else 3 (repeatable; exit 0 pass, 1 worse, 2 input error, 3 inconclusive)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.max_draws < 1:
            raise InputError(f"`--max-draws` must be a positive integer. Got {args.max_draws!r} instead.")
        if args.delta is not None and not (math.isfinite(args.delta) and args.delta != 0):
            raise InputError(f"`--delta` must be a nonzero finite number. Got {args.delta!r} instead.")
        for spec in args.fail_if_worse:
            parse_gate(spec)
        for name, value in (("--confidence", args.confidence), ("--alpha", args.alpha)):
            if not 0 < value < 1:
                raise InputError(f"`{name}` must be strictly between 0 and 1. Got {value!r} instead.")
        settings = paired.CompareSettings(by=paired.default_unit(args.by, args.direction), intersect=args.intersect,
                                          resamples=args.resamples,
                                          permutations=args.permutations, confidence=args.confidence, seed=args.seed,
                                          max_draws=args.max_draws, alpha=args.alpha, delta=args.delta)
        outputs.check_targets([("--json", args.json), ("--md", args.md)],
                              [(side, path) for side, spec in (("A", args.a), ("B", args.b))
                               for path in sources.input_files(spec)])
        (table_a, origin_a), (table_b, origin_b) = (sources.load(args.a, args.repo, args.direction),
                                                      sources.load(args.b, args.repo, args.direction))
        result = paired.compare(table_a, table_b, settings)
        if args.direction:
            result["direction"] = args.direction  # of text <-> image runs
        result["gates"] = [gate(result, spec, args.alpha) for spec in args.fail_if_worse]
        result["sources"] = [origin_a, origin_b]
        result["evaluated"] = [sources.evaluated(args.a, args.repo), sources.evaluated(args.b, args.repo)]
        outputs.write(args.json, args.md, result, markdown(result, (origin_a, origin_b)))  # atomic, before the text
    except InputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_INPUT
    print(text_report(result, (origin_a, origin_b)))
    for g in result["gates"]:  # a passing gate says so too: a CI log shows that every gate ran
        if g["outcome"] == "pass":
            print(f"pass: {g['rule']}")
        else:
            sys.stderr.write(f"{g['outcome']}: {g['rule']}\n")
    return exit_code(result["gates"])
