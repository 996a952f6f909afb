"""Speed of ``recallk leaderboard`` and agreement with its peers, in one run.

    python bench/leaderboard_bench.py            # the issue's size: 10 systems x 10,000 queries, 10,000 draws
    python bench/leaderboard_bench.py --quick    # 10 x 1,000, 1,000 draws: proves it runs
    python bench/leaderboard_bench.py --peers    # also ranx and statsmodels (pip install -e ".[peers,ranx]")
    python bench/leaderboard_bench.py --metrics 10   # also a leaderboard of 10 metrics (the score stage's count)

Prints, for one metric: the randomized Tukey HSD alone, the whole leaderboard of that metric (bootstrap
intervals of every system and of every Δ, batched sign flips, Tukey, letters) and the target's ratio (15 s on
2 cores), with the machine's load average beside each figure (a loaded machine gives pessimistic times).
``--peers`` compares the Tukey p-values with ranx's ``compare(stat_test="tukey")`` on the same per-query
values (ranx runs scipy's classical Tukey HSD: they agree where queries are independent across systems and
diverge, as they should, when a per-query effect is shared) and Holm/BH with statsmodels.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recallk.compare import family, leaderboard, systems  # noqa: E402

TARGET_S = 15.0


def panel(values: np.ndarray, metrics: int = 1) -> systems.Panel:
    """``metrics`` metrics, each the values shifted a little (the same per-query structure)."""
    k = values.shape[1]
    names = [f"s{i}" for i in range(k)]
    tables = {f"m{m}": np.clip(values + 0.01 * m, 0, 1) for m in range(metrics)}
    return systems.Panel(names, [[n] for n in names], "single run", "queries", list(tables), tables,
                         {m: [[float(v[:, s].mean())] for s in range(k)] for m, v in tables.items()}, None,
                         values.shape[0], 0)


def load() -> str:
    return "load %.1f" % os.getloadavg()[0]


def speed(n: int, k: int, draws: int, metrics: int) -> None:
    rng = np.random.default_rng(0)
    values = np.clip(rng.normal(0.6, 0.2, (n, 1)) + rng.normal(0, 0.1, (n, k)) + np.linspace(0, 0.02, k), 0, 1)
    start = time.perf_counter()
    family.randomized_tukey_hsd(values, draws, seed=0)
    tukey = time.perf_counter() - start
    print(f"randomized Tukey HSD, {k} systems x {n} queries, {draws} permutations: {tukey:.2f} s ({load()})")
    start = time.perf_counter()
    leaderboard.leaderboard(panel(values), leaderboard.BoardSettings(resamples=draws, permutations=draws))
    whole = time.perf_counter() - start
    print(f"whole leaderboard of one metric (same sizes, {draws} resamples): {whole:.2f} s ({load()}); "
          f"target {TARGET_S:.0f} s on 2 cores: {whole / TARGET_S:.2f}x of it; {os.cpu_count()} cores here")
    if metrics > 1:
        start = time.perf_counter()
        leaderboard.leaderboard(panel(values, metrics), leaderboard.BoardSettings(resamples=draws, permutations=draws))
        print(f"whole leaderboard of {metrics} metrics: {time.perf_counter() - start:.2f} s ({load()}; the Tukey "
              "permutations are shared by the metrics)")


def peers(draws: int) -> None:
    from ranx import Qrels, Run, compare
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(7)
    n, k, relevant = 1000, 5, 50
    qrels = Qrels({f"q{i}": {f"r{j}": 1 for j in range(relevant)} for i in range(n)})
    for case, shared in (("independent queries", 0.0), ("a shared per-query effect", 6.0)):
        hits = np.clip(np.rint(rng.normal(25, 6, (n, k)) + rng.normal(0, shared, (n, 1)) + [0, .6, 1, 1.6, 1.7]),
                       0, relevant).astype(int)
        runs = [Run({f"q{i}": {**{f"r{j}": float(100 - j) for j in range(hits[i, s])}, "x": 1.0} for i in range(n)},
                    name=f"s{s}") for s in range(k)]
        report = compare(qrels, runs, ["recall@100"], stat_test="tukey")
        ours = family.randomized_tukey_hsd(hits / relevant, draws, seed=0)["p"]
        print(f"\nTukey p-values, {case} (recall@100 of {n} queries; ours: {draws} permutations):")
        gaps = []
        for i in range(k):
            for j in range(i + 1, k):
                theirs = report.comparisons[f"s{i}", f"s{j}"]["recall@100"]["p_value"]
                gaps.append(abs(ours[i, j] - theirs))
                print(f"  s{i} vs s{j}: ours {ours[i, j]:.4f}  ranx {theirs:.4f}")
        print(f"  largest gap {max(gaps):.4f}")
    pvalues = rng.random(12) ** 3
    for ours_name, theirs_name in (("holm", "holm"), ("bh", "fdr_bh")):
        gap = np.abs(np.array(family.adjust(pvalues, ours_name)) - multipletests(pvalues, method=theirs_name)[1]).max()
        print(f"{ours_name} vs statsmodels {theirs_name}: largest gap {gap:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--peers", action="store_true")
    parser.add_argument("--metrics", type=int, default=1, help="also time a leaderboard of this many metrics")
    args = parser.parse_args()
    speed(1_000 if args.quick else 10_000, 10, 1_000 if args.quick else 10_000, args.metrics)
    if args.peers:
        peers(2_000 if args.quick else 20_000)


if __name__ == "__main__":
    main()
