"""The backbone registry: name -> factory of a :class:`~recallk.encode.base.Backbone`.

Register a new backbone with :func:`register`; the encode stage finds it by
``encode.backbone`` and passes ``encode.<backbone name>`` as keyword options.
A family of models from one library (``timm:<model>``, ``open_clip:<model>``, ...) registers
with :func:`register_family`: its factory takes the model name and ``encode.<family>``'s options.
Torch backbones (names and families registered with ``torch=True``) also get ``runtime``, the
:class:`~recallk.encode.device.Request` of ``encode.device`` / ``dtype`` / ``reproducible`` / ``batch_size``.
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

from recallk.encode.base import Backbone, composited_over, fingerprint, is_no_file, text_fingerprint
from recallk.errors import InputError, clip, did_you_mean, quote
from recallk.images import DEFAULT_BACKGROUND

REGISTRY: dict[str, Callable[..., Backbone]] = {}
#: ``family -> factory(model, **options)`` for ``encode.backbone: <family>:<model>``.
FAMILIES: dict[str, Callable[..., Backbone]] = {}
#: Registered names and families whose factory also takes ``runtime`` (torch backbones).
TORCH: set[str] = set()
TORCH_FAMILIES: set[str] = set()


def _entry(table: dict[str, Callable[..., Backbone]], key: str,
           ) -> Callable[[Callable[..., Backbone]], Callable[..., Backbone]]:
    def decorate(factory: Callable[..., Backbone]) -> Callable[..., Backbone]:
        table[key] = factory
        return factory

    return decorate


def register(name: str, torch: bool = False) -> Callable[[Callable[..., Backbone]], Callable[..., Backbone]]:
    """Register ``factory(**options) -> Backbone`` as ``encode.backbone: <name>``; with ``torch=True`` the
    factory also takes ``runtime`` (a :class:`recallk.encode.device.Request`)."""
    if torch:
        TORCH.add(name)
    return _entry(REGISTRY, name)


def register_family(family: str, torch: bool = False,
                    ) -> Callable[[Callable[..., Backbone]], Callable[..., Backbone]]:
    """Register ``factory(model: str, **options) -> Backbone`` for ``encode.backbone: <family>:<model>``; with
    ``torch=True`` the factory also takes ``runtime`` (a :class:`recallk.encode.device.Request`)."""
    if torch:
        TORCH_FAMILIES.add(family)
    return _entry(FAMILIES, family)


def options_key(name: str) -> str:
    """The ``encode`` section holding a backbone's options: ``timm`` for ``timm:resnet50``, ``callable`` for
    ``callable:pkg.mod:fn``, else ``name``."""
    if name.startswith(CALLABLE_PREFIX):
        return "callable"
    family, sep, _ = name.partition(":")
    return family if sep and family in FAMILIES else name


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
    return Backbone(name="pixels", dim=3 * resolution**2,
                    encode=functools.partial(encode_pixels, resolution=resolution),
                    fingerprint=fingerprint("pixels", "1", resolution=resolution), input_size=resolution)


@register("efficientnet_lite0", torch=True)
def efficientnet_lite0(runtime: Any = None, **options: Any) -> Backbone:
    """ImageNet-pretrained EfficientNet-Lite0, 1280-d pooled features (the torch extra, imported lazily)."""
    from recallk.encode.backbones import efficientnet  # the torch extra: MissingExtraError without it

    return efficientnet.build(runtime=runtime, **options)


# The model families, each module imported lazily (its extra may be missing: MissingExtraError). Written
# out, not from a table: tests/test_dvc_yaml.py reads these imports for the encode stage's deps.
@register_family("timm", torch=True)
def timm_model(model: str, runtime: Any = None, **options: Any) -> Backbone:
    """A timm model's pooled features (``timm:<model>``; the timm extra)."""
    from recallk.encode.backbones import timm as timm_backbone

    return timm_backbone.build(model, runtime=runtime, **options)


@register_family("open_clip", torch=True)
def open_clip_model(model: str, runtime: Any = None, **options: Any) -> Backbone:
    """An OpenCLIP model's image embedding (``open_clip:<model>``; the open-clip extra)."""
    from recallk.encode.backbones import open_clip as open_clip_backbone

    return open_clip_backbone.build(model, runtime=runtime, **options)


@register_family("torchvision", torch=True)
def torchvision_model(model: str, runtime: Any = None, **options: Any) -> Backbone:
    """A torchvision classification model's pooled features (``torchvision:<model>``; the torch extra)."""
    from recallk.encode.backbones import torchvision as torchvision_backbone
    from recallk.encode.settings import TorchvisionSettings
    from recallk.settings.base import from_mapping

    return torchvision_backbone.build(model, from_mapping(TorchvisionSettings, options), runtime=runtime)


@register_family("hf", torch=True)
def hf_model(folder: str, runtime: Any = None, **options: Any) -> Backbone:
    """A transformers vision model saved in a local directory (``hf:<dir>``; the hf extra)."""
    from recallk.encode.backbones import hf as hf_backbone

    return hf_backbone.build(folder, runtime=runtime, **options)


CALLABLE_PREFIX = "callable:"
#: The default of ``encode.callable.module_file``: the committed file standing for "no file" (the encode
#: stage depends on ``${encode.callable.module_file}`` in dvc.yaml, and DVC cannot track null).


def _check_module_file(spec: str, source: str, module_file: str) -> None:
    """The module's source must be ``module_file`` or lie inside it (a folder): that is what DVC tracks."""
    real, named = Path(os.path.realpath(source)), Path(os.path.realpath(module_file))
    if real == named or real.is_relative_to(named):
        return
    rel = os.path.relpath(source) if Path(source).resolve().is_relative_to(Path.cwd().resolve()) else source
    unset = is_no_file(module_file)
    raise InputError(f"`encode.backbone: {clip(spec)}` runs code from {quote(rel)}, but "
                     f"`encode.callable.module_file` is {quote(module_file)}{' (none)' if unset else ''}: DVC re-runs "
                     f"encode when that file changes (dvc.yaml depends on it), so set `encode.callable.module_file: "
                     f"{clip(rel)}` (or a folder that holds it, for a package).")


def user_callable(spec: str, module_file: str | None = None, text_function: str | None = None) -> Backbone:
    """``callable:package.module:function``: a user function ``list[PIL.Image] -> (n, d)`` array.

    It is imported from the working directory or the installed packages. Its
    fingerprint hashes the module's source file, so editing it re-encodes. With ``module_file``
    (``encode.callable.module_file``, which the encode stage depends on in dvc.yaml), the module's
    source must be that file or lie in that folder, so DVC sees its edits too. A builtin
    (``builtins:eval``) has no source file and is refused. Whatever the function raises when
    called, ``sys.exit`` included, becomes an :class:`InputError` naming it. ``text_function``
    (``encode.callable.text_function``) names a function of the same module, ``list[str] -> (n, d)``, that embeds
    captions in the images' space: the backbone's text tower, its text fingerprint the module's hash and that name.
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
    fp = fingerprint("callable", "1", target=target, source_sha256=digest)
    encode_text = None
    if text_function is not None:
        encode_text = getattr(module, text_function, None)
        if not callable(encode_text):
            raise InputError(f"`encode.callable.text_function` is {quote(text_function)}, but module {module_name!r} "
                             f"has no such function; name a function of {quote(module_name)} that takes a list of "
                             "captions and returns an (n, d) array, or set it to null.")
    return Backbone(name=target, dim=None, encode=func, user_code=True, fingerprint=fp, encode_text=encode_text,
                    text_fingerprint=None if encode_text is None else
                    text_fingerprint(fp, {"kind": "callable", "function": text_function}))


def get_backbone(name: str, options: dict[str, Any] | None = None, runtime: Any = None,
                 background: str = DEFAULT_BACKGROUND) -> Backbone:
    """Build the registered backbone ``name`` with ``options``; a InputError names the fix.

    ``runtime`` (a :class:`recallk.encode.device.Request`, or None for the CPU in float32) goes to torch
    backbones only; the others (pixels, ``callable:``) run where they run and ignore it. ``background`` is the
    colour its images' transparency is composited over (``split.background``), part of its fingerprint
    (:func:`recallk.encode.base.composited_over`).
    """
    return composited_over(_build(name, options, runtime), background)


def _build(name: str, options: dict[str, Any] | None, runtime: Any) -> Backbone:
    """:func:`get_backbone`'s backbone, before its decoding background is set."""
    if name.startswith(CALLABLE_PREFIX):
        return user_callable(name, **(options or {}))
    family, sep, model = name.partition(":")
    if sep and family in FAMILIES:
        if not model:
            raise InputError(f"`encode.backbone: {name}` names no model; write it as `{family}:<model>`.")
        if family in TORCH_FAMILIES:
            return FAMILIES[family](model, runtime=runtime, **(options or {}))
        return FAMILIES[family](model, **(options or {}))
    if name not in REGISTRY:
        names = sorted([*REGISTRY, "precomputed"])
        families = ", ".join(f"`{f}:<model>`" for f in sorted(FAMILIES))
        raise InputError(f"unknown backbone {name!r} in `encode.backbone`.{did_you_mean(name, names)} "
                        f"Available backbones: {', '.join(names)}, {families}, or `callable:package.module:function`.")
    if name in TORCH:
        return REGISTRY[name](runtime=runtime, **(options or {}))
    return REGISTRY[name](**(options or {}))
