"""``hf:<local dir>``: a tiny DINOv2 saved with save_pretrained, loaded offline, pooled three ways."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image

from extras import extra
from recallk.encode.registry import get_backbone
from recallk.errors import InputError

extra("transformers", "hf")  # without it (and torch), this file is skipped
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoImageProcessor, BitImageProcessor, Dinov2Config, Dinov2Model

CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
              patch_size=8)
WEIGHTS = "model.safetensors"


def save_dinov2(folder, seed: int = 0, size: int = 40):
    torch.manual_seed(seed)
    Dinov2Model(Dinov2Config(**CONFIG)).save_pretrained(folder)
    BitImageProcessor(size={"shortest_edge": size}, crop_size={"height": 32, "width": 32},
                      image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def dino_dir(tmp_path_factory):
    return save_dinov2(tmp_path_factory.mktemp("hf") / "dinov2-tiny")


@pytest.fixture
def dino_copy(dino_dir, tmp_path):
    return shutil.copytree(dino_dir, tmp_path / "dino")


@pytest.fixture(scope="module")
def photos() -> list[Image.Image]:
    rng = np.random.default_rng(1)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in [(48, 64), (70, 50)]]


def hf(folder, pooling: str = "cls"):
    return get_backbone(f"hf:{folder}", {"dir": str(folder), "pooling": pooling})


def reference(folder, photos):
    """transformers' own model and processor on the processor's own batch tensor."""
    model = Dinov2Model.from_pretrained(folder, local_files_only=True).eval()
    processor = AutoImageProcessor.from_pretrained(folder, local_files_only=True)
    with torch.inference_mode():
        return model(**processor(images=photos, return_tensors="pt"))


@pytest.mark.parametrize("pooling, pick", [
    ("cls", lambda out: out.last_hidden_state[:, 0]),  # the class token after DINOv2's final LayerNorm
    ("mean", lambda out: out.last_hidden_state.mean(1)),  # all tokens' mean
    ("pooler", lambda out: out.pooler_output),  # DINOv2's pooler_output: the same CLS token
])
def test_embeddings_equal_transformers_own_forward(dino_dir, photos, pooling, pick):
    backbone = hf(dino_dir, pooling)
    got = backbone.encode(photos)
    want = pick(reference(dino_dir, photos)).numpy()
    assert got.shape == (2, 32) == (2, backbone.dim) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_cls_is_after_the_final_layernorm(dino_dir, photos):
    out = reference(dino_dir, photos)
    np.testing.assert_array_equal(out.pooler_output.numpy(), out.last_hidden_state[:, 0].numpy())
    model = Dinov2Model.from_pretrained(dino_dir, local_files_only=True).eval()
    x = AutoImageProcessor.from_pretrained(dino_dir, local_files_only=True)(images=photos, return_tensors="pt")
    with torch.inference_mode():
        cls = model.layernorm(model.encoder(model.embeddings(x["pixel_values"])).last_hidden_state)[:, 0]
    np.testing.assert_allclose(cls.numpy(), hf(dino_dir).encode(photos), rtol=1e-5, atol=1e-5)


def _edit_weights(folder, edit):
    state = dict(load_file(folder / WEIGHTS))
    edit(state)
    save_file(state, folder / WEIGHTS, metadata={"format": "pt"})


KEY = "encoder.layer.0.mlp.fc1.weight"


@pytest.mark.parametrize("edit, fragment", [
    (lambda s: s.pop(KEY), rf"missing keys: {KEY}"),  # transformers itself only warns
    (lambda s: s.update({"head.extra": torch.zeros(2)}), r"unexpected keys: head\.extra"),
    (lambda s: s.update({KEY: torch.zeros(5, 5)}), rf"mis-shaped keys: {KEY}"),  # transformers raises RuntimeError
])
def test_checkpoint_that_does_not_fit_is_one_clear_error(dino_copy, edit, fragment):
    _edit_weights(dino_copy, edit)
    with pytest.raises(InputError, match=rf"the weights in the hf model directory '.*dino' do not match its "
                                         rf"config.json \(Dinov2Model\): {fragment}"):
        hf(dino_copy)


@pytest.mark.parametrize("edit, fragment", [
    # an int8 export: from_pretrained cast it to float without a word (hostile corpus, issue 25)
    (lambda s: s.update({KEY: s[KEY].to(torch.int8)}), rf"1 key\(s\) of another dtype where the model holds floats: "
                                                       rf"model\.safetensors: {KEY} I8"),
    (lambda s: s[KEY].fill_(float("nan")), rf"1 key\(s\) holding NaN or inf: {KEY}"),  # loaded without a word
])
def test_weights_of_another_dtype_or_not_finite_are_refused(dino_copy, edit, fragment):
    _edit_weights(dino_copy, edit)
    with pytest.raises(InputError, match=rf"the weights in the hf model directory '.*dino' cannot be used \("
                                         rf".*{fragment}"):
        hf(dino_copy)


@pytest.mark.parametrize("remove, fragment", [
    ("config.json", r"has no config.json, so it is not a saved transformers model"),
    (WEIGHTS, r"cannot load the hf model directory .*needs config.json, the weights"),
    ("preprocessor_config.json", r"cannot load the hf model directory .*preprocessor_config.json"),
])
def test_incomplete_directory_is_one_clear_error(dino_copy, remove, fragment):
    (dino_copy / remove).unlink()
    with pytest.raises(InputError, match=fragment):
        hf(dino_copy)


def test_directory_errors(tmp_path, dino_dir):
    with pytest.raises(InputError, match=r"`encode.backbone: hf:.*nowhere`: directory '.*nowhere' not found"):
        hf(tmp_path / "nowhere")
    # the directory must also be encode.hf.dir, the path dvc.yaml tracks
    with pytest.raises(InputError, match=r"needs `encode.hf.dir: .*dinov2-tiny` too \(it is 'recallk/encode/no_file"):
        get_backbone(f"hf:{dino_dir}", {"dir": "recallk/encode/no_file.txt", "pooling": "cls"})
    with pytest.raises(InputError, match=r"`encode.hf.pooling` must be one of cls, mean, pooler. Got 'max' instead."):
        hf(dino_dir, "max")


def test_fingerprint_covers_weights_processor_and_pooling(dino_copy, dino_dir):
    base = hf(dino_copy).fingerprint
    assert hf(dino_copy).fingerprint == base  # stable
    assert hf(dino_copy, "mean").fingerprint != base
    save_dinov2(dino_copy, seed=1)  # other weights, in place
    other_weights = hf(dino_copy).fingerprint
    assert other_weights != base
    save_dinov2(dino_copy, seed=1, size=48)  # the same weights, another processor config (resize 48)
    assert hf(dino_copy).fingerprint not in (base, other_weights)
