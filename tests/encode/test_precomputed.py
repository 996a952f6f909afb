"""recallk.encode.precomputed: reading precomputed embeddings and aligning them to the catalog."""

from __future__ import annotations

import numpy as np
import pytest

from recallk.encode import precomputed
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

