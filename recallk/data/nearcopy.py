"""The second, independent measure that confirms a pHash pair, and the images too small to check.

pHash (:mod:`recallk.data.phash`) keeps only the signs of 64 low DCT frequencies against their median, so
unrelated images of one layout (glyphs on a blank page, product shots on white) agree in most bits: on 570
clean glyph images, 0.71% of unrelated pairs were within 10 bits. A pair is therefore reported only when
a second measure that keeps what pHash throws away also says "the same picture":

* :func:`thumbnail`: the image in grey levels, shrunk by area averaging (``Image.reduce`` then a box
  filter) to :data:`THUMB` x :data:`THUMB` pixels, twice: the whole image and its centre (:data:`CROP` of
  each side), kept as bytes (probe time, one per image, never written to the catalog);
* :func:`similarity`: the Pearson correlation of two thumbnails' grey levels (brightness and contrast
  shifts cancel), the best over shifts of up to :data:`MAX_SHIFT` thumbnail pixels and over whole
  against whole or centre against whole (a small crop moves and enlarges the content); two flat
  thumbnails compare by their mean level alone;
* a pair is a near copy when its pHash distance is within ``split.near_duplicates.max_distance`` *and*
  either its similarity is at least :data:`MIN_SIMILARITY` or the hashes are within :data:`CERTAIN_BITS`.

An image whose shorter side is under :data:`MIN_SIDE` pixels is "too small to check": pHash upscales it to
32x32 first, so distinct small images (the 8x8 digits) collide, and its thumbnail would be upscaled too.
Such images take part in no pair and are counted instead (the figures:
``bench/near_duplicate_alarm.py``, docs/leakage.md).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

#: Thumbnail side, in pixels.
THUMB = 12
#: The shorter side under which an image is too small to check.
MIN_SIDE = 16
#: Thumbnail shifts tried, in pixels each way (a 5-10% crop moves a 12-pixel thumbnail by under 1).
MAX_SHIFT = 1
#: The share of each side kept in the second thumbnail (the image's centre).
CROP = 0.94
#: The correlation a pHash pair must reach to be reported as a near copy.
MIN_SIMILARITY = 0.92
#: pHash distances this small are a near copy without the thumbnails' word (unrelated images that close
#: are rare even among glyphs: bench/near_duplicate_alarm.py).
CERTAIN_BITS = 4
#: A thumbnail whose grey levels vary less than this (standard deviation) is flat: no pattern to correlate.
FLAT = 2.0
#: What the check stands for; bump it if :func:`thumbnail` or :func:`similarity` could change their values.
METHOD = (f"pHash pairs confirmed by a {THUMB}x{THUMB} grey thumbnail correlation >= {MIN_SIMILARITY} (or within "
          f"{CERTAIN_BITS} bits); images under {MIN_SIDE} px a side too small to check")


def too_small(width: np.ndarray, height: np.ndarray) -> np.ndarray:
    """Which images (by their sides) are too small to check."""
    return np.minimum(np.asarray(width, dtype=np.int64), np.asarray(height, dtype=np.int64)) < MIN_SIDE


def thumbnail(image: Image.Image) -> bytes:
    """``image`` (upright RGB) as grey levels shrunk to :data:`THUMB` x :data:`THUMB`, row-major, one byte
    each: the whole image, then its centre at :data:`CROP` of each side (a slightly cropped copy meets it)."""
    grey = image.convert("L")
    factor = max(1, min(grey.width, grey.height) // (4 * THUMB))
    if factor > 1:  # cheap exact area averaging first, on large photos
        grey = grey.reduce(factor)
    w, h = grey.size
    box = ((1 - CROP) / 2 * w, (1 - CROP) / 2 * h, (1 + CROP) / 2 * w, (1 + CROP) / 2 * h)
    return (grey.resize((THUMB, THUMB), Image.Resampling.BOX).tobytes()
            + grey.resize((THUMB, THUMB), Image.Resampling.BOX, box=box).tobytes())


def _windows(thumbs: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """The ``(THUMB - 2 MAX_SHIFT)``-square window of each thumbnail at offset ``(dy, dx)``, flattened."""
    s, m = THUMB, MAX_SHIFT
    return thumbs[:, m + dy:s - m + dy, m + dx:s - m + dx].reshape(thumbs.shape[0], -1)


def _correlation(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise Pearson correlation of ``a`` and ``b`` (float arrays of equal shape), and whether both rows
    are flat (then the correlation is meaningless and 0 is returned for it)."""
    a = a - a.mean(axis=1, keepdims=True)
    b = b - b.mean(axis=1, keepdims=True)
    sa, sb = np.sqrt((a * a).mean(axis=1)), np.sqrt((b * b).mean(axis=1))
    flat = (sa < FLAT) | (sb < FLAT)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(flat, 0.0, (a * b).mean(axis=1) / (sa * sb))
    return r, (sa < FLAT) & (sb < FLAT)


def similarity(thumbs: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """The similarity of each pair ``(i[k], j[k])`` of ``thumbs`` (uint8, ``(n, 2 * THUMB * THUMB)``: the
    rows of :func:`thumbnail`), in [-1, 1].

    The centre window of ``i``'s thumbnail against ``j``'s at every shift of up to :data:`MAX_SHIFT`
    pixels, and the other way round; the best correlation wins. Two flat thumbnails are similar (1.0)
    when their mean levels differ by at most 8 of 255, else -1.0; one flat and one not: 0.0.
    """
    t = np.asarray(thumbs, dtype=np.float64).reshape(-1, 2, THUMB, THUMB)
    ti, tj = t[np.asarray(i, dtype=np.int64)], t[np.asarray(j, dtype=np.int64)]
    best = np.full(ti.shape[0], -1.0)
    both_flat = np.zeros(ti.shape[0], dtype=bool)
    # whole against whole, and each one's centre against the other whole (one of them cropped a little)
    for vi, vj in ((0, 0), (1, 0), (0, 1)):
        centre_i, centre_j = _windows(ti[:, vi], 0, 0), _windows(tj[:, vj], 0, 0)
        for dy in range(-MAX_SHIFT, MAX_SHIFT + 1):
            for dx in range(-MAX_SHIFT, MAX_SHIFT + 1):
                for a, b in ((centre_i, _windows(tj[:, vj], dy, dx)), (_windows(ti[:, vi], dy, dx), centre_j)):
                    r, flat = _correlation(a, b)
                    best = np.maximum(best, r)
                    both_flat |= flat
    ti, tj = ti[:, 0], tj[:, 0]
    level = np.abs(ti.reshape(ti.shape[0], -1).mean(axis=1) - tj.reshape(tj.shape[0], -1).mean(axis=1))
    return np.where(both_flat, np.where(level <= 8, 1.0, -1.0), best)


def confirmed(thumbs: np.ndarray, i: np.ndarray, j: np.ndarray, distance: np.ndarray) -> np.ndarray:
    """Which pHash pairs ``(i, j)`` at ``distance`` bits are near copies: within :data:`CERTAIN_BITS`, or
    confirmed by the thumbnails (:data:`MIN_SIMILARITY`)."""
    if not len(i):
        return np.zeros(0, dtype=bool)
    return (np.asarray(distance) <= CERTAIN_BITS) | (similarity(thumbs, i, j) >= MIN_SIMILARITY)
