"""Image decoding shared by the catalog probe, the encode stage and the Python API.

Every image goes through :func:`decode`: fully decoded (a truncated file fails
here, not later), EXIF orientation applied, and converted to 8-bit RGB.
"""

from __future__ import annotations

import io
import os
import re

import numpy as np
from PIL import Image, ImageOps

#: Bump whenever :func:`decode` could return other pixels (draft rule, EXIF, mode conversion);
#: every backbone fingerprint includes it, so cached embeddings are then recomputed.
DECODE_VERSION = "2"  # 2: 16-bit images (modes I;16* and I) scaled to 8 bits, not clipped

#: Exceptions Pillow raises for files that are not (complete) images.
DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def decode(data: bytes, min_side: int | None = None) -> Image.Image:
    """Decode image bytes into an upright RGB :class:`PIL.Image.Image`.

    With ``min_side``, a JPEG may be decoded at a reduced scale (Pillow's
    ``draft``: 1/2, 1/4 or 1/8) as long as both sides stay >= ``min_side``;
    much faster for large photos that a backbone shrinks anyway, and deterministic.
    Raises one of :data:`DECODE_ERRORS` when the bytes are not a complete image.
    """
    with Image.open(io.BytesIO(data)) as img:
        if min_side and img.format == "JPEG":
            img.draft("RGB", (min_side, min_side))
        img.load()
        upright = ImageOps.exif_transpose(img)
    if upright.mode == "P" and "transparency" in upright.info:
        upright = upright.convert("RGBA")
    if upright.mode.startswith("I;16") or upright.mode == "I":  # 16-bit levels: scale, do not clip at 255
        levels = np.asarray(upright.convert("I"), dtype=np.float64)
        upright = Image.fromarray(np.clip(np.rint(levels / 257.0), 0, 255).astype(np.uint8), "L")
    return upright.convert("RGB")


def describe_error(exc: BaseException) -> str:
    """A stable one-line reason for a decode failure (no object addresses, so reports never churn)."""
    if isinstance(exc, Image.UnidentifiedImageError):
        return "not a recognised image format"
    return re.sub(r"<[^>]* at 0x[0-9a-f]+>", "<data>", str(exc)) or type(exc).__name__


def load(path: str | os.PathLike) -> Image.Image:
    """Read and :func:`decode` one image file."""
    with open(path, "rb") as fh:
        return decode(fh.read())
