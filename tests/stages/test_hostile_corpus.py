"""Hostile-input corpus: every file, manifest, data shape, embedding and params case a user can throw
at split -> encode -> score, run as real stage subprocesses on tiny generated data.

The contract under test (README "What happens with bad data"): a user error exits with code 2 and
prints one ``error: ...`` message on stderr that names the file, CSV line or param and says how to fix
it; no traceback; no output file left behind. Inputs that are accepted must be decoded correctly.

``split.on_bad_image: error | skip`` (default ``error``): unreadable images fail the split with one
message listing every bad file, or (``skip``) are dropped, listed in ``data/prepared/skipped.csv``
(``path,reason``, sorted by path) and counted in ``num_skipped_images`` of metrics/recall.json.
Missing files, paths outside the data root and symlinks out of it stay errors under both.

Every file is generated here (Pillow / numpy); the data is a few 8x8 images per label and the
``pixels`` backbone runs at resolution 4, so the whole corpus is a few dozen short subprocesses.
"""

from __future__ import annotations

import io
import re
import shutil
import struct
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from helpers import (CATALOG, EMBEDDINGS, IDS, SCORE_OUTPUTS, SKIPPED, SPLIT, SPLIT_OUTPUTS, STAGES,
                     assert_no_outputs, assert_user_error, new_project, plant_stale, read_csv, read_metrics, run_module,
                     run_ok, save_image, set_params)
from recallk.data import contract
from recallk.encode.registry import encode_pixels

LABELS = ("a", "b", "c", "d")
PER_LABEL = 3
RES = 4  # encode.pixels.resolution: every embedding is 3 * 4 * 4 = 48 values in [0, 1]


# ================================================================ helpers


def make_project(where: Path, labels: tuple[str, ...] = LABELS, per_label: int = PER_LABEL) -> Path:
    """params.yaml (tiny pixels backbone, few bootstrap resamples) + data/digits/<label>/<i>.png."""
    proj = new_project(where / "proj", per_label=None)
    set_params(proj, {"encode.pixels.resolution": RES, "score.ks": [1, 2], "score.bootstrap.resamples": 10})
    for j, label in enumerate(labels):
        for i in range(per_label):
            save_image(data_root(proj) / label / f"{i}.png", seed=100 * j + i, size=(8, 8))
    return proj


def data_root(proj: Path) -> Path:
    return proj / "data" / "digits"


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    return make_project(tmp_path)


def pipeline(proj: Path) -> list:
    """Run split, encode, score; each must succeed."""
    return [run_ok(proj, stage) for stage in STAGES]


def assert_line_names(stderr: str, where: str, *details: str) -> None:
    """Some line of ``stderr`` contains ``where`` and every one of ``details``."""
    lines = [ln for ln in stderr.splitlines() if where in ln]
    assert lines, f"{where!r} not named in stderr:\n{stderr}"
    assert any(all(d.lower() in ln.lower() for d in details) for ln in lines), \
        f"no line naming {where!r} says {details}:\n" + "\n".join(lines)


def embeddings(proj: Path) -> dict[str, np.ndarray]:
    """image_id -> its embedding row, checked to align with the catalog."""
    emb = np.load(proj / EMBEDDINGS, allow_pickle=False)
    ids = np.load(proj / IDS, allow_pickle=False).tolist()
    assert ids == read_csv(proj, CATALOG)["image_id"].tolist()
    assert emb.dtype == np.float32 and emb.shape == (len(ids), 3 * RES * RES)
    return dict(zip(ids, emb))


def pixels_of(rgb: np.ndarray) -> np.ndarray:
    """The pixels backbone's embedding of an RGB uint8 array (the reference for decoded images)."""
    return encode_pixels([Image.fromarray(rgb.astype(np.uint8), "RGB")], resolution=RES)[0]


def manifest(proj: Path, rows: list[str], header: str = "path,label", *, strategy: str | None = None,
             bom: bool = False) -> None:
    """Write data/digits/manifest.csv (line 1 = header, rows from line 2) and point `split.csv` at it."""
    text = header + "\n" + "".join(r + "\n" for r in rows)
    (data_root(proj) / "manifest.csv").write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    change = {"split.csv": "manifest.csv"}
    if strategy:
        change["split.strategy"] = strategy
    set_params(proj, change)


def base_rows() -> list[str]:
    """``path,label`` of every generated image, label by label (CSV lines 2..13)."""
    return [f"{label}/{i}.png,{label}" for label in LABELS for i in range(PER_LABEL)]


def given_rows(splits: dict[str, tuple[str, ...]]) -> list[str]:
    """``path,label,split`` rows; ``splits[label]`` gives the split of each of the label's images."""
    return [f"{label}/{i}.png,{label},{s}" for label, per in splits.items() for i, s in enumerate(per)]


def line_of(rows: list[str], row: str) -> int:
    return rows.index(row) + 2


# ---------------------------------------------------------------- hostile files


def random_bytes_image(fmt: str, seed: int, size: tuple[int, int] = (32, 32)) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, format=fmt)
    return buf.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def decompression_bomb() -> bytes:
    """A 100 KB-class PNG whose IHDR claims 100000 x 100000 RGB pixels (10^10 > 2 x MAX_IMAGE_PIXELS)."""
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
            + png_chunk(b"IDAT", zlib.compress(b"\x00" * 300_001)) + png_chunk(b"IEND", b""))


#: case -> (path under the data root, bytes, fragment the reason must contain)
UNREADABLE: dict[str, tuple[str, Callable[[], bytes], str]] = {
    "truncated_jpeg": ("a/trunc.jpg", lambda: random_bytes_image("JPEG", 1)[:600], "truncated"),
    "truncated_png": ("b/trunc.png", lambda: random_bytes_image("PNG", 2)[:1500], "truncated"),
    "zero_byte": ("c/empty.jpg", lambda: b"", ""),
    "text_as_jpg": ("d/notes.jpg", lambda: b"this is a shopping list, not a JPEG\n", ""),
    "decompression_bomb": ("a/bomb.png", decompression_bomb, "bomb"),
}


def write_unreadable(proj: Path) -> None:
    for rel, make, _ in UNREADABLE.values():
        (data_root(proj) / rel).write_bytes(make())


def rgb_block(h: int, w: int, colour: tuple[int, int, int]) -> np.ndarray:
    return np.broadcast_to(np.asarray(colour, np.uint8), (h, w, 3)).copy()


GRAY16 = (np.arange(16, dtype=np.uint32).reshape(4, 4) * 16 + 8) * 257  # 16-bit levels 2056 .. 63736
PALETTE = [(255, 0, 0), (0, 0, 255), (0, 255, 0)]  # index 0 is transparent
PALETTE_INDEX = np.array([[0, 0, 1, 2]] * 4, dtype=np.uint8)
CMYK_LEFT, CMYK_RIGHT = (0, 255, 255), (255, 255, 0)  # pure cyan / pure yellow ink as RGB
EXIF_IMAGE = np.concatenate([rgb_block(16, 16, (255, 0, 0)), rgb_block(16, 16, (0, 0, 255))], axis=1)  # 32 x 16
ONE_PIXEL = (200, 100, 50)
GIF_FRAMES = [(255, 0, 0), (0, 255, 0)]


def write_accepted(proj: Path) -> None:
    """Unusual but valid images, one per accepted case (4 x 4 where the pixels are checked exactly)."""
    root = data_root(proj)
    # 16-bit grayscale PNG (Pillow mode I;16)
    gray16 = Image.fromarray(GRAY16.astype(np.uint16))
    assert gray16.mode == "I;16"
    gray16.save(root / "a" / "gray16.png")
    # CMYK JPEG: left half pure cyan ink, right half pure yellow ink
    cmyk = np.zeros((16, 16, 4), np.uint8)
    cmyk[:, :8, 0] = 255
    cmyk[:, 8:, 2] = 255
    Image.fromarray(cmyk, "CMYK").save(root / "b" / "cmyk.jpg", quality=95)
    # palette PNG with a transparent palette entry (tRNS)
    pal = Image.fromarray(PALETTE_INDEX, "P")
    pal.putpalette([v for c in PALETTE for v in c])
    pal.save(root / "c" / "palette.png", transparency=0)
    # JPEG stored sideways with EXIF orientation 6, and the same picture physically rotated
    exif = Image.Exif()
    exif[0x0112] = 6
    sideways = Image.fromarray(EXIF_IMAGE, "RGB")
    sideways.save(root / "d" / "exif6.jpg", quality=95, subsampling=0, exif=exif.tobytes())
    sideways.transpose(Image.Transpose.ROTATE_270).save(root / "d" / "upright.jpg", quality=95, subsampling=0)
    # a single pixel
    Image.fromarray(rgb_block(1, 1, ONE_PIXEL), "RGB").save(root / "a" / "one_pixel.png")
    # animated GIF: red frame, then green frame
    frames = [Image.fromarray(rgb_block(4, 4, c), "RGB") for c in GIF_FRAMES]
    frames[0].save(root / "b" / "anim.gif", save_all=True, append_images=frames[1:], duration=100, loop=0)
    with Image.open(root / "b" / "anim.gif") as gif:
        assert gif.n_frames == 2


# ================================================================ files: unreadable, policy `error`


@pytest.fixture(scope="module")
def error_run(tmp_path_factory):
    """All unreadable files in one data root, default policy: one split run."""
    proj = make_project(tmp_path_factory.mktemp("unreadable_error"))
    write_unreadable(proj)
    plant_stale(proj, SPLIT_OUTPUTS)
    return proj, run_module("stages.split", cwd=proj)


@pytest.mark.parametrize("case", list(UNREADABLE), ids=list(UNREADABLE))
def test_unreadable_file_fails_split_by_default(error_run, case):
    """Default `on_bad_image: error`: exit 2, the file named with why, nothing written."""
    proj, proc = error_run
    rel, _, reason = UNREADABLE[case]
    assert_user_error(proc, "error: ", "replace or remove")
    assert_line_names(proc.stderr, f"'{rel}'", reason)
    assert_no_outputs(proj)


def test_unreadable_files_are_all_listed_in_one_message(error_run):
    proj, proc = error_run
    assert_user_error(proc, f"{len(UNREADABLE)} row(s)")
    for rel, _, _ in UNREADABLE.values():
        assert f"'{rel}'" in proc.stderr
    for label in LABELS:  # the good images are not blamed
        assert f"'{label}/0.png'" not in proc.stderr


# ================================================================ files: unreadable, policy `skip`


@pytest.fixture(scope="module")
def skip_run(tmp_path_factory):
    """All unreadable files, `on_bad_image: skip`: split, encode, score (stops at the first failure)."""
    proj = make_project(tmp_path_factory.mktemp("unreadable_skip"))
    write_unreadable(proj)
    set_params(proj, {"split.on_bad_image": "skip"})
    procs = []
    for stage in STAGES:
        procs.append(run_module(f"stages.{stage}", cwd=proj))
        if procs[-1].returncode != 0:
            break
    skipped = (proj / SKIPPED).read_bytes() if (proj / SKIPPED).is_file() else None
    return proj, procs, skipped


def assert_all_ok(procs) -> None:
    for stage, proc in zip(STAGES, procs):
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, \
            f"{stage} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert len(procs) == len(STAGES)


def skipped_row(frame: pd.DataFrame, rel: str) -> pd.DataFrame:
    """Rows of skipped.csv for ``rel`` (relative to the data root, or as the catalog locates it)."""
    return frame[frame["path"].map(lambda p: p == rel or p.endswith("/" + rel))]


@pytest.mark.parametrize("case", list(UNREADABLE), ids=list(UNREADABLE))
def test_unreadable_file_is_skipped_with_a_reason(skip_run, case):
    proj, procs, _ = skip_run
    assert_all_ok(procs)
    rel, _, reason = UNREADABLE[case]
    skipped = read_csv(proj, SKIPPED)
    row = skipped_row(skipped, rel)
    assert len(row) == 1, f"{rel} not listed once in skipped.csv:\n{skipped}"
    assert row["reason"].iloc[0].strip(), f"empty reason for {rel}"
    assert reason.lower() in row["reason"].iloc[0].lower(), row["reason"].iloc[0]
    assert not read_csv(proj, CATALOG)["path"].str.endswith(rel).any(), f"{rel} still in the catalog"


def test_skip_policy_completes_and_counts(skip_run):
    proj, procs, _ = skip_run
    assert_all_ok(procs)
    n = len(UNREADABLE)
    skipped = read_csv(proj, SKIPPED)
    assert list(skipped.columns) == ["path", "reason"]
    assert len(skipped) == n
    assert skipped["path"].tolist() == sorted(skipped["path"]), "skipped.csv not sorted by path"
    warnings = [ln for ln in procs[0].stderr.splitlines() if "WARNING" in ln and "skip" in ln.lower()]
    assert any(re.search(rf"\b{n}\b", ln) for ln in warnings), f"no warning with the count {n}:\n{procs[0].stderr}"
    assert len(read_csv(proj, CATALOG)) == len(LABELS) * PER_LABEL
    assert read_metrics(proj)["num_skipped_images"] == n


def test_skipped_csv_is_reproducible(skip_run):
    """skipped.csv is a DVC output: the same data must give the same bytes (no addresses, no timings)."""
    proj, procs, first = skip_run
    assert_all_ok(procs)
    run_ok(proj, "split")
    again = (proj / SKIPPED).read_bytes()
    assert again == first, f"skipped.csv differs between two runs:\n{first.decode()}\n---\n{again.decode()}"


def test_skip_policy_without_bad_images_writes_header_only(proj):
    set_params(proj, {"split.on_bad_image": "skip"})
    pipeline(proj)
    assert (proj / SKIPPED).read_text() == "path,reason\n"
    assert read_metrics(proj)["num_skipped_images"] == 0


def test_skip_policy_keeps_missing_outside_and_symlink_errors(proj, tmp_path):
    """Under `skip` only undecodable files are dropped; a missing file, a '..' or absolute path and a
    symlink out of the data root still fail the split, each named by its CSV line."""
    outside = save_image(tmp_path / "elsewhere" / "secret.png", seed=7)
    (data_root(proj) / "a" / "link.png").symlink_to(outside)
    (data_root(proj) / "a" / "trunc.png").write_bytes(random_bytes_image("PNG", 3)[:1500])
    rows = base_rows() + ["a/trunc.png,a", "a/missing.png,a", "../outside.png,a", f"{outside},a", "a/link.png,a"]
    save_image(proj / "data" / "outside.png", seed=8)
    manifest(proj, rows)
    set_params(proj, {"split.on_bad_image": "skip"})
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc)
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'a/missing.png,a')}", "a/missing.png", "does not exist")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, '../outside.png,a')}", "../outside.png")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, f'{outside},a')}", str(outside))
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'a/link.png,a')}", "a/link.png", "outside the data root")
    assert_no_outputs(proj)


def test_on_bad_image_rejects_an_unknown_policy(proj):
    set_params(proj, {"split.on_bad_image": "ignore"})
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "`split.on_bad_image` must be one of error, skip. Got 'ignore' instead.")
    assert_no_outputs(proj)


# ================================================================ files: accepted and decoded correctly


@pytest.fixture(scope="module")
def accepted_run(tmp_path_factory):
    """Every unusual-but-valid image in one data root, through split, encode and score."""
    proj = make_project(tmp_path_factory.mktemp("accepted"))
    write_accepted(proj)
    procs = [run_module(f"stages.{stage}", cwd=proj) for stage in STAGES]
    return proj, procs


def accepted_embedding(accepted_run, image_id: str) -> np.ndarray:
    proj, procs = accepted_run
    assert_all_ok(procs)
    emb = embeddings(proj)
    assert image_id in emb, f"{image_id} not in the catalog"
    return emb[image_id]


def test_16bit_png_is_scaled_not_clipped(accepted_run):
    """I;16 levels 0..65535 must map to 0..255 (level / 257), not be clipped to white."""
    got = accepted_embedding(accepted_run, "a/gray16.png")
    want = pixels_of(np.repeat((GRAY16 / 257).round()[..., None], 3, axis=2))
    np.testing.assert_allclose(got, want, atol=1.5 / 255, err_msg="16-bit PNG decoded to the wrong grey levels")


def test_cmyk_jpeg_decodes_to_the_right_rgb(accepted_run):
    got = accepted_embedding(accepted_run, "b/cmyk.jpg").reshape(RES, RES, 3)
    np.testing.assert_allclose(got[:, 0], np.tile(np.asarray(CMYK_LEFT) / 255, (RES, 1)), atol=0.05)
    np.testing.assert_allclose(got[:, -1], np.tile(np.asarray(CMYK_RIGHT) / 255, (RES, 1)), atol=0.05)


def test_palette_png_with_transparency_becomes_rgb(accepted_run):
    """README: palette images with transparency become RGB; transparent pixels take the palette colour."""
    got = accepted_embedding(accepted_run, "c/palette.png").reshape(RES, RES, 3)
    want = np.asarray(PALETTE, dtype=np.float32)[PALETTE_INDEX] / 255
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_exif_rotated_jpeg_equals_the_physically_rotated_image(accepted_run):
    rotated = accepted_embedding(accepted_run, "d/exif6.jpg")
    upright = accepted_embedding(accepted_run, "d/upright.jpg")
    np.testing.assert_allclose(rotated, upright, atol=0.03)
    assert np.abs(rotated - pixels_of(EXIF_IMAGE)).max() > 0.5  # sanity: orientation was applied
    cat = read_csv(accepted_run[0], CATALOG).set_index("image_id")
    assert (cat.loc["d/exif6.jpg", "width"], cat.loc["d/exif6.jpg", "height"]) == ("16", "32")


def test_1x1_image_is_accepted(accepted_run):
    got = accepted_embedding(accepted_run, "a/one_pixel.png")
    np.testing.assert_allclose(got, pixels_of(rgb_block(RES, RES, ONE_PIXEL)), atol=1e-6)
    cat = read_csv(accepted_run[0], CATALOG).set_index("image_id")
    assert (cat.loc["a/one_pixel.png", "width"], cat.loc["a/one_pixel.png", "height"]) == ("1", "1")


def test_animated_gif_uses_the_first_frame(accepted_run):
    got = accepted_embedding(accepted_run, "b/anim.gif")
    np.testing.assert_allclose(got, pixels_of(rgb_block(RES, RES, GIF_FRAMES[0])), atol=1e-6)


def test_accepted_images_score_end_to_end(accepted_run):
    proj, procs = accepted_run
    assert_all_ok(procs)
    m = read_metrics(proj)
    assert m["embedding_dim"] == 3 * RES * RES and m["num_queries"] > 0


# ================================================================ files: symlinks, names


@pytest.mark.parametrize("kind", ["file_link", "folder_link"])
def test_symlink_out_of_the_data_root_is_rejected(proj, tmp_path, kind):
    outside = tmp_path / "elsewhere"
    save_image(outside / "secret.png", seed=9)
    if kind == "file_link":
        (data_root(proj) / "a" / "link.png").symlink_to(outside / "secret.png")
        named = "a/link.png"
    else:  # a whole label folder that is a symlink to a folder outside the root
        (data_root(proj) / "e").symlink_to(outside, target_is_directory=True)
        named = "e/secret.png"
    plant_stale(proj, SPLIT_OUTPUTS)
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "copy the file into the data root")
    assert_line_names(proc.stderr, f"'{named}'", "outside the data root")
    assert_no_outputs(proj)


UNICODE_LABELS = ("café crème", "日本 語", "Ünïcödé", "plain")
UNICODE_FILES = ("naïve file 1.png", "🐱 cat 2.png", "quote\"d, comma 3.png")


def test_unicode_and_spaces_in_names_work_end_to_end(tmp_path):
    proj = make_project(tmp_path, labels=UNICODE_LABELS, per_label=0)
    expected = []
    for j, label in enumerate(UNICODE_LABELS):
        for i, name in enumerate(UNICODE_FILES):
            save_image(data_root(proj) / label / name, seed=500 + 10 * j + i, size=(8, 8))
            expected.append(f"{label}/{name}")
    pipeline(proj)
    cat = read_csv(proj, CATALOG)
    assert sorted(cat["image_id"]) == sorted(expected)
    assert set(cat["label"]) == set(UNICODE_LABELS)
    assert sorted(np.load(proj / IDS).tolist()) == sorted(expected)
    per_query = read_csv(proj, "data/scores/per_query.csv")
    assert len(per_query) == read_metrics(proj)["num_queries"] + read_metrics(proj)["num_excluded_queries"] > 0
    assert set(per_query["image_id"]) <= set(expected)
    assert set(read_csv(proj, "metrics/per_class.csv")["label"]) <= set(UNICODE_LABELS)


# ================================================================ CSV manifest


def test_manifest_path_with_dotdot_is_rejected(proj):
    save_image(proj / "data" / "outside.png", seed=11)  # exists: rejected for the '..', not as missing
    rows = base_rows() + ["../outside.png,a", "a/../b/0.png,b"]
    manifest(proj, rows)
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "no '..' part")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, '../outside.png,a')}", "'../outside.png'")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'a/../b/0.png,b')}", "'a/../b/0.png'")
    assert_no_outputs(proj)


def test_manifest_absolute_path_is_rejected(proj, tmp_path):
    inside = (data_root(proj) / "a" / "0.png").resolve()   # absolute, though it points into the root
    outside = save_image(tmp_path / "abs" / "x.png", seed=12)
    rows = base_rows()[1:] + [f"{inside},a", f"{outside},b"]
    manifest(proj, rows)
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "path must be relative to the data root")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, f'{inside},a')}", str(inside))
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, f'{outside},b')}", str(outside))
    assert_no_outputs(proj)


def test_manifest_with_utf8_bom_works(proj):
    rows = [f"id-{r.split(',')[0].replace('/', '-')},{r}" for r in base_rows()]
    manifest(proj, rows, header="image_id,path,label", bom=True)
    run_ok(proj, "split")
    cat = read_csv(proj, CATALOG)
    assert list(cat.columns)[:3] == ["image_id", "path", "label"]
    assert sorted(cat["image_id"]) == sorted(r.split(",")[0] for r in rows)  # not defaulted to the path


def test_manifest_extra_columns_are_kept_in_the_catalog(proj):
    rows = [f"{r},g{i % 2},\"note {i}, with \"\"quotes\"\"\"" if i else f"{r},g0," for i, r in enumerate(base_rows())]
    manifest(proj, rows, header="path,label,group,note")
    run_ok(proj, "split")
    cat = read_csv(proj, CATALOG).set_index("image_id")
    assert list(cat.columns) == ["path", "label", "sha256", "width", "height", "phash", "group", "note"]
    assert cat.loc["a/0.png", "group"] == "g0" and cat.loc["a/0.png", "note"] == ""
    assert cat.loc["a/1.png", "group"] == "g1" and cat.loc["a/1.png", "note"] == 'note 1, with "quotes"'


def test_manifest_empty_label_is_rejected(proj):
    rows = base_rows()
    rows[0], rows[4] = "a/0.png,", 'b/1.png,"  "'
    manifest(proj, rows)
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "label must not be")
    assert_line_names(proc.stderr, "CSV line 2", "'a/0.png'")
    assert_line_names(proc.stderr, "CSV line 6", "'b/1.png'")
    assert_no_outputs(proj)


@pytest.mark.parametrize("texts", [
    ("NaN", "null", "None", "N/A"),  # every cell is text: NaN-like words are ordinary labels (only '' is missing)
    ("1", "1.0", "01", "1e0"),       # README: labels are compared as text, so these are four labels, end to end
], ids=["nan_like_labels_are_plain_text", "labels_1_and_1_0_are_different"])
def test_manifest_labels_are_text(proj, texts):
    names = dict(zip(LABELS, texts))
    manifest(proj, [f"{label}/{i}.png,{names[label]}" for label in LABELS for i in range(PER_LABEL)])
    set_params(proj, {"split.fractions": {"train": 0.0, "val": 0.5, "gallery": 0.5}})
    pipeline(proj)
    assert sorted(read_csv(proj, CATALOG)["label"].unique()) == sorted(names.values())
    per_class = read_csv(proj, "metrics/per_class.csv")
    assert sorted(per_class["label"]) == sorted(names.values())
    assert per_class["num_queries"].tolist() == ["2"] * len(LABELS)
    assert read_metrics(proj)["num_queries"] == 2 * len(LABELS)
    # each query's positives are its own label's single gallery image, never another look-alike label
    assert set(read_csv(proj, "data/scores/per_query.csv")["num_positives"]) == {"1"}


def test_manifest_duplicate_rows_are_rejected(proj):
    rows = base_rows() + ["b/1.png,b"]
    manifest(proj, rows)
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "image_id must be unique")
    assert_line_names(proc.stderr, "CSV line 6", "'b/1.png'")
    assert_line_names(proc.stderr, f"CSV line {len(rows) + 1}", "'b/1.png'")
    assert_no_outputs(proj)


def test_manifest_same_file_under_two_ids_is_rejected(proj):
    """The same path as query (x1) and gallery item (x2) would let x1 retrieve its own file (its only
    same-label gallery item), since the score stage tells images apart by image_id: the data contract
    rejects it (PATH_ONCE_RULE), naming both CSV lines, and the split writes nothing."""
    rows = [f"{label}{i},{label}/{i}.png,{label},{s}" for label in "ab" for i, s in enumerate(("val", "gallery", "gallery"))]
    rows += ["x1,c/0.png,c,val", "x2,c/0.png,c,gallery"] + [f"d{i},d/{i}.png,d,train" for i in range(PER_LABEL)]
    manifest(proj, rows, header="image_id,path,label,split", strategy="given")
    plant_stale(proj, SPLIT_OUTPUTS)
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, f"{contract.PATH_ONCE_RULE}: 2 row(s)")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'x1,c/0.png,c,val')}", "'c/0.png'", "image_id 'x1'")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'x2,c/0.png,c,gallery')}", "'c/0.png'", "image_id 'x2'")
    assert_no_outputs(proj)


def test_manifest_path_that_does_not_exist_is_rejected(proj):
    rows = base_rows() + ["a/ghost.png,a"]
    manifest(proj, rows)
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "fix the path or remove the row")
    assert_line_names(proc.stderr, f"CSV line {len(rows) + 1}", "'a/ghost.png'", "does not exist")
    assert_no_outputs(proj)


# ================================================================ data shape


def test_single_image_label_query_is_excluded_and_counted(proj):
    save_image(data_root(proj) / "solo" / "only.png", seed=77, size=(8, 8))
    set_params(proj, {"split.protocol": "leave_one_out",
                        "split.fractions": {"train": 0.0, "val": 0.5, "gallery": 0.5}})
    split_proc, _, _ = pipeline(proj)
    assert "1 queries (labels: solo)" in split_proc.stderr
    m = read_metrics(proj)
    assert m["num_excluded_queries"] == 1
    assert m["num_queries"] == len(LABELS) * PER_LABEL
    row = read_csv(proj, "data/scores/per_query.csv").set_index("image_id").loc["solo/only.png"]
    assert row["first_positive_rank"] == "" and row["num_positives"] == "0"


def test_label_only_in_train_is_not_scored(proj):
    rows = given_rows({"a": ("val", "gallery", "gallery"), "b": ("val", "gallery", "gallery"),
                       "c": ("val", "gallery", "gallery"), "d": ("train",) * 3})
    manifest(proj, rows, header="path,label,split", strategy="given")
    pipeline(proj)
    m = read_metrics(proj)
    assert (m["num_queries"], m["num_excluded_queries"], m["num_gallery"]) == (3, 0, 6)
    assert sorted(read_csv(proj, "metrics/per_class.csv")["label"]) == ["a", "b", "c"]
    assert "d" not in set(read_csv(proj, "data/scores/per_query.csv")["label"])


def test_empty_gallery_is_a_clear_error(proj):
    set_params(proj, {"split.fractions": {"train": 0.5, "val": 0.5, "gallery": 0.0}})
    plant_stale(proj, SPLIT_OUTPUTS)
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "0 gallery images", "`split.fractions`")
    assert_no_outputs(proj)


def test_every_query_excluded_is_a_clear_error_from_score(proj):
    rows = given_rows({"a": ("val",) * 3, "b": ("gallery",) * 3, "c": ("train",) * 3, "d": ("gallery",) * 3})
    manifest(proj, rows, header="path,label,split", strategy="given")
    split_proc = run_ok(proj, "split")
    assert "3 queries (labels: a) have no gallery image" in split_proc.stderr
    run_ok(proj, "encode")
    plant_stale(proj, SCORE_OUTPUTS)
    proc = run_module("stages.score", cwd=proj)
    assert_user_error(proc, "every one of the 3 queries is excluded", "gallery")
    assert_no_outputs(proj, SCORE_OUTPUTS)


def test_same_file_in_train_and_gallery_is_a_contract_error(proj):
    shutil.copy(data_root(proj) / "c" / "0.png", data_root(proj) / "c" / "copy.png")
    rows = given_rows({"a": ("val", "gallery", "gallery"), "b": ("val", "gallery", "gallery"),
                       "c": ("train", "val", "gallery"), "d": ("train",) * 3}) + ["c/copy.png,c,gallery"]
    manifest(proj, rows, header="path,label,split", strategy="given")
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "the same file (equal sha256) must not be in train and in val/gallery")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'c/0.png,c,train')}", "'c/0.png'")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'c/copy.png,c,gallery')}", "'c/copy.png'")
    assert_no_outputs(proj)


def test_near_identical_images_across_splits_are_allowed(proj):
    """Only byte-identical files are leakage; a one-level change in one pixel is another image."""
    arr = np.asarray(Image.open(data_root(proj) / "c" / "0.png")).copy()
    arr[0, 0, 0] ^= 1
    Image.fromarray(arr, "RGB").save(data_root(proj) / "c" / "near.png")
    rows = given_rows({"a": ("val", "gallery", "gallery"), "b": ("val", "gallery", "gallery"),
                       "c": ("train", "val", "gallery"), "d": ("train",) * 3}) + ["c/near.png,c,gallery"]
    manifest(proj, rows, header="path,label,split", strategy="given")
    run_ok(proj, "split")
    split = read_csv(proj, SPLIT).set_index("image_id")["split"]
    assert (split["c/0.png"], split["c/near.png"]) == ("train", "gallery")


# ================================================================ embeddings


HOSTILE_ENCODER = '''\
import numpy as np


def embed(images):
    """Mean colour, but NaN for a pure red image, +inf for pure green, -inf for pure blue."""
    out = []
    for img in images:
        arr = np.asarray(img, dtype=np.float64)
        v = arr.mean(axis=(0, 1)) / 255 + 0.01
        corner = tuple(int(x) for x in arr[0, 0])
        if corner == (255, 0, 0):
            v[0] = np.nan
        elif corner == (0, 255, 0):
            v[1] = np.inf
        elif corner == (0, 0, 255):
            v[2] = -np.inf
        out.append(v)
    return np.asarray(out, dtype=np.float32)
'''


def test_callable_backbone_returning_nan_or_inf_names_the_images(proj):
    (proj / "hostile_encoder.py").write_text(HOSTILE_ENCODER)
    bad = {"a/red.png": (255, 0, 0), "b/green.png": (0, 255, 0), "c/blue.png": (0, 0, 255)}
    for rel, colour in bad.items():
        Image.fromarray(rgb_block(8, 8, colour), "RGB").save(data_root(proj) / rel)
    set_params(proj, {"encode.backbone": "callable:hostile_encoder:embed",
                      "encode.callable.module_file": "hostile_encoder.py"})
    run_ok(proj, "split")
    plant_stale(proj, (EMBEDDINGS, IDS))
    proc = run_module("stages.encode", cwd=proj)
    assert_user_error(proc, "NaN, inf or all-zero", f"{len(bad)} image(s)", *bad)
    for good in ("a/0.png", "b/0.png"):
        assert good not in proc.stderr
    assert_no_outputs(proj, (EMBEDDINGS, IDS))


@pytest.fixture(scope="module")
def split_template(tmp_path_factory):
    """A project whose split already ran (the precomputed cases only re-run encode)."""
    proj = make_project(tmp_path_factory.mktemp("split_template"))
    run_ok(proj, "split")
    return proj


def _precomputed(ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    emb = np.random.default_rng(0).normal(size=(len(ids), 5)).astype(np.float32)
    return np.asarray(ids), emb


PRECOMPUTED_CASES = {
    # (ids, emb) -> arrays to save, fragments the error must contain
    "vector_not_matrix": (lambda ids, emb: (ids, emb[:, 0]), ["2-D", "(n, d)"]),
    "three_dims": (lambda ids, emb: (ids, emb[:, :, None]), ["2-D", "(n, d)"]),
    "zero_width": (lambda ids, emb: (ids, emb[:, :0]), []),
    "ids_rows_mismatch": (lambda ids, emb: (ids, np.vstack([emb, emb[:1]])), ["ids of shape"]),
    "missing_ids": (lambda ids, emb: (ids[2:], emb[2:]), ["2 catalog image(s) have no embedding", "{0}", "{1}"]),
    "zero_vectors": (lambda ids, emb: (ids, np.where(np.isin(np.arange(len(ids)), [1, 4])[:, None], 0, emb)),
                     ["all-zero", "2 image(s)", "{1}", "{4}"]),
}


@pytest.mark.parametrize("case", list(PRECOMPUTED_CASES), ids=list(PRECOMPUTED_CASES))
def test_precomputed_embeddings_errors(split_template, tmp_path, case):
    proj = tmp_path / "proj"
    shutil.copytree(split_template, proj, symlinks=True)
    ids = read_csv(proj, CATALOG)["image_id"].tolist()
    make, fragments = PRECOMPUTED_CASES[case]
    stored_ids, stored = make(*_precomputed(ids))
    np.savez(proj / "emb.npz", ids=stored_ids, embeddings=stored)
    set_params(proj, {"encode.backbone": "precomputed", "encode.precomputed.path": "emb.npz"})
    plant_stale(proj, (EMBEDDINGS, IDS))
    proc = run_module("stages.encode", cwd=proj)
    assert_user_error(proc, "emb.npz", *(f.format(*ids) for f in fragments))
    assert_no_outputs(proj, (EMBEDDINGS, IDS))


# ================================================================ params


@pytest.mark.parametrize("key, value, message", [
    ("split.seed", "x", "`split.seed` must be an integer >= 0. Got 'x' instead."),
    ("split.seed", True, "`split.seed` must be an integer >= 0. Got True instead."),
    ("split.fractions.train", "0.5", "`split.fractions.train` must be a number between 0 and 1. Got '0.5' instead."),
], ids=["seed_string", "seed_bool", "fraction_string"])
def test_params_wrong_type(proj, key, value, message):
    set_params(proj, {key: value})
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "invalid params.yaml", message)
    assert_no_outputs(proj)


def test_params_unknown_key_typo_gets_a_suggestion(proj):
    set_params(proj, {"split.sed": 3})
    proc = run_module("stages.encode", cwd=proj)  # any stage sees a typo in any section
    assert_user_error(proc, "`split.sed` is not a known param", "Did you mean `seed`?", "Known keys: ")
    assert_no_outputs(proj)


def test_params_out_of_range_fraction(proj):
    set_params(proj, {"split.fractions.val": 2})
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "`split.fractions.val` must be a number between 0 and 1. Got 2 instead.")
    assert_no_outputs(proj)


def test_params_fractions_not_summing_to_1(proj):
    set_params(proj, {"split.fractions": {"train": 0.6, "val": 0.3, "gallery": 0.3}})
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "`split.fractions` train + val + gallery must sum to 1. Got 1.2 instead.")
    assert_no_outputs(proj)


def test_params_empty_ks(proj):
    set_params(proj, {"score.ks": []})
    plant_stale(proj, SCORE_OUTPUTS)
    proc = run_module("stages.score", cwd=proj)
    assert_user_error(proc, "`score.ks` must be positive integers. Got [] instead.")
    assert "not found" not in proc.stderr  # params are judged before the inputs are looked for
    assert_no_outputs(proj, SCORE_OUTPUTS)


def test_params_several_errors_reported_together_before_any_work(proj):
    """One run names every params problem, before any data is read and with no output left."""
    (data_root(proj) / "a" / "0.png").write_bytes(b"")  # a data problem that must not be reached
    set_params(proj, {"split.seed": "x", "split.sed": 1, "split.fractions.train": 1.5,
                        "split.on_bad_image": "sometimes", "score.kss": [1]})
    plant_stale(proj, SPLIT_OUTPUTS)
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "invalid params.yaml",
                      "`split.seed` must be an integer >= 0. Got 'x' instead.",
                      "`split.sed` is not a known param", "Did you mean `seed`?",
                      "`split.fractions.train` must be a number between 0 and 1. Got 1.5 instead.",
                      "`split.on_bad_image`", "`score.kss` is not a known param", "Did you mean `ks`?")
    assert "a/0.png" not in proc.stderr and "data contract" not in proc.stderr
    assert_no_outputs(proj)
