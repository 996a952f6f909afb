"""The ``efficientnet_lite0`` backbone: pretrained weights, preprocessing, embeddings, fingerprint (a missing
torch extra: tests/encode/test_registry.py, which runs without it)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_sample_images

from extras import extra
from recallk.encode.registry import get_backbone
from recallk.errors import InputError

extra("torch", "torch")  # without it, this file is skipped
import torch
from efficientnet_pytorch.utils import MemoryEfficientSwish, Swish

from recallk.encode.backbones import efficientnet as backbones_torch


@pytest.fixture(scope="module")
def photos() -> list[Image.Image]:
    """scikit-learn's two sample photos: china.jpg (a temple) and flower.jpg."""
    return [Image.fromarray(arr) for arr in load_sample_images().images]


def _top5(images: list[Image.Image]) -> list[list[int]]:
    model = backbones_torch.pretrained_model()
    with torch.inference_mode():
        logits = model._fc(backbones_torch.pooled_features(model, backbones_torch.preprocess(images)))
    return logits.topk(5).indices.tolist()


def test_pretrained_model_is_lite0():
    model = backbones_torch.build_model()  # load_state_dict(strict=True) inside
    modules = list(model.modules())
    assert not any(isinstance(m, (MemoryEfficientSwish, Swish)) for m in modules)
    assert sum(isinstance(m, torch.nn.ReLU6) for m in modules) == 1 + len(model._blocks) == 17
    assert not any(block.has_se or hasattr(block, "_se_reduce") for block in model._blocks)
    assert not model.training and model._fc.out_features == 1000


def test_classifies_sample_photos(photos):
    china, flower = _top5(photos)  # observed: [698, 442, 975, 663, 483] and [985, 309, 108, 947, 996]
    print("top-5 china:", china, "flower:", flower)
    # Top-1 must be right: with x / 255 input scaling china's top-1 becomes 442 (bell cote); random weights fail both.
    assert china[0] == 698  # palace
    assert flower[0] == 985  # daisy
    assert set(china) & {698, 663, 832, 442, 497, 483}  # palace, monastery, stupa, bell cote, church, castle
    assert set(flower) & {985, 309, 108, 738, 883}  # daisy, bee, sea anemone, pot, vase


def test_preprocess_scaling_and_channel_order():
    x = backbones_torch.preprocess([Image.new("RGB", (300, 400), (255, 127, 0)), Image.new("L", (500, 256), 63)])
    assert x.dtype == torch.float32 and x.shape == (2, 3, 224, 224)
    np.testing.assert_array_equal(x[0, 0], 1.0)  # R: (255 - 127) / 128
    np.testing.assert_array_equal(x[0, 1], 0.0)  # G
    np.testing.assert_array_equal(x[0, 2], -127 / 128)  # B
    np.testing.assert_array_equal(x[1], -0.5)  # grey 63 in every channel


@pytest.mark.parametrize("margin, inside_white", [(8, True), (-16, False)])
def test_preprocess_resizes_then_center_crops(margin, inside_white):
    """1024x512 -> 512x256 -> crop x 144..368, y 16..240, i.e. x 288..736, y 32..480 of the original."""
    arr = np.zeros((512, 1024, 3), dtype=np.uint8)
    arr[32 - margin:480 + margin, 288 - margin:736 + margin] = 255
    x = backbones_torch.preprocess([Image.fromarray(arr)])
    assert bool((x == 1.0).all()) is inside_white  # a white frame around the crop, or black at its edges


def test_embeddings_shape_and_batch_invariance(photos):
    backbone = get_backbone("efficientnet_lite0")
    rng = np.random.default_rng(0)
    fillers = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
               for h, w in [(300, 400), (256, 256), (90, 500), (640, 480), (224, 300), (50, 60)]]
    alone = backbone.encode([photos[0]])
    assert backbone.dim == 1280 and backbone.input_size == 256
    assert alone.shape == (1, 1280) and alone.dtype == np.float32 and np.isfinite(alone).all()
    for pos in (0, 3, 7):
        others = [*fillers, photos[1]]
        batch = [*others[:pos], photos[0], *others[pos:]]
        emb = backbone.encode(batch)
        assert emb.shape == (8, 1280) and emb.dtype == np.float32 and np.isfinite(emb).all()
        assert emb[pos].tobytes() == alone[0].tobytes()  # bit-identical whatever the batch holds
    assert backbone.encode([]).shape == (0, 1280)


def test_fingerprint_covers_the_weights(tmp_path, monkeypatch):
    first = get_backbone("efficientnet_lite0").fingerprint
    assert get_backbone("efficientnet_lite0").fingerprint == first
    other = tmp_path / "other.pth"
    other.write_bytes(b"not the same weights")
    monkeypatch.setattr(backbones_torch, "weights_path", lambda: str(other))
    assert get_backbone("efficientnet_lite0").fingerprint != first


def test_rejects_options():
    with pytest.raises(InputError, match="takes no options; remove resolution"):
        get_backbone("efficientnet_lite0", {"resolution": 16})
