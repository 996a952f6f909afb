"""recallk.encode.batches: encode_catalog's order, checks of what a backbone returns, read_checked."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import threading

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from helpers import image_catalog, image_row, save_image
from recallk import images
from recallk.encode import batches
from recallk.encode.batches import encode_catalog, read_checked
from recallk.encode.cache import EmbeddingCache
from recallk.encode.registry import Backbone, get_backbone
from recallk.errors import InputError

RED, GREEN = (255, 0, 0), (0, 255, 0)


@pytest.mark.parametrize("batch_size, workers", [(1, 1), (3, 2), (64, 4)])
def test_encode_catalog_order_independent_of_batching(tmp_path, batch_size, workers):
    cat = image_catalog(tmp_path, range(7))
    backbone = get_backbone("pixels", {"resolution": 4})
    got, n_encoded, n_cached = encode_catalog(cat, backbone, batch_size=batch_size, num_workers=workers)
    assert (n_encoded, n_cached) == (7, 0)
    want = backbone.encode([images.load(p) for p in cat["path"]])
    np.testing.assert_array_equal(got, want)


def test_encode_refuses_changed_image(tmp_path):
    cat = image_catalog(tmp_path, range(2))
    save_image(tmp_path / "id1.png", seed=99)  # content changed after cataloguing
    with pytest.raises(InputError, match="changed since the catalog was built"):
        encode_catalog(cat, get_backbone("pixels", {"resolution": 2}), batch_size=2, num_workers=1)


def test_encode_rejects_non_finite_embeddings(tmp_path):
    cat = image_catalog(tmp_path, range(3))
    nan_second = Backbone("bad", 2, lambda imgs: np.array([[1, 0], [np.nan, 0], [0, 1]][: len(imgs)]), "b")
    with pytest.raises(InputError, match=r"NaN, inf or all-zero embeddings for 1 image\(s\): id1"):
        encode_catalog(cat, nan_second, batch_size=8, num_workers=1)


def test_encode_rejects_wrong_shape(tmp_path):
    cat = image_catalog(tmp_path, range(2))
    wrong = Backbone("wrong", 3, lambda imgs: np.zeros((len(imgs), 2)), "w")
    with pytest.raises(InputError, match=r"returned shape \(2, 2\).*expected \(2, 3\)"):
        encode_catalog(cat, wrong, batch_size=2, num_workers=1)


# --- bad embeddings ---------------------------------------------------------------------------------------------

def _flaky():
    """Pixels, except a NaN row for red images and an all-zero row for green ones."""
    base = get_backbone("pixels", {"resolution": 4})

    def encode(imgs):
        emb = base.encode(imgs)
        for i, img in enumerate(imgs):
            emb[i] = np.nan if img.getpixel((0, 0)) == RED else 0 if img.getpixel((0, 0)) == GREEN else emb[i]
        return emb

    return dataclasses.replace(base, name="flaky", encode=encode, fingerprint="flaky")


def _coloured_catalog(folder, spec):
    """``(image_id, colour, side)`` rows: a solid image, or a random one for colour None."""
    rows = []
    for image_id, colour, side in spec:
        path = folder / f"{image_id}.png"
        if colour:
            Image.new("RGB", (side, side), colour).save(path)
        else:
            save_image(path, seed=len(rows))
        rows.append(image_row(path, image_id))
    return rows


def test_bad_embeddings_are_named_and_good_ones_are_kept(tmp_path):
    backbone = _flaky()
    rows = _coloured_catalog(tmp_path, [("ok0", None, 6), ("nan1", RED, 6), ("ok2", None, 6), ("zero3", GREEN, 6),
                                        ("ok4", None, 6), ("nan5", RED, 7)])
    cat = pd.DataFrame(rows)
    with EmbeddingCache(tmp_path / "c.sqlite", backbone.fingerprint) as cache:
        with pytest.raises(InputError, match=r"all-zero embeddings for 3 image\(s\): ") as err:
            encode_catalog(cat, backbone, batch_size=2, num_workers=2, cache=cache)
        assert set(re.search(r"image\(s\): (.*?); check", str(err.value))[1].split(", ")) == {"nan1", "zero3", "nan5"}
        good = cat[cat["image_id"].str.startswith("ok")]["sha256"].tolist()
        assert sorted(cache.get_many(cat["sha256"])) == sorted(good)
        for i in (1, 3, 5):  # fix the bad images: replace them with ordinary ones
            rows[i] = image_row(save_image(tmp_path / f"fixed{i}.png", seed=50 + i), rows[i]["image_id"])
        _, n_enc, n_hit = encode_catalog(pd.DataFrame(rows), backbone, batch_size=2, num_workers=2, cache=cache)
    assert (n_enc, n_hit) == (3, 3)


@pytest.mark.parametrize("spec, named", [
    ([("nan0", RED, 6), ("ok1", None, 6), ("zero2", GREEN, 6), ("nan3", RED, 7)], "3 image\\(s\\): nan0, zero2, nan3;"),
    # ^ named in catalog order, as the docstring promises ("encoded, in catalog order")
    ([("ok0", None, 6), ("nan1", RED, 6), ("nan1_copy", RED, 6)], "2 image\\(s\\): nan1, nan1_copy;"),
    # ^ two catalog rows with the same bad file: both rows are unusable, both are named
])
def test_bad_embeddings_name_every_catalog_row_in_order(tmp_path, spec, named):
    with pytest.raises(InputError, match=named):
        encode_catalog(pd.DataFrame(_coloured_catalog(tmp_path, spec)), _flaky(), batch_size=2, num_workers=1)


# --- callable backbones: what they return -----------------------------------------------------------------------

def test_callable_returning_non_numbers(tmp_path, user_module):
    user_module("mymod_text", "def embed(images):\n    return [['a', 'b'] for _ in images]\n")
    with pytest.raises(InputError, match=r"did not return numbers for a batch of 2 .*return an \(n, d\) array"):
        encode_catalog(image_catalog(tmp_path, range(2)), get_backbone("callable:mymod_text:embed"), batch_size=2,
                       num_workers=1)


def test_callable_changing_dimension_between_batches(tmp_path, user_module):
    user_module("mymod_dims", "import numpy as np\ncalls = []\ndef embed(images):\n"
                              "    calls.append(1)\n    return np.ones((len(images), 2 + len(calls)))\n")
    with pytest.raises(InputError, match=r"returned shape \(2, 4\) for a batch of 2; expected \(2, 3\)"):
        encode_catalog(image_catalog(tmp_path, range(4)), get_backbone("callable:mymod_dims:embed"), batch_size=2,
                       num_workers=1)


# --- decoding ahead of the backbone -----------------------------------------------------------------------------

def test_pixels_backbone_on_drafted_jpeg_is_deterministic(tmp_path, big_jpeg):
    (path := tmp_path / "x.jpg").write_bytes(big_jpeg)
    backbone = get_backbone("pixels", {"resolution": 16})
    decode = lambda: read_checked(str(path), hashlib.sha256(big_jpeg).hexdigest(), backbone.input_size)  # noqa: E731
    assert decode().size == (250, 188)  # 1/8 draft, both sides >= 16
    assert backbone.encode([decode()]).tobytes() == backbone.encode([decode()]).tobytes()


# ---------------------------------------------------------------- decoded bytes held at once (issue 25)
# Moved from the hostile corpus (test_hostile_limits.py): batches were cut by image count alone, whatever the
# images' size; now by bytes too.


def test_decoded_batches_hold_a_bounded_number_of_bytes(monkeypatch):
    """Was 3 batches x batch_size images whatever their size: now batches are cut by bytes too, and
    decoding ahead stops when the bytes held would pass ``max_bytes``."""
    lock, state = threading.Lock(), {"decoded": 0, "done": 0, "peak": 0}
    size = 300  # bytes per image (4 x pixels in the encode stage)

    def fake_read(path, sha, min_side=None, background=None):
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
