"""``open_clip:<model>``: a tiny OpenCLIP config (registered in the test, or in a local-dir folder)
with random weights, loaded through the production path (offline: nothing is downloaded)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from extras import extra
from recallk.encode.registry import get_backbone
from recallk.errors import InputError

extra("open_clip", "open-clip")  # without it, this file is skipped
import open_clip
import open_clip.pretrained
import torch

from torch_helpers import ATOL, broken, photos, reference, save_state_dict

TINY = "recallk-tiny-clip"
#: A 2-layer-ish ViT CLIP small enough to build in milliseconds (16-d embeddings of 32 px images).
TINY_CFG = {"embed_dim": 16,
            "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
            "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 16, "heads": 2, "layers": 1}}
OPENAI_MEAN = tuple(open_clip.OPENAI_DATASET_MEAN)


@pytest.fixture(scope="module", autouse=True)
def tiny_config(tmp_path_factory):
    """Register the tiny config with open_clip (open_clip.add_model_config), as a user's own config would be."""
    path = tmp_path_factory.mktemp("open_clip_configs") / f"{TINY}.json"
    path.write_text(json.dumps(TINY_CFG))
    open_clip.add_model_config(path)
    assert TINY in open_clip.list_models()


def tiny(seed: int = 0, **kwargs):
    """(model, eval transform) of the tiny config with seeded random weights: open_clip's own objects."""
    torch.manual_seed(seed)
    model, _, preprocess = open_clip.create_model_and_transforms(TINY, pretrained=None, **kwargs)
    return model.eval(), preprocess


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])  # open_clip ships both
def test_embeddings_are_open_clips_own_encode_image(tmp_path, suffix):
    model, preprocess = tiny()
    weights = save_state_dict(model.state_dict(), tmp_path / f"w{suffix}")
    backbone = get_backbone(f"open_clip:{TINY}", {"weights": str(weights), "tag": None})
    images = photos(4)
    emb = backbone.encode(images)
    want = reference(model.encode_image, preprocess, images)
    assert backbone.name == f"open_clip:{TINY}" and backbone.dim == 16 and backbone.input_size == 32
    assert emb.shape == want.shape == (4, 16) and emb.dtype == np.float32
    np.testing.assert_allclose(emb, want, atol=ATOL, rtol=0)
    assert backbone.encode([images[1]])[0].tobytes() == emb[1].tobytes()  # independent of the batch


def test_folder_config_builds_the_model_and_sets_the_preprocessing(tmp_path):
    """A local-dir folder as on the hub: open_clip_config.json (model_cfg, preprocess_cfg) and
    open_clip_model.safetensors; no registered config needed, the folder's mean and size apply."""
    model, preprocess = tiny(image_mean=(0.5, 0.5, 0.5), image_std=(0.25, 0.25, 0.25))
    folder = tmp_path / "clip"
    save_state_dict(model.state_dict(), folder / "open_clip_model.safetensors")
    preprocess_cfg = {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CFG, "preprocess_cfg": preprocess_cfg}))
    backbone = get_backbone(f"open_clip:{TINY}", {"weights": str(folder), "tag": None})
    np.testing.assert_allclose(backbone.encode(photos(3)), reference(model.encode_image, preprocess, photos(3)),
                               atol=ATOL, rtol=0)
    file_only = save_state_dict(model.state_dict(), tmp_path / "w.safetensors")  # the same weights, default mean
    assert get_backbone(f"open_clip:{TINY}", {"weights": str(file_only)}).fingerprint != backbone.fingerprint


@pytest.mark.parametrize("case", ["missing", "unexpected", "shape"])  # each kind of mismatch, named
def test_checkpoint_that_does_not_fit_is_named(tmp_path, case):
    state, match = broken(tiny()[0].state_dict(), case)
    weights = save_state_dict(state, tmp_path / "w.safetensors")
    with pytest.raises(InputError, match=rf"weights file '.*w\.safetensors' for open_clip:{TINY} does not fit the "
                                         rf"model \({match}"):
        get_backbone(f"open_clip:{TINY}", {"weights": str(weights)})


def test_fingerprint_covers_the_weights_file(tmp_path):
    path = save_state_dict(tiny(seed=0)[0].state_dict(), tmp_path / "w.safetensors")
    first = get_backbone(f"open_clip:{TINY}", {"weights": str(path)})
    assert get_backbone(f"open_clip:{TINY}", {"weights": str(path)}).fingerprint == first.fingerprint
    save_state_dict(tiny(seed=1)[0].state_dict(), path)  # replaced in place
    assert get_backbone(f"open_clip:{TINY}", {"weights": str(path)}).fingerprint != first.fingerprint


def _tags(monkeypatch, **tags):
    """Give the tiny model pretrained tags, as open_clip's registry holds them for its built-in models."""
    base = {"url": "", "hf_hub": "example/tiny-clip/", "mean": OPENAI_MEAN,
            "std": tuple(open_clip.OPENAI_DATASET_STD), "interpolation": "bicubic", "resize_mode": "shortest"}
    monkeypatch.setitem(open_clip.pretrained._PRETRAINED, TINY, {t: {**base, **cfg} for t, cfg in tags.items()})


def test_a_tag_sets_a_lone_files_preprocessing(tmp_path, monkeypatch):
    _tags(monkeypatch, plain={}, siglip_like={"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5),
                                              "resize_mode": "squash"})
    model, preprocess = tiny(image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5), image_resize_mode="squash")
    weights = str(save_state_dict(model.state_dict(), tmp_path / "w.safetensors"))
    with pytest.raises(InputError, match=r"preprocess differently by tag, so set `encode\.open_clip\.tag`.*plain, "
                                         r"siglip_like"):
        get_backbone(f"open_clip:{TINY}", {"weights": weights, "tag": None})
    backbone = get_backbone(f"open_clip:{TINY}", {"weights": weights, "tag": "siglip_like"})
    np.testing.assert_allclose(backbone.encode(photos(3)), reference(model.encode_image, preprocess, photos(3)),
                               atol=ATOL, rtol=0)
    assert get_backbone(f"open_clip:{TINY}", {"weights": weights, "tag": "plain"}).fingerprint != backbone.fingerprint
    with pytest.raises(InputError, match=r"`encode\.open_clip\.tag: plian` is not a pretrained tag.*Did you mean "
                                         r"`plain`\?"):
        get_backbone(f"open_clip:{TINY}", {"weights": weights, "tag": "plian"})


def test_a_quick_gelu_tag_needs_the_quickgelu_model(tmp_path, monkeypatch):
    _tags(monkeypatch, openai={"quick_gelu": True})
    weights = str(save_state_dict(tiny()[0].state_dict(), tmp_path / "w.safetensors"))
    with pytest.raises(InputError, match=rf"trained with quick_gelu=True.*use the model `open_clip:{TINY}-quickgelu`"):
        get_backbone(f"open_clip:{TINY}", {"weights": weights, "tag": "openai"})


def test_no_weights_names_the_hub_repos_to_download(monkeypatch):
    _tags(monkeypatch, plain={})
    with pytest.raises(InputError, match=r"needs `encode\.open_clip\.weights`.*nothing is downloaded.*plain: "
                                         r"example/tiny-clip\).*`hf download example/tiny-clip --local-dir"):
        get_backbone(f"open_clip:{TINY}", {"weights": "recallk/encode/no_file.txt", "tag": None})


@pytest.mark.parametrize("name, options, match", [
    ("recallk-tiny-clp", {}, rf"no model config 'recallk-tiny-clp'\. Did you mean `{TINY}`\?"),  # typo
    (TINY, {"weights": "nothere.pt"}, r"weights file 'nothere\.pt' not found; fix `encode\.open_clip\.weights`"),
])
def test_bad_names_and_paths(name, options, match):
    with pytest.raises(InputError, match=match):
        get_backbone(f"open_clip:{name}", options)


def test_folder_and_tag_together_are_refused(tmp_path):
    folder = tmp_path / "clip"
    save_state_dict(tiny()[0].state_dict(), folder / "open_clip_model.safetensors")
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CFG}))
    with pytest.raises(InputError, match=r"`encode\.open_clip\.tag` is for a lone checkpoint file"):
        get_backbone(f"open_clip:{TINY}", {"weights": str(folder), "tag": "plain"})
