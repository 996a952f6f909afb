"""recallk.evaluation: evaluate() encodes paths or PIL images like the pipeline and scores them with recall_at_k."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from helpers import save_image
from recallk import evaluate, recall_at_k

KS = [1, 2, 5, 10, 40]


def mean_colour(images):
    return np.array([np.asarray(im, dtype=np.float32).mean(axis=(0, 1)) for im in images])


def flat_pixels(images):
    return np.array([np.asarray(im.resize((4, 4)), dtype=np.float32).ravel() for im in images])


def _solid(path, rgb):
    Image.new("RGB", (8, 8), rgb).save(path)
    return str(path)


def test_evaluate_equals_recall_at_k(tmp_path):
    paths = [str(save_image(tmp_path / f"{i}.png", seed=i)) for i in range(12)]
    labels = [i % 3 for i in range(12)]
    qp, ql, gp, gl = paths[:5], labels[:5], paths[3:], labels[3:]  # paths 3 and 4 overlap
    emb = {p: e for p, e in zip(paths, flat_pixels([Image.open(p).convert("RGB") for p in paths]))}
    expected = recall_at_k(np.array([emb[p] for p in qp]), np.array([emb[p] for p in gp]), ql, gl,
                           query_ids=qp, gallery_ids=gp, ks=KS)
    assert evaluate(qp, gp, ql, gl, encoder_fn=flat_pixels, ks=KS) == expected


def test_evaluate_self_match_by_path(tmp_path):
    red = _solid(tmp_path / "red.png", (200, 10, 10))
    near = _solid(tmp_path / "near.png", (190, 20, 10))
    blue = _solid(tmp_path / "blue.png", (10, 10, 200))
    gallery, gl = [red, near, blue], ["x", "y", "x"]
    # red's own file is skipped: nearest is "near" (label y) -> miss at 1, blue found at 2
    assert evaluate([red], gallery, ["x"], gl, encoder_fn=mean_colour, ks=[1, 2]) == {"recall@1": 0.0, "recall@2": 1.0}
    # a different spelling of the same path is still the same image
    rel = os.path.relpath(red)
    assert evaluate([rel], gallery, ["x"], gl, encoder_fn=mean_colour, ks=[1]) == {"recall@1": 0.0}
    # the same PIL object in both lists is the same image, like a path (tests/score/test_api_training_loop.py)
    imgs = [Image.open(p) for p in gallery]
    assert evaluate(imgs[:1], imgs, ["x"], gl, encoder_fn=mean_colour, ks=[1, 2]) == {"recall@1": 0.0, "recall@2": 1.0}
    # an equal copy is another object: the query's twin in the gallery counts as a hit
    assert evaluate([Image.open(red)], imgs, ["x"], gl, encoder_fn=mean_colour, ks=[1, 2]) == \
        {"recall@1": 1.0, "recall@2": 1.0}


def test_evaluate_accepts_pil_images(tmp_path):
    paths = [str(save_image(tmp_path / f"{i}.png", seed=i)) for i in range(8)]
    labels = [i % 2 for i in range(8)]
    pil = [Image.open(p).convert("RGB") for p in paths]
    assert evaluate(pil[:3], pil[3:], labels[:3], labels[3:], encoder_fn=mean_colour, ks=[1, 3]) == \
        evaluate(paths[:3], paths[3:], labels[:3], labels[3:], encoder_fn=mean_colour, ks=[1, 3])


def test_evaluate_applies_exif_orientation(tmp_path):
    rotated = tmp_path / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW on display
    Image.new("RGB", (20, 10), (120, 30, 30)).save(rotated, "JPEG", exif=exif)
    upright = save_image(tmp_path / "upright.png", size=(10, 20))
    seen = []

    def encoder(images):
        seen.extend(im.size for im in images)
        return mean_colour(images)

    evaluate([str(rotated)], [str(rotated), str(upright)], ["a"], ["a", "a"], encoder_fn=encoder, ks=[1])
    assert seen == [(10, 20)] * 3


def test_evaluate_rejects_bad_ks_before_encoding(tmp_path):
    calls = []
    p = str(save_image(tmp_path / "a.png"))
    with pytest.raises(ValueError, match="positive integers"):
        evaluate([p], [p], ["a"], ["a"], encoder_fn=lambda ims: calls.append(ims) or mean_colour(ims), ks=[0])
    assert calls == []
