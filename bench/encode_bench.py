"""Encode-stage throughput benchmark: does image loading hide behind backbone compute?

Generates seeded real-size JPEGs from scikit-learn's sample photos in a temporary
directory, then prints, for the chosen backbone, model-only throughput (images
pre-decoded, only ``backbone.encode`` timed) against end-to-end throughput
(``encode_catalog`` from files), and for the ``pixels`` baseline, ``encode_catalog``
against a plain Pillow loop. No network; run from the project root:

    python bench/encode_bench.py [--images 300] [--backbone efficientnet_lite0] [--batch-size 32] [--workers 2]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from PIL import Image  # noqa: E402
from sklearn.datasets import load_sample_images  # noqa: E402

import recallk.encode.batches as encoding  # noqa: E402
from recallk.encode.registry import get_backbone  # noqa: E402

TARGET = 0.90  # the goal: end-to-end >= 0.9x model-only


def make_images(n: int, out_dir: Path, seed: int = 0) -> pd.DataFrame:
    """``n`` JPEGs (quality 90): random crops / flips of the sample photos, upscaled to ~1200-2000 px."""
    rng = np.random.default_rng(seed)
    photos = [Image.fromarray(a) for a in load_sample_images().images]  # china, flower: 640x427
    rows, longs = [], []
    for i in range(n):
        src = photos[i % len(photos)]
        cw, ch = int(rng.integers(320, 641)), int(rng.integers(240, 428))
        x, y = int(rng.integers(0, src.width - cw + 1)), int(rng.integers(0, src.height - ch + 1))
        img = src.crop((x, y, x + cw, y + ch))
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        long_side = int(rng.integers(1200, 2001))
        scale = long_side / max(cw, ch)
        img = img.resize((round(cw * scale), round(ch * scale)), Image.Resampling.BICUBIC)
        path = out_dir / f"img_{i:04d}.jpg"
        img.save(path, quality=90)
        longs.append(max(img.size))
        rows.append({"image_id": path.stem, "path": str(path),
                     "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    catalog = pd.DataFrame(rows)
    catalog.attrs["long_sides"] = f"{min(longs)}-{max(longs)}"
    return catalog


def batches(items: list, size: int):
    return [items[s:s + size] for s in range(0, len(items), size)]


def end_to_end(catalog: pd.DataFrame, backbone, batch_size: int, workers: int) -> float:
    t0 = time.perf_counter()
    emb, n_new, _ = encoding.encode_catalog(catalog, backbone, batch_size=batch_size, num_workers=workers, cache=None)
    dt = time.perf_counter() - t0
    assert emb.shape[0] == len(catalog) and n_new == catalog["sha256"].nunique()
    return n_new / dt


def bench_model(catalog: pd.DataFrame, name: str, batch_size: int, workers: int) -> None:
    backbone = get_backbone(name)
    # Same decode path as the stage (sha-checked read, JPEG draft down to input_size), done up front.
    images = [encoding.read_checked(p, h, backbone.input_size) for p, h in zip(catalog["path"], catalog["sha256"])]
    groups = batches(images, batch_size)
    backbone.encode(groups[0])  # warm-up: builds / loads the model, first-call allocations
    t0 = time.perf_counter()
    for group in groups:
        backbone.encode(group)
    model_only = len(images) / (time.perf_counter() - t0)
    del images, groups
    print(f"{name} model-only: {model_only:.1f} img/s (batch {batch_size}; "
          f"images pre-decoded with draft to min side {backbone.input_size})", flush=True)
    e2e = end_to_end(catalog, backbone, batch_size, workers)
    ratio = e2e / model_only
    verdict = "OK" if ratio >= TARGET else "BELOW TARGET"
    print(f"{name} end-to-end: {e2e:.1f} img/s (encode_catalog from files, {workers} decode threads)  "
          f"ratio {ratio:.2f}x model-only (target >= {TARGET:.2f}) {verdict}", flush=True)


def plain_pillow(paths: list[str], resolution: int) -> float:
    t0 = time.perf_counter()
    for p in paths:
        with Image.open(p) as img:
            np.asarray(img.convert("RGB").resize((resolution, resolution), Image.Resampling.BILINEAR))
    return len(paths) / (time.perf_counter() - t0)


def bench_pixels(catalog: pd.DataFrame, batch_size: int, workers: int, resolution: int = 16) -> None:
    backbone = get_backbone("pixels", {"resolution": resolution})
    head = catalog.head(batch_size)
    end_to_end(head, backbone, batch_size, workers)  # warm-up
    plain_pillow(head["path"].tolist(), resolution)
    e2e = end_to_end(catalog, backbone, batch_size, workers)
    plain = plain_pillow(catalog["path"].tolist(), resolution)
    print(f"pixels (resolution {resolution}) end-to-end: {e2e:.0f} img/s; plain Pillow loop (full decode, "
          f"1 thread): {plain:.0f} img/s  ratio {e2e / plain:.1f}x", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--backbone", default="efficientnet_lite0")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    logging.disable(logging.CRITICAL)
    warnings.filterwarnings("ignore")
    _tqdm = encoding.tqdm
    encoding.tqdm = lambda *a, **k: _tqdm(*a, **{**k, "disable": True})  # no progress bars in the output

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="encode_bench_") as tmp:
        t0 = time.perf_counter()
        catalog = make_images(args.images, Path(tmp), args.seed)
        mb = sum(os.path.getsize(p) for p in catalog["path"]) / 1e6
        print(f"generated {len(catalog)} JPEGs (q90, seed {args.seed}, {mb:.0f} MB, "
              f"{catalog.attrs['long_sides']} px long side) in {time.perf_counter() - t0:.1f}s; "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
        bench_model(catalog, args.backbone, args.batch_size, args.workers)
        bench_pixels(catalog, args.batch_size, args.workers)
    print(f"total {time.perf_counter() - start:.1f}s (load average now {os.getloadavg()[0]:.1f}; "
          "other processes on these CPUs skew every number)")


if __name__ == "__main__":
    main()
