"""Text <-> image retrieval at MSCOCO 5K scale: recallk's exact engine beside CLIP_benchmark's retrieval metric.

The data: 5,000 images around 500 topics (clustered, like real embeddings) and 25,010 captions (5 per image, 10
images with 6, as in the Karpathy test split), 512-d float32, each caption its image plus noise. Both directions
at K = 1, 5, 10:

* ``recallk``: :func:`recallk.score.crossmodal.crossmodal_per_query` (both directions, recall@K, MRR, ranks, MAP
  for image -> text, under the default 512 MB bound);
* ``clip_benchmark``: CLIP_benchmark 1.6.2's ``zeroshot_retrieval`` as its ``evaluate`` runs it after encoding: the
  full (texts x images) score matrix, the positive-pair matrix, then ``batchify(recall_at_k, ...) > 0`` per K and
  direction (recall@K only), batches of 64 as a DataLoader of 64 images gives.

Each contender runs in its own process (``--child``), so the peak resident memory it reports (``ru_maxrss``) is
its own; the time is the median of ``--repeat`` runs in turn. The hit counts are compared: they must be equal
except on the queries the engine names as tie-affected (a tie at the boundary, in float32). From the root:

    python bench/crossmodal_bench.py              # COCO 5K scale (minutes)
    python bench/crossmodal_bench.py --scale 0.1  # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

KS = (1, 5, 10)


def coco_like(scale: float, dim: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images, captions and each caption's image at ``scale`` x MSCOCO 5K (5,000 images, 25,010 captions)."""
    rng = np.random.default_rng(seed)
    n_images = max(20, int(5000 * scale))
    topics = rng.standard_normal((max(2, n_images // 10), dim), dtype=np.float32)
    images = topics[np.arange(n_images) % len(topics)] + 0.6 * rng.standard_normal((n_images, dim), dtype=np.float32)
    per_image = np.full(n_images, 5)
    per_image[: max(1, n_images // 500)] = 6  # 5,000 images: 10 with a sixth caption, 25,010 in all
    captions = np.repeat(np.arange(n_images), per_image)
    texts = images[captions] + 0.9 * rng.standard_normal((captions.size, dim), dtype=np.float32)
    return images.astype(np.float32), texts.astype(np.float32), captions


def run_recallk(images: np.ndarray, texts: np.ndarray, captions: np.ndarray) -> dict:
    from recallk.score.crossmodal import crossmodal_per_query

    runs = crossmodal_per_query(images, texts, captions, ks=KS)
    hits = {d: {k: runs.values[d][f"recall@{k}"].astype(bool).tolist() for k in KS} for d in runs.values}
    ties = {d: np.flatnonzero(t).tolist() for d, t in runs.tie_sensitive.items()}
    return {"hits": hits, "ties": ties}


def run_clip_benchmark(images: np.ndarray, texts: np.ndarray, captions: np.ndarray) -> dict:
    import torch
    import torch.nn.functional as F
    from clip_benchmark.metrics.zeroshot_retrieval import batchify, recall_at_k

    images_emb = F.normalize(torch.from_numpy(images), dim=-1)
    texts_emb = F.normalize(torch.from_numpy(texts), dim=-1)
    scores = texts_emb @ images_emb.t()
    positive = torch.zeros_like(scores, dtype=bool)
    positive[torch.arange(len(scores)), torch.from_numpy(captions)] = True
    hits = {"text_to_image": {}, "image_to_text": {}}
    for k in KS:
        hits["text_to_image"][k] = (batchify(recall_at_k, scores, positive, 64, "cpu", k=k) > 0).tolist()
        hits["image_to_text"][k] = (batchify(recall_at_k, scores.T, positive.T, 64, "cpu", k=k) > 0).tolist()
    return {"hits": hits}


CONTENDERS = {"recallk": run_recallk, "clip_benchmark": run_clip_benchmark}


def blas_of(name: str) -> str:
    """The BLAS the contender's products ran: numpy's OpenBLAS for recallk, torch's for CLIP_benchmark."""
    if name == "clip_benchmark":
        import torch

        config = torch.__config__.show()
        blas = next(("BLAS_INFO=" + part.split("BLAS_INFO=")[1].strip()
                     for part in config.replace("\n", ",").split(",") if "BLAS_INFO=" in part), "BLAS_INFO unknown")
        return f"torch {torch.__version__} ({blas}), {torch.get_num_threads()} threads"
    from blas_report import blas_libraries, describe

    return "; ".join(describe(p) for p in blas_libraries()) or "unknown"


def child(name: str, scale: float) -> None:
    """One timed run of ``name`` in this process; prints JSON (seconds, peak MiB above the data's, hits)."""
    if name == "clip_benchmark":
        import torch  # noqa: F401  (imported before the baseline, as the engine's numpy is)
    images, texts, captions = coco_like(scale)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    out = CONTENDERS[name](images, texts, captions)
    seconds = time.perf_counter() - start
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    print(json.dumps({"seconds": seconds, "peak_mib": peak, "blas": blas_of(name), **out}))


def run_child(name: str, scale: float) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", name, "--scale", str(scale)], capture_output=True,
                          text=True, check=True, env=os.environ.copy())
    return json.loads(proc.stdout.strip().splitlines()[-1])


def disagreements(a: dict, b: dict, ties: dict) -> dict[str, int]:
    """Per direction: queries whose hit differs between the contenders at some K, and how many of those the
    engine did not name as tie-affected (must be 0)."""
    out = {}
    for direction in a:
        differ = {i for k in KS for i, (x, y) in enumerate(zip(a[direction][str(k)], b[direction][str(k)])) if x != y}
        out[direction] = (len(differ), len(differ - set(ties[direction])))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of MSCOCO 5K's sizes (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per contender, the median quoted (default 3)")
    parser.add_argument("--child", choices=sorted(CONTENDERS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.scale)
        return 0
    images, texts, captions = coco_like(args.scale)
    print(f"{len(texts):,} captions x {len(images):,} images x {images.shape[1]}, both directions, K = {KS}; "
          f"median of {args.repeat} runs each, each in its own process")
    runs: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
    for _ in range(args.repeat):
        for name in CONTENDERS:
            runs[name].append(run_child(name, args.scale))
    median = {name: statistics.median(r["seconds"] for r in rs) for name, rs in runs.items()}
    for name, rs in runs.items():
        peak = max(r["peak_mib"] for r in rs)
        times = ", ".join(f"{r['seconds']:.2f}" for r in rs)
        print(f"  {name:15s} {median[name]:8.2f} s  (runs {times})  "
              f"peak {peak:,.0f} MiB above the data  BLAS: {rs[0]['blas']}")
    print(f"  recallk / clip_benchmark time: {median['recallk'] / median['clip_benchmark']:.2f}x")
    ours, theirs = runs["recallk"][0], runs["clip_benchmark"][0]
    bad = 0
    for direction, (n, unnamed) in disagreements(ours["hits"], theirs["hits"], ours["ties"]).items():
        print(f"  {direction}: {n} queries differ at some K, {unnamed} of them not named tie-affected "
              f"({len(ours['ties'][direction])} named)")
        bad += unnamed
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
