"""encode.engine: ray (recallk.encode.ray_engine) on the session's real local Ray cluster.

The embeddings are byte-identical to the local engine's, the cache is filled as batches stream
back, a worker killed midway leaves its finished batches in the cache (a re-run encodes only the
rest), and a worker's InputError reaches the caller as the local engine's message.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from helpers import DIGITS, image_catalog, image_row, save_image
from recallk.encode.batches import encode_catalog
from recallk.encode.cache import EmbeddingCache
from recallk.encode.ray_engine import ray_source
from recallk.encode.registry import get_backbone
from recallk.encode.settings import EncodeRaySettings
from recallk.errors import InputError

pytestmark = pytest.mark.ray


def ray_encode(cat: pd.DataFrame, name: str, options: dict | None, cache: EmbeddingCache | None = None, *,
               concurrency: int = 2, batch_size: int = 4, max_restarts: int = 0):
    """encode_catalog with the Ray engine (the session's cluster): (embeddings, n_encoded, n_cached)."""
    backbone = get_backbone(name, options)
    source = ray_source(backbone, name, options, EncodeRaySettings(concurrency=concurrency, batch_size=batch_size),
                        max_restarts=max_restarts)
    return encode_catalog(cat, backbone, batch_size=batch_size, num_workers=1, cache=cache, source=source)


def digits_catalog(per_label: int) -> pd.DataFrame:
    files = [f for d in sorted(DIGITS.iterdir()) if d.is_dir() for f in sorted(d.iterdir())[:per_label]]
    return pd.DataFrame([image_row(f, f"{f.parent.name}/{f.stem}") for f in files])


def jpeg_catalog(folder: Path) -> pd.DataFrame:
    """Real JPEG files written by Pillow (large enough for the reduced-size JPEG decoding)."""
    return pd.DataFrame([image_row(save_image(folder / f"j{i}.jpg", seed=i, size=(64 + 8 * i, 48), fmt="JPEG"),
                                   f"j{i}") for i in range(10)])


@pytest.mark.parametrize("which, resolution", [
    ("digits", 16),  # the committed digits (PNG), the default backbone
    ("jpeg", 8),     # JPEGs: decoded in the workers at reduced size, as locally
])
def test_ray_embeddings_byte_identical_to_local_and_cached(ray_cluster, tmp_path, which, resolution):
    cat = digits_catalog(4) if which == "digits" else jpeg_catalog(tmp_path)
    cat = pd.concat([cat, cat.iloc[:3].assign(image_id=lambda f: f["image_id"] + "-copy")], ignore_index=True)
    options = {"resolution": resolution}
    local, *_ = encode_catalog(cat, get_backbone("pixels", options), batch_size=4, num_workers=1)
    fp = get_backbone("pixels", options).fingerprint
    with EmbeddingCache(tmp_path / "c.sqlite", fp) as cache:
        got, n_encoded, n_cached = ray_encode(cat, "pixels", options, cache)
        assert got.tobytes() == local.tobytes()
        assert (n_encoded, n_cached) == (len(cat) - 3, 0)  # the copies share their files' sha256
        held = cache.get_many(cat["sha256"])
        assert len(held) == len(cat) - 3
        for sha, row in zip(cat["sha256"], local):
            assert held[sha].tobytes() == row.tobytes()
        again, n_encoded, n_cached = ray_encode(cat, "pixels", options, cache)  # all hits: Ray is not asked
        assert again.tobytes() == local.tobytes() and (n_encoded, n_cached) == (0, len(cat) - 3)


def test_ray_workers_composite_over_the_drivers_background(ray_cluster, tmp_path):
    """`split.background` travels to the actors: RGBA files encoded on Ray over black are the local engine's bytes
    over black (and not over white); a worker builds the same fingerprint, so it encodes."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(6):
        rgba = rng.integers(0, 256, size=(12, 12, 4), dtype=np.uint8)
        rgba[::2, :, 3] = 0  # garbage under transparent rows
        path = tmp_path / f"t{i}.png"
        Image.fromarray(rgba, "RGBA").save(path)
        rows.append(image_row(path, f"t{i}"))
    cat = pd.DataFrame(rows)
    options = {"resolution": 4}
    backbone = get_backbone("pixels", options, background="black")
    local, *_ = encode_catalog(cat, backbone, batch_size=4, num_workers=1)
    white, *_ = encode_catalog(cat, get_backbone("pixels", options), batch_size=4, num_workers=1)
    source = ray_source(backbone, "pixels", options, EncodeRaySettings(concurrency=1, batch_size=4))
    got, *_ = encode_catalog(cat, backbone, batch_size=4, num_workers=1, source=source)
    assert got.tobytes() == local.tobytes() and got.tobytes() != white.tobytes()


def test_ray_resumes_from_cache_after_a_killed_worker(ray_cluster, tmp_path):
    cat = image_catalog(tmp_path, range(20))
    (ray_cluster / "encoded").write_text("")
    (ray_cluster / "crash_after").write_text("8")  # the actor kills its own process after 8 images,
    (ray_cluster / "wait_for").write_text(f"4 {tmp_path / 'c.sqlite'}")  # once the first batch is in the cache
    name = "callable:ray_backbones:crashing"
    fp = get_backbone(name).fingerprint
    with EmbeddingCache(tmp_path / "c.sqlite", fp) as cache:
        with pytest.raises(InputError, match="a Ray encoder worker died .*re-run to encode the rest"):
            ray_encode(cat, name, None, cache, concurrency=1)
        kept = len(cache.get_many(cat["sha256"]))
        assert 4 <= kept < 20 and kept % 4 == 0  # whole batches only, committed as they came back
        (ray_cluster / "crash_after").unlink()
        (ray_cluster / "wait_for").unlink()
        got, n_encoded, n_cached = ray_encode(cat, name, None, cache, concurrency=1)
    assert (n_encoded, n_cached) == (20 - kept, kept)
    local, *_ = encode_catalog(cat, get_backbone("pixels", {"resolution": 4}), batch_size=4, num_workers=1)
    assert got.tobytes() == local.tobytes()


def _changed(folder: Path) -> pd.DataFrame:
    cat = image_catalog(folder, range(6))
    save_image(folder / "id4.png", seed=99)  # its content changed after cataloguing
    return cat


def _undecodable(folder: Path) -> pd.DataFrame:
    cat = image_catalog(folder, range(5))
    bad = folder / "id2.png"
    bad.write_bytes(b"not an image at all")
    cat.loc[2, "sha256"] = hashlib.sha256(bad.read_bytes()).hexdigest()  # the catalog saw these bytes
    return cat


@pytest.mark.parametrize("make, backbone, fragment", [
    (_changed, "pixels", r"id4\.png' changed since the catalog was built"),  # a file edited after the split
    (_undecodable, "pixels", r"id2\.png' no longer decodes"),  # bytes that Pillow refuses
    (lambda f: image_catalog(f, range(5)), "callable:ray_backbones:two_rows_short",  # a backbone's wrong shape
     r"returned shape \(2, 3\) for a batch of 4"),
])
def test_ray_worker_input_error_is_the_local_message(ray_cluster, tmp_path, make, backbone, fragment):
    cat = make(tmp_path)
    with pytest.raises(InputError, match=fragment) as local:
        encode_catalog(cat, get_backbone(backbone, None), batch_size=4, num_workers=1)
    with pytest.raises(InputError, match=fragment) as remote:
        ray_encode(cat, backbone, None)
    address = re.compile(r"0x[0-9a-f]+")  # Pillow names its in-memory file by address
    assert address.sub("0x", str(remote.value)) == address.sub("0x", str(local.value))


def test_ray_backbone_failure_keeps_its_message(ray_cluster, tmp_path):
    cat = image_catalog(tmp_path, range(3))
    with pytest.raises(Exception, match="the model ran out of memory"):  # a bug of the model: Ray's error
        ray_encode(cat, "callable:ray_backbones:failing", None)
