"""Write scikit-learn's handwritten digits as PNG files, one folder per label.

``python -m recallk.digits data/digits`` recreates the default dataset that ships
in ``data/digits`` (1,797 real 8x8 scans, 10 classes): pixel values 0..16 are
scaled to 0..255 and stored as 8-bit grayscale PNGs named by their index in
``sklearn.datasets.load_digits``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
from PIL import Image

log = logging.getLogger(__name__)


def digit_images() -> tuple[np.ndarray, np.ndarray]:
    """Return ``(images, labels)``: uint8 array (1797, 8, 8) and int array (1797,)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)
    return pixels, digits.target.astype(int)


def write_digits(root: str | Path) -> int:
    """Write every digit to ``root/<label>/<index>.png``; return the number written."""
    root = Path(root)
    pixels, labels = digit_images()
    for index, (img, label) in enumerate(zip(pixels, labels)):
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, mode="L").save(folder / f"{index:04d}.png", optimize=False)
    return len(labels)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="data/digits")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    log.info("wrote %d digit images under %s", write_digits(args.root), args.root)


if __name__ == "__main__":
    main()
