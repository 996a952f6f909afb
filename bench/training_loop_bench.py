"""Issue 40's benchmark, speed where a training loop feels it: each figure the median of ``--runs`` one-run ratios.

* ``small``: a training loop's call, 64 queries x 64 gallery x 256-d (``bench/small_batch.py``'s batch and plain
  numpy, :func:`small_batch.numpy_recall`): ``recall_at_k`` and a kept :class:`recallk.Scorer` against plain numpy,
  alternated call by call in one child (``small pair``, BLAS on one thread); a run's ratio is that of the fastest
  calls. Target: ``recall_at_k`` at most 1.5x plain numpy.
* ``qg2k``: recall@K at 2,000 x 10,000 x 512 (clustered, 200 classes: the cell of ``score_bench.py --table``), a
  run being the engine's child then FAISS's (``IndexFlatIP`` on the unit rows, ``bench/score_methods.py``), each
  the best of ``--repeat`` calls. Target: at most 1.0x FAISS. ``--sizes`` adds the table's other cells (``qg``:
  10,000 x 50,000, at most 1.0x; ``loo20k``: leave-one-out 20,000, at most 0.6x; ``loo6k``), which must hold.
* ``epoch``: the callback of a training loop, ``recallk.training.Evaluator(...)(epoch, q, g)`` (every epoch: the
  ranking, the means, the per-query values and their bootstrap intervals, the decision), at 10,000 validation
  queries x 50,000 gallery x 512-d (scenario C's clustered data), beside one plain numpy evaluation of the same
  size (``bench/full_matrix.py``: the whole similarity matrix, argpartition, argsort; run when it fits memory, as
  in ``score_bench.py``), each in its own child: seconds per epoch (``--epochs`` epochs, the last reported) and
  peak extra memory (``ru_maxrss`` less the RSS after the data), the callback's against ``max_memory_mb``.

Every child reports the BLAS it ran (``bench/blas_report.py``); the FAISS child gets numpy's OpenBLAS kernel.

    python bench/training_loop_bench.py [--runs 3] [--parts small,qg2k,epoch] [--sizes qg2k] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import score_bench  # noqa: E402
import small_batch  # noqa: E402
from blas_report import blas_libraries, blas_lines, numpy_kernel, ran_blas  # noqa: E402
from full_matrix import full_matrix_estimate_bytes  # noqa: E402
from score_methods import KS, MAX_MEMORY_MB, TABLE_SIZES, make_data, run_full_matrix, sizes, table_label  # noqa: E402

#: The issue's targets: (contender, anchor) -> the most the median ratio may be.
TARGETS = {"small": 1.5, "qg2k": 1.0, "qg": 1.0, "loo20k": 0.6, "loo6k": 1.0}
PARTS = ("small", "qg2k", "epoch")
EPOCH_METHODS = ("evaluator", "numpy")


def _median_line(name: str, ratios: list[float], target: float | None) -> str:
    """One target's line: each run's ratio and their median, against the target."""
    runs = ", ".join(f"{r:.2f}" for r in ratios)
    if not ratios:
        return f"  {name}: no run finished"
    med = statistics.median(ratios)
    verdict = "" if target is None else f" (target <= {target:.2f}x: {'MET' if med <= target else 'MISSED'})"
    return f"  {name} = {med:.2f}x, median of {len(ratios)} runs ({runs}){verdict}"


def small_part(runs: int, seed: int) -> None:
    """``small``: ``runs`` children of the alternated pair (``small_batch.run_pair``)."""
    print(f"\nThe training loop's call: {small_batch.N_QUERY} x {small_batch.N_GALLERY} x {small_batch.DIM}-d, "
          f"recall@{KS}, {small_batch.PAIR_CALLS:,} calls each alternated with plain numpy, BLAS on one thread")
    engine, scorer, res = [], [], {}
    for r in range(runs):
        pair = res[f"run {r + 1}"] = score_bench.run_child("small pair", "S", False, seed, 1)
        if "seconds" not in pair:
            print(f"  run {r + 1}: {pair.get('error')}")
            continue
        engine.append(pair["seconds"] / pair["numpy_seconds"])
        scorer.append(pair["scorer_seconds"] / pair["numpy_seconds"])
        print(f"  run {r + 1}: recall_at_k {pair['seconds'] * 1e3:.3f} ms, kept Scorer "
              f"{pair['scorer_seconds'] * 1e3:.3f} ms, plain numpy {pair['numpy_seconds'] * 1e3:.3f} ms"
              " (fastest calls)")
    for line in blas_lines(res):
        print(line)
    print(_median_line("recall_at_k/plain numpy", engine, TARGETS["small"]))
    print(_median_line("kept Scorer/plain numpy", scorer, None))


def size_part(size: str, runs: int, quick: bool, seed: int, repeat: int) -> None:
    """One table cell (clustered data): ``runs`` runs of the engine's child then FAISS's."""
    label = table_label(size, quick)
    print(f"\n{label}, clustered: engine recall@K (recall only, max_memory_mb={MAX_MEMORY_MB}) against FAISS, "
          f"best of {repeat} calls per child")
    ratios, res = [], {}
    for r in range(runs):
        pair = {m: score_bench.run_child(m, f"T:{size}:clustered", quick, seed, repeat) for m in ("engine", "faiss")}
        eng, fa = pair["engine"], pair["faiss"]
        res.update({f"{m} (run {r + 1})": pair[m] for m in pair})
        if "seconds" not in eng or "seconds" not in fa:
            print(f"  run {r + 1}: {eng.get('error') or fa.get('error')}")
            continue
        ratios.append(eng["seconds"] / fa["seconds"])
        agree = all(eng["info"][f"recall@{k}"] == fa["info"][f"recall@{k}"] for k in KS)
        print(f"  run {r + 1}: engine {eng['seconds']:.3f} s, faiss {fa['seconds']:.3f} s = {ratios[-1]:.2f}x "
              f"(recall agrees: {'yes' if agree else 'NO'})")
    for line in blas_lines(res):
        print(line)
    print(_median_line("engine/faiss", ratios, TARGETS.get(size)))


def epoch_child(method: str, quick: bool, seed: int, epochs: int) -> None:
    """In a child: ``epochs`` calls of the callback (or one plain numpy evaluation) on scenario C's data; seconds of
    each call, peak extra memory, recall, the BLAS it ran."""
    numpy_paths = {p["filepath"] for p in blas_libraries()}
    from recallk.training import Evaluator

    blas = ran_blas(method, numpy_paths)
    d = make_data("C", quick, seed)
    base, max_before, reset = score_bench._rss_bytes(), score_bench._maxrss_bytes(), _reset_peak()
    times, cpu = [], []
    if method == "evaluator":
        evaluator = Evaluator(d["ql"], d["gl"], ks=KS, metrics=["recall"], max_memory_mb=MAX_MEMORY_MB)
        for epoch in range(epochs):
            t0, c0 = time.perf_counter(), time.process_time()
            result = evaluator(epoch, d["q"], d["g"])
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        info = {k: v for k, v in result.metrics.items() if k.startswith("recall@")}
    else:
        t0, c0 = time.perf_counter(), time.process_time()
        info = run_full_matrix(d)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    peak = _peak_bytes() if reset else score_bench._maxrss_bytes()
    print(json.dumps({"seconds": times, "cpu_seconds": cpu, "extra_bytes": peak - base,
                      "hidden": not reset and peak <= max_before, "info": info, "blas": blas}))


def _reset_peak() -> bool:
    """Reset this process's peak RSS (``VmHWM``; Linux 4.0 and later), so that the data's own generation does not
    hide the call's peak; False where it cannot be reset (``ru_maxrss`` is read then)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak_bytes() -> int:
    """This process's peak RSS since :func:`_reset_peak` (``VmHWM``)."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))


def epoch_part(quick: bool, seed: int, epochs: int) -> None:
    """``epoch``: the callback's child and plain numpy's, once each."""
    s = sizes(quick)["C"]
    nq, ng = s["n_query"], s["n_gallery"]
    print(f"\nThe callback per epoch: recallk.training.Evaluator(ks={KS}, metrics=['recall']) at {nq:,} validation "
          f"queries x {ng:,} gallery x 512-d (clustered, {s['classes']:,} classes), {epochs} epochs, beside one "
          "plain numpy evaluation (the whole matrix, argpartition, argsort)")
    res = {}
    for method in EPOCH_METHODS:
        if method == "numpy":
            need = full_matrix_estimate_bytes(nq, ng, False)
            limit = min(score_bench.FULL_LIMIT_BYTES,
                        score_bench.FULL_AVAILABLE_FRACTION * score_bench._mem_available())
            if need >= limit:
                print(f"  plain numpy: skipped (needs {need / 2**30:.1f} GB, limit {limit / 2**30:.1f} GB)")
                continue
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", method, "--seed", str(seed),
               "--epochs", str(epochs)] + (["--quick"] if quick else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ))
        if proc.returncode != 0:
            print(f"  {method}: failed (rc={proc.returncode}) {(proc.stderr or proc.stdout).strip()[-300:]}")
            continue
        r = res[method] = json.loads(proc.stdout.strip().splitlines()[-1])
        mb = r["extra_bytes"] / 2**20
        each = ", ".join(f"{t:.2f} s ({c:.2f} s CPU)" for t, c in zip(r["seconds"], r["cpu_seconds"]))
        rec = " ".join(f"{r['info'][f'recall@{k}']:.4f}" for k in KS)
        print(f"  {method:9s}: {each} per call, peak extra {'<=' if r['hidden'] else ''}{mb:.0f} MB, recall {rec}")
    for line in blas_lines(res):
        print(line)
    ev, ref = res.get("evaluator"), res.get("numpy")
    if ev:
        mb = ev["extra_bytes"] / 2**20
        print(f"  callback peak extra memory = {mb:.0f} MB against max_memory_mb = {MAX_MEMORY_MB} "
              f"({'within' if mb <= MAX_MEMORY_MB else 'ABOVE'} the bound)")
    if ev and ref:
        ratio, cpu = ev["seconds"][-1] / ref["seconds"][0], ev["cpu_seconds"][-1] / ref["cpu_seconds"][0]
        agree = all(ev["info"][f"recall@{k}"] == ref["info"][f"recall@{k}"] for k in KS)
        print(f"  callback per epoch / plain numpy = {ratio:.2f}x ({cpu:.2f}x in CPU time; epoch "
              f"{len(ev['seconds']) - 1}; recall agrees: {'yes' if agree else 'NO'}); memory "
              f"{ev['extra_bytes'] / max(1, ref['extra_bytes']):.3f}x numpy's")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per ratio; the median is the figure (default 3)")
    ap.add_argument("--parts", default=",".join(PARTS), help="which of small, qg2k, epoch (default: all)")
    ap.add_argument("--sizes", default="qg2k", help=f"table cells for qg2k, of {', '.join(TABLE_SIZES)}")
    ap.add_argument("--repeat", type=int, default=3, help="calls per engine or FAISS child, the best kept")
    ap.add_argument("--epochs", type=int, default=2, help="epochs the callback is called (the last reported)")
    ap.add_argument("--quick", action="store_true", help="qg2k and epoch 20x smaller (a smoke run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", choices=EPOCH_METHODS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        epoch_child(args.child, args.quick, args.seed, args.epochs)
        return
    score_bench.KERNEL = numpy_kernel()  # before faiss brings its own OpenBLAS: the FAISS children's kernel
    t0, before = time.perf_counter(), os.getloadavg()
    print(f"training_loop_bench: {'QUICK (20x smaller) ' if args.quick else ''}runs={args.runs}, "
          f"{score_bench._load()} at the start")
    parts = args.parts.split(",")
    if "small" in parts:
        small_part(args.runs, args.seed)
    if "qg2k" in parts:
        for size in args.sizes.split(","):
            size_part(size, args.runs, args.quick, args.seed, args.repeat)
    if "epoch" in parts:
        epoch_part(args.quick, args.seed, args.epochs)
    print(f"\nmachine: {score_bench.machine_state(before, os.getloadavg())}; {score_bench._load()} at the end; "
          f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
