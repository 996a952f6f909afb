"""Images as the model should see them (issue 38): transparency composited over ``split.background``, never dropped.

Real RGBA, LA and palette PNGs made here with Pillow, whose transparent pixels hold garbage colours (random RGB
under alpha 0): decoded through the pipeline's path (``recallk.images.decode`` / ``load``, the split stage's probe,
the encode and score stages), they give the metrics of the same images flattened over the background beforehand,
and not those of the alpha dropped (Pillow's ``convert("RGB")``, what torchvision's, timm's and open_clip's loaders
do). The pHash check composites the same way, the background is part of the backbone fingerprint, and opaque
images (the committed digits) decode exactly as before.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import (
    CATALOG,
    COUNTS,
    DIGITS,
    EMBEDDINGS,
    IDS,
    METRICS,
    PER_QUERY,
    new_project,
    read_csv,
    run_in_process,
    set_params,
)
from recallk import images
from recallk.data import catalog
from recallk.data.phash import phash
from recallk.encode.registry import encode_pixels, get_backbone
from recallk.errors import InputError
from recallk.evaluation import evaluate
from stages.params import validate_section
from stages.runner import background_of

WHITE, BLACK, GREY = (255, 255, 255), (0, 0, 0), (128, 128, 128)
SIDE, OBJECT = 24, 10  # each image: an opaque square of its label's colour on a transparent field of garbage
LABEL_COLOURS = {"red": (200, 40, 40), "green": (40, 170, 60), "blue": (50, 60, 200), "yellow": (210, 190, 40)}
PER_LABEL = 6


def garbage_rgba(seed: int, colour: tuple[int, int, int]) -> np.ndarray:
    """SIDE x SIDE RGBA, alpha 0 but for an opaque OBJECT-square of ``colour`` (with noise, near the centre)
    and a half-transparent ring around it (alpha 128). Under the alpha lie garbage colours, as in real files
    (an editor's leftovers): a random colour per image, plus per-pixel noise."""
    rng = np.random.default_rng(seed)
    arr = np.empty((SIDE, SIDE, 4), dtype=np.uint8)
    hidden = rng.integers(0, 256, size=3) + rng.integers(-30, 31, size=(SIDE, SIDE, 3))
    arr[..., :3] = np.clip(hidden, 0, 255)
    arr[..., 3] = 0
    top, left = (SIDE - OBJECT) // 2 + rng.integers(-2, 3, size=2)
    arr[top - 1:top + OBJECT + 1, left - 1:left + OBJECT + 1, 3] = 128
    noise = rng.integers(-25, 26, size=(OBJECT, OBJECT, 3))
    arr[top:top + OBJECT, left:left + OBJECT, :3] = np.clip(np.asarray(colour) + noise, 0, 255)
    arr[top:top + OBJECT, left:left + OBJECT, 3] = 255
    return arr


def flattened(rgba: np.ndarray, background: tuple[int, int, int]) -> np.ndarray:
    """The reference composite, in floating point: ``c * a + b * (1 - a)``, rounded."""
    a = rgba[..., 3:].astype(np.float64) / 255.0
    return np.rint(rgba[..., :3] * a + np.asarray(background, dtype=np.float64) * (1.0 - a)).astype(np.uint8)


def png(img: Image.Image, **save) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", **save)
    return buf.getvalue()


def write_set(root: Path, kind: str, background: tuple[int, int, int] = WHITE) -> list[tuple[Path, str]]:
    """The image set under ``root/<label>/<i>.png`` as ``kind``: ``rgba`` (real RGBA PNGs, garbage under the
    alpha), ``flat`` (the same images flattened over ``background``, saved as RGB) or ``dropped`` (the RGBA
    PNGs with their alpha dropped by Pillow, saved as RGB). Returns ``(path, label)`` in order."""
    out = []
    for j, (label, colour) in enumerate(LABEL_COLOURS.items()):
        for i in range(PER_LABEL):
            rgba = garbage_rgba(100 * j + i, colour)
            path = root / label / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            if kind == "rgba":
                Image.fromarray(rgba, "RGBA").save(path)
            elif kind == "flat":
                Image.fromarray(flattened(rgba, background), "RGB").save(path)
            else:
                Image.fromarray(rgba, "RGBA").convert("RGB").save(path)
            out.append((path, label))
    return out


# ---------------------------------------------------------------------------------------------- decode


def test_rgba_is_composited_over_the_background_exactly():
    rgba = garbage_rgba(7, (200, 40, 40))
    data = png(Image.fromarray(rgba, "RGBA"))
    for name, rgb in (("white", WHITE), ("black", BLACK), ("#808080", GREY), ("#C0FFEE", (0xC0, 0xFF, 0xEE))):
        img, transparent = images.decode_noting_transparency(data, background=name)
        assert img.mode == "RGB" and transparent
        np.testing.assert_array_equal(np.asarray(img), flattened(rgba, rgb), err_msg=name)
    dropped = np.asarray(Image.fromarray(rgba, "RGBA").convert("RGB"))
    assert not np.array_equal(np.asarray(images.decode(data)), dropped)  # the garbage is gone
    clear = rgba[..., 3] == 0
    assert (np.asarray(images.decode(data))[clear] == 255).all()


def test_la_palette_and_colour_key_transparency_are_composited_alike():
    """LA, a palette with a transparent entry (PNG tRNS, GIF) and an RGB colour key: each transparent pixel is the
    background, each opaque one keeps its colour; translucent LA pixels are blended like RGBA."""
    la = np.zeros((4, 4, 2), np.uint8)
    la[..., 0] = 77
    la[0, :, 1], la[1, :, 1], la[2:, :, 1] = 0, 128, 255
    got = np.asarray(images.decode(png(Image.fromarray(la, "LA")), background="#ff0000"))
    want = flattened(np.dstack([la[..., :1]] * 3 + [la[..., 1:]]), (255, 0, 0))
    np.testing.assert_array_equal(got, want)

    pal = Image.fromarray(np.array([[0, 1], [1, 2]], np.uint8), "P")
    pal.putpalette([9, 200, 9, 1, 2, 3, 250, 0, 0])  # entry 0 transparent, its stored colour green
    want = np.array([[WHITE, (1, 2, 3)], [(1, 2, 3), (250, 0, 0)]], np.uint8)
    gif = io.BytesIO()
    pal.save(gif, format="GIF", transparency=0)
    for data in (png(pal, transparency=0), gif.getvalue()):
        img, transparent = images.decode_noting_transparency(data)
        assert transparent
        np.testing.assert_array_equal(np.asarray(img), want)

    key = Image.fromarray(np.array([[[9, 9, 9], [4, 5, 6]]], np.uint8), "RGB")
    img, transparent = images.decode_noting_transparency(png(key, transparency=(9, 9, 9)), background="black")
    assert transparent and np.asarray(img).tolist() == [[[0, 0, 0], [4, 5, 6]]]


def test_images_without_a_transparent_pixel_decode_as_before():
    """Opaque images are Pillow's ``convert("RGB")`` as they always were (so no committed metric moves), and a
    palette whose transparent entry no pixel uses, or an all-opaque alpha channel, counts as no transparency."""
    digits = sorted(DIGITS.rglob("*.png"))[:20]
    assert digits
    for path in digits:
        with Image.open(path) as raw:
            want = np.asarray(raw.convert("RGB"))
        img, transparent = images.decode_noting_transparency(path.read_bytes())
        assert not transparent and np.array_equal(np.asarray(img), want), path
    opaque = garbage_rgba(3, (1, 2, 3))
    opaque[..., 3] = 255
    pal = Image.fromarray(np.array([[1, 2]], np.uint8), "P")
    pal.putpalette([0, 0, 0, 10, 20, 30, 40, 50, 60])
    for img, want in ((Image.fromarray(opaque, "RGBA"), opaque[..., :3]),
                      (pal, np.array([[[10, 20, 30], [40, 50, 60]]], np.uint8))):
        got, transparent = images.decode_noting_transparency(png(img, **({"transparency": 0} if img.mode == "P"
                                                                          else {})))
        assert not transparent and np.array_equal(np.asarray(got), want)


# ---------------------------------------------------------------------------------------------- the proof


def test_composited_metrics_equal_the_pre_flattened_images_and_differ_from_dropping_alpha(tmp_path):
    """The metrics of real RGBA PNGs read through ``recallk.images.load`` (the Python API's path, the pipeline's
    decoder) are those of the same images flattened over white beforehand, and not those of the alpha dropped."""
    rgba = write_set(tmp_path / "rgba", "rgba")
    flat = write_set(tmp_path / "flat", "flat")

    def metrics(items: list) -> dict[str, float]:
        labels = [label for _, label in rgba]
        queries = [i for i in range(len(items)) if i % PER_LABEL < 2]
        gallery = [i for i in range(len(items)) if i % PER_LABEL >= 2]
        return evaluate([items[i] for i in queries], [items[i] for i in gallery], [labels[i] for i in queries],
                        [labels[i] for i in gallery], encoder_fn=lambda imgs: encode_pixels(imgs, resolution=8),
                        ks=[1, 2, 5])

    composited = metrics([path for path, _ in rgba])
    pre_flattened = metrics([path for path, _ in flat])
    dropped = metrics([Image.open(path).convert("RGB") for path, _ in rgba])  # torchvision's pil_loader, timm's
    assert composited == pre_flattened
    assert composited != dropped and composited["recall@1"] > dropped["recall@1"]


# ---------------------------------------------------------------------------------------------- pHash, the probe


def test_the_phash_check_sees_the_composited_image(tmp_path):
    """The split stage's probe hashes the image composited over ``split.background``: the pHash and the
    near-duplicate thumbnail equal the pre-flattened copy's, not the dropped-alpha image's."""
    rgba = write_set(tmp_path / "rgba", "rgba")
    flat = write_set(tmp_path / "flat", "flat")
    black = write_set(tmp_path / "black", "flat", background=BLACK)
    differs = 0
    for (a, _), (f, _), (b, _) in zip(rgba, flat, black):
        got = catalog.probe_file(tmp_path, a.relative_to(tmp_path).as_posix())
        ref = catalog.probe_file(tmp_path, f.relative_to(tmp_path).as_posix())
        assert (got[3], got[6], got[7]) == (ref[3], ref[6], True) and ref[7] is False
        on_black = catalog.probe_file(tmp_path, a.relative_to(tmp_path).as_posix(), background="black")
        assert on_black[3] == catalog.probe_file(tmp_path, b.relative_to(tmp_path).as_posix())[3]
        differs += got[3] != phash(Image.open(a).convert("RGB"))
    assert differs > len(rgba) // 2  # dropping the alpha hashes the garbage


# ---------------------------------------------------------------------------------------------- the param


def test_the_background_is_part_of_the_backbone_fingerprint():
    white = get_backbone("pixels", {"resolution": 4})
    assert white.background == "white" and white.fingerprint == get_backbone("pixels", {"resolution": 4},
                                                                            background="white").fingerprint
    black = get_backbone("pixels", {"resolution": 4}, background="black")
    assert black.fingerprint != white.fingerprint and black.background == "black"
    assert get_backbone("pixels", {"resolution": 4}, background="#FFFFFF").fingerprint == white.fingerprint
    assert get_backbone("pixels", {"resolution": 4}, background="#fffffe").fingerprint != white.fingerprint


@pytest.mark.parametrize("value, fragment", [
    (None, "write a colour in quotes"),  # `background: #808080` unquoted: YAML reads a comment
    ("red", "must be white, black or a colour"),
    ("#fff", "must be white, black or a colour"),
    (255, "must be white, black or a colour"),
])
def test_split_background_is_checked(value, fragment):
    with pytest.raises(InputError, match=fragment) as caught:
        validate_section({"split": {"background": value}}, "split")
    assert "`split.background`" in str(caught.value)
    assert validate_section({"split": {"background": "#A0b0C0"}}, "split")["background"] == "#A0b0C0"


def test_encode_and_score_read_the_background_split_recorded():
    assert background_of(None) == background_of({"data_root": "x"}) == "white"  # by hand, or an older split
    assert background_of({"background": "black"}) == "black"
    with pytest.raises(InputError, match="re-run the split stage|Re-run the split stage"):
        background_of({"background": "purple"})


def test_the_report_says_how_transparency_was_shown():
    """The `[evaluated]` block's `transparency:` line, from split's provenance.json; none for a split that predates
    the param, or an embeddings-only catalog (nothing decoded)."""
    from recallk.report.provenance import provenance

    score = {"bootstrap": {"resamples": 0}, "exclude_same": [], "whiten": "none", "backend": "numpy"}
    split = {"data_root": "d", "manifest": None, "strategy": "given", "protocol": "query_gallery", "seed": 0,
             "num_images": 10, "num_labels": 2, "num_skipped_images": 0, "images": "files", "background": "#808080",
             "num_transparent_images": 3, "near_duplicates": None}
    shown = provenance(split, None, score)
    assert shown["transparency"] == "3 of 10 images have transparency, composited over #808080 (split.background)"
    assert list(shown).index("transparency") == list(shown).index("data") + 1
    older = {k: v for k, v in split.items() if k not in ("background", "num_transparent_images")}
    assert "transparency" not in provenance(older, None, score)
    assert "transparency" not in provenance({**split, "images": "none", "num_transparent_images": None}, None, score)
    assert provenance(split, None, score)["id"] != provenance({**split, "background": "white"}, None, score)["id"]


# ---------------------------------------------------------------------------------------------- the stages


def project(where: Path, kind: str, background: str = "white") -> Path:
    """A project of the image set as ``kind`` (:func:`write_set`), its split given by a manifest (the same in
    every project: a content-keyed split would differ between the RGBA files and their flattened copies)."""
    proj = new_project(where, per_label=None)
    set_params(proj, {"split.background": background, "split.csv": "manifest.csv", "split.strategy": "given",
                      "encode.pixels.resolution": 8, "score.ks": [1, 2, 5], "score.bootstrap.resamples": 10})
    root = proj / "data" / "digits"
    rows = [f"{path.relative_to(root).as_posix()},{label},{'val' if i % PER_LABEL < 2 else 'gallery'}"
            for i, (path, label) in enumerate(write_set(root, kind, background=BLACK if background == "black"
                                                        else WHITE))]
    (root / "manifest.csv").write_text("path,label,split\n" + "".join(r + "\n" for r in rows), encoding="utf-8")
    return proj


def run_stages(proj: Path, *stages: str) -> list:
    procs = [run_in_process(stage, cwd=proj) for stage in stages]
    for proc in procs:
        assert proc.returncode == 0, proc.stderr
    return procs


@pytest.mark.stage
def test_the_pipeline_on_rgba_pngs_equals_the_pre_flattened_images(tmp_path):
    """split, encode and score on real RGBA PNGs give the metrics, pHashes and embeddings of the same images
    flattened over white beforehand, and other metrics than the alpha dropped; the split stage counts them."""
    runs = {kind: project(tmp_path / kind, kind) for kind in ("rgba", "flat", "dropped")}
    logs = {kind: run_stages(proj, "split", "encode", "score") for kind, proj in runs.items()}
    # the means and counts, and every metric of every query (not the bootstrap bounds: resamples draw the queries
    # in the order of their files' sha256, recallk.stats.resample.content_order, and these files differ in bytes)
    metrics = {kind: {**json.loads((proj / METRICS).read_text(encoding="utf-8")),
                      **json.loads((proj / COUNTS).read_text(encoding="utf-8"))} for kind, proj in runs.items()}
    assert metrics["rgba"] == metrics["flat"]
    assert metrics["rgba"] != metrics["dropped"] and metrics["rgba"]["recall@1"] > metrics["dropped"]["recall@1"]
    per_query = {kind: read_csv(proj, PER_QUERY).drop(columns="evaluated") for kind, proj in runs.items()}
    assert per_query["rgba"].equals(per_query["flat"]) and not per_query["rgba"].equals(per_query["dropped"])
    cats = {kind: read_csv(proj, CATALOG).set_index("image_id") for kind, proj in runs.items()}
    assert cats["rgba"]["phash"].equals(cats["flat"]["phash"])
    emb = {kind: np.load(proj / EMBEDDINGS) for kind, proj in runs.items()}
    assert all(np.load(runs[kind] / IDS).tolist() == cats[kind].index.tolist() for kind in runs)
    np.testing.assert_array_equal(emb["rgba"], emb["flat"])

    n = len(LABEL_COLOURS) * PER_LABEL
    for kind, count in (("rgba", n), ("flat", 0)):
        provenance = json.loads((runs[kind] / "data/prepared/provenance.json").read_text(encoding="utf-8"))
        assert provenance["background"] == "white" and provenance["num_transparent_images"] == count
        split_log, _, score_log = logs[kind]
        assert f"{count} of {n} images have transparency; composited over white (split.background)" in split_log.stderr
        assert "transparency:" in score_log.stdout  # the report block's [evaluated] lines
        assert f"{count} of {n} images have transparency, composited over white (split.background)" in score_log.stdout


@pytest.mark.stage
def test_encode_composites_over_the_background_split_recorded(tmp_path):
    """`split.background: black`: split records it, and encode (which reads it from split's provenance.json, its
    params dep `split.background`) embeds each image composited over black."""
    proj = project(tmp_path / "black", "rgba", background="black")
    run_stages(proj, "split", "encode")
    ids = np.load(proj / IDS).tolist()
    emb = dict(zip(ids, np.load(proj / EMBEDDINGS)))
    root = proj / "data" / "digits"
    for image_id in ids[:5]:
        with Image.open(root / image_id) as img:
            rgba = np.asarray(img)
        want = encode_pixels([Image.fromarray(flattened(rgba, BLACK), "RGB")], resolution=8)[0]
        np.testing.assert_array_equal(emb[image_id], want)
