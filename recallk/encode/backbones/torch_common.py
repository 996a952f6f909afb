"""What every torch backbone shares: weights files, strict loading, deterministic inference, fingerprints.

* :func:`resolve_weights` turns a ``weights`` param (a file, a folder, ``local-dir:<folder>`` or the
  placeholder for none) into a :class:`WeightsSource`; reading and strictly loading the file is
  :mod:`recallk.encode.backbones.state_dicts` (``load_state_dict_file``, ``strict_load``);
* :func:`image_encoder` runs ``forward(transform(image))`` per image (:func:`per_image`), so an
  embedding never depends on its batch or the machine's core count;
* :func:`place` puts a model on ``encode.device`` in ``encode.dtype`` (:mod:`recallk.encode.device`);
  on CUDA :func:`image_encoder` runs whole batches;
* :func:`runtime_fingerprint`: the library versions and device settings a fingerprint must cover.

Only the backbone modules (imported lazily by :mod:`recallk.encode.registry`) import this module.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
from PIL import Image

from recallk.encode import device
from recallk.encode.base import Backbone, ModelSpec, file_sha256, is_no_file, text_fingerprint
from recallk.errors import InputError, MissingExtraError

try:
    import torch
except ImportError as exc:  # only this import: any other ImportError is a bug with its traceback
    raise MissingExtraError("torch backbones", "torch", "torch", exc) from None

T = TypeVar("T")

#: File suffixes a weights file may have.
WEIGHTS_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
#: Prefix of a folder source (timm's and open_clip's own spelling): config + weights file.
LOCAL_DIR = "local-dir:"
#: Keys listed per kind in a :func:`strict_load` message before "... and N more".
MAX_KEYS = 8


@functools.lru_cache(maxsize=64)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def weights_sha256(path: str | Path) -> str:
    """Hex sha256 of a weights file, cached per process by path, size and modification time (so a
    file replaced in place is hashed again)."""
    st = os.stat(path)
    return _sha256_of(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class WeightsSource:
    """Where a backbone's weights come from.

    ``file`` is the weights file read; ``folder`` the ``local-dir`` folder holding it and its
    config file (``config``), or None for a lone file.
    """

    file: Path
    folder: Path | None = None
    config: Path | None = None

    def fingerprint(self) -> dict[str, Any]:
        """sha256 of the weights file (and of the config file, which may set the preprocessing)."""
        out: dict[str, Any] = {"weights_sha256": weights_sha256(self.file)}
        if self.config is not None:
            out["config_sha256"] = weights_sha256(self.config)
        return out


def _pick_weights(folder: Path, preferred: Sequence[str], param: str) -> Path:
    for name in preferred:
        if (folder / name).is_file():
            return folder / name
    found = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHTS_SUFFIXES)
    if len(found) == 1:
        return found[0]
    names = ", ".join(p.name for p in found[:MAX_KEYS]) or "none"
    raise InputError(f"`{param}` folder {str(folder)!r} must hold one weights file ({', '.join(preferred)} or a "
                     f"single {'/'.join(WEIGHTS_SUFFIXES)} file); found {names}. Keep one, or point `{param}` at "
                     "the file itself.")


def resolve_weights(value: str | None, *, param: str, config_name: str,
                    preferred: Sequence[str] = ("model.safetensors", "pytorch_model.bin")) -> WeightsSource | None:
    """The weights a ``weights`` param names, checked to exist.

    Parameters
    ----------
    value : str or None
        A weights file (``.safetensors``, ``.pth``, ``.pt``, ``.bin``); a folder, optionally written
        ``local-dir:<folder>``, holding ``config_name`` and one weights file; or None / the
        placeholder ``recallk/encode/no_file.txt`` for "none".
    param : str
        The param's dotted name, for messages (``encode.timm.weights``).
    config_name : str
        The config file a folder must hold (``config.json`` for timm).
    preferred : sequence of str
        Weights file names tried first in a folder, in order; else the folder's only weights file.

    Returns
    -------
    WeightsSource or None
        None when no weights are named.
    """
    if value is None or is_no_file(value):
        return None
    path = Path(value[len(LOCAL_DIR):] if value.startswith(LOCAL_DIR) else value)
    if value.startswith(LOCAL_DIR) and not path.is_dir():
        raise InputError(f"`{param}: {value}` names no folder; give a folder holding {config_name} and the weights.")
    if path.is_dir():
        config = path / config_name
        if not config.is_file():
            raise InputError(f"`{param}` folder {str(path)!r} has no {config_name}; a folder must hold the "
                             f"library's {config_name} and the weights (as downloaded from the Hugging Face hub), or "
                             f"point `{param}` at the weights file itself.")
        return WeightsSource(file=_pick_weights(path, preferred, param), folder=path, config=config)
    if not path.is_file():
        raise InputError(f"weights file {str(path)!r} not found; fix `{param}` (a {'/'.join(WEIGHTS_SUFFIXES)} "
                         "file, or a folder with the config and weights).")
    return WeightsSource(file=path)


def per_image(forward: Callable[[T], torch.Tensor], items: Sequence[T], *, dim: int,
              workers: int | None = None) -> torch.Tensor:
    """``forward(item)`` for each item, each alone on one intra-op thread, items in parallel on threads.

    CPU kernels pick algorithms and work splits by batch size and thread count, so a batched or
    multi-threaded pass is not bit-identical to this one (about 1e-6 apart); this way an embedding
    never depends on its batch or on the machine's core count, which a shared content-addressed
    cache requires. On 2 busy cores it is also several times faster than letting torch split each image.

    Parameters
    ----------
    forward : callable
        ``item -> (1, dim)`` or ``(dim,)`` tensor; it runs under :func:`torch.inference_mode`.
    items : sequence
        One input per image (a ``(1, C, H, W)`` tensor, or a PIL image the callable preprocesses).
    dim : int
        Output dimension (the shape of an empty result).
    workers : int, optional
        Items run at once; default one per core.

    Returns
    -------
    torch.Tensor
        float32, shape ``(len(items), dim)``, row ``i`` from ``items[i]``.
    """
    if not len(items):
        return torch.empty((0, dim))

    def one(item: T) -> torch.Tensor:
        with torch.inference_mode():
            return forward(item).reshape(1, -1).float()

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
            rows = list(pool.map(one, items))
    finally:
        torch.set_num_threads(previous)
    return torch.cat(rows)


@dataclass(frozen=True)
class Placement:
    """Where a model was put (:func:`place`): the resolved runtime and the fingerprint fields it implies."""

    runtime: device.Runtime
    fields: dict[str, Any]


#: What a backbone built without a request runs on: the CPU in float32 (the library's default; the encode
#: stage passes ``encode.device``, whose default ``auto`` picks a GPU when there is one).
CPU = device.Request(device="cpu", dtype="float32")


def place(model: torch.nn.Module, request: device.Request | None = None) -> Placement:
    """Resolve ``request`` on this machine (:func:`recallk.encode.device.resolve`), set torch's switches
    for it (:func:`~recallk.encode.device.apply_flags`) and move ``model`` to its device and dtype, in place.

    Returns
    -------
    Placement
        The runtime and :func:`~recallk.encode.device.runtime_options` (batch size only on CUDA).
    """
    request = request or CPU
    found = device.machine()
    runtime = device.resolve(request.device, request.dtype, request.reproducible, found=found)
    device.apply_flags(runtime)
    model.to(device=runtime.device, dtype=getattr(torch, runtime.dtype))
    return Placement(runtime, device.runtime_options(runtime, found, batch_size=request.batch_size,
                                                     flags=device.current_flags()))


def image_encoder(transform: Callable[[Image.Image], torch.Tensor], forward: Callable[[torch.Tensor], torch.Tensor],
                  dim: int, *, placement: Placement | None = None) -> Callable[[Sequence[Image.Image]], np.ndarray]:
    """A :class:`~recallk.encode.base.Backbone` ``encode`` function: ``images -> (n, dim)`` float32.

    Each image is converted to RGB and preprocessed by the library's own ``transform`` (PIL image ->
    ``(C, H, W)`` tensor). On the CPU (``placement`` None or a CPU one) ``forward`` (``(1, C, H, W) ->
    (1, dim)``) runs per image (:func:`per_image`); on CUDA the batch runs as one ``(n, C, H, W)`` tensor
    (results then depend on the batch, which the fingerprint records). Inputs are cast to the
    placement's dtype; outputs come back as float32.
    """
    runtime = placement.runtime if placement else device.Runtime("cpu", "float32", True)
    dtype = getattr(torch, runtime.dtype)

    def encode(images: Sequence[Image.Image]) -> np.ndarray:
        tensors = [transform(img.convert("RGB")) for img in images]
        if runtime.device == "cpu":
            rows = per_image(lambda x: forward(x.unsqueeze(0).to(dtype)), tensors, dim=dim)
        elif not tensors:
            rows = torch.empty((0, dim))
        else:
            with torch.inference_mode():
                x = torch.stack(tensors).to(device=runtime.device, dtype=dtype, non_blocking=True)
                rows = forward(x).reshape(len(tensors), -1).float().cpu()
        return rows.numpy().astype(np.float32, copy=False)

    return encode


def text_encoder(tokenize: Callable[[Sequence[str]], Any], forward: Callable[[Any], torch.Tensor], dim: int, *,
                 placement: Placement | None = None) -> Callable[[Sequence[str]], np.ndarray]:
    """A :attr:`~recallk.encode.base.Backbone.encode_text` function: ``captions -> (n, dim)`` float32.

    ``tokenize`` (the model's own tokenizer: ``list of str -> model input``) and ``forward`` (``model input ->
    (n, dim)``) run on one caption at a time on the CPU (:func:`per_image`: an embedding never depends on its
    batch), on the whole batch on CUDA, as :func:`image_encoder` does for images.
    """
    runtime = placement.runtime if placement else device.Runtime("cpu", "float32", True)

    def encode(texts: Sequence[str]) -> np.ndarray:
        texts = [str(t) for t in texts]
        if runtime.device == "cpu":
            rows = per_image(lambda text: forward(tokenize([text])), texts, dim=dim)
        elif not texts:
            rows = torch.empty((0, dim))
        else:
            with torch.inference_mode():
                tokens = tokenize(texts)
                moved = (tokens.to(runtime.device) if hasattr(tokens, "to")
                         else {k: v.to(runtime.device) for k, v in tokens.items()})
                rows = forward(moved).reshape(len(texts), -1).float().cpu()
        return rows.numpy().astype(np.float32, copy=False)

    return encode


def output_dim(transform: Callable[[Image.Image], torch.Tensor], forward: Callable[[torch.Tensor], torch.Tensor],
               placement: Placement | None = None) -> int:
    """The embedding size, from one forward of a mid-grey 256 x 256 image (through ``transform``)."""
    return int(image_encoder(transform, forward, 0, placement=placement)([Image.new("RGB", (256, 256), 128)]).shape[1])


@dataclass(frozen=True)
class TextTower:
    """A CLIP-style model's text side for :func:`torch_backbone`: its ``tokenize`` (``list of str -> model
    input``), ``forward`` (``model input -> (n, dim)``) and ``tokenizer`` description (JSON-able, for the text
    fingerprint: kind, vocabulary hash, length)."""

    tokenize: Callable[[Sequence[str]], Any]
    forward: Callable[[Any], torch.Tensor]
    tokenizer: dict[str, Any]


def torch_backbone(spec: ModelSpec, model: torch.nn.Module, transform: Callable[[Image.Image], torch.Tensor],
                   forward: Callable[[torch.Tensor], torch.Tensor], *, runtime: device.Request | None = None,
                   input_size: int | None = None, text: TextTower | None = None) -> Backbone:
    """A :class:`~recallk.encode.base.Backbone` from a loaded model, its transform and its forward.

    ``model`` is placed (:func:`place`) by ``runtime``, the output size found by one forward
    (:func:`output_dim`), and the fingerprint covers ``spec`` and :func:`runtime_fingerprint` of
    ``spec.libraries`` and the placement. With ``text`` (a :class:`TextTower`), captions are embedded too
    (:func:`text_encoder`), under a text fingerprint that adds the tokenizer.
    """
    placement = place(model, runtime)
    dim = output_dim(transform, forward, placement)
    fp = spec.fingerprint(runtime_fingerprint(*spec.libraries, placement=placement))
    encode_text = text_fp = None
    if text is not None:
        encode_text = text_encoder(text.tokenize, text.forward, dim, placement=placement)
        text_fp = text_fingerprint(fp, text.tokenizer)
    return Backbone(name=spec.name, dim=dim, encode=image_encoder(transform, forward, dim, placement=placement),
                    fingerprint=fp, input_size=input_size, encode_text=encode_text, text_fingerprint=text_fp)


def resize_side(transform: Any) -> int | None:
    """The shorter side a ``torchvision.transforms.Compose`` first resizes to (its first ``Resize``),
    for :attr:`~recallk.encode.base.Backbone.input_size`; None if it has none or another kind (then
    images are always decoded at full size)."""
    from torchvision import transforms

    for step in getattr(transform, "transforms", []):
        if isinstance(step, transforms.Resize):
            size = step.size
            if isinstance(size, int):
                return size
            if isinstance(size, (list, tuple)) and size and step.max_size is None:
                return int(max(size))
            return None
        if not isinstance(step, (transforms.ToTensor, transforms.PILToTensor)) and type(step).__name__ not in (
                "MaybeToTensor", "MaybePILToTensor"):
            return None  # something before the resize may change the geometry: decode at full size
    return None


def library_versions(*distributions: str) -> dict[str, str]:
    """``{distribution: installed version}``, e.g. ``library_versions("timm")``."""
    return {name: importlib.metadata.version(name) for name in distributions}


def runtime_fingerprint(*distributions: str, placement: Placement | None = None) -> dict[str, Any]:
    """What a torch backbone's output depends on besides its weights and preprocessing.

    Parameters
    ----------
    *distributions : str
        Libraries (distribution names) whose versions count, e.g. ``"timm"``.
    placement : Placement, optional
        Where the model runs (:func:`place`); default the CPU in float32 (per-image inference on one
        intra-op thread, :func:`per_image`).

    Returns
    -------
    dict
        Each library's version and :func:`recallk.encode.device.runtime_options`: on CPU ``torch``,
        ``device``, ``dtype``, ``intra_op_threads``; on CUDA also the batch size, GPU, CUDA, cuDNN and the
        TF32 / determinism flags. Pass it to :func:`recallk.encode.base.fingerprint` as ``runtime=...``.
    """
    fields = placement.fields if placement else {"torch": torch.__version__, "device": "cpu", "dtype": "float32",
                                                 "intra_op_threads": 1}
    return {**library_versions(*distributions), **fields}
