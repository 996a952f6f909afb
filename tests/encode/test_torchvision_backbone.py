"""``torchvision:<model>``: strict local weights, the classifier removed, torchvision's own preprocessing."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from extras import extra
from recallk.encode.registry import get_backbone
from recallk.errors import InputError

extra("torch", "torch")  # without it, this file is skipped
import torch
import torchvision
from torchvision.models.feature_extraction import create_feature_extractor

from recallk.encode.backbones import torchvision as tvb

PRESET = "ResNet18_Weights.IMAGENET1K_V1"
EXPLICIT = {"resize": 40, "crop": 32, "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3], "interpolation": "bicubic"}


def random_model(name: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torchvision.models.get_model(name, weights=None).eval()


@pytest.fixture(scope="module")
def resnet18_file(tmp_path_factory) -> tuple[str, dict[str, torch.Tensor]]:
    """A random resnet18's whole state dict saved as torchvision ships it (a .pth)."""
    state = random_model("resnet18").state_dict()
    path = tmp_path_factory.mktemp("tv") / "resnet18.pth"
    torch.save(state, path)
    return str(path), state


@pytest.fixture(scope="module")
def photos() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in [(240, 320), (300, 256)]]


def options(weights: str, **more) -> dict:
    return {"weights": weights, "preset": None, "resize": None, "crop": None, "mean": None, "std": None,
            "interpolation": "bilinear", **more}


def test_embeddings_equal_torchvisions_own_forward(resnet18_file, photos):
    path, state = resnet18_file
    backbone = get_backbone("torchvision:resnet18", options(path, preset=PRESET))
    got = backbone.encode(photos)
    # the oracle: torchvision's own model, weights, preset transform and feature extractor (the pooled node)
    model = random_model("resnet18", seed=1)
    model.load_state_dict(state)
    x = torch.stack([torchvision.models.get_weight(PRESET).transforms()(img) for img in photos])
    with torch.inference_mode():
        want = create_feature_extractor(model, {"flatten": "pooled"})(x)["pooled"].numpy()
        logits = model(x).numpy()
    assert got.shape == (2, 512) == (2, backbone.dim) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the embedding is the input of the classifier: fc applied to it gives torchvision's logits
    fc = state["fc.weight"].numpy(), state["fc.bias"].numpy()
    np.testing.assert_allclose(got @ fc[0].T + fc[1], logits, rtol=1e-4, atol=1e-4)
    assert backbone.input_size == 256  # the preset's resize: JPEGs may be decoded reduced down to it


@pytest.mark.parametrize("name, head, dim", [
    ("resnet18", "fc", 512),  # a Linear head: replaced whole
    ("mobilenet_v3_small", "classifier[3]", 1024),  # Linear-Hardswish-Dropout-Linear: the last Linear goes
    ("squeezenet1_1", "classifier[1]", 512),  # a 1x1 conv classifier and its ReLU go; the global pool stays
    ("convnext_tiny", "classifier[2]", 768),  # LayerNorm2d-Flatten-Linear: the normalised pooled features stay
])
def test_strip_classifier_per_family(name, head, dim):
    model = random_model(name)
    assert tvb.strip_classifier(model) == head
    with torch.inference_mode():
        assert model(torch.zeros(1, 3, 64, 64)).shape == (1, dim)


def test_explicit_preprocessing_equals_torchvisions_preset_code(resnet18_file, photos):
    path, _ = resnet18_file
    backbone = get_backbone("torchvision:resnet18", options(path, **EXPLICIT))
    transform = torchvision.transforms.Compose([
        torchvision.transforms.Resize(40, interpolation=torchvision.transforms.InterpolationMode.BICUBIC),
        torchvision.transforms.CenterCrop(32), torchvision.transforms.ToTensor(),
        torchvision.transforms.Normalize(EXPLICIT["mean"], EXPLICIT["std"])])
    model = random_model("resnet18", seed=1)
    model.load_state_dict(resnet18_file[1])
    model.fc = torch.nn.Identity()
    with torch.inference_mode():
        want = model(torch.stack([transform(img) for img in photos])).numpy()
    np.testing.assert_allclose(backbone.encode(photos), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("change", [
    {"resize": 48},  # each explicit preprocessing param reaches the fingerprint
    {"crop": 24},
    {"mean": [0.5, 0.5, 0.5]},
    {"std": [0.2, 0.2, 0.2]},
    {"interpolation": "bilinear"},
])
def test_preprocessing_params_reach_the_fingerprint(resnet18_file, change):
    path, _ = resnet18_file
    base = get_backbone("torchvision:resnet18", options(path, **EXPLICIT)).fingerprint
    assert get_backbone("torchvision:resnet18", options(path, **{**EXPLICIT, **change})).fingerprint != base
    assert get_backbone("torchvision:resnet18", options(path, **EXPLICIT)).fingerprint == base


def test_preset_reaches_the_fingerprint(resnet18_file):
    path, _ = resnet18_file
    fp = {p: get_backbone("torchvision:resnet18", options(path, preset=p)).fingerprint
          for p in (PRESET, "ResNet50_Weights.IMAGENET1K_V2")}  # 256/224 versus 232/224
    assert len(set(fp.values())) == 2
    config = tvb.transform_config(tvb.preset_transform("ResNet50_Weights.IMAGENET1K_V2"))
    assert config == {"resize": [232], "crop": [224], "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
                      "interpolation": "bilinear", "antialias": True}


def test_changed_weights_file_changes_the_fingerprint(tmp_path, resnet18_file):
    path = tmp_path / "w.pth"
    torch.save(random_model("resnet18", seed=0).state_dict(), path)
    first = get_backbone("torchvision:resnet18", options(str(path), preset=PRESET)).fingerprint
    torch.save(random_model("resnet18", seed=2).state_dict(), path)  # replaced in place
    assert get_backbone("torchvision:resnet18", options(str(path), preset=PRESET)).fingerprint != first


def _saved(tmp_path, state: dict) -> str:
    path = tmp_path / "bad.pth"
    torch.save(state, path)
    return str(path)


@pytest.mark.parametrize("edit, fragment", [
    (lambda s: s.pop("layer1.0.conv1.weight"), r"1 missing key\(s\): layer1\.0\.conv1\.weight"),  # a missing key
    (lambda s: s.update({"head.extra": torch.zeros(2)}), r"1 unexpected key\(s\): head\.extra"),  # an extra key
    (lambda s: s.update({"fc.weight": torch.zeros(10, 512)}),  # a 10-class head for a 1000-class model
     r"1 key\(s\) of another shape: fc\.weight \(10, 512\) \(model: \(1000, 512\)\)"),
])
def test_checkpoint_that_does_not_fit_is_one_clear_error(tmp_path, resnet18_file, edit, fragment):
    state = dict(resnet18_file[1])
    edit(state)
    with pytest.raises(InputError, match=rf"`encode.torchvision.weights` file '.*bad\.pth' for torchvision:resnet18 "
                                         rf"does not fit the model \({fragment}"):
        get_backbone("torchvision:resnet18", options(_saved(tmp_path, state), preset=PRESET))


@pytest.mark.parametrize("opts, fragment", [
    # no weights: the preset's URL says which file to fetch
    ({"weights": "recallk/encode/no_file.txt", "preset": PRESET},
     r"needs `encode.torchvision.weights`.*https://download.pytorch.org/models/resnet18-f37072fd.pth"),
    ({"preset": "ResNet18_Weights.NOPE"}, r"`encode.torchvision.preset: ResNet18_Weights.NOPE` is not a torchvision"),
    ({"preset": PRESET, "crop": 224}, r"must be null: give either a preset or explicit params, not both"),
    ({"resize": 256}, r"needs either `preset`.*missing: crop, mean, std"),  # no default preprocessing
    ({**EXPLICIT, "interpolation": "lanczos"}, r"`encode.torchvision.interpolation` must be one of bilinear"),
])
def test_bad_options(resnet18_file, opts, fragment):
    with pytest.raises(InputError, match=fragment):
        get_backbone("torchvision:resnet18", options(resnet18_file[0]) | opts)


def test_unknown_model_suggests_names(resnet18_file):
    with pytest.raises(InputError, match=r"unknown torchvision classification model 'resnet19'.*Did you mean"):
        get_backbone("torchvision:resnet19", options(resnet18_file[0], preset=PRESET))
