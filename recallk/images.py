"""Image decoding shared by the catalog probe, the encode stage and the Python API.

Every image goes through :func:`decode`: fully decoded (a truncated file fails
here, not later), EXIF orientation applied, and converted to 8-bit RGB. Pixels of more
than 8 bits are scaled by their bit depth (16-bit levels, float 0..1), never clipped; those
whose scale is unknown are refused (:func:`_grey_levels`). Transparency (an alpha channel, LA,
a palette's or a colour key's transparency) is composited over a declared background
(``split.background``, default white: :func:`_flatten`), never dropped: dropping it would show
whatever colour happens to be stored under each transparent pixel.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import threading
import warnings
from typing import Iterator

import numpy as np
from PIL import Image, ImageOps

from recallk.errors import quote

log = logging.getLogger(__name__)

#: Bump whenever :func:`decode` could return other pixels (draft rule, EXIF, mode conversion);
#: every backbone fingerprint includes it, so cached embeddings are then recomputed.
DECODE_VERSION = "4"  # 2: 16-bit images (modes I;16* and I) scaled to 8 bits, not clipped;
#                       3: float images (mode F) scaled from 0..1; levels beyond 16 bits or 0..1 refused;
#                       4: transparency composited over the background (it was dropped: the stored colours showed);
#                       the default background, white; another colour is hashed into the fingerprint beside it
#                       (recallk.encode.base.composited_over)

#: ``split.background``'s named colours; any other is written ``"#rrggbb"`` (quoted: YAML reads ``#`` as a comment).
NAMED_BACKGROUNDS = {"white": (255, 255, 255), "black": (0, 0, 0)}
#: The default background (``split.background``): white, as transformers' image processors composite
#: (``transformers.image_transforms.convert_to_rgb``), and the page most transparent images (product shots,
#: logos, icons, scans with the paper cut out) are drawn to be seen on (docs/data.md#transparent-images).
DEFAULT_BACKGROUND = "white"
_HEX_COLOUR = re.compile(r"#[0-9a-fA-F]{6}")


def background_problem(value: object) -> str | None:
    """What is wrong with a ``split.background`` value (``white``, ``black`` or ``"#rrggbb"``), or None."""
    if isinstance(value, str) and (value in NAMED_BACKGROUNDS or _HEX_COLOUR.fullmatch(value)):
        return None
    if value is None:  # `background: #808080` unquoted: YAML reads a comment, and the value is empty
        return ("must be white, black or a colour \"#rrggbb\". Got null instead: write a colour in quotes "
                "(`\"#808080\"`), as YAML reads an unquoted `#` as the start of a comment.")
    return f"must be white, black or a colour \"#rrggbb\". Got {quote(value)} instead."


def background_rgb(value: str) -> tuple[int, int, int]:
    """The RGB colour of a ``split.background`` value; ``ValueError`` for one :func:`background_problem` refuses."""
    problem = background_problem(value)
    if problem:
        raise ValueError(f"background {problem}")
    if value in NAMED_BACKGROUNDS:
        return NAMED_BACKGROUNDS[value]
    return int(value[1:3], 16), int(value[3:5], 16), int(value[5:7], 16)


def background_hex(value: str) -> str:
    """``"#rrggbb"`` (lowercase) of a ``split.background`` value: one name for one colour (``white`` and
    ``"#FFFFFF"`` decode alike, so a fingerprint built on it serves the same cached embeddings)."""
    return "#{:02x}{:02x}{:02x}".format(*background_rgb(value))


#: Largest image accepted, in pixels (width x height, from the header, before anything is decoded): Pillow's
#: own ``MAX_IMAGE_PIXELS`` (89,478,485, about 9459 x 9459; 256 MiB as RGB). Pillow only warns between this and
#: twice it, so without this check an 809 KB PNG of 1.3 x the limit would be decoded in full (over 1 GB).
MAX_PIXELS = 89_478_485

#: Exceptions Pillow raises for files that are not (complete) images.
DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


#: Held while Pillow's warnings are captured (``warnings.catch_warnings`` swaps process-wide state, and the
#: split stage decodes in threads); only the cheap steps (the header, the EXIF) run under it.
_WARNINGS_LOCK = threading.Lock()


@contextlib.contextmanager
def _named_warnings(name: str | None) -> Iterator[None]:
    """Pillow's warnings of the block (``Corrupt EXIF data``, ``Tag data larger than file``), logged once
    each with the file ``name`` they are about; without a name they are warned again as they were."""
    with _WARNINGS_LOCK, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # refused below, with a clearer message
        yield
    for w in caught:
        if name is None:
            warnings.warn(w.message, w.category, stacklevel=4)
        else:
            log.warning("%s: Pillow warns: %s (the image is used as decoded)", name, w.message)


def decode(data: bytes, min_side: int | None = None, name: str | None = None,
           background: str = DEFAULT_BACKGROUND) -> Image.Image:
    """Decode image bytes into an upright RGB :class:`PIL.Image.Image`.

    With ``min_side``, a JPEG may be decoded at a reduced scale (Pillow's
    ``draft``: 1/2, 1/4 or 1/8) as long as both sides stay >= ``min_side``;
    much faster for large photos that a backbone shrinks anyway, and deterministic.
    Transparent and translucent pixels are composited over ``background`` (a ``split.background``
    value, :func:`_flatten`).
    Raises one of :data:`DECODE_ERRORS` when the bytes are not a complete image, or when the
    header claims more than :data:`MAX_PIXELS` pixels (checked before decoding).
    Pillow's warnings about the header or the EXIF block are logged naming ``name`` (the file).
    """
    return decode_noting_transparency(data, min_side, name, background)[0]


def decode_noting_transparency(data: bytes, min_side: int | None = None, name: str | None = None,
                               background: str = DEFAULT_BACKGROUND) -> tuple[Image.Image, bool]:
    """:func:`decode`, and whether the image has transparency: a pixel whose alpha is below 255 (once a
    palette's or a colour key's transparency is applied), which compositing over ``background`` changed
    (the split stage counts these images)."""
    rgb = background_rgb(background)  # first: a bad value is refused before any work
    with _named_warnings(name):
        img = Image.open(io.BytesIO(data))
    with img:
        width, height = img.size
        if width * height > MAX_PIXELS:
            raise Image.DecompressionBombError(
                f"{width} x {height} = {width * height:,} pixels, above the limit of {MAX_PIXELS:,} "
                "(recallk.images.MAX_PIXELS, Pillow's MAX_IMAGE_PIXELS): downscale the image")
        if min_side and img.format == "JPEG":
            img.draft("RGB", (min_side, min_side))
        img.load()
        with _named_warnings(name):
            upright = ImageOps.exif_transpose(img)
    if upright.mode.startswith("I;16") or upright.mode in ("I", "F"):
        upright = _grey_levels(upright)
    return _flatten(upright, rgb)


def _flatten(img: Image.Image, background: tuple[int, int, int]) -> tuple[Image.Image, bool]:
    """``img`` as RGB with every pixel composited over ``background``, and whether any pixel had alpha below 255.

    Any transparency Pillow knows (:meth:`PIL.Image.Image.has_transparency_data`: modes RGBA, LA, PA, RGBa, La,
    a palette with alpha, a ``transparency`` key of a palette, grey or RGB image) is applied by converting to
    RGBA; then each channel is ``(c * a + b * (255 - a)) / 255`` rounded to the nearest integer (exact
    integer arithmetic: a fully transparent pixel is the background, an opaque one keeps its colour). Without
    transparency the image is converted as before (``convert("RGB")``), so opaque images decode unchanged.
    """
    if not img.has_transparency_data:
        return img.convert("RGB"), False
    rgba = np.asarray(img.convert("RGBA"))
    alpha = rgba[..., 3:].astype(np.uint16)
    if alpha.min() == 255:  # an alpha channel, or a transparent palette entry, that no pixel uses
        return Image.fromarray(np.ascontiguousarray(rgba[..., :3]), "RGB"), False
    # c * a + b * (255 - a) + 127 <= 255 * 255 + 127 fits 16 bits; 255 is odd, so // rounds with no tie
    flat = rgba[..., :3].astype(np.uint16) * alpha
    flat += np.asarray(background, dtype=np.uint16) * (255 - alpha)
    flat += 127
    flat //= 255
    return Image.fromarray(flat.astype(np.uint8), "RGB"), True


def _grey_levels(img: Image.Image) -> Image.Image:
    """8-bit grey levels of a 16-bit, 32-bit integer or float image, scaled by its bit depth, never clipped.

    Integer pixels (modes ``I;16*`` and ``I``) are 16-bit levels 0..65535, divided by 257; float pixels
    (mode ``F``) are brightness 0..1, times 255. A 32-bit image with levels beyond 0..65535, or a float
    one beyond 0..1 (or NaN/inf), has no known scale: a guess would silently turn it black or white, so
    it is refused (``ValueError``, a decode error that names the range and the fix).
    """
    is_float = img.mode == "F"
    values = np.asarray(img if is_float else img.convert("I"), dtype=np.float64)
    top, what = (1.0, "floating-point pixels (mode F)") if is_float else (65535.0, "32-bit integer pixels (mode I)")
    if not np.isfinite(values).all():
        raise ValueError(f"{what} include NaN or inf; save the image with 8 or 16 bits per channel")
    lo, hi = values.min(), values.max()
    if lo < 0 or hi > top:
        need = "0..1" if is_float else "16-bit levels 0..65535"
        raise ValueError(f"{what} span {lo:g}..{hi:g}, beyond {need}, so their brightness scale is unknown; "
                         f"{'scale them to 0..1 or ' if is_float else ''}save the image with 8 or 16 bits per channel")
    return Image.fromarray(np.rint(values * 255.0 if is_float else values / 257.0).astype(np.uint8), "L")


def describe_error(exc: BaseException) -> str:
    """A stable one-line reason for a decode failure (no object addresses, so reports never churn)."""
    if isinstance(exc, Image.UnidentifiedImageError):
        return "not a recognised image format"
    return re.sub(r"<[^>]* at 0x[0-9a-f]+>", "<data>", str(exc)) or type(exc).__name__


def load(path: str | os.PathLike, background: str = DEFAULT_BACKGROUND) -> Image.Image:
    """Read and :func:`decode` one image file (transparency composited over ``background``)."""
    with open(path, "rb") as fh:
        return decode(fh.read(), name=str(path), background=background)
