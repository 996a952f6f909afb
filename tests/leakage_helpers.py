"""Near-duplicate images shared by the leakage tests (importable as ``leakage_helpers``, beside ``helpers``):
seeded smooth images whose pHash survives small edits, planted near copies, and ``prepare_all()`` with the
leakage defaults."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from helpers import SPLIT_FRACTIONS
from recallk.data import prepare
from recallk.data.settings import SplitSettings
from recallk.images import decode
from recallk.settings.base import from_mapping


def smooth(seed: int, size: int = 64) -> Image.Image:
    """A seeded smooth colour image (a 6x6 random grid, bicubic): its pHash is stable under small edits."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(6, 6, 3), dtype=np.uint8)).resize((size, size),
                                                                                        Image.Resampling.BICUBIC)


def near_copy(img: Image.Image) -> Image.Image:
    """A JPEG (quality 70) of the image at 3/4 of its size, decoded: a planted near-copy."""
    buf = io.BytesIO()
    img.resize((img.width * 3 // 4, img.height * 3 // 4), Image.Resampling.BILINEAR).save(buf, "JPEG", quality=70)
    return decode(buf.getvalue())


def write_planted_images(root: Path, spec: dict[str, list[int]], planted: dict[str, tuple[str, int]] | None = None
                         ) -> None:
    """``spec``: label -> seeds of its distinct images (``<label>/<seed>.png``); ``planted``: relative path ->
    (label, seed) of the image it is a near copy of."""
    for label, seeds in spec.items():
        (root / label).mkdir(parents=True, exist_ok=True)
        for seed in seeds:
            smooth(seed).save(root / label / f"{seed}.png")
    for rel, (_, seed) in (planted or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        near_copy(smooth(seed)).save(root / rel)


#: near-duplicate fixtures: label -> seeds of its distinct images
LEAK_LABELS = {f"l{k}": list(range(10 * k, 10 * k + 8)) for k in range(4)}
#: a near copy of each of three images in its own label, and one of l0's image under l3 (cross-label)
LEAK_PLANTED = {"l0/copy_0.png": ("l0", 0), "l1/copy_11.png": ("l1", 11), "l2/copy_23.png": ("l2", 23),
           "l3/copy_of_l0_2.png": ("l0", 2)}


def planted_pairs() -> set[tuple[str, str]]:
    return {tuple(sorted((rel, f"{label}/{seed}.png"))) for rel, (label, seed) in LEAK_PLANTED.items()}


def run_prepare(root: Path, **overrides) -> prepare.Prepared:
    """``prepare_all()`` on ``root`` with per_class defaults, ``images: auto`` and the near-duplicate report."""
    params = dict(data_root=str(root), csv=None, on_bad_image="error", strategy="per_class",
                  protocol="query_gallery", seed=0, fractions=SPLIT_FRACTIONS, images="auto",
                  near_duplicates={"policy": "report", "max_distance": 10}) | overrides
    return prepare.prepare_all(from_mapping(SplitSettings, params))
