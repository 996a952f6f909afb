"""GPU check of a torch backbone: the same images on CPU and on CUDA at batch 1, 7 and 64.

For each setting it prints the max |delta| of the embeddings against the CPU (and against CUDA at
batch 1), whether recall@1/5/10 (leave-one-out over the committed digits, cosine) or any top-10
neighbour list changes, and the throughput in images/s (images pre-decoded; ``backbone.encode`` timed,
which returns host arrays, so the GPU work is included). Without CUDA it says so and exits 0 after the
CPU part (which also checks that CPU vectors do not depend on the batch size). No network; run from
the project root:

    python bench/gpu_check.py [--images 512] [--backbone efficientnet_lite0 | torchvision:resnet50]

``torchvision:<model>`` runs with seeded random weights saved to a temporary file (nothing to
download), with ResNet50_Weights.IMAGENET1K_V2's preprocessing; efficientnet_lite0 uses its shipped
weights when its package is installed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from recallk.encode.device import Request, current_flags, machine  # noqa: E402
from recallk.encode.registry import get_backbone  # noqa: E402

KS = (1, 5, 10)
BATCHES = (1, 7, 64)


def digits(n: int) -> tuple[list[Image.Image], np.ndarray]:
    """The first ``n`` committed digits (round-robin over labels), upscaled to 64 x 64 RGB, and their labels."""
    folders = sorted(p for p in (ROOT / "data" / "digits").iterdir() if p.is_dir())
    files = [sorted(f.iterdir()) for f in folders]
    images, labels = [], []
    for i in range(n):
        label = i % len(folders)
        path = files[label][i // len(folders)]
        images.append(Image.open(path).convert("RGB").resize((64, 64), Image.Resampling.BILINEAR))
        labels.append(label)
    return images, np.asarray(labels)


def backbone_options(name: str, tmp: Path) -> dict:
    if not name.startswith("torchvision:"):
        return {}
    import torchvision

    torch.manual_seed(0)
    path = tmp / "weights.pth"
    torch.save(torchvision.models.get_model(name.split(":", 1)[1], weights=None).state_dict(), path)
    return {"weights": str(path), "preset": "ResNet50_Weights.IMAGENET1K_V2"}


def encode(name: str, options: dict, request: Request, images: list[Image.Image]) -> tuple[np.ndarray, float, str]:
    """Embeddings of ``images`` in batches of ``request.batch_size``, images/s, and the fingerprint."""
    backbone = get_backbone(name, options, runtime=request)
    backbone.encode(images[:2])  # warm-up (cuDNN / kernel selection)
    start = time.perf_counter()
    rows = [backbone.encode(images[i:i + request.batch_size]) for i in range(0, len(images), request.batch_size)]
    seconds = time.perf_counter() - start
    return np.concatenate(rows), len(images) / seconds, backbone.fingerprint


def neighbours(emb: np.ndarray, k: int = max(KS)) -> np.ndarray:
    """Each image's top-k others by cosine (leave-one-out), ties by index."""
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    sims = unit @ unit.T
    np.fill_diagonal(sims, -np.inf)
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


def recalls(top: np.ndarray, labels: np.ndarray) -> dict[int, float]:
    hit = labels[top] == labels[:, None]
    return {k: float(hit[:, :k].any(axis=1).mean()) for k in KS}


def report(tag: str, emb: np.ndarray, ref: np.ndarray, ref_top: np.ndarray, labels: np.ndarray, ips: float,
           fp: str) -> None:
    top = neighbours(emb)
    r = recalls(top, labels)
    changed = int((top != ref_top).any(axis=1).sum())
    print(f"{tag:<34} max|d| vs CPU {np.abs(emb - ref).max():.2e}  recall@1/5/10 "
          f"{r[1]:.4f}/{r[5]:.4f}/{r[10]:.4f}  top-10 lists changed {changed:>4}  {ips:8.1f} img/s  key {fp}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--backbone", default=None, help="default: efficientnet_lite0 if installed, else "
                                                         "torchvision:resnet50 (random weights)")
    args = parser.parse_args()
    name = args.backbone
    if name is None:
        try:
            import efficientnet_pytorch  # noqa: F401
            name = "efficientnet_lite0"
        except ImportError:
            name = "torchvision:resnet50"
    found = machine()
    print(f"backbone {name}, {args.images} digits; torch {found.torch}, CUDA build {found.cuda}, "
          f"cuDNN {found.cudnn}, GPU {found.gpu}")
    images, labels = digits(args.images)
    with tempfile.TemporaryDirectory() as tmp:
        options = backbone_options(name, Path(tmp))
        cpu = {}
        for bs in BATCHES:
            cpu[bs] = encode(name, options, Request(device="cpu", batch_size=bs), images)
        ref, _, _ = cpu[1]
        ref_top = neighbours(ref)
        for bs in BATCHES:
            report(f"cpu float32 batch {bs}", cpu[bs][0], ref, ref_top, labels, cpu[bs][1], cpu[bs][2])
        same = all(np.array_equal(cpu[bs][0], ref) for bs in BATCHES)
        print(f"CPU embeddings bit-identical across batch sizes {BATCHES}: {same}; one cache key: "
              f"{len({cpu[bs][2] for bs in BATCHES}) == 1}")
        if not found.cuda_available:
            print("no CUDA device: the GPU part is skipped.")
            return
        # the fast settings first: torch's deterministic switches, once set by a reproducible run, stay set
        settings = [(dtype, reproducible) for reproducible in (False, True)
                    for dtype in ("float32", "bfloat16", "float16")]
        for dtype, reproducible in settings:
            runs = {bs: encode(name, options, Request(device="cuda", dtype=dtype, reproducible=reproducible,
                                                      batch_size=bs), images) for bs in BATCHES}
            for bs in BATCHES:
                emb, ips, fp = runs[bs]
                tag = f"cuda {dtype} {'repro' if reproducible else 'fast'} batch {bs}"
                report(tag, emb, ref, ref_top, labels, ips, fp)
            base = runs[1][0]
            print("  vs cuda batch 1: " + ", ".join(f"batch {bs} max|d| {np.abs(runs[bs][0] - base).max():.2e}"
                                                     for bs in BATCHES[1:]))
            print(f"  flags: {current_flags()}")


if __name__ == "__main__":
    main()
