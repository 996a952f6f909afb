"""``timm:<model>``: a timm model's pooled features, from local weights (the timm extra).

The model is built with ``timm.create_model(name, pretrained=False, num_classes=0)``, so its
output is the pooled feature vector before the classifier, and its weights come from one of:

* ``encode.timm.weights`` naming a ``.safetensors`` / ``.pth`` / ``.pt`` / ``.bin`` file;
* ``encode.timm.weights`` naming a folder (timm's ``local-dir:`` layout, as ``hf download
  timm/<repo> --local-dir <folder>`` writes it): its ``config.json`` builds the model (and sets the
  preprocessing), its ``model.safetensors`` (or ``pytorch_model.bin``) holds the weights;
* nothing set: timm's own pretrained source for the model (``pretrained_cfg["hf_hub_id"]``),
  read from the local Hugging Face cache only; nothing is downloaded at run time.

Either way the state dict loads strictly (:func:`recallk.encode.backbones.state_dicts.strict_load`); only
the classifier keys that ``num_classes=0`` removes (``pretrained_cfg["classifier"]``) are dropped.
Preprocessing is timm's own: ``timm.data.resolve_model_data_config(model)`` and
``timm.data.create_transform(**config, is_training=False)``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from recallk.encode.base import Backbone, fingerprint
from recallk.errors import InputError, MissingExtraError, clip, did_you_mean

try:
    import timm
    import timm.data
    import torch
    from huggingface_hub import constants as hf_constants
    from huggingface_hub import try_to_load_from_cache
except ImportError as exc:  # only these imports: any other ImportError is a bug with its traceback
    raise MissingExtraError("backbone 'timm:<model>'", "timm", "timm, huggingface-hub", exc) from None
from recallk.encode.backbones import state_dicts, torch_common
from recallk.encode.device import Request

log = logging.getLogger(__name__)

FAMILY = "timm"
PARAM = "encode.timm.weights"
#: Bump whenever a code change could change the embeddings.
VERSION = "1"
#: Weights files tried in a folder and in the Hugging Face cache, in timm's order.
WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin")


def hf_cache_dir() -> str:
    """The Hugging Face hub cache as the environment names it now (``HF_HUB_CACHE``, else
    ``HF_HOME/hub``), else huggingface_hub's default."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return hf_constants.HF_HUB_CACHE


def _check_name(model: str) -> str:
    """The architecture of ``model`` (``convnext_tiny`` for ``convnext_tiny.fb_in22k``), which must be timm's."""
    if any(c in model for c in "/\\:"):
        raise InputError(f"`encode.backbone: timm:{clip(model)}` is not a timm model name; name the architecture "
                         f"(e.g. `timm:convnext_tiny.fb_in22k`) and put a downloaded folder or file in `{PARAM}`.")
    arch, _, tag = model.partition(".")
    if not timm.is_model(arch):
        raise InputError(f"`encode.backbone: timm:{clip(model)}`: timm {timm.__version__} has no model {arch!r}."
                         f"{did_you_mean(arch, timm.list_models())} List them with timm.list_models('*{arch[:6]}*').")
    if tag and model not in timm.list_pretrained(f"{arch}.*"):
        tags = ", ".join(timm.list_pretrained(f"{arch}.*")[:10]) or "none"
        raise InputError(f"`encode.backbone: timm:{clip(model)}`: timm knows no pretrained tag {tag!r} for {arch} "
                         f"(known: {tags}).")
    return arch


def _create(name: str) -> torch.nn.Module:
    return timm.create_model(name, pretrained=False, num_classes=0)


def _create_from_folder(arch: str, source: torch_common.WeightsSource) -> torch.nn.Module:
    try:
        model = _create(f"{torch_common.LOCAL_DIR}{source.folder}")
    except (ValueError, KeyError, RuntimeError) as exc:  # json.JSONDecodeError is a ValueError
        raise InputError(f"cannot build a timm model from {str(source.config)!r} ({type(exc).__name__}: {exc}); "
                         "it must be timm's config.json (architecture, pretrained_cfg), as on the hub.") from None
    built = model.pretrained_cfg.get("architecture")
    if built != arch:
        raise InputError(f"{str(source.config)!r} describes timm model {built!r}, not {arch!r} of "
                         f"`encode.backbone`; set `encode.backbone: timm:{built}` or point `{PARAM}` at {arch}'s "
                         "weights.")
    return model


def _cached_hub_weights(model: torch.nn.Module, name: str) -> torch_common.WeightsSource:
    """timm's pretrained weights for ``model`` in the local Hugging Face cache, else one InputError
    saying what to fetch."""
    cfg = model.pretrained_cfg
    hub_id = cfg.get("hf_hub_id")
    if not hub_id:
        where = f" (timm lists only {cfg['url']})" if cfg.get("url") else ""
        raise InputError(f"`encode.backbone: timm:{name}` has no weights on the Hugging Face hub{where}; download "
                         f"its weights and set `{PARAM}` to the file.")
    if cfg.get("custom_load"):
        raise InputError(f"timm's weights for {name} ({hub_id}) are not a plain state dict; convert them with timm "
                         f"(model.state_dict() saved with safetensors) and set `{PARAM}` to that file.")
    repo, _, revision = hub_id.partition("@")
    files = (cfg["hf_hub_filename"],) if cfg.get("hf_hub_filename") else WEIGHTS_FILES
    cache = hf_cache_dir()
    for filename in files:
        found = try_to_load_from_cache(repo, filename, cache_dir=cache, revision=revision or None)
        if isinstance(found, str):
            log.info("timm:%s: weights from the Hugging Face cache, %s", name, found)
            return torch_common.WeightsSource(file=Path(found))
    raise InputError(
        f"`encode.backbone: timm:{name}` needs weights: `{PARAM}` is not set and timm's pretrained weights, "
        f"{repo}/{files[0]} on the Hugging Face hub, are not in the local cache ({cache}); nothing is downloaded at "
        f"run time. Fetch them once with `hf download {repo}` (then they are found in the cache), or download them "
        f"to a folder, `hf download {repo} --local-dir weights/{repo.split('/')[-1]}`, and set "
        f"`{PARAM}: weights/{repo.split('/')[-1]}` (or its {files[0]} file).")


def _drop_classifier(state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``state`` without the classifier that ``num_classes=0`` removed (by ``pretrained_cfg["classifier"]``);
    every other key must match exactly."""
    heads = model.pretrained_cfg.get("classifier") or ()
    heads = (heads,) if isinstance(heads, str) else tuple(heads)
    own = model.state_dict()
    drop = {k for k in state for head in heads if k.startswith(f"{head}.") and k not in own}
    return {k: v for k, v in state.items() if k not in drop}


def build(model: str, *, weights: str | None = None, runtime: Request | None = None) -> Backbone:
    """The ``timm:<model>`` :class:`~recallk.encode.base.Backbone`.

    Parameters
    ----------
    model : str
        A timm model name, optionally with its pretrained tag (``convnext_tiny.fb_in22k``).
    weights : str, optional
        ``encode.timm.weights``: a weights file, a folder (``config.json`` + weights; also written
        ``local-dir:<folder>``), or None / the placeholder: timm's pretrained weights from the local
        Hugging Face cache.
    runtime : recallk.encode.device.Request, optional
        ``encode.device`` / ``dtype`` / ``reproducible`` / ``batch_size``; default the CPU in float32.

    Returns
    -------
    Backbone
        ``dim`` = the pooled feature size; ``fingerprint`` covers the weights' sha256 (and the
        folder's config.json), the resolved data config and transform, the model name and the
        timm / torchvision / torch versions; ``input_size`` = the transform's resize side.
    """
    arch = _check_name(model)
    source = torch_common.resolve_weights(weights, param=PARAM, config_name="config.json", preferred=WEIGHTS_FILES)
    net = _create_from_folder(arch, source) if source is not None and source.folder is not None else _create(model)
    if source is None:
        source = _cached_hub_weights(net, model)
    state = _drop_classifier(state_dicts.load_state_dict_file(source.file), net)
    state_dicts.strict_load(net, state, f"weights file {str(source.file)!r} for timm:{model}")
    net.eval()
    data_config = timm.data.resolve_model_data_config(net)
    transform = timm.data.create_transform(**data_config, is_training=False)
    with torch.inference_mode():
        dim = int(net(torch.zeros((1, *data_config["input_size"]))).shape[-1])
    placement = torch_common.place(net, runtime)
    fp = fingerprint(f"{FAMILY}:{model}", VERSION, architecture=net.pretrained_cfg.get("architecture", arch),
                     weights=source.fingerprint(), data_config=json.loads(json.dumps(data_config)),
                     transform=repr(transform),
                     runtime=torch_common.runtime_fingerprint("timm", "torchvision", placement=placement))
    return Backbone(name=f"{FAMILY}:{model}", dim=dim,
                    encode=torch_common.image_encoder(transform, net, dim, placement=placement),
                    fingerprint=fp, input_size=torch_common.resize_side(transform))
