"""Hostile corpus, part 3: resource limits (denial of service from small inputs).

Defect class of every case here: ``limits``. Each failed on the code before this file (the input was
decoded, inflated or allocated in full, or a whole system folder was scanned) and passes after: the
size is read from a header and refused with a message naming the file before anything large exists.
"""

from __future__ import annotations

import struct
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import CATALOG, SPLIT_OUTPUTS, assert_no_outputs, read_csv, run_fails, run_ok, set_params, tiny_project
from recallk import images
from recallk.data import catalog, contract
from recallk.encode import batches
from recallk.errors import InputError


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    return tiny_project(tmp_path)


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
def test_an_image_between_1x_and_2x_the_pixel_limit_is_refused_from_its_header(proj):
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


# ---------------------------------------------------------------- encode: decoded bytes held at once


def test_decoded_batches_hold_a_bounded_number_of_bytes(monkeypatch):
    """Was 3 batches x batch_size images whatever their size: now batches are cut by bytes too, and
    decoding ahead stops when the bytes held would pass ``max_bytes``."""
    lock, state = threading.Lock(), {"decoded": 0, "done": 0, "peak": 0}
    size = 300  # bytes per image (4 x pixels in the encode stage)

    def fake_read(path, sha, min_side=None):
        with lock:
            state["decoded"] += 1
            state["peak"] = max(state["peak"], (state["decoded"] - state["done"]) * size)
        return Image.new("RGB", (1, 1))

    monkeypatch.setattr(batches, "read_checked", fake_read)
    n = 40
    got = []
    for start, imgs in batches.decoded_batches([f"p{i}" for i in range(n)], ["s"] * n, batch_size=16, num_workers=4,
                                               prefetch=2, sizes=[size] * n, max_bytes=1_000):
        got.append((start, len(imgs)))
        with lock:
            state["done"] += len(imgs)
    assert sum(k for _, k in got) == n and [s for s, _ in got] == sorted(s for s, _ in got)
    assert max(k for _, k in got) == 1  # 1000 // (2 + 1) = 333 bytes a batch: one 300-byte image
    assert state["peak"] <= 1_000


@pytest.mark.parametrize("sizes, batch_size, max_bytes, want", [
    ([10] * 5, 2, 100, [(0, 2, 20), (2, 4, 20), (4, 5, 10)]),  # small images: batch_size decides
    ([40, 40, 40, 40], 8, 100, [(0, 2, 80), (2, 4, 80)]),      # bytes decide
    ([500, 10, 10], 8, 100, [(0, 1, 500), (1, 3, 20)]),        # one image over the budget: a batch alone
    ([0] * 3, 2, 100, [(0, 2, 0), (2, 3, 0)]),                  # sizes unknown: images only
])
def test_batches_are_cut_by_images_and_bytes(sizes, batch_size, max_bytes, want):
    assert batches.byte_bounded_chunks(sizes, batch_size, max_bytes) == want


# ---------------------------------------------------------------- ids, headers, archives


@pytest.mark.stage
def test_a_very_long_image_id_is_refused(proj):
    """One 5,000-character id made ids.npy 64 MB for 16 images (fixed-width strings)."""
    long_id = "x" * 5_000
    text = "image_id,path,label\n" + "".join(
        f"{long_id if (label, i) == ('a', 0) else label + str(i)},{label}/{i}.png,{label}\n"
        for label in "abcd" for i in range(3))
    (proj / "data" / "digits" / "manifest.csv").write_text(text, encoding="utf-8")
    set_params(proj, {"split.csv": "manifest.csv"})
    proc = run_fails(proj, "split", contract.ID_LENGTH_RULE, "(5002 characters in all)")  # the repr, quotes included
    assert len(proc.stderr) < 5_000  # the id is quoted cut short


@pytest.mark.stage
def test_an_id_at_the_length_limit_is_accepted(proj):
    text = "image_id,path,label\n" + "".join(
        f"{label}{i}{'y' * (contract.MAX_ID_LENGTH - 2)},{label}/{i}.png,{label}\n"
        for label in "abcd" for i in range(3))
    (proj / "data" / "digits" / "manifest.csv").write_text(text, encoding="utf-8")
    set_params(proj, {"split.csv": "manifest.csv"})
    run_ok(proj, "split")
    assert read_csv(proj, CATALOG)["image_id"].str.len().max() == contract.MAX_ID_LENGTH


def _npy_header(shape: tuple, descr: str = "<f4") -> bytes:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}".encode("latin-1")
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


@pytest.mark.stage
def test_an_npy_header_claiming_10_12_rows_is_refused_before_allocation(proj):
    """It was allocated first: ``_ArrayMemoryError: Unable to allocate 29.1 TiB`` (a traceback)."""
    run_ok(proj, "split")
    np.save(proj / "ids.npy", np.array(read_csv(proj, CATALOG)["image_id"].tolist()))
    (proj / "e.npy").write_bytes(_npy_header((10**12, 8)) + b"\x00" * 64)
    set_params(proj, {"encode.backbone": "precomputed", "encode.precomputed.path": "e.npy",
                      "encode.precomputed.ids": "ids.npy"})
    run_fails(proj, "encode", "header claims shape (1000000000000, 8)", "32,000,000,000,000 bytes",
              "the file holds 64 bytes")


def test_an_npz_deflate_bomb_is_refused_before_inflating(tmp_path, monkeypatch):
    """80 MB of zeros deflate to 80 KB: was inflated in full before any check."""
    np.savez_compressed(tmp_path / "bomb.npz", ids=np.array(["a"]), embeddings=np.zeros((20_000, 1_000), np.float32))
    assert (tmp_path / "bomb.npz").stat().st_size < 1_000_000
    monkeypatch.setattr(np, "load", lambda *a, **k: pytest.fail("inflated the bomb"))
    from recallk.encode import precomputed

    with pytest.raises(InputError, match=r"(?s)member 'embeddings.npy'.*inflates from .* to 80,000,128 bytes"
                                         r".*deflate bomb"):
        precomputed.read_precomputed(str(tmp_path / "bomb.npz"), None)


def test_an_npz_member_whose_header_claims_more_than_it_holds_is_refused(tmp_path):
    import zipfile

    from recallk.encode import precomputed

    with zipfile.ZipFile(tmp_path / "e.npz", "w") as archive:
        archive.writestr("ids.npy", _npy_header((3,), "<U1") + "abc".encode("utf-32-le"))
        archive.writestr("embeddings.npy", _npy_header((10**9, 4)) + b"\x00" * 48)
    with pytest.raises(InputError, match=r"\(member 'embeddings.npy'\): its header claims shape \(1000000000, 4\)"):
        precomputed.read_precomputed(str(tmp_path / "e.npz"), None)


# ---------------------------------------------------------------- system folders as data root


@pytest.mark.parametrize("root", ["/", "/usr", "/etc", "/tmp", "~"])
def test_a_system_folder_is_refused_as_data_root(root):
    """`data_root: /` hashed and decoded every file of the machine."""
    with pytest.raises(InputError, match="is a system folder"):
        catalog.check_root(Path(root).expanduser())


@pytest.mark.stage
def test_a_system_folder_is_refused_by_the_split_stage(proj):
    set_params(proj, {"split.data_root": "/"})
    run_fails(proj, "split", "data root '/' is a system folder", "`split.data_root`")


def test_an_ordinary_folder_under_tmp_is_a_data_root(tmp_path):
    catalog.check_root(tmp_path)  # no error
