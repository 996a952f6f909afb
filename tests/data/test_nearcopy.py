"""recallk.data.nearcopy: the near-duplicate alarm on clean data (issue 25, the hostile corpus's round 2).

Defect class ``alarm``: pHash alone flagged 0.71% of unrelated pairs of clean glyph images and warned
"the numbers may be inflated", and warned on the built-in digits' first run (8x8 images, far too small
for a perceptual hash). Now a pHash pair must also pass the thumbnail correlation
(:mod:`recallk.data.nearcopy`), and images under 16 px a side are "too small to check". Each case failed
on the code before this file and passes after; planted copies are still found.

Round 2 of the class: the first confirmation (12x12 box-filtered thumbnails, pairs within 4 bits taken
unchecked) still passed 0.012-0.015% of unrelated glyph pairs; the named pairs below are ones it flagged.
"""

from __future__ import annotations

import io
import logging
import string

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageEnhance, ImageFont

from leakage_helpers import near_copy, run_prepare, smooth
from recallk.data import nearcopy, phash
from recallk.images import decode


def glyph(text: str, side: int, shift: int) -> Image.Image:
    """Dark text on white paper, as a scanned glyph set looks."""
    img = Image.new("L", (side, side), 245)
    font = ImageFont.load_default(size=side // 2)
    ImageDraw.Draw(img).text((side // 5 + shift, side // 5), text, fill=20, font=font)
    return img.convert("RGB")


#: Letters and digits without the look-alikes of a sans font (I l 1, O o 0): those pairs are near copies.
CHARS = "".join(c for c in string.ascii_letters + string.digits if c not in "Il1Oo0")


def glyphs(n: int) -> list[Image.Image]:
    """``n`` clean glyph images of distinct two-character texts, 48 to 63 px."""
    rng = np.random.default_rng(3)
    m = len(CHARS)
    texts = [CHARS[k % m] + CHARS[(k // m * 17 + 5 * k) % m] for k in range(n)]
    assert len(set(texts)) == n
    return [glyph(text, 48 + k % 16, int(rng.integers(-3, 4))) for k, text in enumerate(texts)]


def check(images: list[Image.Image]) -> tuple[int, int]:
    """``(pHash pairs within 10 bits, pairs the thumbnails confirm)`` among ``images``."""
    codes = phash.to_codes([phash.phash(im) for im in images])
    thumbs = np.stack([np.frombuffer(nearcopy.thumbnail(im), dtype=np.uint8) for im in images])
    i, j, dist = phash.near_pairs(codes, 10)
    return int(i.size), int(nearcopy.confirmed(thumbs, i, j, dist).sum())


def test_clean_glyphs_are_rarely_near_duplicates():
    """pHash alone pairs 66 of these 11,175 unrelated glyph pairs (one layout for all: the hard case); the
    aligned thumbnails keep none of them (the first confirmation kept 2: ``at``~``aL`` and ``cD``~``d3``)."""
    candidates, confirmed = check(glyphs(150))
    assert candidates >= 30  # the layout fools pHash: the case is real
    assert confirmed * 50 <= candidates


def _confirmed_pair(a: Image.Image, b: Image.Image) -> tuple[int, float, bool]:
    """``(pHash distance, similarity, confirmed)`` of two images."""
    codes = phash.to_codes([phash.phash(a), phash.phash(b)])
    thumbs = np.stack([np.frombuffer(nearcopy.thumbnail(im), dtype=np.uint8) for im in (a, b)])
    dist = phash.popcount(codes[:1] ^ codes[1:])
    return int(dist[0]), float(nearcopy.similarity(thumbs, [0], [1])[0]), bool(
        nearcopy.confirmed(thumbs, [0], [1], dist)[0])


@pytest.mark.parametrize("a, b", [(56, 112), (58, 115)])
def test_named_clean_glyph_pairs_are_not_near_copies(a, b):
    """``at`` ~ ``aL`` and ``cD`` ~ ``d3`` of :func:`glyphs`: 8 bits apart, and the 12x12 thumbnails of the
    first confirmation correlated 0.953 and 0.942 (>= 0.92: flagged). The antialiased, crop-aligned 24x24
    thumbnails see different letters (0.89 and 0.51)."""
    images = glyphs(150)
    dist, sim, ok = _confirmed_pair(images[a], images[b])
    assert dist <= 10 and sim < nearcopy.MIN_SIMILARITY and not ok


def test_unrelated_glyphs_two_bits_apart_are_checked_too():
    """``d2`` and ``sU`` (one size and place) are 2 bits apart: the first confirmation took pairs within
    4 bits unchecked and flagged them. Every pair is checked now (similarity about 0.5)."""
    dist, sim, ok = _confirmed_pair(glyph("d2", 56, 0), glyph("sU", 56, 0))
    assert dist <= 4 and sim < 0.8 and not ok


def edits(img: Image.Image) -> dict[str, Image.Image]:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=60)
    w, h = img.size
    return {"rescale": img.resize((w * 3 // 2, h * 3 // 2), Image.Resampling.BILINEAR),
            "jpeg": decode(buf.getvalue()),
            "crop": img.crop((1, 1, w - 1, h - 1)),  # about 6% of the area
            # 3% of each side off one corner (a 5% one-sided cut of a sharp glyph correlates 0.925-0.957:
            # at the threshold; docs/leakage.md)
            "corner crop": img.crop((w * 3 // 100, h * 3 // 100, w, h)),
            "colour": ImageEnhance.Brightness(ImageEnhance.Contrast(img).enhance(1.08)).enhance(0.93)}


@pytest.mark.parametrize("kind", ["glyph", "smooth photo"])
def test_planted_copies_are_still_confirmed(kind):
    bases = glyphs(12) if kind == "glyph" else [smooth(seed, 64) for seed in range(12)]
    found = []
    for base in bases:
        for edit, copy in edits(base).items():
            codes = phash.to_codes([phash.phash(base), phash.phash(copy)])
            thumbs = np.stack([np.frombuffer(nearcopy.thumbnail(im), dtype=np.uint8) for im in (base, copy)])
            dist = phash.popcount(codes[:1] ^ codes[1:])
            found.append((edit, bool(dist[0] <= 10), bool(nearcopy.confirmed(thumbs, [0], [1], dist)[0])))
    # the thumbnails confirm every copy, the corner crops too (pHash misses many crops: 12 to 16 bits)
    assert [(edit, ok) for edit, _, ok in found if not ok] == []
    plain = [close for edit, close, _ in found if edit != "corner crop"]
    assert sum(plain) >= len(plain) * 3 // 4


def test_similarity_is_symmetric_and_repeatable():
    images = glyphs(12)
    thumbs = np.stack([np.frombuffer(nearcopy.thumbnail(im), dtype=np.uint8) for im in images])
    i, j = np.triu_indices(12, 1)
    forward = nearcopy.similarity(thumbs, i, j)
    assert forward.tobytes() == nearcopy.similarity(thumbs, j, i).tobytes()
    assert forward.tobytes() == nearcopy.similarity(thumbs, i, j).tobytes()
    assert nearcopy.similarity(thumbs, [], []).shape == (0,)


def test_similarity_ignores_brightness_and_contrast_but_not_content():
    base = smooth(1, 64)
    other = smooth(2, 64)
    brighter = ImageEnhance.Brightness(base).enhance(1.3)
    thumbs = np.stack([np.frombuffer(nearcopy.thumbnail(im), dtype=np.uint8) for im in (base, brighter, other)])
    sim = nearcopy.similarity(thumbs, [0, 0], [1, 2])
    assert sim[0] > 0.97 and sim[1] < nearcopy.MIN_SIMILARITY


def test_two_flat_images_compare_by_their_level():
    thumbs = np.stack([np.frombuffer(nearcopy.thumbnail(Image.new("RGB", (40, 40), c)), dtype=np.uint8)
                       for c in ((128, 128, 128), (131, 131, 131), (30, 30, 30))])
    assert nearcopy.similarity(thumbs, [0, 0], [1, 2]).tolist() == [1.0, -1.0]


def test_tiny_images_are_too_small_to_check_and_never_warn(tmp_path, caplog):
    """Like the 8x8 digits: distinct tiny images collide under pHash; the stage says so once, without the
    "may be inflated" warning, and lists no pair."""
    rng = np.random.default_rng(0)
    for label in ("a", "b", "c", "d"):
        (tmp_path / label).mkdir()
        for k in range(8):
            pixels = rng.integers(0, 17, size=(8, 8, 3)).astype(np.uint8) * 15
            Image.fromarray(pixels).save(tmp_path / label / f"{k}.png")
    with caplog.at_level(logging.INFO, logger="recallk.data.prepare"):
        out = run_prepare(tmp_path)
    assert out.summary["too_small_to_check"] == 32 and out.summary["pairs"] == 0 and out.near_duplicates.empty
    assert "32 of 32 images are under 16 px a side, too small to check" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "near-duplicate" in r.getMessage()]


def test_a_small_copy_of_a_large_image_is_still_checked(tmp_path):
    """Only images under 16 px are skipped: a 48 px JPEG copy of a 64 px image is found (a leak)."""
    for label, seeds in {"a": [1, 2, 3], "b": [4, 5, 6]}.items():
        (tmp_path / label).mkdir()
        for seed in seeds:
            smooth(seed).save(tmp_path / label / f"{seed}.png")
    near_copy(smooth(1)).save(tmp_path / "b" / "copy.png")
    out = run_prepare(tmp_path)
    assert set(zip(out.near_duplicates["id_a"], out.near_duplicates["id_b"])) == {("a/1.png", "b/copy.png")}
    assert out.summary["too_small_to_check"] == 0
