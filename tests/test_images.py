"""recallk.images: decoding to upright RGB, truncated files, JPEG draft decoding, Pillow's warnings named, the pixel
limit read from the header."""

from __future__ import annotations

import io
import logging
import struct
import warnings
import zlib
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from helpers import SPLIT_OUTPUTS, assert_no_outputs, run_fails, save_image, tiny_project
from recallk import images
from recallk.data import catalog
from recallk.images import decode


def _exif_rotated_jpeg(path):
    """A 20x10 (w x h) JPEG whose EXIF says 'rotate 90 CW' (orientation 6): upright it is 10x20."""
    img = Image.new("RGB", (20, 10), (200, 30, 30))
    exif = Image.Exif()
    exif[0x0112] = 6
    img.save(path, exif=exif)
    return path


@pytest.mark.parametrize("mode, extra", [
    ("L", {}),                      # grayscale -> RGB
    ("RGBA", {}),                   # alpha composited over the background (tests/test_transparency.py)
    ("P", {"transparency": 0}),     # palette with transparency goes through RGBA, composited the same way
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


# ---------------------------------------------------------------- Pillow's warnings name the file (issue 25)
# Moved from the hostile corpus (test_hostile_labels.py): Pillow warned without naming the file.


def jpeg_with_broken_exif() -> bytes:
    """An 8x8 JPEG whose EXIF ImageDescription claims 100 bytes at an offset past the block's end."""
    tiff = (b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1) + struct.pack("<HHII", 0x010E, 2, 100, 26)
            + struct.pack("<I", 0))
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buf, "JPEG", exif=b"Exif\x00\x00" + tiff)
    return buf.getvalue()


def test_a_pillow_exif_warning_names_the_file(caplog):
    with caplog.at_level(logging.WARNING, logger="recallk.images"), warnings.catch_warnings():
        warnings.simplefilter("error")  # logged, not warned nameless
        decode(jpeg_with_broken_exif(), name="data/x/broken.jpg")
    assert any(r.getMessage().startswith("data/x/broken.jpg: Pillow warns: Tag data larger than file")
               for r in caplog.records), caplog.text


def test_the_split_probe_names_each_file_pillow_warns_about(tmp_path, caplog):
    """Twice the same warning, for two files: each is named (the default filter showed the first only)."""
    for name in ("one.jpg", "two.jpg"):
        (tmp_path / "a").mkdir(exist_ok=True)
        (tmp_path / "a" / name).write_bytes(jpeg_with_broken_exif())
    frame = pd.DataFrame({"image_id": ["a/one.jpg", "a/two.jpg"], "path": ["a/one.jpg", "a/two.jpg"],
                          "label": ["a", "a"]})
    with caplog.at_level(logging.WARNING, logger="recallk.images"):
        catalog.probe(tmp_path, frame)
    named = {Path(r.getMessage().split(":")[0]).name for r in caplog.records if "Pillow warns" in r.getMessage()}
    assert named == {"one.jpg", "two.jpg"}


def test_without_a_name_pillow_warnings_are_warned_as_before():
    with pytest.warns(UserWarning, match="Tag data larger than file"):
        decode(jpeg_with_broken_exif())


# ---------------------------------------------------------------- the pixel limit, from the header (issue 25)
# Moved from the hostile corpus (test_hostile_limits.py): an image over Pillow's limit, which Pillow only warns about,
# was decoded in full; now its size is read from the header and refused, naming the file.


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def big_bilevel_png(width: int, height: int) -> bytes:
    """A real, complete 1-bit PNG of ``width`` x ``height`` (all black): tiny on disk, huge decoded."""
    row = b"\x00" + b"\x00" * ((width + 7) // 8)
    packer = zlib.compressobj(9)
    idat = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


#: 1.34 x Pillow's MAX_IMAGE_PIXELS: Pillow only warns, so it used to be decoded (360 MB as RGB).
OVER_LIMIT = (12_000, 10_000)


@pytest.mark.stage
def test_an_image_between_1x_and_2x_the_pixel_limit_is_refused_from_its_header(tmp_path):
    """Through the split stage, in process, on the tiny project."""
    proj = tiny_project(tmp_path)
    data = big_bilevel_png(*OVER_LIMIT)
    assert len(data) < 100_000  # a 36 KB file
    (proj / "data" / "digits" / "a" / "huge.png").write_bytes(data)
    run_fails(proj, "split", "a/huge.png", "12000 x 10000 = 120,000,000 pixels", "MAX_PIXELS")
    assert_no_outputs(proj, SPLIT_OUTPUTS)


def test_the_pixel_limit_is_checked_before_decoding(monkeypatch):
    """decode() never calls load() on an image over the limit."""
    monkeypatch.setattr(Image.Image, "load", lambda self: pytest.fail("decoded an image over the limit"))
    with pytest.raises(Image.DecompressionBombError, match="above the limit of 89,478,485"):
        images.decode(big_bilevel_png(*OVER_LIMIT))


def test_an_image_at_the_limit_is_accepted():
    assert images.MAX_PIXELS == 89_478_485 == Image.MAX_IMAGE_PIXELS
    side = 64
    img = images.decode(big_bilevel_png(side, side))
    assert img.size == (side, side) and img.mode == "RGB"
