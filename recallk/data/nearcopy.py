"""The second, independent measure that confirms a pHash pair, and the images too small to check.

pHash (:mod:`recallk.data.phash`) keeps only the signs of 64 low DCT frequencies against their median, so
unrelated images of one layout (glyphs on a blank page, product shots on white) agree in most bits: on 570
clean glyph images, 0.2-0.7% of unrelated pairs were within 10 bits. A pair is therefore reported only when
a second measure that keeps what pHash throws away also says "the same picture":

* :func:`thumbnail`: the image in grey levels, shrunk with an antialiasing (Lanczos) filter to
  :data:`THUMB` x :data:`THUMB` pixels (``Image.reduce`` first on large photos), kept as bytes (probe time,
  one per image, never written to the catalog). The filter matters: a box-filtered thumbnail aliases, and
  a slightly cropped copy's thumbnail then differs from the resampled original by more than two unrelated
  glyphs do;
* :func:`similarity`: the Pearson correlation of two thumbnails' grey levels (brightness and contrast
  shifts cancel) after aligning them for a small crop: one thumbnail is resampled (bilinear) on the box of
  the other's frame that a crop of up to :data:`MAX_CUT` of each side would leave, the box chosen per
  axis by matching the two images' mean row and column profiles (1-D, cheap), both ways round (either
  image may be the cropped one), and the uncropped frame always tried; two flat thumbnails compare by
  their mean level alone;
* a pair is a near copy when its pHash distance is within ``split.near_duplicates.max_distance`` *and* its
  similarity is at least :data:`MIN_SIMILARITY`. No distance is close enough to skip the check: unrelated
  glyphs 2 bits apart occur (bench/near_duplicate_alarm.py).

An image whose shorter side is under :data:`MIN_SIDE` pixels is "too small to check": pHash upscales it to
32x32 first, so distinct small images (the 8x8 digits) collide, and its thumbnail would be upscaled too.
Such images take part in no pair and are counted instead (the figures:
``bench/near_duplicate_alarm.py``, docs/leakage.md).

pHash and the grey thumbnail both see grey levels only, so a red and a blue circle, or two skin-tone
swatches of one shape, pass both. The thumbnail therefore also carries the image's colours
(:func:`colours`: :data:`COLOUR` x :data:`COLOUR` RGB cells of the composited image, after the grey bytes),
and :func:`confirmed` also requires :func:`colour_distance` of at most :data:`MAX_COLOUR_DISTANCE`: a
pair whose colours differ is not a copy, however alike its grey levels.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

#: Thumbnail side, in pixels.
THUMB = 24
#: The shorter side under which an image is too small to check.
MIN_SIDE = 16
#: The share of a side a crop may remove (both ends together), searched in steps of :data:`CUT_STEP`.
MAX_CUT = 0.07
#: The step of the crop search, as a share of the side.
CUT_STEP = 0.01
#: The correlation a pHash pair must reach to be reported as a near copy.
MIN_SIMILARITY = 0.94
#: A thumbnail whose grey levels vary less than this (standard deviation) is flat: no pattern to correlate.
FLAT = 2.0
#: Thumbnail pixels left out at each border when correlating (resampling clamps there).
MARGIN = 1
#: Colour cells per side (:func:`colours`), the share of cells :func:`colour_distance` reads (its 75th
#: percentile cell), and the largest distance of a near copy (mean absolute RGB difference, 0-255).
#: Measured (docs/leakage.md): planted JPEG, rescale and 5-10% crops stay under 20; colour edits
#: (brightness, contrast, saturation and gamma within 10%, an RGB offset of 8) are under 24 in 96% of
#: cases (up to 34); red/green/blue versions of one shape are over 100, and adjacent skin-tone swatches
#: 20-45 (a swatch one 10% brightness step from the next is a limit: no colour measure tells them apart).
COLOUR = 8
_PCT = 75
MAX_COLOUR_DISTANCE = 24.0
#: Pairs compared per block (bounds the memory: about 60 KB per pair).
_BLOCK = 2048
#: What the check stands for; bump it if :func:`thumbnail` or :func:`similarity` could change their values.
METHOD = (f"pHash pairs confirmed by a {THUMB}x{THUMB} antialiased grey thumbnail correlation >= {MIN_SIMILARITY}, "
          f"aligned for crops of up to {MAX_CUT:.0%} of a side, and {COLOUR}x{COLOUR} RGB cells within "
          f"{MAX_COLOUR_DISTANCE:g} levels; images under {MIN_SIDE} px a side too small to check")


def too_small(width: np.ndarray, height: np.ndarray) -> np.ndarray:
    """Which images (by their sides) are too small to check."""
    return np.minimum(np.asarray(width, dtype=np.int64), np.asarray(height, dtype=np.int64)) < MIN_SIDE


def thumbnail(image: Image.Image) -> bytes:
    """``image`` (upright RGB) as grey levels shrunk to :data:`THUMB` x :data:`THUMB` with a Lanczos
    (antialiasing) filter, row-major, one byte each; then its :func:`colours`."""
    grey = image.convert("L")
    factor = max(1, min(grey.width, grey.height) // (4 * THUMB))
    if factor > 1:  # cheap exact area averaging first, on large photos (the filter still has 4 pixels per output)
        grey = grey.reduce(factor)
    return grey.resize((THUMB, THUMB), Image.Resampling.LANCZOS).tobytes() + colours(image)


def colours(image: Image.Image) -> bytes:
    """``image``'s RGB levels averaged over :data:`COLOUR` x :data:`COLOUR` cells (a box filter), row-major,
    three bytes a cell (the image as decoded: transparency already composited over ``split.background``)."""
    return image.convert("RGB").resize((COLOUR, COLOUR), Image.Resampling.BOX).tobytes()


def colour_distance(thumbs: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """The colour distance of each pair (rows of :func:`thumbnail`): for each cell of one image, the smallest
    mean absolute RGB difference (0-255) to the cells within one cell of it in the other (crops and
    rescales move content); the 75th percentile of the cells, the larger of both ways round. Rows without
    colour cells (grey thumbnails alone) are at distance 0."""
    t = np.asarray(thumbs, dtype=np.uint8)
    t = t.reshape(len(t), -1)
    i, j = np.asarray(i, dtype=np.intp), np.asarray(j, dtype=np.intp)
    if t.shape[1] < THUMB * THUMB + COLOUR * COLOUR * 3 or not i.size:
        return np.zeros(i.size)
    c = t[:, THUMB * THUMB:THUMB * THUMB + COLOUR * COLOUR * 3].reshape(-1, COLOUR, COLOUR, 3).astype(np.float32)
    out = np.empty(i.size)
    for lo in range(0, i.size, _BLOCK):
        a, b = c[i[lo:lo + _BLOCK]], c[j[lo:lo + _BLOCK]]
        out[lo:lo + _BLOCK] = np.maximum(_worst_cell(a, b), _worst_cell(b, a))
    return out


def _worst_cell(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    pad = np.pad(b, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
    best = np.full(a.shape[:3], np.inf, dtype=np.float32)
    for dy in range(3):
        for dx in range(3):
            best = np.minimum(best, np.abs(a - pad[:, dy:dy + COLOUR, dx:dx + COLOUR]).mean(axis=3))
    return np.percentile(best.reshape(len(a), -1), _PCT, axis=1)


def _boxes() -> np.ndarray:
    """``(lo, hi)`` of every crop box searched along one axis (normalised), the whole frame first."""
    k = int(round(MAX_CUT / CUT_STEP))
    return np.array([(a * CUT_STEP, 1 - c * CUT_STEP) for a in range(k + 1) for c in range(k + 1 - a)])


def _taps(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear taps ``(x0, x1, weight of x1)``, each ``(len(lo), THUMB)``: output pixel ``k`` of a box
    ``(lo, hi)`` samples the thumbnail at ``lo + (hi - lo) (k + 1/2) / THUMB`` (normalised)."""
    k = (np.arange(THUMB) + 0.5) / THUMB
    x = np.clip((lo[:, None] + (hi - lo)[:, None] * k) * THUMB - 0.5, 0, THUMB - 1)
    x0 = np.floor(x).astype(np.intp)
    return x0, np.minimum(x0 + 1, THUMB - 1), (x - x0).astype(np.float32)


_BOXES = _boxes()
_X0, _X1, _W = _taps(_BOXES[:, 0], _BOXES[:, 1])
#: The resampling of a profile onto each box, as one matrix: ``(len(_BOXES) * THUMB, THUMB)``.
_RESAMPLE = np.zeros((len(_BOXES), THUMB, THUMB), dtype=np.float32)
np.add.at(_RESAMPLE, (np.arange(len(_BOXES))[:, None], np.arange(THUMB)[None, :], _X0), 1 - _W)
np.add.at(_RESAMPLE, (np.arange(len(_BOXES))[:, None], np.arange(THUMB)[None, :], _X1), _W)
_RESAMPLE = _RESAMPLE.reshape(-1, THUMB)


def _unit(x: np.ndarray) -> np.ndarray:
    """Each row (last axis) minus its mean, over its norm (a flat row stays 0)."""
    x = x - x.mean(axis=-1, keepdims=True)
    return x / np.maximum(np.sqrt((x * x).sum(axis=-1, keepdims=True)), 1e-6)


def _best_box(profile_a: np.ndarray, profile_b: np.ndarray) -> np.ndarray:
    """The box of ``b``'s frame whose resampled profile correlates best with ``a``'s (ties: the first)."""
    sampled = _unit((profile_b @ _RESAMPLE.T).reshape(len(profile_b), len(_BOXES), THUMB))
    return np.argmax(np.einsum("pk,pbk->pb", _unit(profile_a), sampled), axis=1)


def _inner(t: np.ndarray) -> np.ndarray:
    m = MARGIN
    return _unit(t[:, m:THUMB - m, m:THUMB - m].reshape(len(t), -1))


def _aligned(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The correlation of thumbnails ``a`` with ``b`` resampled on the box ``a`` looks cropped from."""
    rows, cols = _best_box(a.mean(axis=2), b.mean(axis=2)), _best_box(a.mean(axis=1), b.mean(axis=1))
    p = np.arange(len(b))[:, None]
    wy = _W[rows][:, :, None]
    r = b[p, _X0[rows]] * (1 - wy) + b[p, _X1[rows]] * wy  # rows resampled, (P, THUMB, THUMB)
    shape = r.shape
    x0 = np.broadcast_to(_X0[cols][:, None, :], shape)
    x1 = np.broadcast_to(_X1[cols][:, None, :], shape)
    wx = _W[cols][:, None, :]
    c = np.take_along_axis(r, x0, axis=2) * (1 - wx) + np.take_along_axis(r, x1, axis=2) * wx
    return (_inner(a) * _inner(c)).sum(axis=1)


def similarity(thumbs: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """The similarity of each pair ``(i[k], j[k])`` of ``thumbs`` (uint8, ``(n, THUMB * THUMB)``: the
    rows of :func:`thumbnail`), in [-1, 1].

    The best of: the correlation as they are, ``i`` against the crop box of ``j`` it matches, and ``j``
    against the crop box of ``i`` (:data:`MAX_CUT`). Two flat thumbnails are similar (1.0) when their mean
    levels differ by at most 8 of 255, else -1.0; one flat and one not: 0.0.
    """
    i, j = np.asarray(i, dtype=np.intp), np.asarray(j, dtype=np.intp)
    out = np.empty(i.size)
    if not i.size:
        return out
    t = np.asarray(thumbs, dtype=np.uint8)
    t = t.reshape(len(t), -1)[:, :THUMB * THUMB].reshape(-1, THUMB, THUMB)
    for lo in range(0, i.size, _BLOCK):
        ti = t[i[lo:lo + _BLOCK]].astype(np.float32)
        tj = t[j[lo:lo + _BLOCK]].astype(np.float32)
        best = np.maximum((_inner(ti) * _inner(tj)).sum(axis=1), np.maximum(_aligned(ti, tj), _aligned(tj, ti)))
        si, sj = ti.reshape(len(ti), -1).std(axis=1), tj.reshape(len(tj), -1).std(axis=1)
        level = np.abs(ti.reshape(len(ti), -1).mean(axis=1) - tj.reshape(len(tj), -1).mean(axis=1))
        flat_i, flat_j = si < FLAT, sj < FLAT
        out[lo:lo + _BLOCK] = np.where(flat_i & flat_j, np.where(level <= 8, 1.0, -1.0),
                                       np.where(flat_i | flat_j, 0.0, best))
    return out


def confirmed(thumbs: np.ndarray, i: np.ndarray, j: np.ndarray, distance: np.ndarray) -> np.ndarray:
    """Which pHash pairs ``(i, j)`` (at ``distance`` bits, within the split's ``max_distance``) are near
    copies: those the thumbnails confirm (:data:`MIN_SIMILARITY`) whose colours agree too
    (:data:`MAX_COLOUR_DISTANCE`). ``distance`` is not needed by the rule; it is kept so that callers state
    what they confirm."""
    if not len(i):
        return np.zeros(0, dtype=bool)
    return (similarity(thumbs, i, j) >= MIN_SIMILARITY) & (colour_distance(thumbs, i, j) <= MAX_COLOUR_DISTANCE)
