"""``hf:<local dir>``: a Hugging Face transformers vision model saved in a local directory.

``transformers.AutoModel.from_pretrained(dir, local_files_only=True)`` and
``AutoImageProcessor.from_pretrained(dir, local_files_only=True)``: nothing is downloaded, and the
preprocessing is the processor the model was saved with. ``encode.hf.pooling`` picks the embedding:

- ``cls``: ``last_hidden_state[:, 0]``, the class token. For DINOv2 ``last_hidden_state`` is taken after
  the final LayerNorm (``Dinov2Model.forward``: ``sequence_output = self.layernorm(...)``), so this is
  the CLS-after-LayerNorm embedding DINOv2 reports, and equals its ``pooler_output``;
- ``mean``: the mean of ``last_hidden_state`` over all tokens (for DINOv2: CLS, register and patch tokens);
- ``pooler``: the model's ``pooler_output`` (for CLIP's vision tower: the class token after
  ``post_layernorm``; for ViT: a tanh dense layer), an error for a model without one.

A CLIP-style model (one with ``get_image_features`` and ``get_text_features``, e.g. ``CLIPModel``) is read
through ``get_image_features``; with ``pooling: pooler`` that is its projected embedding, in the space of its
text tower, and captions are embedded too (``get_text_features`` of the tokenizer saved in the same directory,
``AutoTokenizer``, offline) for text <-> image retrieval.

The weights load strictly: a missing, unexpected or mis-shaped key is an InputError naming them
(transformers itself only warns for the first two). The encode stage depends on ``${encode.hf.dir}``
(dvc.yaml), which must name the same directory as ``encode.backbone``, so editing the model's files
re-runs encode; the fingerprint hashes every file in it. Only :mod:`recallk.encode.registry` imports
this module, lazily.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any, Iterator

from PIL import Image

from recallk.errors import InputError, MissingExtraError

try:
    import torch
    import transformers
    from transformers import AutoImageProcessor, AutoModel, AutoTokenizer
except ImportError as exc:  # only these imports: any other ImportError is a bug with its traceback
    raise MissingExtraError("backbone 'hf:...'", "torch", "torch, transformers", exc) from None

from recallk.encode.backbones import state_dicts, torch_common
from recallk.encode.base import Backbone, ModelSpec, is_no_file
from recallk.encode.device import Request
from recallk.encode.settings import POOLINGS

PREFIX = "hf:"
#: Bump whenever a code change could change the embeddings.
VERSION = "1"


def check_dir(folder: str, tracked: str | None) -> Path:
    """The model directory of ``encode.backbone: hf:<folder>``, checked; ``tracked`` is ``encode.hf.dir``."""
    spec = f"`encode.backbone: {PREFIX}{folder}`"
    if not folder:
        raise InputError(f"{spec} names no directory; write `hf:<dir>`, a folder saved with save_pretrained "
                         "(or `hf download <repo> --local-dir <dir>`).")
    if tracked is None or is_no_file(tracked) or Path(tracked) != Path(folder):
        raise InputError(f"{spec} needs `encode.hf.dir: {folder}` too (it is {tracked!r}): the encode stage "
                         "depends on that path in dvc.yaml, so that a change to the model's files re-runs encode.")
    path = Path(folder)
    if not path.is_dir():
        raise InputError(f"{spec}: directory {folder!r} not found; save the model there with "
                         "model.save_pretrained(dir) and processor.save_pretrained(dir), or download it with "
                         f"`hf download <repo> --local-dir {folder}`.")
    if not (path / "config.json").is_file():
        raise InputError(f"{spec}: {folder!r} has no config.json, so it is not a saved transformers model; save it "
                         "with save_pretrained, or download it with `hf download <repo> --local-dir <dir>`.")
    return path


def files_sha256(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder`` outside hidden directories (``.cache``)."""
    out = {}
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = file.relative_to(folder)
        if not any(part.startswith(".") for part in rel.parts):
            out[rel.as_posix()] = torch_common.weights_sha256(file)
    return out


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' load report and progress bar off (its missing keys become our error instead)."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        transformers.logging.enable_progress_bar()


def load(path: Path) -> tuple[torch.nn.Module, Any]:
    """``(model in eval mode, image processor)`` from ``path``, strictly; an InputError names any key problem."""
    where = f"hf model directory {str(path)!r}"
    try:
        with _quiet():
            model, info = AutoModel.from_pretrained(path, local_files_only=True, output_loading_info=True,
                                                    ignore_mismatched_sizes=True)
            processor = AutoImageProcessor.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:  # no weights / processor config, an unknown model type
        raise InputError(f"cannot load the {where} ({type(exc).__name__}: {exc}); it needs config.json, the "
                         "weights (model.safetensors) and preprocessor_config.json, as save_pretrained writes "
                         "them.") from None
    problems = [f"{what}: {', '.join(sorted(map(str, keys)))}" for what, keys in
                [("missing keys", info["missing_keys"]), ("unexpected keys", info["unexpected_keys"]),
                 ("mis-shaped keys", [k[0] if isinstance(k, tuple) else k for k in info["mismatched_keys"]])]
                if keys]
    if problems:
        raise InputError(f"the weights in the {where} do not match its config.json ({type(model).__name__}): "
                         f"{'; '.join(problems)}. Use the files saved together with that config.")
    _check_file_dtypes(path, model, where)
    state = model.state_dict()
    state_dicts.check_values(state, state, f"the weights in the {where}")  # NaN or inf (the model's own dtypes)
    return model.eval(), processor


def _check_file_dtypes(path: Path, model: torch.nn.Module, where: str) -> None:
    """Refuse integer or bool tensors in the directory's ``.safetensors`` files where the model holds floats
    (an int8 export): ``from_pretrained`` casts them to float without a word. Keys match exactly or up to
    the model's prefix (``dinov2.`` ...)."""
    from safetensors import safe_open

    floats = [k for k, v in model.state_dict().items() if v.is_floating_point()]
    bad = []
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as fh:
            for key in fh.keys():
                dtype = fh.get_slice(key).get_dtype()
                if (dtype.startswith(("I", "U")) or dtype == "BOOL") and any(
                        k == key or k.endswith("." + key) or key.endswith("." + k) for k in floats):
                    bad.append(f"{file.name}: {key} {dtype}")
    if bad:
        raise InputError(f"the weights in the {where} cannot be used ({len(bad)} key(s) of another dtype where the "
                         f"model holds floats: {', '.join(bad[:state_dicts.MAX_KEYS])}): a quantized or "
                         "other-dtype export; use the float weights as saved by save_pretrained.")


def processor_config(processor: Any) -> dict[str, Any]:
    """The processor's resolved settings, plain JSON values, with its class (the PIL or torchvision backend)."""
    return {"class": type(processor).__name__, **json.loads(json.dumps(processor.to_dict(), default=str))}


def pool(outputs: Any, pooling: str) -> torch.Tensor:
    """``(n, hidden)`` from a model's outputs by ``encode.hf.pooling`` (see the module docstring)."""
    if pooling == "cls":
        return outputs.last_hidden_state[:, 0]
    if pooling == "mean":
        return outputs.last_hidden_state.mean(dim=1)
    pooled = getattr(outputs, "pooler_output", None)
    if pooled is None:
        raise InputError("`encode.hf.pooling: pooler` but this model returns no pooler_output; use cls or mean.")
    return pooled.flatten(1)


def build(folder: str, *, dir: str | None = None, pooling: str = "cls", runtime: Request | None = None) -> Backbone:
    """The ``hf:<folder>`` :class:`~recallk.encode.base.Backbone`.

    Parameters
    ----------
    folder : str
        The directory in ``encode.backbone``.
    dir : str
        ``encode.hf.dir``, the same directory (the path dvc.yaml tracks).
    pooling : {"cls", "mean", "pooler"}
    runtime : recallk.encode.device.Request, optional
        ``encode.device``, ``encode.dtype``, ``encode.reproducible`` and the batch size; default CPU float32.

    Returns
    -------
    Backbone
        Its fingerprint covers every file's sha256 (weights, config, processor config), the processor's
        resolved settings, the pooling, the device fields and the transformers and torch versions.
    """
    if pooling not in POOLINGS:
        raise InputError(f"`encode.hf.pooling` must be one of {', '.join(POOLINGS)}. Got {pooling!r} instead.")
    path = check_dir(folder, dir)
    model, processor = load(path)

    def transform(img: Image.Image) -> torch.Tensor:
        return processor(images=img, return_tensors="pt")["pixel_values"][0]

    clip_style = hasattr(model, "get_image_features") and hasattr(model, "get_text_features")

    def forward(x: torch.Tensor) -> torch.Tensor:
        outputs = model.get_image_features(pixel_values=x) if clip_style else model(pixel_values=x)
        return pool(outputs, pooling)

    options = {"files_sha256": files_sha256(path), "processor": processor_config(processor), "pooling": pooling,
               "model_class": type(model).__name__}
    spec = ModelSpec(f"{PREFIX}{folder}", VERSION, options, libraries=("transformers",))
    text = text_tower(model, path) if clip_style and pooling == "pooler" else None
    return torch_common.torch_backbone(spec, model, transform, forward, runtime=runtime, text=text)


def text_tower(model: torch.nn.Module, path: Path) -> torch_common.TextTower:
    """The text side of a CLIP-style model (``get_text_features``) with the tokenizer saved beside it."""
    try:
        with _quiet():
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"hf model directory {str(path)!r} has a text tower but no tokenizer it can load offline "
                         f"({type(exc).__name__}: {exc}); save it there with tokenizer.save_pretrained(dir) to embed "
                         "captions.") from None

    # captions longer than the text tower's positions are cut to them (as CLIP's own tokenizers, at 77, do)
    positions = getattr(getattr(model.config, "text_config", None), "max_position_embeddings", None)
    max_length = int(min(tokenizer.model_max_length, positions or tokenizer.model_max_length))

    def tokenize(texts: Any) -> Any:
        return tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")

    def forward(tokens: Any) -> torch.Tensor:
        return model.get_text_features(**tokens).pooler_output

    vocab = json.dumps(sorted(tokenizer.get_vocab().items())).encode()
    description = {"kind": type(tokenizer).__name__, "vocab_sha256": hashlib.sha256(vocab).hexdigest(),
                   "max_length": max_length}
    return torch_common.TextTower(tokenize, forward, description)
