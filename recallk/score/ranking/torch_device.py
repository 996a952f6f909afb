"""Where ``score.backend: torch`` runs: ``score.device`` and ``score.matmul`` checked against the machine and
the caller's tensors, one clear :class:`~recallk.errors.InputError` for each thing that cannot work.

* ``score.device: cuda`` on a machine where torch sees no CUDA device.
* A candidate format the device lacks: ``tf32`` anywhere but a CUDA GPU of compute capability 8.0 or more
  (the CPU has no TF32, and a silent float32 would not be what was asked), ``bfloat16`` on a GPU without it;
  and embeddings of a dtype the device cannot hold in float64 (the exact re-score), e.g. on Apple's MPS.
* Query and gallery tensors on two devices, or tensors on a device other than ``score.device``.
"""

from __future__ import annotations

from typing import Any

from recallk.errors import InputError

#: ``score.device`` values.
DEVICES = ("auto", "cpu", "cuda")


def is_tensor(x: Any) -> bool:
    """A torch tensor (torch is not imported to find out)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "device")


def resolve(torch, device: str, matmul: str, query_emb: Any = None, gallery_emb: Any = None) -> str:
    """The torch device to rank on, from ``score.device`` (``auto``: the tensors' device, else ``cuda`` when
    torch sees one, else ``cpu``), checked with ``score.matmul`` and the embeddings (see the module).

    Raises
    ------
    InputError
        One message per problem, naming the param or argument and the fix.
    """
    on = {name: x.device for name, x in (("query_emb", query_emb), ("gallery_emb", gallery_emb)) if is_tensor(x)}
    if len(set(on.values())) > 1:
        raise InputError(f"`query_emb` is on {on['query_emb']} and `gallery_emb` on {on['gallery_emb']}: the torch "
                         "backend multiplies them on one device; move both there first (e.g. `.to('cuda')`).")
    cuda = torch.cuda.is_available()
    if device == "cuda" and not cuda:
        raise InputError(f"`score.device: cuda` needs a CUDA GPU, and this torch ({torch.__version__}) sees none "
                         "(`torch.cuda.is_available()` is False); set `score.device: cpu` or `auto`.")
    held = next(iter(on.values()), None)
    if device == "auto":
        chosen = str(held) if held is not None else ("cuda" if cuda else "cpu")
    else:
        chosen = str(held) if held is not None and held.type == device else device
        if held is not None and held.type != device:
            raise InputError(f"the embeddings are tensors on {held} but `score.device` is {device}: move them "
                             f"(`.to('{device}')`) or set `score.device: auto` to rank where they are.")
    kind = check_kind(torch.device(chosen))
    if matmul == "tf32" and (kind != "cuda" or torch.cuda.get_device_capability(torch.device(chosen))[0] < 8):
        where = "the CPU" if kind != "cuda" else f"{torch.cuda.get_device_name(torch.device(chosen))}"
        raise InputError(f"`score.matmul: tf32` needs a CUDA GPU with TF32 (compute capability 8.0 or more); "
                         f"{where} has none. Set `score.matmul: float32`.")
    if matmul == "bfloat16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise InputError(f"`score.matmul: bfloat16` needs a GPU with bfloat16; "
                         f"{torch.cuda.get_device_name(torch.device(chosen))} has none. Set `score.matmul: float32`.")
    return chosen


def check_kind(device) -> str:
    """``device``'s type when the backend can rank there (``cpu``, ``cuda``), else the error."""
    if device.type not in ("cpu", "cuda"):
        raise InputError(f"the torch backend runs on `cpu` or `cuda`; the embeddings are on {device}, which "
                         "lacks float64 for the exact re-score; move them to the CPU or a CUDA GPU.")
    return device.type


def check_tensor(torch, x: Any, name: str) -> None:
    """A tensor of embeddings as :func:`recallk.checks.check_matrix` wants them, checked where it lives (on a
    device the backend runs on: :func:`check_kind`)."""
    check_kind(x.device)
    if x.ndim != 2:
        raise InputError(f"`{name}` must be a 2-D array (n, d). Got shape {tuple(x.shape)} instead.")
    if x.shape[1] == 0 and x.shape[0]:
        raise InputError(f"`{name}` has dimension 0 (shape {tuple(x.shape)}); each row needs at least one value.")
    if x.dtype.is_complex or x.dtype == torch.bool:
        raise InputError(f"`{name}` must hold real numbers. Got dtype {x.dtype} instead.")
    if x.dtype.is_floating_point:
        bad = ~torch.isfinite(x.detach()).all(dim=1)
        if bool(bad.any()):
            rows = torch.nonzero(bad)[:10, 0].tolist()
            raise InputError(f"`{name}` has NaN or inf in {int(bad.sum())} row(s), first rows {rows}; "
                             "fix the encoder or drop those items.")
