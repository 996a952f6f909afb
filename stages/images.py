"""Image decoding shared by the catalog probe, the encode stage and the Python API.

Every image goes through :func:`decode`: fully decoded (a truncated file fails
here, not later), EXIF orientation applied, and converted to 8-bit RGB.
"""

from __future__ import annotations

import io
import os

from PIL import Image, ImageOps

#: Exceptions Pillow raises for files that are not (complete) images.
DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def decode(data: bytes) -> Image.Image:
    """Decode image bytes into an upright RGB :class:`PIL.Image.Image`.

    Raises one of :data:`DECODE_ERRORS` when the bytes are not a complete image.
    """
    with Image.open(io.BytesIO(data)) as img:
        img.load()
        upright = ImageOps.exif_transpose(img)
    if upright.mode == "P" and "transparency" in upright.info:
        upright = upright.convert("RGBA")
    return upright.convert("RGB")


def load(path: str | os.PathLike) -> Image.Image:
    """Read and :func:`decode` one image file."""
    with open(path, "rb") as fh:
        return decode(fh.read())
