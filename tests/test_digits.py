"""The committed default dataset is scikit-learn's digits, pixel for pixel."""

from __future__ import annotations

import numpy as np
from PIL import Image

from helpers import DIGITS
from recallk.digits import digit_images, write_digits


def test_committed_digits_match_scikit_learn():
    pixels, labels = digit_images()
    files = sorted(DIGITS.glob("*/*.png"))
    assert len(files) == 1797 == len(labels)
    for path in files:
        index = int(path.stem)
        assert path.parent.name == str(labels[index])  # folder name is the label
        np.testing.assert_array_equal(np.asarray(Image.open(path)), pixels[index])


def test_write_digits_recreates_the_dataset(tmp_path):
    assert write_digits(tmp_path) == 1797
    for rel in ("0/0000.png", "7/0017.png", "8/1796.png"):
        np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / rel)), np.asarray(Image.open(DIGITS / rel)))
    assert sorted(p.name for p in tmp_path.iterdir()) == [str(d) for d in range(10)]
