"""``timm:<model>``: timm's tiny ``test_*`` models with random weights saved to files, folders and a
Hugging Face cache, loaded through the production path (offline: nothing is downloaded)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from extras import extra
from recallk.encode.registry import get_backbone
from recallk.errors import InputError

extra("timm", "timm")  # without it, this file is skipped
import timm
import timm.data
import torch
from timm.models import save_for_hf

from torch_helpers import ATOL, broken, photos, reference, save_state_dict


def tiny(name: str = "test_vit", seed: int = 0) -> torch.nn.Module:
    """A timm test model with its classifier (as checkpoints on the hub have it), random weights."""
    torch.manual_seed(seed)
    return timm.create_model(name, pretrained=False).eval()


def timm_reference(model: torch.nn.Module, images) -> np.ndarray:
    """timm's own pooled features: the model without its classifier, on timm's own eval transform."""
    model.reset_classifier(0)
    transform = timm.data.create_transform(**timm.data.resolve_model_data_config(model), is_training=False)
    return reference(model, transform, images)


@pytest.mark.parametrize("name, suffix", [
    ("test_vit", ".safetensors"),  # a ViT (class token, layer norm), the hub's format
    ("test_convnext", ".pth"),  # a ConvNeXt (head.norm stays, head.fc is dropped), torch.save
    ("test_efficientnet", ".bin"),  # an EfficientNet (BatchNorm, classifier), a pytorch_model.bin
])
def test_embeddings_are_timms_own_forward(tmp_path, name, suffix):
    model = tiny(name)
    weights = save_state_dict(model.state_dict(), tmp_path / f"w{suffix}")
    backbone = get_backbone(f"timm:{name}", {"weights": str(weights)})
    images = photos(4)
    emb = backbone.encode(images)
    want = timm_reference(model, images)
    assert backbone.name == f"timm:{name}" and emb.dtype == np.float32
    assert emb.shape == want.shape == (4, backbone.dim) and backbone.dim == model.num_features
    np.testing.assert_allclose(emb, want, atol=ATOL, rtol=0)
    # per image, alone on one thread: bit-identical whatever else is in the batch
    assert backbone.encode([images[2]])[0].tobytes() == emb[2].tobytes()
    assert backbone.encode([]).shape == (0, backbone.dim)


def test_input_size_is_the_transforms_resize(tmp_path):
    weights = save_state_dict(tiny().state_dict(), tmp_path / "w.safetensors")
    cfg = timm.data.resolve_model_data_config(tiny())  # 160 px, crop_pct 0.95: resize to 168
    assert get_backbone("timm:test_vit", {"weights": str(weights)}).input_size == int(160 / cfg["crop_pct"]) == 168


@pytest.mark.parametrize("case", ["missing", "unexpected", "shape"])  # each kind of mismatch, named
def test_checkpoint_that_does_not_fit_is_named(tmp_path, case):
    state, match = broken(tiny().state_dict(), case)
    weights = save_state_dict(state, tmp_path / "w.safetensors")
    with pytest.raises(InputError, match=rf"weights file '.*w\.safetensors' for timm:test_vit does not fit the "
                                         rf"model \({match}"):
        get_backbone("timm:test_vit", {"weights": str(weights)})


def test_headless_checkpoint_loads_and_a_foreign_one_is_refused(tmp_path):
    model = tiny()
    headless = {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}
    emb = get_backbone("timm:test_vit", {"weights": str(save_state_dict(headless, tmp_path / "h.pth"))})
    np.testing.assert_allclose(emb.encode(photos(2)), timm_reference(model, photos(2)), atol=ATOL, rtol=0)
    convnext = save_state_dict(tiny("test_convnext").state_dict(), tmp_path / "c.safetensors")
    with pytest.raises(InputError, match=r"does not fit the model \(\d+ missing key\(s\): .*unexpected key"):
        get_backbone("timm:test_vit", {"weights": str(convnext)})


@pytest.mark.parametrize("content, suffix, match", [
    (None, ".safetensors", r"weights file '.*nothere\.safetensors' not found; fix `encode\.timm\.weights`"),  # absent
    (b"not weights", ".safetensors", r"cannot read weights file '.*bad\.safetensors'"),  # truncated download
    (b"not weights", ".pth", r"cannot read weights file '.*bad\.pth'"),  # not a torch file
    (b"", ".bin", r"cannot read weights file '.*bad\.bin'"),  # empty
    (b"x", ".ckpt", r"has suffix '\.ckpt'; give a \.safetensors, \.pth, \.pt, \.bin file"),  # unknown format
])
def test_unreadable_weights_are_named(tmp_path, content, suffix, match):
    path = tmp_path / (f"nothere{suffix}" if content is None else f"bad{suffix}")
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InputError, match=match):
        get_backbone("timm:test_vit", {"weights": str(path)})


def test_pickled_objects_are_not_loaded(tmp_path):
    path = tmp_path / "model.pth"
    torch.save({"model": tiny(), "state_dict": None}, path)  # a whole pickled module, not a state dict
    with pytest.raises(InputError, match=r"'.*model\.pth' holds Python objects besides tensors.*state_dict\(\) only"):
        get_backbone("timm:test_vit", {"weights": str(path)})


def test_fingerprint_covers_the_weights_file(tmp_path):
    path = tmp_path / "w.safetensors"
    save_state_dict(tiny(seed=0).state_dict(), path)
    first = get_backbone("timm:test_vit", {"weights": str(path)})
    assert get_backbone("timm:test_vit", {"weights": str(path)}).fingerprint == first.fingerprint
    copy = save_state_dict(tiny(seed=0).state_dict(), tmp_path / "renamed.safetensors")
    assert get_backbone("timm:test_vit", {"weights": str(copy)}).fingerprint == first.fingerprint  # content only
    save_state_dict(tiny(seed=1).state_dict(), path)  # replaced in place
    second = get_backbone("timm:test_vit", {"weights": str(path)})
    assert second.fingerprint != first.fingerprint
    assert not np.allclose(second.encode(photos(1)), first.encode(photos(1)))


def test_folder_config_sets_the_preprocessing_and_the_fingerprint(tmp_path):
    """A local-dir folder (as `hf download --local-dir` leaves it): config.json + model.safetensors. Its
    pretrained_cfg is the preprocessing; changing mean or crop_pct there changes embeddings and fingerprint."""
    model = tiny()
    folder = tmp_path / "test_vit"
    save_for_hf(model, folder)
    plain = get_backbone("timm:test_vit", {"weights": str(folder)})
    config = json.loads((folder / "config.json").read_text())
    config["pretrained_cfg"].update(mean=[0.2, 0.3, 0.4], crop_pct=0.8)
    (folder / "config.json").write_text(json.dumps(config))
    changed = get_backbone("timm:test_vit", {"weights": f"local-dir:{folder}"})  # timm's own spelling works too
    assert changed.fingerprint != plain.fingerprint and changed.input_size == 200 != plain.input_size
    reloaded = timm.create_model(f"local-dir:{folder}", pretrained=True, num_classes=0).eval()
    assert list(timm.data.resolve_model_data_config(reloaded)["mean"]) == [0.2, 0.3, 0.4]
    transform = timm.data.create_transform(**timm.data.resolve_model_data_config(reloaded), is_training=False)
    np.testing.assert_allclose(changed.encode(photos(3)), reference(reloaded, transform, photos(3)), atol=ATOL, rtol=0)


@pytest.mark.parametrize("setup, match", [
    ("no_config", r"folder '.*' has no config\.json"),  # weights only: point at the file instead
    ("two_weights", r"must hold one weights file .*found a\.pth, b\.pth"),  # ambiguous
    ("other_model", r"describes timm model 'test_convnext', not 'test_vit'"),  # the folder is another model
])
def test_bad_folders_are_named(tmp_path, setup, match):
    folder = tmp_path / "f"
    if setup == "other_model":
        save_for_hf(tiny("test_convnext"), folder)
    else:
        folder.mkdir()
        for name in ("a.pth", "b.pth") if setup == "two_weights" else ("a.pth",):
            save_state_dict(tiny().state_dict(), folder / name)
        if setup == "two_weights":
            (folder / "config.json").write_text(json.dumps({"architecture": "test_vit"}))
    with pytest.raises(InputError, match=match):
        get_backbone("timm:test_vit", {"weights": str(folder)})


def test_no_weights_and_empty_hf_cache_is_one_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    with pytest.raises(InputError, match=r"`encode\.backbone: timm:test_vit` needs weights: `encode\.timm\.weights` is "
                                         r"not set.*timm/test_vit\.r160_in1k/model\.safetensors.*not in the local "
                                         r"cache "
                                         r".*nothing is downloaded.*`hf download timm/test_vit\.r160_in1k`"):
        get_backbone("timm:test_vit", {"weights": "recallk/encode/no_file.txt"})  # the placeholder means none


def test_no_weights_reads_timms_weights_from_the_hf_cache(tmp_path, monkeypatch):
    """The Hugging Face cache layout (models--org--name/snapshots/<commit>/file, refs/main), as a
    `hf download timm/test_vit.r160_in1k` leaves it; no network involved."""
    repo = tmp_path / "hub" / "models--timm--test_vit.r160_in1k"
    model = tiny()
    save_state_dict(model.state_dict(), repo / "snapshots" / "abc123" / "model.safetensors")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    backbone = get_backbone("timm:test_vit", {"weights": None})
    np.testing.assert_allclose(backbone.encode(photos(2)), timm_reference(model, photos(2)), atol=ATOL, rtol=0)


@pytest.mark.parametrize("name, match", [
    ("test_vitt", r"timm \S+ has no model 'test_vitt'\. Did you mean `test_vit`\?"),  # typo
    ("test_vit.nosuchtag", r"no pretrained tag 'nosuchtag' for test_vit \(known: test_vit\.r160_in1k\)"),  # bad tag
    ("hf-hub:timm/test_vit", r"not a timm model name.*put a downloaded folder or file in `encode\.timm\.weights`"),
    ("", r"`encode\.backbone: timm:` names no model; write it as `timm:<model>`"),  # nothing after the prefix
])
def test_bad_model_names(name, match):
    with pytest.raises(InputError, match=match):
        get_backbone(f"timm:{name}", {})


def test_fingerprint_holds_the_resolved_preprocessing(tmp_path, monkeypatch):
    """The data config reaches the fingerprint: the same weights under another resolved config fingerprint apart."""
    weights = str(save_state_dict(tiny().state_dict(), tmp_path / "w.safetensors"))
    first = get_backbone("timm:test_vit", {"weights": weights}).fingerprint
    resolve = timm.data.resolve_model_data_config
    monkeypatch.setattr(timm.data, "resolve_model_data_config", lambda m: {**resolve(m), "interpolation": "bilinear"})
    assert get_backbone("timm:test_vit", {"weights": weights}).fingerprint != first
