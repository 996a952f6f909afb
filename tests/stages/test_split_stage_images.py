"""The split stage (stages/split.py) on image files: unreadable ones (``split.on_bad_image``), unusual but valid
ones decoded right through encode, symlinks out of the data root; the hostile-input corpus of issue 25 (its
manifests and data shapes: test_split_stage_manifests.py), run through the real stages on tiny generated data.

The contract under test (README "What happens with bad data"): a user error exits with code 2 and
prints one ``error: ...`` message on stderr that names the file, CSV line or param and says how to fix
it; no traceback; no output file left behind. Inputs that are accepted must be decoded correctly.

``split.on_bad_image: error | skip`` (default ``error``): unreadable images fail the split with one
message listing every bad file, or (``skip``) are dropped, listed in ``data/prepared/skipped.csv``
(``path,reason``, sorted by path) and counted in ``num_skipped_images`` of metrics/recall.json.
Missing files, paths outside the data root and symlinks out of it stay errors under both.

Every file is generated here (Pillow / numpy); the data is a few 8x8 images per label and the
``pixels`` backbone runs at resolution 4, so the whole corpus is a few dozen short stage runs, in process
(:func:`helpers.run_in_process`: the runner's exit code and stderr, without an interpreter start each).
"""

from __future__ import annotations

import io
import re
import struct
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from helpers import (
    CATALOG,
    SKIPPED,
    SPLIT_OUTPUTS,
    STAGES,
    assert_no_outputs,
    assert_user_error,
    plant_stale,
    read_csv,
    read_metrics,
    run_in_process,
    run_ok,
    save_image,
    set_params,
)
from hostile_cases import (
    LABELS,
    PER_LABEL,
    RES,
    assert_line_names,
    base_rows,
    data_root,
    embeddings,
    line_of,
    make_project,
    manifest,
    pipeline,
    pixels_of,
    rgb_block,
)

pytestmark = pytest.mark.stage  # every test here runs the stages (in process: helpers.run_in_process)


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    return make_project(tmp_path)


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
    return proj, run_in_process("split", cwd=proj)


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
        procs.append(run_in_process(stage, cwd=proj))
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
    proc = run_in_process("split", cwd=proj)
    assert_user_error(proc)
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'a/missing.png,a')}", "a/missing.png", "does not exist")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, '../outside.png,a')}", "../outside.png")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, f'{outside},a')}", str(outside))
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'a/link.png,a')}", "a/link.png", "outside the data root")
    assert_no_outputs(proj)


def test_on_bad_image_rejects_an_unknown_policy(proj):
    set_params(proj, {"split.on_bad_image": "ignore"})
    proc = run_in_process("split", cwd=proj)
    assert_user_error(proc, "`split.on_bad_image` must be one of error, skip. Got 'ignore' instead.")
    assert_no_outputs(proj)


# ================================================================ files: accepted and decoded correctly


@pytest.fixture(scope="module")
def accepted_run(tmp_path_factory):
    """Every unusual-but-valid image in one data root, through split, encode and score."""
    proj = make_project(tmp_path_factory.mktemp("accepted"))
    write_accepted(proj)
    procs = [run_in_process(stage, cwd=proj) for stage in STAGES]
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
    """docs/errors.md: palette images with transparency become RGB; transparent pixels are composited over
    `split.background` (white), not shown in the colour stored in the palette (docs/data.md#transparent-images)."""
    got = accepted_embedding(accepted_run, "c/palette.png").reshape(RES, RES, 3)
    want = np.asarray(PALETTE, dtype=np.float32)[PALETTE_INDEX] / 255
    want[PALETTE_INDEX == 0] = 1.0  # index 0 is the transparent entry
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
    proc = run_in_process("split", cwd=proj)
    assert_user_error(proc, "copy the file into the data root")
    assert_line_names(proc.stderr, f"'{named}'", "outside the data root")
    assert_no_outputs(proj)


