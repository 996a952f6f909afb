"""``torchvision:<model>``: a torchvision classification model with local weights, as a pooled-feature backbone.

The model is built with ``torchvision.models.get_model(name, weights=None)`` (nothing is downloaded),
the state dict in ``encode.torchvision.weights`` (a ``.pth``/``.bin``/``.safetensors`` of the whole
classification model, e.g. torchvision's own ``resnet50-11ad3fa6.pth``) is loaded strictly, and then the
final classification layer is replaced by ``Identity`` (:func:`strip_classifier`), so the embedding is the
input of that layer: the pooled features (ResNet 2048-d, ConvNeXt after its LayerNorm, ViT's class
token after its LayerNorm, VGG's fc7 4096-d, SqueezeNet's pooled 512-d).

Preprocessing is torchvision's own ``ImageClassification`` preset (resize the shorter side, center-crop,
scale to [0, 1], normalise): the one the weights enum's ``transforms()`` returns when
``encode.torchvision.preset`` names an enum member such as ``ResNet50_Weights.IMAGENET1K_V2`` (resolving
it reads no file), else built from the explicit ``resize``, ``crop``, ``mean``, ``std``, ``interpolation``
params. Only :mod:`recallk.encode.registry` imports this module, lazily.
"""

from __future__ import annotations

from typing import Any

from recallk.errors import InputError, MissingExtraError, did_you_mean

try:
    import torch
    import torchvision
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms._presets import ImageClassification
except ImportError as exc:  # only these imports: any other ImportError is a bug with its traceback
    raise MissingExtraError("backbone 'torchvision:...'", "torch", "torch, torchvision", exc) from None

from recallk.encode.backbones import state_dicts, torch_common
from recallk.encode.base import Backbone, ModelSpec, is_no_file
from recallk.encode.device import Request
from recallk.encode.settings import INTERPOLATIONS as INTERPOLATION_NAMES
from recallk.encode.settings import TorchvisionSettings

PREFIX = "torchvision:"
#: Bump whenever a code change could change the embeddings.
VERSION = "1"
INTERPOLATIONS = {name: InterpolationMode(name) for name in INTERPOLATION_NAMES}
#: The attributes torchvision's classification models keep their head in.
HEADS = ("fc", "classifier", "heads", "head")
EXPLICIT = ("resize", "crop", "mean", "std")


def classification_models() -> list[str]:
    """The names ``get_model`` builds that are classification models (``torchvision.models`` itself)."""
    return sorted(torchvision.models.list_models(module=torchvision.models))


def build_model(name: str) -> torch.nn.Module:
    """``get_model(name, weights=None)`` in eval mode (random weights, nothing downloaded)."""
    names = classification_models()
    if name not in names:
        raise InputError(f"unknown torchvision classification model {name!r} in `encode.backbone: {PREFIX}{name}`."
                         f"{did_you_mean(name, names)} Available: {', '.join(names)}.")
    return torchvision.models.get_model(name, weights=None).eval()


def strip_classifier(model: torch.nn.Module) -> str:
    """Replace the model's final classification layer by ``Identity``, in place; return where it was.

    The head is the first of :data:`HEADS` the model has. A ``Linear`` head is replaced whole; in a
    ``Sequential`` head, the last ``Linear`` or ``Conv2d`` (SqueezeNet's 1x1 classifying conv) and any
    ``ReLU`` right after it are, and what precedes (LayerNorm, pre-logits) or follows (global pooling,
    flatten) stays. So the output is the input of the layer that computes the class logits.
    """
    for attr in HEADS:
        head = getattr(model, attr, None)
        if isinstance(head, torch.nn.Linear):
            setattr(model, attr, torch.nn.Identity())
            return attr
        if isinstance(head, torch.nn.Sequential):
            layers = [i for i, m in enumerate(head) if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
            if layers:
                last = layers[-1]
                head[last] = torch.nn.Identity()
                if last + 1 < len(head) and isinstance(head[last + 1], torch.nn.ReLU):
                    head[last + 1] = torch.nn.Identity()
                return f"{attr}[{last}]"
    raise InputError(f"torchvision model {type(model).__name__} has no classification head in "
                     f"{', '.join(HEADS)}; use a classification model or a `callable:` backbone.")


def preset_transform(preset: str) -> ImageClassification:
    """The preprocessing of the weights enum member ``preset`` (``"ResNet50_Weights.IMAGENET1K_V2"``)."""
    try:
        weights = torchvision.models.get_weight(preset)
    except (ValueError, KeyError, AttributeError) as exc:
        raise InputError(f"`encode.torchvision.preset: {preset}` is not a torchvision weights enum member ({exc}); "
                         "write it as `<Enum>.<member>`, such as ResNet50_Weights.IMAGENET1K_V2 "
                         "(torchvision.models.get_model_weights(name) lists a model's).") from None
    transform = weights.transforms()
    if not isinstance(transform, ImageClassification):
        raise InputError(f"`encode.torchvision.preset: {preset}` is not an image classification preset "
                         f"({type(transform).__name__}); name a classification model's weights.")
    return transform


def explicit_transform(resize: Any, crop: Any, mean: Any, std: Any, interpolation: str) -> ImageClassification:
    """torchvision's ``ImageClassification`` from explicit params (the same code a preset runs)."""
    given = {"resize": resize, "crop": crop, "mean": mean, "std": std}
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise InputError("`encode.torchvision` needs either `preset` (a weights enum member, such as "
                         "ResNet50_Weights.IMAGENET1K_V2) or all of resize, crop, mean and std; missing: "
                         f"{', '.join(missing)}. The preprocessing must be the one the weights were trained "
                         "with, so there is no default.")
    if interpolation not in INTERPOLATIONS:
        raise InputError(f"`encode.torchvision.interpolation` must be one of {', '.join(INTERPOLATIONS)}. "
                         f"Got {interpolation!r} instead.")
    return ImageClassification(crop_size=int(crop), resize_size=int(resize), mean=tuple(map(float, mean)),
                               std=tuple(map(float, std)), interpolation=INTERPOLATIONS[interpolation])


def transform_config(transform: ImageClassification) -> dict[str, Any]:
    """The resolved preprocessing as plain values (for the fingerprint and the docs)."""
    return {"resize": list(transform.resize_size), "crop": list(transform.crop_size),
            "mean": [float(v) for v in transform.mean], "std": [float(v) for v in transform.std],
            "interpolation": transform.interpolation.value, "antialias": bool(transform.antialias)}


def _weights_file(model: str, weights: str | None, preset: str | None) -> str:
    """The checked ``encode.torchvision.weights`` path; when it is not set, the message names the file to fetch."""
    if weights is None or is_no_file(weights):
        url = ""
        if preset is not None:
            url = f" (for {preset}: {torchvision.models.get_weight(preset).url})"
        raise InputError(f"`encode.backbone: {PREFIX}{model}` needs `encode.torchvision.weights`: a local state dict "
                         f"file of the whole classification model{url}; torchvision downloads nothing here.")
    return weights


def build(model: str, settings: TorchvisionSettings | None = None, runtime: Request | None = None) -> Backbone:
    """The ``torchvision:<model>`` :class:`~recallk.encode.base.Backbone`.

    Parameters
    ----------
    model : str
        A classification model of ``torchvision.models.list_models(module=torchvision.models)``.
    settings : TorchvisionSettings, optional
        ``encode.torchvision`` (default: its defaults): ``weights``, a state dict file of the whole
        classification model, loaded strictly (:func:`recallk.encode.backbones.state_dicts.strict_load`);
        ``preset``, a weights enum member whose ``transforms()`` is the preprocessing, else the explicit
        ``resize``, ``crop``, ``mean``, ``std``, ``interpolation``: resize the shorter side to ``resize``,
        center-crop ``crop``, scale to [0, 1], ``(x - mean) / std`` per channel. Refused together with
        ``preset`` (one source only).
    runtime : recallk.encode.device.Request, optional
        ``encode.device``, ``encode.dtype``, ``encode.reproducible`` and the batch size; default CPU float32.

    Returns
    -------
    Backbone
        Its fingerprint covers the weights' sha256, the resolved preprocessing, the head removed, the
        device fields and the torch and torchvision versions.
    """
    settings = settings or TorchvisionSettings()
    preset, weights = settings.preset, settings.weights
    if preset is not None:
        extra = [k for k in EXPLICIT if getattr(settings, k) is not None]
        if extra:
            raise InputError(f"`encode.torchvision.preset: {preset}` sets the preprocessing, so "
                             f"{', '.join(f'`encode.torchvision.{k}`' for k in extra)} must be null: give either "
                             "a preset or explicit params, not both.")
        transform = preset_transform(preset)
    else:
        transform = explicit_transform(settings.resize, settings.crop, settings.mean, settings.std,
                                       settings.interpolation)
    path = _weights_file(model, weights, preset)
    net = build_model(model)
    state_dicts.strict_load(net, state_dicts.load_state_dict_file(path),
                             source=f"`encode.torchvision.weights` file {path!r} for {PREFIX}{model}")
    head = strip_classifier(net)
    options = {"model": model, "preset": preset, "preprocess": transform_config(transform), "head_removed": head,
               "weights_sha256": torch_common.weights_sha256(path)}
    spec = ModelSpec(f"{PREFIX}{model}", VERSION, options, libraries=("torchvision",))
    return torch_common.torch_backbone(spec, net, transform, net, runtime=runtime,
                                       input_size=min(transform.resize_size))
