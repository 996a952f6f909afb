"""Reading a weights file and loading it strictly, refusing anything but the model's own tensors.

* :func:`load_state_dict_file` reads a ``.safetensors`` / ``.pth`` / ``.pt`` / ``.bin`` file on the CPU
  with nothing unpickled but tensors;
* :func:`strict_load` loads a state dict only if its keys, shapes and dtype kinds are exactly the
  model's and every floating value is finite, else one :class:`~recallk.errors.InputError` naming the
  file and the keys (libraries such as timm load classifiers non-strictly; this never does);
* :func:`check_values` is that dtype and finiteness check alone (for models a library loads itself).

Only the backbone modules import this module (after :mod:`recallk.encode.backbones.torch_common`,
which turns a missing torch into the extra's install line).
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from recallk.encode.backbones import torch_common
from recallk.encode.backbones.torch_common import torch  # a missing torch: the extra's install line
from recallk.errors import InputError, MissingExtraError

#: Keys listed per kind in a message before "... and N more".
MAX_KEYS = torch_common.MAX_KEYS
#: What a weights file that is not a zip checkpoint but a pickle asking for Python objects is told: it is
#: never unpickled, and re-downloading a hostile file does not help.
PICKLE_ADVICE = ("it was not loaded: it is a pickle that asks for Python objects besides tensors (a legacy or "
                 "hand-made checkpoint, or a file built to run code when unpickled). Do not open it with "
                 "torch.load(weights_only=False) unless you trust its source; take weights from a source you "
                 "trust, ideally a .safetensors file, or, for your own checkpoint, save model.state_dict() again")


def _unwrap(obj: Any) -> Any:
    """The state dict inside a training checkpoint (``{"state_dict": ...}``), else ``obj``."""
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        return obj["state_dict"]
    return obj


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        from safetensors import SafetensorError
        from safetensors.torch import load_file
    except ImportError as exc:
        raise MissingExtraError(f"weights file {str(path)!r}", "timm", "safetensors", exc) from None
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise InputError(f"cannot read weights file {str(path)!r} ({exc}); is it a complete .safetensors file? "
                         "Download it again.") from None


def _read_torch(path: Path) -> Any:
    try:
        return _unwrap(torch.load(path, map_location="cpu", weights_only=True))
    except pickle.UnpicklingError as exc:
        if zipfile.is_zipfile(path):  # torch.save's archive, holding objects besides tensors
            raise InputError(f"weights file {str(path)!r} holds Python objects besides tensors, which are not "
                             "loaded (torch.load with weights_only=True; a file from an unknown source may be built "
                             "to run code when unpickled): for your own checkpoint, save its state_dict() only, or "
                             "convert it to .safetensors; else take weights from a source you trust.") from None
        if "GLOBAL" in str(exc):  # torch's unpickler refused a global (a class or function) the pickle asked for
            raise InputError(f"weights file {str(path)!r}: {PICKLE_ADVICE}.") from None
        raise InputError(f"cannot read weights file {str(path)!r} (not a torch checkpoint: "
                         "an unreadable pickle); is it a complete download? Download it again from its "
                         "source.") from None
    except (OSError, EOFError, RuntimeError, ValueError, KeyError, IndexError, zipfile.BadZipFile) as exc:
        raise InputError(f"cannot read weights file {str(path)!r} ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}); is it a complete torch checkpoint? "
                         "Download it again from its source.") from None


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict from ``path`` on the CPU.

    ``.safetensors`` files load with :func:`safetensors.torch.load_file`; ``.pth`` / ``.pt`` /
    ``.bin`` with ``torch.load(weights_only=True)``, so no Python object is unpickled. A
    checkpoint holding ``{"state_dict": ...}`` gives that inner dict.

    Returns
    -------
    dict of str to torch.Tensor
        The tensors by key. A missing, unreadable or tensor-less file is an InputError naming it (a
        missing ``safetensors`` is a :class:`~recallk.errors.MissingExtraError` with its install line);
        a pickle asking for Python objects is told so (:data:`PICKLE_ADVICE`), never "download it again".
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"weights file {str(path)!r} not found; download it or fix the path.")
    if path.suffix not in torch_common.WEIGHTS_SUFFIXES:
        raise InputError(f"weights file {str(path)!r} has suffix {path.suffix!r}; give a "
                         f"{', '.join(torch_common.WEIGHTS_SUFFIXES)} file.")
    state = _read_safetensors(path) if path.suffix == ".safetensors" else _read_torch(path)
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise InputError(f"weights file {str(path)!r} is not a state dict (a mapping of names to tensors); save "
                         "model.state_dict().")
    return state


def _listed(keys: Sequence[str]) -> str:
    more = f", ... and {len(keys) - MAX_KEYS} more" if len(keys) > MAX_KEYS else ""
    return ", ".join(keys[:MAX_KEYS]) + more


def _kind(dtype: torch.dtype) -> str:
    """``float`` (any floating dtype: a float16 export loads into a float32 model), ``complex``, ``bool``,
    ``int`` (integers, also quantized)."""
    if dtype.is_floating_point:
        return "float"
    if dtype.is_complex:
        return "complex"
    return "bool" if dtype == torch.bool else "int"


def value_problems(state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> list[str]:
    """The dtype and finiteness problems of ``state`` against the model's ``expected`` tensors (same keys):
    keys of another kind of dtype (an int8 export for a float model) and floating keys holding NaN or inf."""
    kinds = [f"{k} {state[k].dtype} (model: {expected[k].dtype})" for k in expected
             if k in state and _kind(state[k].dtype) != _kind(expected[k].dtype)]
    bad = [k for k, v in state.items() if v.dtype.is_floating_point and not bool(torch.isfinite(v).all())]
    return [f"{len(found)} {what}: {_listed(found)}" for what, found in
            [("key(s) of another dtype", kinds), ("key(s) holding NaN or inf", bad)] if found]


def check_values(state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise an InputError naming ``source`` and the keys when :func:`value_problems` finds any."""
    problems = value_problems(state, expected)
    if problems:
        raise InputError(f"{source} cannot be used ({'; '.join(problems)}): a quantized or other-dtype export, or "
                         "damaged weights; use the float weights as published for this model.")


def strict_load(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], source: str) -> None:
    """Load ``state_dict`` into ``model`` only if its keys, shapes and dtype kinds are exactly the model's
    and every floating value is finite.

    Parameters
    ----------
    model : torch.nn.Module
        The model built without weights.
    state_dict : mapping of str to torch.Tensor
        The weights (:func:`load_state_dict_file`).
    source : str
        What the weights are, for the message (``weights file 'x.safetensors' for timm:resnet50``).

    Raises
    ------
    InputError
        Naming the missing keys, the unexpected keys, the keys of another shape, of another dtype kind
        (an int8 export into a float model) and those holding NaN or inf (each list cut at
        :data:`MAX_KEYS`), and the fix.
    """
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    shapes = [f"{k} {tuple(state_dict[k].shape)} (model: {tuple(expected[k].shape)})" for k in expected
              if k in state_dict and tuple(state_dict[k].shape) != tuple(expected[k].shape)]
    problems = [f"{len(found)} {what}: {_listed(found)}" for what, found in
                [("missing key(s)", missing), ("unexpected key(s)", unexpected), ("key(s) of another shape", shapes)]
                if found]
    if problems:
        raise InputError(f"{source} does not fit the model ({'; '.join(problems)}); use weights saved from exactly "
                         "this architecture and configuration.")
    check_values(state_dict, expected, source)
    model.load_state_dict(dict(state_dict), strict=True)
