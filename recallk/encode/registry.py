"""The backbone registry: name -> factory of a :class:`~recallk.encode.base.Backbone`.

Register a new backbone with :func:`register`; the encode stage finds it by
``encode.backbone`` and passes ``encode.<backbone name>`` as keyword options.
``callable:package.module:function`` names a user function instead.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image

from recallk.checks import clip, did_you_mean, quote
from recallk.encode.base import Backbone, fingerprint
from recallk.errors import InputError

REGISTRY: dict[str, Callable[..., Backbone]] = {}


def register(name: str) -> Callable[[Callable[..., Backbone]], Callable[..., Backbone]]:
    def decorate(factory: Callable[..., Backbone]) -> Callable[..., Backbone]:
        REGISTRY[name] = factory
        return factory

    return decorate


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
    from recallk.encode import efficientnet  # the torch extra: MissingExtraError without it

    return efficientnet.build(**options)


CALLABLE_PREFIX = "callable:"
#: The default of ``encode.callable.module_file``: a committed file standing for "no callable module"
#: (the encode stage depends on ``${encode.callable.module_file}`` in dvc.yaml, and DVC cannot track null).
MODULE_PLACEHOLDER = "recallk/encode/no_callable_module.txt"


def _check_module_file(spec: str, source: str, module_file: str) -> None:
    """The module's source must be ``module_file`` or lie inside it (a folder): that is what DVC tracks."""
    real, named = Path(os.path.realpath(source)), Path(os.path.realpath(module_file))
    if real == named or real.is_relative_to(named):
        return
    rel = os.path.relpath(source) if Path(source).resolve().is_relative_to(Path.cwd().resolve()) else source
    unset = Path(module_file).name == Path(MODULE_PLACEHOLDER).name
    raise InputError(f"`encode.backbone: {clip(spec)}` runs code from {quote(rel)}, but "
                     f"`encode.callable.module_file` is {quote(module_file)}{' (none)' if unset else ''}: DVC re-runs "
                     f"encode when that file changes (dvc.yaml depends on it), so set `encode.callable.module_file: "
                     f"{clip(rel)}` (or a folder that holds it, for a package).")


def user_callable(spec: str, module_file: str | None = None) -> Backbone:
    """``callable:package.module:function``: a user function ``list[PIL.Image] -> (n, d)`` array.

    It is imported from the working directory or the installed packages. Its
    fingerprint hashes the module's source file, so editing it re-encodes. With ``module_file``
    (``encode.callable.module_file``, which the encode stage depends on in dvc.yaml), the module's
    source must be that file or lie in that folder, so DVC sees its edits too. A builtin
    (``builtins:eval``) has no source file and is refused. Whatever the function raises when
    called, ``sys.exit`` included, becomes an :class:`InputError` naming it.
    """
    target = spec[len(CALLABLE_PREFIX):]
    module_name, _, func_name = target.partition(":")
    hint = "write it as `callable:package.module:function`, importable from the project root"
    if not module_name or not func_name:
        raise InputError(f"`encode.backbone: {spec}` is not a valid callable; {hint}.")
    try:
        loaded = module_name in sys.modules
        module = importlib.import_module(module_name)
        if loaded:  # the fingerprint hashes the file as it is now: run that code, not an older import
            module = importlib.reload(module)
    except Exception as exc:  # any failure in the user's module (ImportError, SyntaxError, ...) is theirs to fix
        raise InputError(f"cannot import module {module_name!r} for `encode.backbone` "
                        f"({type(exc).__name__}: {exc}); {hint}.") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise InputError(f"module {module_name!r} has no function {func_name!r} for `encode.backbone`; {hint}.")
    try:
        source = inspect.getsourcefile(module)
    except TypeError:  # a built-in module (builtins, sys): no file
        source = None
    if not source or inspect.isbuiltin(func) or not Path(source).is_file():
        raise InputError(f"`encode.backbone: {clip(spec)}` names a built-in, which has no source file to fingerprint "
                         f"or track; a backbone is a Python function in a module file of yours; {hint}.")
    if module_file is not None:
        _check_module_file(spec, source, module_file)
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()
    return Backbone(name=target, dim=None, encode=func, user_code=True,
                    fingerprint=fingerprint("callable", "1", target=target, source_sha256=digest))


def get_backbone(name: str, options: dict[str, Any] | None = None) -> Backbone:
    """Build the registered backbone ``name`` with ``options``; a InputError names the fix."""
    if name.startswith(CALLABLE_PREFIX):
        return user_callable(name, **(options or {}))
    if name not in REGISTRY:
        names = sorted([*REGISTRY, "precomputed"])
        raise InputError(f"unknown backbone {name!r} in `encode.backbone`.{did_you_mean(name, names)} "
                        f"Available backbones: {', '.join(names)}, or `callable:package.module:function`.")
    return REGISTRY[name](**(options or {}))
