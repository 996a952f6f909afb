"""The re-ID rules' cost at Market-1501's size: 3,368 queries x 19,732 gallery items (3,819 junk), d = 512,
random unit vectors, the engine with ``exclude_same_all: [label, camera]`` and ``junk`` against the same
problem with no exclusion (and against the gallery with the junk dropped, the usual loaders' way).
Prints the times and the ratios in one run: ``python -m bench.reid_rules_bench [--scale 0.25]`` from the repo
root."""

from __future__ import annotations

import argparse
import time

import numpy as np

from recallk.score.exclusion import junk_pair
from recallk.score.metrics import retrieval_summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of Market-1501's sizes")
    ap.add_argument("--dim", type=int, default=512)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n, m = int(3368 * args.scale), int(19732 * args.scale)
    q = rng.normal(size=(n, args.dim)).astype(np.float32)
    g = rng.normal(size=(m, args.dim)).astype(np.float32)
    q_pid, g_pid = rng.integers(1, 751, size=n), rng.integers(-1, 751, size=m)
    g_pid[rng.random(m) < 0.19] = -1
    q_cam, g_cam = rng.integers(1, 7, size=n), rng.integers(1, 7, size=m)
    metrics = ["recall", "map"]
    runs = {
        "plain": lambda: retrieval_summary(q, g, q_pid, g_pid, ks=[1, 5, 10], metrics=metrics),
        "junk dropped": lambda: retrieval_summary(q, g[g_pid != -1], q_pid, g_pid[g_pid != -1], ks=[1, 5, 10],
                                                  metrics=metrics),
        "re-ID rules": lambda: retrieval_summary(
            q, g, q_pid, g_pid, ks=[1, 5, 10], metrics=metrics,
            exclude=[(np.c_[q_pid, q_cam], np.c_[g_pid, g_cam]), junk_pair(n, g_pid == -1)]),
    }
    times = {}
    for name, fn in runs.items():
        t0 = time.perf_counter()
        fn()
        times[name] = time.perf_counter() - t0
    for name, t in times.items():
        print(f"{name:>13}: {t:7.2f} s  ({t / times['plain']:.2f}x plain)")


if __name__ == "__main__":
    main()
