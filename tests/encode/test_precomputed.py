"""recallk.encode.precomputed: reading precomputed embeddings and aligning them to the catalog."""

from __future__ import annotations

import numpy as np
import pytest

from recallk.encode import precomputed
from recallk.encode.precomputed import align
from recallk.errors import InputError

CAT_IDS = ["a", "b", "c"]


EMB = np.arange(1, 13, dtype=np.float64).reshape(4, 3)  # rows for ids d, c, a, b (d is extra)


STORED_IDS = np.array(["d", "c", "a", "b"])


def _load(path, ids=None):
    return precomputed.align(*precomputed.read_precomputed(str(path), ids and str(ids)), CAT_IDS, source="src")


@pytest.mark.parametrize("layout", ["npz", "npy+npy", "npy+txt"])
def test_precomputed_aligned_to_catalog_order(tmp_path, layout):
    if layout == "npz":
        np.savez(path := tmp_path / "e.npz", ids=STORED_IDS, embeddings=EMB)
        ids = None
    else:
        np.save(path := tmp_path / "e.npy", EMB)
        ids = tmp_path / ("ids.npy" if layout == "npy+npy" else "ids.txt")
        np.save(ids, STORED_IDS) if layout == "npy+npy" else ids.write_text("\n".join(STORED_IDS) + "\n")
    got = _load(path, ids)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, EMB[[2, 3, 1]])


@pytest.mark.parametrize("path, ids, match", [
    (None, None, r"needs `encode.precomputed.path`"),                        # path: null
    ("nowhere.npz", None, r"'nowhere.npz' not found; fix `encode.precomputed.path`"),  # no such file
    ("e.npy", None, r"holds embeddings only; set `encode.precomputed.ids`"),   # .npy without its ids
    ("e.npy", "nowhere.txt", r"ids file 'nowhere.txt' not found"),            # ids file missing
    ("obj.npy", "ids.npy", r"cannot load precomputed embeddings .*no objects"),  # pickled .npy refused
    ("npy.npz", None, r"'npy.npz' is not an .npz archive; save it with numpy.savez"),  # .npy bytes named .npz
    ("broken.npz", None, r"cannot load precomputed embeddings 'broken.npz'"),         # corrupt zip archive
    ("e.npy", "latin1.txt", r"ids file 'latin1.txt' is not UTF-8 text"),              # ids not UTF-8
    ("zip.npy", "ids.npy", r"'zip.npy' is an .npz archive, not one array"),            # .npz bytes named .npy
])
def test_precomputed_file_errors(tmp_path, monkeypatch, path, ids, match):
    monkeypatch.chdir(tmp_path)
    np.save("e.npy", EMB)
    np.save("ids.npy", STORED_IDS)
    np.save("obj.npy", np.array([[{"x": 1}]] * 4, dtype=object), allow_pickle=True)
    with open("npy.npz", "wb") as fh:
        np.save(fh, EMB)
    with open("zip.npy", "wb") as fh:
        np.savez(fh, ids=STORED_IDS, embeddings=EMB)
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 not really a zip archive")
    (tmp_path / "latin1.txt").write_bytes("d\nc\n\xe9t\xe9\nb\n".encode("latin-1"))
    with pytest.raises(InputError, match=match):
        precomputed.read_precomputed(path, ids)


@pytest.mark.parametrize("arrays, match", [
    ({"ids": None}, r"lacks array\(s\) ids; save it with numpy.savez"),               # npz without ids
    ({"embeddings": EMB[:, 0]}, r"numeric 2-D array \(n, d\); got shape \(4,\)"),  # a vector, not a matrix
    ({"ids": STORED_IDS[:3]}, r"ids of shape \(3,\) for 4 embedding rows"),              # ids shorter than rows
    ({"ids": np.array(["a", "b", "c", "a"])}, r"ids repeat"),                         # 'a' twice
    ({"ids": np.array(["d", "c", "x", "b"])}, r"1 catalog image\(s\) have no embedding, e.g. a;"),  # 'a' absent
    ({"embeddings": np.where(np.arange(4)[:, None] == 3, np.nan, EMB)},
     r"NaN, inf or all-zero embeddings for 1 image\(s\): b;"),                       # row of 'b' is NaN
    ({"ids": STORED_IDS.astype(object)}, r"cannot load precomputed embeddings .*no objects"),
    # ^ object ids (e.g. pandas' to_numpy()): np.savez pickles them; refused with a InputError, not unpickled
], ids=["no ids", "1-D", "length", "repeat", "missing id", "nan", "object npz"])
def test_precomputed_npz_errors(tmp_path, arrays, match):
    arrays = {k: v for k, v in {"ids": STORED_IDS, "embeddings": EMB, **arrays}.items() if v is not None}
    np.savez(tmp_path / "e.npz", **arrays)
    with pytest.raises(InputError, match=match):
        _load(tmp_path / "e.npz")


# ---------------------------------------------------------------- byte-string ids in an .npz (issue 25)
# They ended in a UnicodeDecodeError traceback (moved from the hostile corpus, test_hostile_cache.py).


def test_byte_string_ids_that_are_not_utf8_are_named():
    with pytest.raises(InputError, match=r"x\.npz: id 1 is the byte string b'b\\xff', which is not UTF-8"):
        align(np.array([b"a", b"b\xff"]), np.ones((2, 3)), ["a"], source="x.npz")  # UnicodeDecodeError before


def test_utf8_byte_string_ids_are_decoded():
    # sibling: numpy's own cast decoded ASCII only, so a UTF-8 id failed as well
    out = align(np.array(["é".encode(), b"a"]), np.eye(2), ["a", "é"], source="x.npz")
    assert out.tolist() == [[0, 1], [1, 0]]


# ---------------------------------------------------------------- headers and archives past the limits (issue 25)
# Moved from the hostile corpus (test_hostile_limits.py): an archive was inflated, or a header's shape allocated,
# before any check; now the sizes are read first and refused.


def _npy_header(shape: tuple, descr: str = "<f4") -> bytes:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}".encode("latin-1")
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


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
