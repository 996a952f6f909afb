"""Image decoding, the backbone registry and the encode stage."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from recallk import images
from recallk.encode import registry as backbones
from recallk.encode.registry import Backbone, get_backbone
from recallk.errors import InputError
from recallk.encode.batches import encode_catalog

from conftest import run_module, save_image


def _exif_rotated_jpeg(path):
    """A 20x10 (w x h) JPEG whose EXIF says 'rotate 90 CW' (orientation 6): upright it is 10x20."""
    img = Image.new("RGB", (20, 10), (200, 30, 30))
    exif = Image.Exif()
    exif[0x0112] = 6
    img.save(path, exif=exif)
    return path


@pytest.mark.parametrize("mode, extra", [
    ("L", {}),                      # grayscale -> RGB
    ("RGBA", {}),                   # alpha dropped
    ("P", {"transparency": 0}),     # palette with transparency goes through RGBA
    ("CMYK", {}),                   # CMYK -> RGB
])
def test_decode_gives_rgb(tmp_path, mode, extra):
    path = tmp_path / f"x.{'jpg' if mode == 'CMYK' else 'png'}"
    Image.new(mode, (5, 4)).save(path, **extra)
    img = images.load(path)
    assert img.mode == "RGB" and img.size == (5, 4)


def test_decode_applies_exif_orientation(tmp_path):
    assert images.load(_exif_rotated_jpeg(tmp_path / "r.jpg")).size == (10, 20)


def test_decode_rejects_truncated_file(tmp_path):
    path = save_image(tmp_path / "t.png", size=(64, 64))
    data = path.read_bytes()
    with pytest.raises(images.DECODE_ERRORS):
        images.decode(data[: len(data) // 2])


@pytest.mark.parametrize("size", [1, 4, 16])
def test_pixels_backbone_shape_and_values(size):
    backbone = get_backbone("pixels", {"resolution": size})
    white = Image.new("RGB", (30, 20), (255, 255, 255))
    emb = backbone.encode([white, Image.new("RGB", (7, 7))])
    assert emb.shape == (2, 3 * size * size) == (2, backbone.dim)
    assert emb.dtype == np.float32
    np.testing.assert_array_equal(emb[0], 1.0)  # white -> all ones
    np.testing.assert_array_equal(emb[1], 0.0)  # black -> all zeros


def test_fingerprint_changes_with_preprocessing():
    assert get_backbone("pixels", {"resolution": 8}).fingerprint != get_backbone("pixels", {"resolution": 16}).fingerprint
    assert get_backbone("pixels", {"resolution": 8}).fingerprint == get_backbone("pixels", {"resolution": 8}).fingerprint


@pytest.mark.parametrize("name, match", [
    ("pixel", "unknown backbone 'pixel'.*Did you mean `pixels`"),  # typo gets a suggestion
    ("resnet", "unknown backbone 'resnet'.*Available backbones: .*pixels, precomputed, or `callable:"),
])
def test_unknown_backbone(name, match):
    with pytest.raises(InputError, match=match):
        get_backbone(name)


def test_register_adds_a_backbone(monkeypatch):
    monkeypatch.setattr(backbones, "REGISTRY", dict(backbones.REGISTRY))

    @backbones.register("const")
    def const() -> Backbone:
        return Backbone("const", 2, lambda imgs: np.ones((len(imgs), 2)), "c")

    assert get_backbone("const").dim == 2


def _catalog(tmp_path, n):
    import hashlib
    rows = []
    for i in range(n):
        p = save_image(tmp_path / f"{i}.png", seed=i)
        rows.append({"image_id": f"id{i}", "path": str(p), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("batch_size, workers", [(1, 1), (3, 2), (64, 4)])
def test_encode_catalog_order_independent_of_batching(tmp_path, batch_size, workers):
    cat = _catalog(tmp_path, 7)
    backbone = get_backbone("pixels", {"resolution": 4})
    got, n_encoded, n_cached = encode_catalog(cat, backbone, batch_size=batch_size, num_workers=workers)
    assert (n_encoded, n_cached) == (7, 0)
    want = backbone.encode([images.load(p) for p in cat["path"]])
    np.testing.assert_array_equal(got, want)


def test_encode_refuses_changed_image(tmp_path):
    cat = _catalog(tmp_path, 2)
    save_image(tmp_path / "1.png", seed=99)  # content changed after cataloguing
    with pytest.raises(InputError, match="changed since the catalog was built"):
        encode_catalog(cat, get_backbone("pixels", {"resolution": 2}), batch_size=2, num_workers=1)


def test_encode_rejects_non_finite_embeddings(tmp_path):
    cat = _catalog(tmp_path, 3)
    nan_second = Backbone("bad", 2, lambda imgs: np.array([[1, 0], [np.nan, 0], [0, 1]][: len(imgs)]), "b")
    with pytest.raises(InputError, match=r"NaN, inf or all-zero embeddings for 1 image\(s\): id1"):
        encode_catalog(cat, nan_second, batch_size=8, num_workers=1)


def test_encode_rejects_wrong_shape(tmp_path):
    cat = _catalog(tmp_path, 2)
    wrong = Backbone("wrong", 3, lambda imgs: np.zeros((len(imgs), 2)), "w")
    with pytest.raises(InputError, match=r"returned shape \(2, 2\).*expected \(2, 3\)"):
        encode_catalog(cat, wrong, batch_size=2, num_workers=1)


def test_encode_stage_writes_aligned_outputs(project):
    assert run_module("stages.split", cwd=project).returncode == 0
    proc = run_module("stages.encode", cwd=project)
    assert proc.returncode == 0, proc.stderr
    emb = np.load(project / "data/embeddings/embeddings.npy", allow_pickle=False)
    ids = np.load(project / "data/embeddings/ids.npy", allow_pickle=False)
    cat = pd.read_csv(project / "data/prepared/catalog.csv", dtype=str)
    assert emb.dtype == np.float32 and emb.shape == (200, 768)
    assert ids.tolist() == cat["image_id"].tolist()
    first = images.load(project / cat["path"][0])
    np.testing.assert_array_equal(emb[0], get_backbone("pixels", {"resolution": 16}).encode([first])[0])
