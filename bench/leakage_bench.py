"""Near-duplicate benchmark: does the split stage's pHash find planted near-copies, and only them?

Real images, nothing downloaded:

* photos: scikit-learn's two sample photos (``load_sample_images``), cut into base crops (random
  positions and sizes, at most 25% of a crop's area shared with any other base crop);
* distractors: for some base crops, another crop of the same photo shifted by 35-50% of its size
  (same scene, overlapping, but not a copy);
* digits: the committed 8x8 scans under ``data/digits`` (``--digits`` per label).

Each base gets planted copies, one per transform class: ``rescale`` (x0.5 to x1.5; digits x2 to x4),
``jpeg`` (quality 30 to 95), ``crop`` (5% to 10% of the area cut from the borders), ``colour``
(brightness, contrast and saturation within 10%, a gamma within 0.9 to 1.1, an RGB offset of up to
8 levels), and ``flip`` (a mirror image, reported apart: pHash is not mirror-invariant). Every image
goes through the pipeline's decoder (``recallk.images.decode``) and :func:`recallk.data.phash.phash`.

Printed per ``max_distance``: the recall of the planted (base, copy) pairs by class, the false pair
rate (pairs of images of different families within the distance, over all such pairs; also for photos,
digits and the distractor pairs alone) and how many of the flagged pairs are planted. Target: recall
>= 0.95 of the non-flip copies at <= 1% false pairs, at the default ``split.near_duplicates.max_distance``.
Then the banded search on synthetic hashes: 100,000 uniform random 64-bit hashes (and 1,000 planted
near pairs), timed, checked against brute force on a 20,000-hash subset (the planted pairs in it).

Run from the project root:

    python bench/leakage_bench.py [--crops 80] [--digits 30] [--seed 0] [--synthetic 100000]
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from PIL import Image, ImageEnhance, ImageOps  # noqa: E402
from sklearn.datasets import load_sample_images  # noqa: E402

from recallk.data import phash  # noqa: E402
from recallk.data.settings import NearDuplicateSettings  # noqa: E402
from recallk.images import decode  # noqa: E402

DEFAULT = NearDuplicateSettings().max_distance
DISTANCES = (4, 6, 8, 10, 12, 14)
CLASSES = ("rescale", "jpeg", "crop", "colour", "flip")


def _bytes(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _overlap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    """Shared area over the smaller box's area."""
    w = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    return w * h / min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))


def photo_bases(n_per_photo: int, rng: np.random.Generator) -> tuple[list[Image.Image], list[Image.Image]]:
    """Base crops (little shared area) and, for every other base, a shifted distractor crop."""
    bases, distractors = [], []
    for photo in load_sample_images().images:
        img = Image.fromarray(photo)
        boxes: list[tuple[int, int, int, int]] = []
        tries = 0
        while len(boxes) < n_per_photo and tries < 20000:
            tries += 1
            w, h = int(rng.integers(48, 160)), int(rng.integers(48, 160))
            x, y = int(rng.integers(0, img.width - w)), int(rng.integers(0, img.height - h))
            box = (x, y, x + w, y + h)
            if all(_overlap(box, b) <= 0.25 for b in boxes):
                boxes.append(box)
        for k, box in enumerate(boxes):
            bases.append(img.crop(box))
            if k % 2 == 0:
                w, h = box[2] - box[0], box[3] - box[1]
                dx, dy = (int(rng.uniform(0.35, 0.5) * s) * int(rng.choice([-1, 1])) for s in (w, h))
                x = int(np.clip(box[0] + dx, 0, img.width - w))
                y = int(np.clip(box[1] + dy, 0, img.height - h))
                distractors.append((len(bases) - 1, img.crop((x, y, x + w, y + h))))
    return bases, distractors


def digit_bases(per_label: int) -> list[Image.Image]:
    root = ROOT / "data" / "digits"
    return [decode(p.read_bytes()) for label in sorted(root.iterdir()) if label.is_dir()
            for p in sorted(label.glob("*.png"))[:per_label]]


def copies(img: Image.Image, rng: np.random.Generator, digit: bool) -> dict[str, bytes]:
    """One planted copy per class, as file bytes."""
    w, h = img.size
    out: dict[str, bytes] = {}
    f = rng.uniform(2, 4) if digit else rng.choice([rng.uniform(0.5, 0.8), rng.uniform(1.2, 1.5)])
    out["rescale"] = _bytes(img.resize((max(1, round(w * f)), max(1, round(h * f))), Image.Resampling.BILINEAR))
    out["jpeg"] = _bytes(img, "JPEG", quality=int(rng.integers(30, 96)))
    keep = np.sqrt(1 - rng.uniform(0.05, 0.10))  # the share of each side kept: 5-10% of the area cut
    cw, ch = max(1, round(w * keep)), max(1, round(h * keep))
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    out["crop"] = _bytes(img.crop((x, y, x + cw, y + ch)))
    shifted = ImageEnhance.Brightness(img).enhance(rng.uniform(0.9, 1.1))
    shifted = ImageEnhance.Contrast(shifted).enhance(rng.uniform(0.9, 1.1))
    shifted = ImageEnhance.Color(shifted).enhance(rng.uniform(0.9, 1.1))
    gamma = rng.uniform(0.9, 1.1)
    arr = 255.0 * (np.asarray(shifted, dtype=np.float64) / 255.0) ** gamma + rng.integers(-8, 9, size=3)
    out["colour"] = _bytes(Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8)))
    out["flip"] = _bytes(ImageOps.mirror(img))
    return out


def hash_bytes(data: bytes) -> int:
    return int(phash.phash(decode(data)), 16)


def build(args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(args.seed)
    photos, distractors = photo_bases(args.crops, rng)
    digits = digit_bases(args.digits)
    codes, family, kind, source = [], [], [], []  # kind: "base", a class name or "distractor"
    start = time.perf_counter()
    for fam, (img, is_digit) in enumerate([(p, False) for p in photos] + [(d, True) for d in digits]):
        codes.append(hash_bytes(_bytes(img)))
        family.append(fam), kind.append("base"), source.append("digit" if is_digit else "photo")
        for cls, data in copies(img, rng, is_digit).items():
            codes.append(hash_bytes(data))
            family.append(fam), kind.append(cls), source.append("digit" if is_digit else "photo")
    n_fam = len(photos) + len(digits)
    for k, (base, img) in enumerate(distractors):  # its own family, paired with its base for the distractor rate
        codes.append(hash_bytes(_bytes(img)))
        family.append(n_fam + k), kind.append(f"distractor:{base}"), source.append("photo")
    elapsed = time.perf_counter() - start
    return {"codes": np.array(codes, dtype=np.uint64), "family": np.array(family), "kind": np.array(kind),
            "source": np.array(source), "n_photos": len(photos), "n_digits": len(digits),
            "n_distractors": len(distractors), "hash_ms": 1000 * elapsed / len(codes)}


def evaluate(data: dict) -> None:
    codes, family, kind, source = data["codes"], data["family"], data["kind"], data["source"]
    n = codes.size
    dist = phash.popcount((codes[:, None] ^ codes[None, :]).ravel()).reshape(n, n)
    upper = np.triu(np.ones((n, n), dtype=bool), 1)
    other = upper & (family[:, None] != family[None, :])
    base_of = {f: i for i, (f, k) in enumerate(zip(family, kind)) if k == "base"}
    planted = {cls: [(base_of[f], i) for i, (f, k) in enumerate(zip(family, kind)) if k == cls] for cls in CLASSES}
    distractor_pairs = [(int(k.split(":")[1]), i) for i, k in enumerate(kind) if k.startswith("distractor:")]
    distractor_pairs = [(base_of[b], i) for b, i in distractor_pairs]
    photo = (source[:, None] == "photo") & (source[None, :] == "photo")
    digit = (source[:, None] == "digit") & (source[None, :] == "digit")
    print(f"images: {n} ({data['n_photos']} photo crops, {data['n_digits']} digits, {len(CLASSES)} copies each, "
          f"{data['n_distractors']} distractor crops); pHash {data['hash_ms']:.2f} ms per image (decode + hash)")
    print(f"pairs of different families: {int(other.sum()):,} (photo-photo {int((other & photo).sum()):,}, "
          f"digit-digit {int((other & digit).sum()):,})")
    header = (f"{'d':>3} " + " ".join(f"{c:>8}" for c in CLASSES) + f" {'non-flip (photo / digit)':>24} {'false':>7} "
              f"{'photos':>8} {'digits':>8} {'distract':>8} {'family':>8}")
    print("\nrecall of planted (base, copy) pairs by class, of the non-flip ones (photos / digits); false pair rate\n"
          "(all, photo-photo, digit-digit, base-distractor); share of the flagged pairs within one family")
    print(header)
    for d in sorted(set(DISTANCES) | {DEFAULT}):
        rec = {c: np.mean([dist[a, b] <= d for a, b in planted[c]]) for c in CLASSES}
        non_flip = np.mean([dist[a, b] <= d for c in CLASSES if c != "flip" for a, b in planted[c]])
        by_source = {src: np.mean([dist[a, b] <= d for c in CLASSES if c != "flip" for a, b in planted[c]
                                   if source[a] == src]) for src in ("photo", "digit")}
        close = dist <= d
        false = (close & other).sum() / other.sum()
        f_photo = (close & other & photo).sum() / (other & photo).sum()
        f_digit = (close & other & digit).sum() / (other & digit).sum()
        f_distractor = np.mean([dist[a, b] <= d for a, b in distractor_pairs]) if distractor_pairs else float("nan")
        flagged = close & upper
        share = (flagged & ~other).sum() / max(1, flagged.sum())  # pairs within a family: base or copies
        mark = "  <- default" if d == DEFAULT else ""
        print(f"{d:>3} " + " ".join(f"{rec[c]:>8.3f}" for c in CLASSES)
              + f" {non_flip:>5.3f} ({by_source['photo']:.3f} / {by_source['digit']:.3f}) {false:>7.2%} "
              f"{f_photo:>8.2%} {f_digit:>8.2%} {f_distractor:>8.2%} {share:>8.1%}{mark}")


def synthetic(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)
    planted = min(1000, n // 4)
    flips = np.zeros(planted, dtype=np.uint64)
    for k in range(planted):  # 1 to DEFAULT random bits flipped
        for b in rng.choice(64, size=int(rng.integers(1, DEFAULT + 1)), replace=False):
            flips[k] |= np.uint64(1) << np.uint64(b)
    codes[n - planted:] = codes[:planted] ^ flips
    print(f"\nbanded search on {n:,} synthetic hashes (uniform random, {planted} planted pairs within {DEFAULT} bits)")
    for d in sorted({4, 8, DEFAULT}):
        start = time.perf_counter()
        i, j, _ = phash.near_pairs(codes, d)
        took = time.perf_counter() - start
        found = set(zip(i.tolist(), j.tolist()))
        hit = np.mean([(k, n - planted + k) in found for k in range(planted) if bin(int(flips[k])).count("1") <= d])
        print(f"  max_distance {d:>2}: {phash.plan(n, d)} bands, {i.size:,} pairs, {took:.2f} s; planted pairs found "
              f"{hit:.3f}")
    sub = np.concatenate([codes[:10000], codes[-10000:]]) if n > 20000 else codes  # the planted pairs included
    start = time.perf_counter()
    want = phash.near_pairs_brute(sub, DEFAULT)
    brute = time.perf_counter() - start
    start = time.perf_counter()
    got = phash.near_pairs(sub, DEFAULT)
    banded = time.perf_counter() - start
    same = all(np.array_equal(a, b) for a, b in zip(got, want))
    print(f"  {sub.size:,}-hash subset at {DEFAULT}: banded {banded:.2f} s, brute force {brute:.2f} s, "
          f"identical pairs: {same} ({want[0].size} pairs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crops", type=int, default=80, help="base crops per sample photo")
    parser.add_argument("--digits", type=int, default=30, help="digit scans per label")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--synthetic", type=int, default=100_000, help="synthetic hashes for the timing (0: skip)")
    args = parser.parse_args()
    evaluate(build(args))
    if args.synthetic:
        synthetic(args.synthetic, args.seed)


if __name__ == "__main__":
    main()
