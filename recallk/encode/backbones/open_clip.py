"""``open_clip:<model>``: the image embedding of an OpenCLIP model, from local weights (the open-clip extra).

``encode.open_clip.weights`` names either

* a folder (open_clip's ``local-dir:`` layout, as ``hf download timm/<repo> --local-dir <folder>``
  writes it): ``open_clip_config.json`` builds the model and sets its preprocessing, and the
  weights are its ``open_clip_model.safetensors`` (or another of open_clip's file names); or
* a checkpoint file (``.safetensors`` / ``.pth`` / ``.pt`` / ``.bin``) for the built-in config
  ``<model>``; the preprocessing is then the config's, with the mean, std, interpolation and resize
  mode of the pretrained tag ``encode.open_clip.tag`` when set (as open_clip does for a tag).
  When the model's known tags preprocess differently, the tag is required: a wrong
  normalisation gives a plausible but wrong recall.

The model comes from ``open_clip.create_model_and_transforms(..., load_weights=False)`` (nothing
is downloaded) and the checkpoint loads strictly (:func:`recallk.encode.backbones.state_dicts.strict_load`).
The embedding is ``model.encode_image`` of the eval transform's tensor (not normalised). A model with a text
tower (``encode_text``: CLIP, CoCa, SigLIP) embeds captions too, with the same weights and its own tokenizer
(``open_clip.get_tokenizer``: the built-in config's, or the folder's ``open_clip_config.json``'s), for text <->
image retrieval; its ``text_fingerprint`` covers the tokenizer's kind, vocabulary and context length.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from typing import Any, Iterator

from recallk.encode.base import Backbone, fingerprint, text_fingerprint
from recallk.errors import InputError, MissingExtraError, clip, did_you_mean

try:
    import open_clip
    import torch
except ImportError as exc:  # only these imports: any other ImportError is a bug with its traceback
    raise MissingExtraError("backbone 'open_clip:<model>'", "open-clip", "open_clip_torch", exc) from None
from recallk.encode.backbones import state_dicts, torch_common
from recallk.encode.device import Request

FAMILY = "open_clip"
PARAM = "encode.open_clip.weights"
#: Bump whenever a code change could change the embeddings.
VERSION = "1"
#: Weights files tried in a folder, in open_clip's order.
WEIGHTS_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors", "open_clip_pytorch_model.bin",
                 "open_clip_pytorch_model.pth", "model.safetensors", "pytorch_model.bin", "pytorch_model.pth",
                 "model.pth")
#: The pretrained-tag fields that set preprocessing, and create_model_and_transforms' arguments for them.
PREPROCESS_ARGS = {"mean": "image_mean", "std": "image_std", "interpolation": "image_interpolation",
                   "resize_mode": "image_resize_mode"}


def _hub_hint(model: str) -> str:
    repos = [f"{tag}: {cfg['hf_hub'].rstrip('/')}" for tag in open_clip.list_pretrained_tags_by_model(model)
             if (cfg := open_clip.get_pretrained_cfg(model, tag)).get("hf_hub")]
    if not repos:
        return ""
    first = repos[0].split(": ")[1]
    return (f" Its pretrained weights on the Hugging Face hub ({'; '.join(repos[:6])}): e.g. `hf download {first} "
            f"--local-dir weights/{first.split('/')[-1]}` and `{PARAM}: weights/{first.split('/')[-1]}`.")


def _tag_preprocess(model: str, tag: str | None) -> dict[str, Any]:
    """``create_model_and_transforms`` preprocessing arguments for ``tag`` (a lone checkpoint file)."""
    tags = open_clip.list_pretrained_tags_by_model(model)
    if tag is None:
        kinds = {tuple((k, str(open_clip.get_pretrained_cfg(model, t).get(k))) for k in PREPROCESS_ARGS) for t in tags}
        if len(kinds) > 1:
            raise InputError(f"`open_clip:{model}`'s pretrained weights preprocess differently by tag, so set "
                             f"`encode.open_clip.tag` to the tag of {PARAM} ({', '.join(tags)}), or set {PARAM} to "
                             "the downloaded folder with its open_clip_config.json.")
        tag = tags[0] if tags else None
        if tag is None:
            return {}
    cfg = open_clip.get_pretrained_cfg(model, tag)
    if not cfg:
        raise InputError(f"`encode.open_clip.tag: {clip(tag)}` is not a pretrained tag of open_clip:{model}."
                         f"{did_you_mean(tag, tags)} Known tags: {', '.join(tags) or 'none'}.")
    quick = bool(cfg.get("quick_gelu", False))
    if quick != bool(open_clip.get_model_config(model).get("quick_gelu", False)):
        raise InputError(f"tag {tag!r} was trained with quick_gelu={quick}, which open_clip:{model} does not use; "
                         f"use the model `open_clip:{model}{'-quickgelu' if quick else ''}` for it.")
    return {arg: cfg[key] for key, arg in PREPROCESS_ARGS.items() if cfg.get(key) is not None}


class _NotRandom(logging.Filter):
    """Drops open_clip's "initialized randomly" warning: the weights load right after (strictly)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No pretrained weights loaded")


@contextlib.contextmanager
def _quiet_random_init() -> Iterator[None]:
    root, quiet = logging.getLogger(), _NotRandom()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


def _create(model: str, source: torch_common.WeightsSource, tag: str | None) -> tuple[torch.nn.Module, Any]:
    if source.folder is not None:
        if tag is not None:
            raise InputError(f"`encode.open_clip.tag` is for a lone checkpoint file; {PARAM} is a folder, whose "
                             "open_clip_config.json sets the preprocessing: set the tag to null.")
        name, options = f"{torch_common.LOCAL_DIR}{source.folder}", {}
    else:
        name, options = model, _tag_preprocess(model, tag)
    try:
        with _quiet_random_init():
            net, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=None, load_weights=False,
                                                                       pretrained_text=False, **options)
    except (ValueError, KeyError, TypeError) as exc:
        if source.folder is None:
            raise
        raise InputError(f"cannot build an open_clip model from {str(source.config)!r} ({type(exc).__name__}: "
                         f"{exc}); it must be open_clip's open_clip_config.json (model_cfg, preprocess_cfg).") from None
    return net, preprocess


def tokenizer_description(tokenizer: Any) -> dict[str, Any]:
    """What a text embedding depends on in ``tokenizer`` (open_clip's ``SimpleTokenizer`` or ``HFTokenizer``):
    its class, context length and the sha256 of its vocabulary (token -> id, sorted)."""
    vocab = getattr(tokenizer, "encoder", None)
    if vocab is None and hasattr(tokenizer, "tokenizer"):
        vocab = tokenizer.tokenizer.get_vocab()
    blob = json.dumps(sorted((str(k), int(v)) for k, v in (vocab or {}).items())).encode()
    return {"kind": type(tokenizer).__name__, "context_length": getattr(tokenizer, "context_length", None),
            "vocab_sha256": hashlib.sha256(blob).hexdigest()}


def _tokenizer(model: str, source: torch_common.WeightsSource) -> Any:
    name = f"{torch_common.LOCAL_DIR}{source.folder}" if source.folder is not None else model
    try:
        return open_clip.get_tokenizer(name)
    except (OSError, ValueError) as exc:
        raise InputError(f"`open_clip:{model}`'s tokenizer could not be loaded offline ({type(exc).__name__}: "
                         f"{clip(str(exc))}); captions need it: put its files in the weights folder, or use a "
                         "model whose config uses open_clip's built-in tokenizer.") from None


def build(model: str, *, weights: str | None = None, tag: str | None = None,
          runtime: Request | None = None) -> Backbone:
    """The ``open_clip:<model>`` :class:`~recallk.encode.base.Backbone`.

    Parameters
    ----------
    model : str
        An open_clip model config name (``ViT-B-32``), see ``open_clip.list_models()``; with a
        folder in ``weights`` the folder's config builds the model.
    weights : str
        ``encode.open_clip.weights``: a checkpoint file or a folder (also written ``local-dir:<folder>``).
    tag : str, optional
        ``encode.open_clip.tag``: the pretrained tag of a lone checkpoint, whose preprocessing applies.
    runtime : recallk.encode.device.Request, optional
        ``encode.device`` / ``dtype`` / ``reproducible`` / ``batch_size``; default the CPU in float32.

    Returns
    -------
    Backbone
        ``dim`` = the model's embedding size; ``fingerprint`` covers the weights' sha256 (and the
        folder's config), the preprocessing config and transform, the model name and the
        open_clip / torchvision / torch versions; ``input_size`` = the transform's resize side.
    """
    if model not in open_clip.list_models():
        raise InputError(f"`encode.backbone: open_clip:{clip(model)}`: open_clip has no model config {model!r}."
                         f"{did_you_mean(model, open_clip.list_models())} List them with open_clip.list_models().")
    source = torch_common.resolve_weights(weights, param=PARAM, config_name="open_clip_config.json",
                                          preferred=WEIGHTS_FILES)
    if source is None:
        raise InputError(f"`encode.backbone: open_clip:{model}` needs `{PARAM}`: a checkpoint file, or a folder "
                         f"with open_clip_config.json and the weights; nothing is downloaded at run time."
                         f"{_hub_hint(model)}")
    net, preprocess = _create(model, source, tag)
    state_dicts.strict_load(net, state_dicts.load_state_dict_file(source.file),
                             f"weights file {str(source.file)!r} for open_clip:{model}")
    net.eval()
    preprocess_cfg = json.loads(json.dumps(net.visual.preprocess_cfg))
    with torch.inference_mode():
        side = preprocess_cfg["size"]
        side = (side, side) if isinstance(side, int) else tuple(side)
        dim = int(net.encode_image(torch.zeros((1, 3, *side))).shape[-1])
    placement = torch_common.place(net, runtime)
    fp = fingerprint(f"{FAMILY}:{model}", VERSION, weights=source.fingerprint(), tag=tag,
                     preprocess_cfg=preprocess_cfg, transform=repr(preprocess),
                     runtime=torch_common.runtime_fingerprint("open_clip_torch", "timm", "torchvision",
                                                              placement=placement))
    encode = torch_common.image_encoder(preprocess, net.encode_image, dim, placement=placement)
    encode_text = text_fp = None
    if hasattr(net, "encode_text"):
        tokenizer = _tokenizer(model, source)
        encode_text = torch_common.text_encoder(tokenizer, net.encode_text, dim, placement=placement)
        text_fp = text_fingerprint(fp, tokenizer_description(tokenizer))
    return Backbone(name=f"{FAMILY}:{model}", dim=dim, encode=encode, fingerprint=fp,
                    input_size=torch_common.resize_side(preprocess), encode_text=encode_text,
                    text_fingerprint=text_fp)
