"""What trusting the embedding cache costs: the content check, the row digests and the verification sample.

On seeded real-size JPEGs (``bench/encode_bench.py``'s generator, in a temporary folder) it times, in one
run: a cold encode (every image a miss), the cache's read with its digest checks (``get_many``), the
content check alone (every file hashed against its sha256, :func:`recallk.encode.verify.check_unchanged`),
and warm encodes with ``verify_cache`` 0 and 8, and prints each as a ratio of the cold encode. No network;
from the project root (the quoted figures come from an idle machine):

    python bench/cache_trust_bench.py [--images 300] [--backbone pixels] [--workers 2] [--verify 8]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for where in (ROOT, ROOT / "bench"):
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))

from encode_bench import make_images  # noqa: E402
from recallk.encode import verify  # noqa: E402
from recallk.encode.batches import encode_catalog  # noqa: E402
from recallk.encode.cache import EmbeddingCache  # noqa: E402
from recallk.encode.registry import get_backbone  # noqa: E402


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--backbone", default="pixels")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--verify", type=int, default=verify.SAMPLE)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    backbone = get_backbone(args.backbone)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "img").mkdir()
        catalog = make_images(args.images, Path(tmp) / "img")
        db = Path(tmp) / "cache" / "embeddings.sqlite"
        run = dict(batch_size=args.batch_size, num_workers=args.workers)
        with EmbeddingCache(db, backbone.fingerprint) as cache:
            cold, _ = timed(encode_catalog, catalog, backbone, cache=cache, verify_cache=0, **run)
            read, _ = timed(cache.get_many, catalog["sha256"])
            hashed, _ = timed(verify.check_unchanged, catalog["image_id"].tolist(), catalog["path"].tolist(),
                              catalog["sha256"].tolist(), workers=args.workers)
            warm0, _ = timed(encode_catalog, catalog, backbone, cache=cache, verify_cache=0, **run)
            warm, _ = timed(encode_catalog, catalog, backbone, cache=cache, verify_cache=args.verify, **run)
            megabytes = sum(Path(p).stat().st_size for p in catalog["path"]) / 1e6
    print(f"{args.images} images ({megabytes:.0f} MB of JPEG), backbone {args.backbone}, {args.workers} worker(s)")
    print(f"cold encode (all misses)              {cold:8.3f} s  1.000x")
    for what, secs in [("cache read + digest checks", read), ("content check (hash every file)", hashed),
                       ("warm encode, verify_cache=0", warm0), (f"warm encode, verify_cache={args.verify}", warm),
                       ("  of which the sample", warm - warm0)]:
        print(f"{what:<38}{secs:8.3f} s  {secs / cold:.3f}x of cold")


if __name__ == "__main__":
    main()
