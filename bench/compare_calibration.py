"""Calibration and speed of ``recallk compare``: Type I error, interval coverage, power, MDE, time.

Simulated comparisons of known truth (:mod:`calibration`: per-query correlation of
A and B, label clusters, and alternatives of known size), analysed as ``compare`` does:

* Type I error of the sign-flip test at alpha 0.05, by query, by label and two-level (whose test flips
  labels), over ``--nulls`` null comparisons, with independent differences and with label-clustered
  differences (where the query-level analysis is expected to fail: it is printed, not checked);
  target [0.04, 0.06] wherever the analysis is valid;
* coverage of the 95% bootstrap interval of Δ (target [0.94, 0.96]), by query, by label and two-level
  (labels, then queries within labels, from variance-matched values: ``stats.two_level_values``);
* the power curve: simulated power of the sign-flip test against the predicted power from each
  comparison's bootstrap standard error, and the simulated power at the predicted minimum detectable
  Δ (80%): each within 5 points;
* the family-wise error of the leaderboard's randomized Tukey HSD, when ``recallk.compare.family`` is
  in the tree (else a line says the hook is empty);
* speed: ``recallk compare``'s library call on 2 systems x ``--speed-queries`` queries with the
  defaults (10,000 resamples and patterns asked, capped by ``--max-draws``), wall and CPU seconds.

Run from the project root (the committed run: docs/runs/compare_calibration.txt):

    python bench/compare_calibration.py [--nulls 4000] [--power-reps 1000] [--speed-queries 200000]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import calibration  # noqa: E402  (bench/calibration.py, beside this script)
from recallk.compare import paired  # noqa: E402

TYPE1 = (0.04, 0.06)
COVERAGE = (0.94, 0.96)
POWER_POINTS = 0.05


def check(ok: bool) -> str:
    return "ok" if ok else "OUT OF RANGE"


def speed_tables(queries: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two per-query tables as the score stage writes them (every metric column, 20 queries per label)."""
    rng = np.random.default_rng(seed)

    def one(shift: float) -> pd.DataFrame:
        cols: dict[str, object] = {"image_id": [f"q{i:07d}" for i in range(queries)],
                                   "label": [f"l{i // 20}" for i in range(queries)],
                                   "num_positives": "19", "num_retrievable": "999"}
        for k in (1, 5, 10):
            cols[f"hit@{k}"] = (rng.random(queries) < 0.6 + shift).astype(float)
            cols[f"precision@{k}"] = rng.integers(0, k + 1, queries) / k
        for column in ("r_precision", "ap@r", "ap", "rr"):
            cols[column] = np.clip(rng.random(queries) + shift, 0, 1)
        return pd.DataFrame(cols)

    return one(0.0), one(0.005)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nulls", type=int, default=4000, help="null comparisons per scenario (default 4000)")
    p.add_argument("--power-reps", type=int, default=1000, help="comparisons per point of the power curve")
    p.add_argument("--tukey-nulls", type=int, default=2000, help="null comparisons of the Tukey HSD")
    p.add_argument("--speed-queries", type=int, default=200_000, help="queries of the speed run (0: skip)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    design = calibration.Design()
    print(f"compare_calibration: python {platform.python_version()}, numpy {np.__version__}; {design}")
    failures = 0

    start = time.perf_counter()
    rates = calibration.null_rates(args.nulls, design, args.seed)
    print(f"\nnull comparisons: {args.nulls} per scenario, {design.labels} labels x {design.per_label} queries "
          f"({time.perf_counter() - start:.1f} s)")
    print(f"{'scenario/unit':<24}{'Type I':>8}{'':>14}{'coverage':>10}")
    for key, r in rates.items():
        if not r["valid"]:
            print(f"{key:<24}{r['type1']:>8.4f}{'(invalid here)':>14}{r['coverage']:>10.4f}  (not checked: "
                  "label-clustered differences, the query-level analysis is optimistic)")
            continue
        ok_t = TYPE1[0] <= r["type1"] <= TYPE1[1]
        ok_c = COVERAGE[0] <= r["coverage"] <= COVERAGE[1]
        failures += (not ok_t) + (not ok_c)
        print(f"{key:<24}{r['type1']:>8.4f}{check(ok_t):>14}{r['coverage']:>10.4f}  {check(ok_c)}")

    for by in ("query", "label"):
        start = time.perf_counter()
        rows = calibration.power_curve(args.power_reps, design, by=by, seed=args.seed + 1)
        print(f"\npower of the sign-flip test by {by} ({args.power_reps} comparisons a point, "
              f"{time.perf_counter() - start:.1f} s)\n{'true Δ':>10}{'simulated':>11}{'predicted':>11}")
        for row in rows:
            ok = abs(row["simulated"] - row["predicted"]) <= POWER_POINTS
            mde_ok = not row["at_mde"] or abs(row["simulated"] - 0.8) <= POWER_POINTS
            failures += (not ok) + (not mde_ok)
            print(f"{row['delta']:>10.4f}{row['simulated']:>11.3f}{row['predicted']:>11.3f}  {check(ok)}"
                  + (f"  <- the predicted MDE (80%): simulated {row['simulated']:.3f} {check(mde_ok)}"
                     if row["at_mde"] else ""))

    fwer = calibration.tukey_family_error(args.tukey_nulls)
    if fwer is None:
        print("\nTukey HSD family-wise error: hook empty (recallk.compare.family is not in this tree)")
    else:
        ok = TYPE1[0] <= fwer <= TYPE1[1]
        failures += not ok
        print(f"\nTukey HSD family-wise error, 4 systems, {args.tukey_nulls} nulls: {fwer:.4f} {check(ok)}")

    if args.speed_queries:
        a, b = speed_tables(args.speed_queries)
        wall, cpu = time.perf_counter(), time.process_time()
        result = paired.compare(a, b)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        d = result["draws"]
        print(f"\nspeed: 2 systems x {args.speed_queries:,} queries, {len(result['metrics'])} metrics, defaults "
              f"({d['resamples']:,} of {d['resamples_asked']:,} resamples, {d['permutations']:,} of "
              f"{d['permutations_asked']:,} patterns, --max-draws {d['max_draws']:,}): {wall:.1f} s wall, "
              f"{cpu:.1f} s CPU (target <= 30 s on 2 idle cores)")
    print(f"\n{failures} check(s) out of range")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
