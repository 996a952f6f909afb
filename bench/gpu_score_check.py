"""Device check of ``score.backend: torch``: the numpy engine's bytes on the adversarial suite, then the speed.

1. **Rank-exact.** Every problem of the adversarial suite (``tests/torch_cases.py``: exact duplicates, 8-bit
   embeddings, all-equal rows, 1-ulp ties, leave-one-out, ``exclude_same``, K above the gallery) ranked on the
   device at block/tile sizes 1, 7, 64 and 4,096 and with 1, 2 and 7 shards: every per-query metric value
   (its bytes) and first rank must equal the numpy engine's; then, at two layouts, with the embeddings as
   tensors on the device and with TF32 and bfloat16 candidates where the device has them. Prints
   ``identical`` or each difference.
2. **Speed.** ``--queries`` x ``--gallery`` x ``--dim`` clustered unit vectors (default 100,000 x 1,000,000 x
   512 on CUDA), recall@1/5/10 with its capped pass, candidates in float32 and (where the GPU has it) TF32:
   wall time, the product's rate (2 n m d flops / s) against the GPU's peak (a table of known parts), and
   FAISS ``knn_gpu`` (k = 10, float32) where a GPU build of faiss is installed.

Without CUDA it runs both parts on the CPU at a tiny size (``--tiny`` forces that; the test suite runs it), with
the numpy engine timed beside it, and says that no GPU was checked. Run from the project root:

    python bench/gpu_score_check.py            # on a CUDA machine: about 2-4 minutes on an H100/H200
    python bench/gpu_score_check.py --tiny     # anywhere: seconds
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench", ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from recallk.score.passes import Pass  # noqa: E402
from recallk.score.ranking import rank_data  # noqa: E402
from recallk.score.ranking.torch_backend import TorchOptions, rank_data_torch  # noqa: E402
from recallk.score.retrieval_data import RetrievalData  # noqa: E402
from torch_cases import ADVERSARIAL, LAYOUTS, adversarial_case, differences  # noqa: E402
from torch_timing import clustered, timed  # noqa: E402

#: Dense peak rates (TFLOP/s) of known parts: (float32, TF32), from the vendors' data sheets.
PEAKS = {"H200": (67.0, 494.7), "H100 SXM": (67.0, 494.7), "H100 PCIe": (51.0, 378.0), "A100": (19.5, 156.0),
         "L40S": (91.6, 183.0), "A10": (31.2, 62.5), "RTX 4090": (82.6, 82.6)}


def peak(name: str) -> tuple[float, float] | None:
    """The peak rates of the GPU ``name`` (torch's device name), or None for a part not in :data:`PEAKS`."""
    for part, rates in PEAKS.items():
        if all(word in name for word in part.split()):
            return rates
    return None


def check_suite(device: str, full: bool) -> bool:
    """Part 1; returns whether every case was identical. Host arrays in float32 at every layout; then, at two
    layouts, the embeddings as tensors on the device (checked and normalised there) and each narrower candidate
    format the device has (TF32 on compute capability 8.0+, bfloat16), whose wider windows must give the same
    bytes."""
    ok = True
    cuda = device.startswith("cuda")
    runs = [("float32, arrays", "float32", False, LAYOUTS if full else [(64, 64, 2)])]
    few = [(7, 7, 1), (4096, 4096, 2)] if full else [(7, 7, 2)]
    if cuda:
        runs.append(("float32, tensors", "float32", True, few))
        if torch.cuda.get_device_capability()[0] >= 8:
            runs.append(("tf32, tensors", "tf32", True, few))
    if not cuda or torch.cuda.is_bf16_supported():
        runs.append(("bfloat16, " + ("tensors" if cuda else "arrays"), "bfloat16", cuda, few))
    for label, precision, as_tensors, layouts in runs:
        print(f"  candidates {label}:")
        for kind in ADVERSARIAL:
            started = time.perf_counter()
            found = differences(adversarial_case(kind), layouts=layouts, device=device, precision=precision,
                                as_tensors=as_tensors)
            ok &= not found
            print(f"    {kind:16s} {'identical' if not found else 'DIFFERS: ' + '; '.join(found[:5])} "
                  f"({len(layouts)} layout(s), {time.perf_counter() - started:.1f} s)")
    return ok


def speed(device: str, n: int, m: int, d: int, budget_mb: float) -> bool:
    """Part 2; returns whether the float32 and TF32 rankings agree with each other (and with numpy on the CPU)."""
    q, g, ql, gl = clustered(n, m, d)
    data = RetrievalData(q, g, ql, gl, same_set=False)
    ranks, flops = Pass.first(10), 2.0 * n * m * d
    formats = ["float32"]
    if device.startswith("cuda") and torch.cuda.get_device_capability()[0] >= 8:
        formats.append("tf32")
    rates = peak(torch.cuda.get_device_name()) if device.startswith("cuda") else None
    firsts, took = {}, {}
    for fmt in formats:
        seconds, ranking = timed(lambda fmt=fmt: rank_data_torch(data, ranks, budget_mb,
                                                                 TorchOptions(device=device, precision=fmt)))
        firsts[fmt], took[fmt] = ranking.first_rank, seconds
        rate = flops / seconds / 1e12
        vs = "" if rates is None else f", {rate / rates[fmt == 'tf32']:.1%} of the {fmt} peak " \
                                      f"({rates[fmt == 'tf32']:g} TFLOP/s)"
        print(f"  torch {fmt:8s} {seconds:8.2f} s  {rate:7.2f} TFLOP/s{vs}")
    same = all(np.array_equal(firsts["float32"], f) for f in firsts.values())
    if not device.startswith("cuda"):
        seconds, ranking = timed(lambda: rank_data(data, ranks, budget_mb))
        print(f"  numpy engine     {seconds:8.2f} s  (torch float32 / numpy engine: {took['float32'] / seconds:.2f}x)")
        same &= np.array_equal(ranking.first_rank, firsts["float32"])
    faiss_line(q, g, device)
    print(f"  float32{' and TF32' if len(formats) > 1 else ''} first ranks "
          f"{'identical' if same else 'DIFFER'}{' (and the numpy engine)' if not device.startswith('cuda') else ''}")
    return same


def faiss_line(q: np.ndarray, g: np.ndarray, device: str) -> None:
    """FAISS ``knn_gpu`` (k = 10) on the same vectors where a GPU build is installed."""
    try:
        import faiss
    except ImportError:
        print("  faiss knn_gpu    not installed")
        return
    if not device.startswith("cuda") or not hasattr(faiss, "StandardGpuResources"):
        print("  faiss knn_gpu    no GPU build of faiss here")
        return
    res = faiss.StandardGpuResources()
    qn, gn = q / np.linalg.norm(q, axis=1, keepdims=True), g / np.linalg.norm(g, axis=1, keepdims=True)
    seconds, _ = timed(lambda: faiss.knn_gpu(res, qn, gn, 10))
    print(f"  faiss knn_gpu    {seconds:8.2f} s  (k = 10, float32, top-k only: no exact re-score, no ties)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU-sized run (also without CUDA)")
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--gallery", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--max-memory-mb", type=float, default=8192)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    device = "cuda" if cuda else "cpu"
    if cuda:
        print(f"device: {torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})")
        n, m, d = args.queries, args.gallery, args.dim
    else:
        print(f"device: cpu (torch {torch.__version__}); no CUDA GPU checked: "
              f"{'--tiny' if args.tiny else 'torch.cuda.is_available() is False'}")
        n, m, d = 200, 4000, 64
    print("1. rank-exact against the numpy engine, adversarial suite")
    exact = check_suite(device, full=cuda)
    print(f"2. speed, {n:,} queries x {m:,} gallery x {d}-d, recall@1/5/10")
    agree = speed(device, n, m, d, args.max_memory_mb if cuda else 256)
    return 0 if exact and agree else 1


if __name__ == "__main__":
    sys.exit(main())
