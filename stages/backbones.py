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
import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image

from stages.common import UserError, did_you_mean


@dataclass(frozen=True)
class Backbone:
    name: str
    dim: int
    encode: Callable[[Sequence[Image.Image]], np.ndarray]
    fingerprint: str


REGISTRY: dict[str, Callable[..., Backbone]] = {}


def register(name: str) -> Callable[[Callable[..., Backbone]], Callable[..., Backbone]]:
    def decorate(factory: Callable[..., Backbone]) -> Callable[..., Backbone]:
        REGISTRY[name] = factory
        return factory

    return decorate


def fingerprint(name: str, version: str, **options: Any) -> str:
    """A short stable hash of a backbone's name, code version and preprocessing options."""
    blob = json.dumps({"name": name, "version": version, "options": options}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def encode_pixels(images: Sequence[Image.Image], *, resolution: int) -> np.ndarray:
    """Resize each RGB image to ``resolution`` squared (bilinear); flatten to ``3 * resolution**2`` values in [0, 1]."""
    out = np.empty((len(images), 3 * resolution * resolution), dtype=np.float32)
    for i, img in enumerate(images):
        small = img.convert("RGB").resize((resolution, resolution), Image.Resampling.BILINEAR)
        out[i] = np.asarray(small, dtype=np.float32).reshape(-1) / 255.0
    return out


@register("pixels")
def pixels(resolution: int = 16) -> Backbone:
    """Baseline with no learned weights: the resized image's pixels are the embedding."""
    return Backbone(name="pixels", dim=3 * resolution**2, encode=functools.partial(encode_pixels, resolution=resolution),
                    fingerprint=fingerprint("pixels", "1", resolution=resolution))


def get_backbone(name: str, options: dict[str, Any] | None = None) -> Backbone:
    """Build the registered backbone ``name`` with ``options``; a UserError names the fix."""
    if name not in REGISTRY:
        raise UserError(f"unknown backbone {name!r} in `encode.backbone`.{did_you_mean(name, REGISTRY)} "
                        f"Available backbones: {', '.join(sorted(REGISTRY))}.")
    return REGISTRY[name](**(options or {}))
