"""Score-stage benchmark: exact recall@K of the engine against FAISS, a full N x M matrix and the compute floor.

On one seeded data set (random normal float32 vectors, labels from 1,000
classes, every class present so every query has positives) it times, each in a
fresh subprocess so peak memory is per method:

* ``engine``: :func:`recallk.score.metrics.retrieval_summary` with ``max_memory_mb=512``, recall@K only
  (the first-positive pass; a query stops counting once max(K) items surely beat its best
  positive, which on these random vectors, where nearly every query misses, is early);
* ``engine ranks``: the same call with recall and MRR, so every query's first-positive rank is
  exact (what the score stage computes for ``per_query.csv``): no early stop, the full product;
* ``engine top``: the same call with recall, precision@K, r_precision and map@r (the top-L pass: each
  query's first max(R, max K) ranks, exact);
* ``engine suite``: the same call with every metric (recall, precision@K, r_precision,
  map@r, map, mrr: the complete exact ranking of every positive);
* ``faiss``: ``faiss.IndexFlatIP`` on L2-normalised float32 vectors, ``search``
  with k = max(ks) (+1 for leave-one-out, self dropped), then the same recall
  (hit if any of the top K shares the label; queries without a positive excluded);
* ``pml``: pytorch-metric-learning's ``AccuracyCalculator(k="max_bin_count")`` (precision@1, R-precision,
  MAP@R, checked against the suite; ``bench/pml_anchor.py``), skipped when not importable; ``pml full``:
  ``AccuracyCalculator(k=None)`` with full mAP (D only: it holds every query x gallery neighbour);
* ``full matrix``: a full N x M similarity-matrix implementation of recall@K
  (argpartition + argsort, ``bench/full_matrix.py``), run only when its estimated memory fits;
* ``floor``: the bare float32 product ``q_block @ g.T`` over query blocks into a
  reused buffer, nothing else: the compute floor;
* ``floor float64``: the same product in float64, the floor of the suite (an exact rank
  for every positive needs exact products; the fast path needs them only near the first
  positive). For leave-one-out the suite computes half of these products.

Scenario S: a training loop's call, 64 x 64 x 256-d, 1,000 calls per method (``bench/small_batch.py``):
``recall_at_k`` and ``retrieval_metrics`` against plain numpy (normalise, matmul, argsort); target <= 1.5x (issue 40;
issue 28's was 2x), a kept ``Scorer`` beside it.
Scenario A: 10,000 queries x 50,000 gallery x 512-d (disjoint), recall@{1,5,10}.
Scenario B: leave-one-out, 20,000 x 512-d (queries == gallery, self excluded by id).
Scenario C: A's sizes, clustered (class centre + noise, recall@10 about 0.66): random vectors make nearly
every query miss, which lets recall-only stop early; here most hit. ``engine top`` (recall@K, precision@K,
r_precision, map@r: the top-L pass) against FAISS and ``pml`` (k = "max_bin_count"), targets <= 0.8x its
time and <= 0.5x its memory.
Scenario D: 5,000 x 20,000 x 512-d clustered: ``engine suite`` (every metric, full map: the complete
ranking) against ``pml full`` (AccuracyCalculator(k=None), the whole gallery as neighbours, with full mAP),
targets <= 0.15x its time and <= 0.05x its memory, and ``engine top`` against ``pml``.
Targets (the issue's): A engine <= 1.0x FAISS and <= 1.15x floor; B engine
<= 0.65x FAISS; engine extra memory <= 512 MB; suite <= 1.3x recall-only. Peak extra memory is
``ru_maxrss`` at the end minus the RSS after imports and data generation. The FAISS child starts with
``OPENBLAS_CORETYPE`` set to numpy's OpenBLAS kernel (faiss-cpu's older OpenBLAS may fall back to a generic
one), and every child reports the BLAS library and kernel it ran (``bench/blas_report.py``).

``--table``: the performance table (docs/internals/benchmarks.md), one command: recall@K (the engine's recall-only
call against FAISS) at 10,000 x 50,000, leave-one-out 20,000 and 6,000, and 2,000 x 10,000 (512-d), each on
clustered data and on random data (:data:`score_methods.TABLE_SIZES`), every contender in its own child
``--repeat`` times (best kept), and the training-loop call (scenario S's alternated pair); it prints the BLAS each
contender ran, the load average before and after (the machine state), and the table's rows in markdown.

Run from the project root (``--quick``: A, B and C 20x smaller, a smoke run):

    python bench/score_bench.py [--quick] [--seed 0] [--repeat 1] [--scenarios S,A,B,C,D]
    python bench/score_bench.py --table [--repeat 3]
    python bench/score_bench.py --collapsed [--repeat 3]

``--collapsed``: every pass (recall only, the top-L pass, every metric) and FAISS on collapsed embeddings (one
direction plus 1e-6 noise per row: every cosine within float32's error, as after a fine-tune collapses) beside
clustered data, at 2,000 x 10,000 and leave-one-out 6,000: what ties cost the exact engine (FAISS does not care).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import pml_anchor  # noqa: E402
import small_batch  # noqa: E402
from blas_report import blas_libraries, blas_lines, blas_summary, child_env, numpy_kernel, ran_blas  # noqa: E402
from full_matrix import full_matrix_estimate_bytes  # noqa: E402
from score_methods import (  # noqa: E402
    COLLAPSED_KINDS,
    COLLAPSED_SIZES,
    DIM,
    KS,
    MAX_MEMORY_MB,
    RUNS,
    TABLE_KINDS,
    TABLE_SIZES,
    make_data,
    run_floor,
    sizes,
    table_label,
    table_scenario,
)

FULL_LIMIT_BYTES = 16 * 2**30          # run the full matrix only below this estimate ...
FULL_AVAILABLE_FRACTION = 0.8          # ... and below this share of MemAvailable
TARGETS = {"A": {"faiss": 1.0, "floor": 1.15}, "B": {"faiss": 0.65}, "C": {}}
SUITE_TARGET = 1.3
METHODS = ("engine", "engine ranks", "engine top", "engine suite", "faiss", "pml", "pml full", "full matrix", "floor",
           "floor float64")
_AB = tuple(m for m in METHODS if m != "pml full")
SCENARIO_METHODS = {"A": _AB, "B": _AB, "C": ("engine", "engine ranks", "engine top", "faiss", "pml"),
                    "D": ("engine top", "engine suite", "pml", "pml full")}
SCENARIOS = ("S", "A", "B", "C", "D")
#: The issue's targets against pytorch-metric-learning, (time, memory) ratios: the top metrics (recall@K,
#: precision@K, r_precision, map@r) against AccuracyCalculator(k="max_bin_count"), the full suite (with map)
#: against AccuracyCalculator(k=None).
PML_TARGETS = {"engine top": (0.8, 0.5), "engine suite": (0.15, 0.05)}


# --------------------------------------------------------------------------- child process

def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # KiB on Linux


def child(method: str, scenario: str, quick: bool, seed: int, repeat: int) -> None:
    numpy_paths = {p["filepath"] for p in blas_libraries()}  # numpy's BLAS: the only one loaded so far
    import faiss  # noqa: F401  (imported before the baseline in every child, so the baseline is comparable)

    import recallk.score.metrics  # noqa: F401
    if method.startswith("pml") and pml_anchor.available():  # torch and pml imported outside the timing
        import pytorch_metric_learning.utils.accuracy_calculator  # noqa: F401
    blas = ran_blas(method, numpy_paths)
    if scenario == "S":
        print(json.dumps(dict(small_batch.run(method, seed, KS), blas=blas)))
        return
    d = make_data(scenario, quick, seed)
    base, max_before = _rss_bytes(), _maxrss_bytes()
    times = []
    for _ in range(repeat):
        if method.startswith("floor"):
            info, secs = run_floor(d, np.float64 if method == "floor float64" else np.float32)
        else:
            fn = RUNS[method]
            t0 = time.perf_counter()
            info = fn(d)
            secs = time.perf_counter() - t0
        times.append(secs)
    secs = min(times)
    peak = _maxrss_bytes()
    print(json.dumps({"seconds": secs, "extra_bytes": peak - base, "hidden": peak <= max_before,
                      "baseline_bytes": base, "info": info, "blas": blas}))


# --------------------------------------------------------------------------- parent

#: numpy's OpenBLAS kernel, the FAISS children's OPENBLAS_CORETYPE (:func:`blas_report.child_env`); set by main.
KERNEL: str | None = None


def run_child(method: str, scenario: str, quick: bool, seed: int, repeat: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--method", method, "--scenario", scenario,
           "--seed", str(seed), "--repeat", str(repeat)] + (["--quick"] if quick else [])
    env = child_env(method, KERNEL, small_batch.ENV if scenario == "S" else {})
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return {"error": f"failed (rc={proc.returncode}) {tail[0][:200]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _mem_available() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _fmt_recall(info: dict) -> str:
    return " ".join(f"{info[f'recall@{k}']:.4f}" for k in KS)


def scenario_report(scenario: str, quick: bool, seed: int, repeat: int) -> None:
    s = sizes(quick)[scenario]
    if scenario in ("A", "C", "D"):
        nq, ng, loo = s["n_query"], s["n_gallery"], False
        kind = "clustered (most queries hit)" if scenario in ("C", "D") else "disjoint"
        print(f"\nScenario {scenario}: {nq:,} queries x {ng:,} gallery x {DIM}-d, {kind}, {s['classes']:,} classes, "
              f"ks={KS}")
    else:
        nq = ng = s["n"]
        loo = True
        print(f"\nScenario B: leave-one-out {nq:,} x {DIM}-d (queries == gallery, self excluded by id), "
              f"{s['classes']:,} classes, ks={KS}")
    print(f"  {'method':14s} {'wall s':>8s} {'peak extra MB':>14s}   recall@{','.join(map(str, KS))}")
    res = {}
    for m in SCENARIO_METHODS[scenario]:
        if m.startswith("pml") and not pml_anchor.available():
            print(f"  {m:14s} {pml_anchor.SKIP_NOTE}")
            continue
        if m == "full matrix":
            need = full_matrix_estimate_bytes(nq, ng, loo)
            limit = min(FULL_LIMIT_BYTES, FULL_AVAILABLE_FRACTION * _mem_available())
            if need >= limit:
                print(f"  {m:14s} skipped (needs {need / 2**30:.1f} GB, limit {limit / 2**30:.1f} GB)")
                continue
        r = run_child(m, scenario, quick, seed, repeat)
        res[m] = r
        if "error" in r:
            print(f"  {m:14s} {r['error']}")
            continue
        mb = r["extra_bytes"] / 2**20
        mem = f"{'<=' if r['hidden'] else ''}{mb:.0f}"
        rec = f"(blocks of {r['info']['block_rows']} queries)" if m.startswith("floor") else \
            pml_anchor.fmt(r["info"]) if m.startswith("pml") else _fmt_recall(r["info"])
        note = f"   est. {full_matrix_estimate_bytes(nq, ng, loo) / 2**30:.2f} GB" if m == "full matrix" else ""
        print(f"  {m:14s} {r['seconds']:8.2f} {mem:>14s}   {rec}{note}")
    for line in blas_lines(res):
        print(line)
    for name, anchor, keys in (("engine top", "pml", pml_anchor.KEYS),
                               ("engine suite", "pml full", pml_anchor.FULL_KEYS)):
        if name in res and anchor in res:
            for line in pml_anchor.compare(res[name], res[anchor], name, anchor, PML_TARGETS[name], keys):
                print(line)

    eng = res.get("engine", {})
    if "seconds" not in eng:
        if "engine" in SCENARIO_METHODS[scenario]:
            print("  engine did not run: no ratios")
        return
    for other in ("faiss", "floor"):
        o = res.get(other, {})
        if "seconds" not in o:
            continue
        ratio = eng["seconds"] / o["seconds"]
        target = TARGETS[scenario].get(other)
        verdict = f"(target <= {target:.2f}x: {'MET' if ratio <= target else 'MISSED'})" if target else "(no target)"
        print(f"  engine/{other:5s} = {ratio:5.2f}x {verdict}")
    ranks = res.get("engine ranks", {})
    for other in ("faiss", "floor"):
        o = res.get(other, {})
        if "seconds" in ranks and "seconds" in o:
            print(f"  engine ranks/{other:5s} = {ranks['seconds'] / o['seconds']:5.2f}x (no target: every exact "
                  f"first rank, no early stop)")
    suite = res.get("engine suite", {})
    if "seconds" in suite and "seconds" in ranks:
        print(f"  suite/engine ranks = {suite['seconds'] / ranks['seconds']:5.2f}x (no target)")
    if "seconds" in suite:
        ratio = suite["seconds"] / eng["seconds"]
        print(f"  suite/engine = {ratio:5.2f}x (target <= {SUITE_TARGET:.2f}x: "
              f"{'MET' if ratio <= SUITE_TARGET else 'MISSED'}); suite/faiss = "
              f"{suite['seconds'] / res['faiss']['seconds'] if 'seconds' in res.get('faiss', {}) else float('nan'):.2f}"
              "x")
    f64 = res.get("floor float64", {})
    if "seconds" in f64:  # every positive's exact rank needs float64 products: their bare cost bounds the suite
        half = " (the suite computes half of them here)" if scenario == "B" else ""
        print(f"  floor float64/engine = {f64['seconds'] / eng['seconds']:5.2f}x: the suite's exact products alone"
              f"{half}; floor float64/floor = "
              f"{f64['seconds'] / res['floor']['seconds'] if 'seconds' in res.get('floor', {}) else float('nan'):.2f}x")
        if "seconds" in suite:
            print(f"  suite/floor float64 = {suite['seconds'] / f64['seconds']:5.2f}x: the suite over its own floor "
                  f"(products{', half of them,' if scenario == 'B' else ''} plus a sort of every row)")
    for name, r in (("engine", eng), ("engine ranks", ranks), ("suite", suite)):
        if "extra_bytes" in r:
            mb = r["extra_bytes"] / 2**20
            print(f"  {name} extra memory = {mb:.0f} MB (budget <= {MAX_MEMORY_MB} MB: "
                  f"{'MET' if mb <= MAX_MEMORY_MB else 'MISSED'})")
    fa = res.get("faiss", {})
    if "info" in fa:
        keys = [f"recall@{k}" for k in KS] + ["num_queries"]
        agree = all(eng["info"][k] == fa["info"][k] for k in keys) and \
            all(r.get("info", eng["info"])[k] == eng["info"][k] for k in keys for r in (ranks, suite))
        nq_inc = eng["info"]["num_queries"]
        print(f"  recall agrees: {'yes' if agree else 'no'} (engine {_fmt_recall(eng['info'])}, "
              f"faiss {_fmt_recall(fa['info'])}, {nq_inc:,} queries in the mean"
              + ("" if fa["info"]["num_queries"] == nq_inc else f" vs faiss {fa['info']['num_queries']:,}") + ")")
    sd = res.get("full matrix", {})
    if "info" in sd:
        agree = all(eng["info"][f"recall@{k}"] == sd["info"][f"recall@{k}"] for k in KS)
        print(f"  full matrix recall agrees with engine: {'yes' if agree else 'no'} ({_fmt_recall(sd['info'])})")
    for line in pml_anchor.compare(suite, res.get("pml", {})):
        print(line)
    top = res.get("engine top", {})
    for other, r in (("faiss", res.get("faiss", {})), ("engine ranks", ranks)):
        if "seconds" in top and "seconds" in r:
            print(f"  engine top/{other} = {top['seconds'] / r['seconds']:5.2f}x (no target)")


def _load() -> str:
    """The 1-, 5- and 15-minute load averages and the core count, as text."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} on {os.cpu_count()} cores"


def machine_state(before: tuple[float, ...], after: tuple[float, ...]) -> str:
    """'idle' when the 1-minute load average before the run and the 5-minute one at its end less the bench's own
    load (its children use every core while they run) both stay below half a core, else 'busy' with the figures."""
    cores = os.cpu_count() or 1
    others = max(before[0], after[1] - cores)
    return "idle" if others < 0.5 else f"busy (load average {before[0]:.1f} before, {after[1]:.1f} over the run, " \
        f"{cores} cores)"


def table_report(quick: bool, seed: int, repeat: int) -> None:
    """``--table``: engine (recall only) against FAISS per size and data kind, then the markdown rows."""
    before = os.getloadavg()
    print(f"\nTable: engine recall@K (recall only, max_memory_mb={MAX_MEMORY_MB}) against FAISS IndexFlatIP, "
          f"ks={KS}, {_load()} at the start")
    ratios: dict[tuple[str, str], float] = {}
    blas: dict[str, list[str]] = {}
    for size in TABLE_SIZES:
        label = table_label(size, quick)
        for kind in TABLE_KINDS:
            sc = table_scenario(size, kind)
            res = {m: run_child(m, sc, quick, seed, repeat) for m in ("engine", "faiss")}
            for m, r in res.items():
                if "blas" in r:
                    blas.setdefault(r["blas"], []).append(m)
            eng, fa = res["engine"], res["faiss"]
            if "seconds" not in eng or "seconds" not in fa:
                print(f"  {label}, {kind}: {eng.get('error') or fa.get('error')}")
                continue
            ratios[size, kind] = eng["seconds"] / fa["seconds"]
            agree = all(eng["info"][f"recall@{k}"] == fa["info"][f"recall@{k}"] for k in KS)
            print(f"  {label}, {kind:9s}: engine {eng['seconds']:7.2f} s, faiss {fa['seconds']:7.2f} s, "
                  f"engine/faiss = {ratios[size, kind]:5.2f}x, recall@{KS[-1]} {eng['info'][f'recall@{KS[-1]}']:.4f}"
                  f" (agrees: {'yes' if agree else 'NO'})")
    for text, methods in blas.items():
        print(f"  BLAS of {', '.join(sorted(set(methods)))}: {text}")
    pair = run_child("small pair", "S", quick, seed, 1)
    after = os.getloadavg()
    state = machine_state(before, after)
    print(f"  machine: {state}; {_load()} at the end")
    print("\n| what | engine, clustered data | engine, random data | against |\n|---|---|---|---|")
    for size in TABLE_SIZES:
        label = table_label(size, quick)
        cells = [f"{ratios[size, kind]:.2f}× FAISS" if (size, kind) in ratios else "failed" for kind in TABLE_KINDS]
        print(f"| {label} | {cells[0]} | {cells[1]} | FAISS `IndexFlatIP` search, exact vs float32 |")
    if "seconds" in pair:
        print(f"| a training loop's call, 64 × 64 × 256 (clustered) | {pair['seconds'] / pair['numpy_seconds']:.2f}× "
              f"per call (fastest of {small_batch.PAIR_CALLS:,}, alternated) | | plain numpy normalise + matmul + "
              f"argsort ({pair['numpy_seconds'] * 1e3:.2f} ms) |")
    print(f"\nmachine state: {state}")


def collapsed_report(quick: bool, seed: int, repeat: int) -> None:
    """``--collapsed``: each pass on collapsed embeddings beside clustered data, at the benchmark sizes, and FAISS
    on both (its time does not depend on ties): collapsed / clustered per contender."""
    methods = ("engine", "engine top", "engine suite", "faiss")
    print(f"\nCollapsed embeddings (every row one direction + 1e-6 noise) against clustered data, ks={KS}, "
          f"{_load()} at the start")
    for size in COLLAPSED_SIZES:
        label = table_label(size, quick)
        res = {(m, kind): run_child(m, table_scenario(size, kind), quick, seed, repeat)
               for kind in COLLAPSED_KINDS for m in methods}
        for m in methods:
            a, b = res[m, "clustered"], res[m, "collapsed"]
            if "seconds" not in a or "seconds" not in b:
                print(f"  {label}, {m}: {a.get('error') or b.get('error')}")
                continue
            vs_faiss = b["seconds"] / res["faiss", "collapsed"].get("seconds", float("nan"))
            print(f"  {label}, {m:12s}: clustered {a['seconds']:6.2f} s, collapsed {b['seconds']:6.2f} s "
                  f"({b['seconds'] / a['seconds']:5.2f}x; {vs_faiss:5.2f}x FAISS on it), "
                  f"recall@1 collapsed {b['info'].get('recall@1', float('nan')):.4f}")
    print(f"  {_load()} at the end")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sizes 20x smaller (smoke run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="time each method this many times, keep the best")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="which to run, e.g. S or A,B (default: all)")
    ap.add_argument("--table", action="store_true", help="the performance table (engine vs FAISS on "
                    "clustered and random data at the issue's sizes, and the training-loop call) as markdown rows")
    ap.add_argument("--collapsed", action="store_true", help="each pass on collapsed embeddings (every cosine "
                    "within float32's error) beside clustered data, at 2,000 x 10,000 and leave-one-out 6,000")
    ap.add_argument("--method", choices=METHODS + small_batch.METHODS, help=argparse.SUPPRESS)
    ap.add_argument("--scenario", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.method:
        child(args.method, args.scenario, args.quick, args.seed, max(1, args.repeat))
        return
    global KERNEL
    kernel = KERNEL = numpy_kernel()  # before faiss brings its own OpenBLAS
    import faiss
    t0 = time.perf_counter()
    print(f"score_bench: {'QUICK (20x smaller)' if args.quick else 'full'} sizes, seed {args.seed}, "
          f"python {platform.python_version()}, numpy {np.__version__}, faiss {faiss.__version__}, "
          f"max_memory_mb={MAX_MEMORY_MB}, repeat={max(1, args.repeat)} (best time kept)")
    print("BLAS / threads:")
    for line in blas_summary():
        print(line)
    print(f"FAISS and pml children: OPENBLAS_CORETYPE={kernel} (the kernel of numpy's OpenBLAS)" if kernel
          else "FAISS and pml children: OPENBLAS_CORETYPE not set (numpy's BLAS reports no OpenBLAS kernel)")
    print("each method runs in a fresh subprocess on the same seeded data; wall s = the method call only; "
          "peak extra = ru_maxrss - RSS after data generation")
    if args.collapsed:
        collapsed_report(args.quick, args.seed, max(1, args.repeat))
        print(f"\ntotal {time.perf_counter() - t0:.1f} s")
        return
    if args.table:
        table_report(args.quick, args.seed, max(1, args.repeat))
        print(f"\ntotal {time.perf_counter() - t0:.1f} s")
        return
    for sc in args.scenarios.split(","):
        if sc == "S":
            small_batch.report(lambda m: run_child(m, "S", args.quick, args.seed, 1), KS)
        else:
            scenario_report(sc, args.quick, args.seed, max(1, args.repeat))
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
