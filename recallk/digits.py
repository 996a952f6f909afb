"""Write scikit-learn's handwritten digits as PNG files, one folder per label.

``python -m recallk.digits data/digits`` recreates the default dataset that ships
in ``data/digits`` (1,797 real 8x8 scans, 10 classes): pixel values 0..16 are
scaled to 0..255 and stored as 8-bit grayscale PNGs named by their index in
``sklearn.datasets.load_digits``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from recallk.atomic import Folder, write_all
from recallk.errors import InputError

log = logging.getLogger(__name__)


def digit_images() -> tuple[np.ndarray, np.ndarray]:
    """Return ``(images, labels)``: uint8 array (1797, 8, 8) and int array (1797,)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)
    return pixels, digits.target.astype(int)


def write_digits(root: str | Path) -> int:
    """Write every digit to ``root/<label>/<index>.png``, all or nothing (:func:`recallk.atomic.write_all`: each
    label's folder is filled in a temp folder beside it, and the ten are renamed into place together, over
    any old ones); return the number written."""
    root = Path(root)
    pixels, labels = digit_images()

    def png(img: np.ndarray):
        return lambda path: Image.fromarray(img, mode="L").save(path, format="PNG", optimize=False)

    folders: dict[int, dict[str, object]] = {}
    for index, (img, label) in enumerate(zip(pixels, labels)):
        folders.setdefault(int(label), {})[f"{index:04d}.png"] = png(img)
    write_all([(root / str(label), Folder(files)) for label, files in sorted(folders.items())])
    return len(labels)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="data/digits")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        n = write_digits(args.root)
    except InputError as exc:  # e.g. a full disk: one line, no traceback, nothing half-written
        sys.stderr.write(f"error: {exc}\n")
        return 2
    log.info("wrote %d digit images under %s", n, args.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
