"""Helpers of the torch backbone families' tests (importable as ``torch_helpers``): real images,
weights files in every format, broken checkpoints, the library's own reference embeddings."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from PIL import Image

#: Embeddings of the stage vs the library's own batched forward: per-image CPU kernels differ by ~1e-6.
ATOL = 1e-5


def photos(n: int = 3, seed: int = 0) -> list[Image.Image]:
    """``n`` small seeded RGB images of different sizes (through Pillow, like decoded files)."""
    rng = np.random.default_rng(seed)
    sizes = [(20, 30), (41, 17), (32, 32), (9, 50), (64, 48)]
    return [Image.fromarray(rng.integers(0, 256, (*sizes[i % len(sizes)], 3), dtype=np.uint8)) for i in range(n)]


def save_state_dict(state: dict[str, torch.Tensor], path: Path) -> Path:
    """Write ``state`` as the suffix says: ``.safetensors`` (safetensors), else ``torch.save``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in state.items()}
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)
    return path


def broken(state: dict[str, torch.Tensor], case: str) -> tuple[dict[str, torch.Tensor], str]:
    """A copy of ``state`` with one ``case`` of damage (missing / unexpected / shape) and the
    message fragment naming it."""
    out = dict(state)
    key = sorted(k for k, v in out.items() if v.ndim >= 1)[0]
    if case == "missing":
        del out[key]
        return out, rf"1 missing key\(s\): {key}"
    if case == "unexpected":
        out["extra.weight"] = torch.zeros(3)
        return out, r"1 unexpected key\(s\): extra\.weight"
    assert case == "shape"
    out[key] = torch.zeros(*(s + 1 for s in out[key].shape))
    return out, rf"1 key\(s\) of another shape: {key}"


def reference(forward: Callable[[torch.Tensor], torch.Tensor], transform: Callable[[Image.Image], torch.Tensor],
              images: Sequence[Image.Image]) -> np.ndarray:
    """The library's own embedding: its forward on its own preprocessed batch."""
    with torch.no_grad():
        return forward(torch.stack([transform(img.convert("RGB")) for img in images])).numpy()
