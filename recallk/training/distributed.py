"""The distributed side of the training adapters (torch only; no Lightning, no transformers): every rank's validation
embeddings gathered with the row each belongs to, checked to cover the validation set exactly once, put in order;
scored on rank 0 alone; its result (or its error) broadcast, so every rank acts on the same numbers and no rank waits
for ever on one that failed.

A ``DistributedSampler`` splits the validation set across ranks by interleaving (rank r takes rows r, r + w, ...) and
pads the last round by repeating the first rows, so the embeddings travel with their row numbers: the repeats are
dropped (the first copy kept), and a row that never arrives (a rank that sent fewer samples, a limit on the
validation batches) or one outside the set is one :class:`~recallk.errors.InputError` raised on every rank at once.
Without ``torch.distributed`` initialised (one process) the same checks run on the one rank's rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence, TypeVar

from recallk.errors import InputError, quote
from recallk.training.evaluator import EpochResult, Evaluator

T = TypeVar("T")
#: Rows a message names at most.
SHOWN = 10


def world() -> tuple[int, int]:
    """``(rank, world size)``: ``(0, 1)`` without an initialised ``torch.distributed`` process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _device() -> Any:
    """Where the collectives' tensors must live: the current GPU for NCCL, else the CPU (gloo)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def local_rows(embeddings: Sequence[Any], indices: Sequence[Any]) -> tuple[Any, Any, str | None]:
    """One rank's batches as one ``(rows, d)`` float tensor and its ``(rows,)`` int64 row numbers, or a problem
    (the text of an error every rank raises) when they do not fit together."""
    import torch

    if not embeddings:
        return torch.zeros((0, 0)), torch.zeros(0, dtype=torch.int64), None
    try:
        emb = torch.cat([torch.as_tensor(e).detach().reshape(len(e), -1).float() for e in embeddings])
        idx = torch.cat([torch.as_tensor(i).detach().reshape(-1) for i in indices])
    except (RuntimeError, TypeError, ValueError) as exc:
        return None, None, f"its batches do not join into one table of embeddings ({exc})"
    if idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool:
        return None, None, f"its row numbers are {str(idx.dtype).removeprefix('torch.')}, not integers"
    if len(emb) != len(idx):
        return None, None, f"it gave {len(emb)} embeddings but {len(idx)} row numbers"
    return emb, idx.to(torch.int64), None


def gather_rows(emb: Any, idx: Any, problem: str | None, total: int, hint: str) -> Any:
    """Every rank's ``(emb, idx)`` (:func:`local_rows`), checked on every rank, as one ``(total, d)`` tensor in row
    order on rank 0 (None on the other ranks; on the collectives' device). Called by every rank.

    Raises
    ------
    InputError
        On every rank, when a rank's rows did not fit together (``problem``), the ranks disagree on the width, a row
        number is outside ``0 .. total - 1``, or a row never arrived; ``hint`` ends the message (what to check).
    """
    import torch
    import torch.distributed as dist

    rank, size = world()
    header = (0 if emb is None else len(emb), 0 if emb is None or not len(emb) else emb.shape[1], problem)
    headers = [header]
    if size > 1:
        headers = [None] * size
        dist.all_gather_object(headers, header)
    bad = [f"rank {r}: {p}" for r, (_, _, p) in enumerate(headers) if p]
    if bad:
        raise InputError(f"The validation embeddings cannot be gathered: {'; '.join(bad)}. {hint}")
    widths = sorted({d for n, d, _ in headers if n})
    if len(widths) > 1:
        per_rank = ", ".join(f"rank {r}: {d}" for r, (n, d, _) in enumerate(headers) if n)
        raise InputError(f"The ranks' embeddings differ in width ({per_rank}): every rank must run the same model.")
    if size > 1:
        emb, idx = _all_gather(emb, idx, [n for n, _, _ in headers], widths[0] if widths else 0)
    idx = idx.cpu()
    _check_coverage(idx, total, [n for n, _, _ in headers], hint)
    if rank != 0:
        return None
    order = torch.argsort(idx, stable=True)
    first = torch.ones(len(order), dtype=torch.bool)
    first[1:] = idx[order][1:] != idx[order][:-1]
    return emb[order[first].to(emb.device)]


def _all_gather(emb: Any, idx: Any, rows: list[int], width: int) -> tuple[Any, Any]:
    """Every rank's rows, concatenated in rank order (padded to the longest for ``all_gather``, then trimmed)."""
    import torch
    import torch.distributed as dist

    device, longest = _device(), max(rows)
    padded_emb = torch.zeros((longest, width), dtype=torch.float32, device=device)
    padded_idx = torch.full((longest,), -1, dtype=torch.int64, device=device)
    if len(emb):
        padded_emb[:len(emb)] = emb.to(device)
        padded_idx[:len(idx)] = idx.to(device)
    embs = [torch.empty_like(padded_emb) for _ in rows]
    idxs = [torch.empty_like(padded_idx) for _ in rows]
    dist.all_gather(embs, padded_emb)
    dist.all_gather(idxs, padded_idx)
    return torch.cat([e[:n] for e, n in zip(embs, rows)]), torch.cat([i[:n] for i, n in zip(idxs, rows)])


def _check_coverage(idx: Any, total: int, rows: list[int], hint: str) -> None:
    """Every row number in ``0 .. total - 1`` arrived, and none outside it; else one InputError (the same text on
    every rank: they all hold every rank's numbers)."""
    import torch

    sent = ", ".join(f"rank {r} sent {n}" for r, n in enumerate(rows)) if len(rows) > 1 else f"{rows[0]} rows sent"
    outside = idx[(idx < 0) | (idx >= total)]
    if len(outside):
        raise InputError(f"The validation embeddings carry row numbers outside the validation set's 0 .. {total - 1}: "
                         f"{quote(sorted(set(outside.tolist()))[:SHOWN])} ({sent}). {hint}")
    present = torch.zeros(total, dtype=torch.bool)
    present[idx] = True
    missing = (~present).nonzero().flatten().tolist()
    if missing:
        more = f", ... ({len(missing)} in all)" if len(missing) > SHOWN else ""
        shown = ", ".join(map(str, missing[:SHOWN])) + more
        raise InputError(f"The validation embeddings cover {total - len(missing)} of the {total} validation rows "
                         f"({sent}; missing rows {shown}): every row must arrive once per evaluation. {hint}")


def on_rank_zero(fn: Callable[[], T], strip: Callable[[T], T] = lambda value: value) -> T:
    """``fn()`` run on rank 0 only and its value broadcast to every rank (``strip`` applied first, e.g. to drop
    what the other ranks do not need); when it raises, rank 0 raises it and every other rank raises an error with
    its text (an :class:`InputError` for an InputError), so no rank is left waiting. Called by every rank."""
    import torch.distributed as dist

    rank, size = world()
    if size == 1:
        return fn()
    payload: list[Any] = [None]
    error: BaseException | None = None
    if rank == 0:
        try:
            value = fn()
            payload = [("ok", strip(value))]
        except Exception as exc:  # every rank must learn of it; rank 0 re-raises the original below
            error = exc
            payload = [("error", type(exc).__name__, str(exc), isinstance(exc, InputError))]
    dist.broadcast_object_list(payload, src=0)
    if error is not None:
        raise error
    kind, *rest = payload[0]
    if kind == "error":
        name, message, is_input = rest
        raise InputError(message) if is_input else RuntimeError(f"rank 0 failed to score the epoch: {name}: {message}")
    if rank == 0:
        return value
    return rest[0]


def without_table(result: Any) -> Any:
    """An :class:`~recallk.training.EpochResult` without its per-query table (the other ranks do not need it)."""
    return dataclasses.replace(result, table=None)


# ------------------------------------------------------------------------------- shared by both adapters


def checked_evaluator(evaluator: Any) -> Evaluator:
    """``evaluator`` when it is an :class:`~recallk.training.Evaluator`, else an InputError."""
    if not isinstance(evaluator, Evaluator):
        raise InputError(f"`evaluator` must be a recallk.training.Evaluator. Got {quote(evaluator)} instead.")
    return evaluator


def total_rows(evaluator: Evaluator) -> int:
    """The rows of the validation set an adapter embeds: the queries, then the gallery (leave-one-out: the one set)."""
    return evaluator.n_queries if evaluator.leave_one_out else evaluator.n_queries + evaluator.n_gallery


def score_rows(evaluator: Evaluator, epoch: int, rows: Any) -> EpochResult:
    """``evaluator`` called on the validation set's embeddings in row order (:func:`total_rows`)."""
    if evaluator.leave_one_out:
        return evaluator(epoch, rows)
    n = evaluator.n_queries
    return evaluator(epoch, rows[:n], rows[n:])


def logged_values(result: EpochResult) -> dict[str, float]:
    """Each mean of ``result`` and its interval's bounds, ``<key>_ci_low`` and ``<key>_ci_high``: what is logged."""
    values: dict[str, float] = {}
    for key, value in result.metrics.items():
        low, high = result.intervals[key]
        values.update({key: value, f"{key}_ci_low": low, f"{key}_ci_high": high})
    return values
