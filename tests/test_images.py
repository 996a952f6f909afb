"""recallk.images: decoding to upright RGB, truncated files, JPEG draft decoding."""

from __future__ import annotations

import pytest
from PIL import Image

from helpers import save_image
from recallk import images


def _exif_rotated_jpeg(path):
    """A 20x10 (w x h) JPEG whose EXIF says 'rotate 90 CW' (orientation 6): upright it is 10x20."""
    img = Image.new("RGB", (20, 10), (200, 30, 30))
    exif = Image.Exif()
    exif[0x0112] = 6
    img.save(path, exif=exif)
    return path


@pytest.mark.parametrize("mode, extra", [
    ("L", {}),                      # grayscale -> RGB
    ("RGBA", {}),                   # alpha dropped
    ("P", {"transparency": 0}),     # palette with transparency goes through RGBA
    ("CMYK", {}),                   # CMYK -> RGB
])
def test_decode_gives_rgb(tmp_path, mode, extra):
    path = tmp_path / f"x.{'jpg' if mode == 'CMYK' else 'png'}"
    Image.new(mode, (5, 4)).save(path, **extra)
    img = images.load(path)
    assert img.mode == "RGB" and img.size == (5, 4)


def test_decode_applies_exif_orientation(tmp_path):
    assert images.load(_exif_rotated_jpeg(tmp_path / "r.jpg")).size == (10, 20)


def test_decode_rejects_truncated_file(tmp_path):
    path = save_image(tmp_path / "t.png", size=(64, 64))
    data = path.read_bytes()
    with pytest.raises(images.DECODE_ERRORS):
        images.decode(data[: len(data) // 2])


# --- JPEG draft decoding ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("min_side, size", [
    (224, (500, 375)),     # 1/4 scale: 1/8 would make the short side 188 < 224
    (16, (250, 188)),      # 1/8, the smallest draft scale
    (750, (1000, 750)),    # 1/2: the short side lands exactly on min_side
    (751, (2000, 1500)),   # no reduction keeps both sides >= 751: full size
])
def test_jpeg_draft_keeps_min_side(big_jpeg, min_side, size):
    img = images.decode(big_jpeg, min_side=min_side)
    assert img.size == size and min(img.size) >= min_side and img.mode == "RGB"


def test_no_draft_without_min_side_or_for_png(tmp_path, big_jpeg):
    assert images.decode(big_jpeg).size == (2000, 1500)
    png = save_image(tmp_path / "big.png", seed=3, size=(800, 600)).read_bytes()
    assert images.decode(png, min_side=16).size == (800, 600)

