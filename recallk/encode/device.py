"""Where and in what precision a torch backbone runs: ``encode.device``, ``encode.dtype``, ``encode.reproducible``.

The rules are pure functions of the request and of what the machine offers (:class:`Machine`), so they
are tested on any machine; :func:`machine` reads the facts from torch and :func:`apply_flags` sets torch's
global switches. What the rules decide goes into the backbone's fingerprint (:func:`runtime_options`),
so the embedding cache never mixes vectors made under different conditions:

- on CPU each image runs alone on one intra-op thread (see :mod:`recallk.encode.backbones.torch_common`), so a
  vector depends neither on the batch nor on the core count: the batch size stays out of the key and a
  CPU cache is shared across ``encode.batch_size`` values;
- on CUDA, kernels pick algorithms by batch shape and results differ from CPU at about 1e-6, so the key
  covers the batch size, the GPU model, the torch / CUDA / cuDNN versions and the TF32 and determinism
  flags in force.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from recallk.errors import InputError

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "float16", "bfloat16")
#: cuBLAS needs a fixed workspace for deterministic matmuls (torch's "Reproducibility" notes).
CUBLAS_WORKSPACE = ":4096:8"


@dataclass(frozen=True)
class Request:
    """What the ``encode`` params ask of a torch backbone (``encode.device``, ``dtype``, ``reproducible``,
    ``batch_size``); the embed step passes it to the torch backbones' factories."""

    device: str = "auto"
    dtype: str = "float32"
    reproducible: bool = True
    batch_size: int = 64


@dataclass(frozen=True)
class Machine:
    """What torch offers on this machine (:func:`machine`), as plain values."""

    cuda_available: bool
    torch: str
    cuda: str | None = None  # torch.version.cuda: the CUDA the build targets (None: a CPU build)
    cudnn: int | None = None
    gpu: str | None = None  # torch.cuda.get_device_name(0)


@dataclass(frozen=True)
class Runtime:
    """The resolved device, dtype and mode of one encode run."""

    device: str  # "cpu" | "cuda"
    dtype: str  # one of DTYPES
    reproducible: bool


def resolve(device: str = "auto", dtype: str = "float32", reproducible: bool = True, *,
            found: Machine) -> Runtime:
    """Resolve ``encode.device`` / ``encode.dtype`` / ``encode.reproducible`` on the machine ``found``.

    ``auto`` is ``cuda`` when torch sees a CUDA device, else ``cpu``. Asking for ``cuda`` where there
    is none, or for ``float16`` on CPU (most CPU kernels lack it or emulate it slowly, and the vectors
    would not match a GPU's anyway), is an InputError naming the fix; ``bfloat16`` runs on both.

    Parameters
    ----------
    device : {"auto", "cpu", "cuda"}
    dtype : {"float32", "float16", "bfloat16"}
        The model's weights and inputs are cast to it; embeddings are returned as float32.
    reproducible : bool
        Deterministic algorithms, ``cudnn.benchmark`` off and TF32 off (see :func:`apply_flags`).
    found : Machine

    Returns
    -------
    Runtime
    """
    if device not in DEVICES:
        raise InputError(f"`encode.device` must be one of {', '.join(DEVICES)}. Got {device!r} instead.")
    if dtype not in DTYPES:
        raise InputError(f"`encode.dtype` must be one of {', '.join(DTYPES)}. Got {dtype!r} instead.")
    if device == "cuda" and not found.cuda_available:
        build = f"a CUDA {found.cuda} build" if found.cuda else "a CPU-only build"
        raise InputError(f"`encode.device: cuda` but torch {found.torch} ({build}) sees no CUDA device; set "
                         "`encode.device: auto` or `cpu`, or install a CUDA build of torch on a machine with an "
                         "NVIDIA GPU and driver (docs/backbones.md, 'GPUs').")
    resolved = "cuda" if device == "cuda" or (device == "auto" and found.cuda_available) else "cpu"
    if resolved == "cpu" and dtype == "float16":
        why = "resolves to cpu on this machine" if device == "auto" else "is cpu"
        raise InputError(f"`encode.dtype: float16` needs a GPU but `encode.device: {device}` {why}; CPU kernels "
                         "lack half precision. Use `encode.dtype: float32` (or bfloat16) on CPU.")
    return Runtime(device=resolved, dtype=dtype, reproducible=bool(reproducible))


def runtime_options(runtime: Runtime, found: Machine, *, batch_size: int, flags: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint fields of a run: what the vectors depend on beyond the model and preprocessing.

    On CPU: device, dtype, torch version and the one-thread-per-image rule, and never the batch size
    (vectors are batch-independent there, so the cache is shared). On CUDA also the batch size, GPU
    model, CUDA and cuDNN versions, and ``flags`` (:func:`current_flags`: TF32, determinism, benchmark).
    """
    out: dict[str, Any] = {"device": runtime.device, "dtype": runtime.dtype, "torch": found.torch}
    if runtime.device == "cpu":
        out["intra_op_threads"] = 1
        return out
    return {**out, "batch_size": int(batch_size), "cuda": found.cuda, "cudnn": found.cudnn, "gpu": found.gpu,
            "reproducible": runtime.reproducible, "flags": dict(sorted(flags.items()))}


def machine() -> Machine:
    """The facts :func:`resolve` needs, read from the installed torch."""
    import torch

    available = bool(torch.cuda.is_available())
    cudnn = torch.backends.cudnn.version() if available and torch.backends.cudnn.is_available() else None
    return Machine(cuda_available=available, torch=torch.__version__, cuda=torch.version.cuda, cudnn=cudnn,
                   gpu=torch.cuda.get_device_name(0) if available else None)


def apply_flags(runtime: Runtime) -> None:
    """Set torch's global switches for ``runtime`` (process-wide, as torch keeps them).

    Reproducible mode: ``torch.use_deterministic_algorithms(True)``, ``cudnn.deterministic = True``,
    ``cudnn.benchmark = False``, TF32 off for matmuls and cuDNN (``allow_tf32 = False``: torch 2.14
    reads these back consistently, which it refuses once the newer ``fp32_precision`` API is mixed in), and
    ``CUBLAS_WORKSPACE_CONFIG`` set when the environment does not set it. Otherwise torch's defaults are left
    as they are. CPU: nothing.
    """
    import torch

    if runtime.device != "cuda" or not runtime.reproducible:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def current_flags() -> dict[str, Any]:
    """The TF32, determinism and benchmark switches in force, for the fingerprint."""
    import torch

    out: dict[str, Any] = {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
                           "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
                           "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
                           "float32_matmul_precision": torch.get_float32_matmul_precision(),
                           "cublas_workspace": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
    for name, switch in [("matmul", torch.backends.cuda.matmul), ("cudnn_conv", torch.backends.cudnn.conv),
                         ("cudnn_rnn", torch.backends.cudnn.rnn)]:
        out[f"fp32_precision_{name}"] = switch.fp32_precision
    for name, switch in [("tf32_matmul", torch.backends.cuda.matmul), ("tf32_cudnn", torch.backends.cudnn)]:
        try:  # the effective legacy switch; torch refuses to read it when the two APIs were mixed
            out[name] = bool(switch.allow_tf32)
        except RuntimeError:
            out[name] = "mixed"
    return out
