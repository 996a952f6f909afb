"""The torch backend behind the API and the score stage: :func:`torch_data` (tensors kept where they are)
and :func:`rank_torch` (``score.device`` / ``score.matmul`` / ``score.shards`` resolved, then
:func:`~recallk.score.ranking.torch_backend.rank_data_torch`)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from recallk.score.passes import Pass
from recallk.score.ranking.engine import Ranking
from recallk.score.ranking.torch_backend import TorchOptions, import_torch, rank_data_torch
from recallk.score.ranking.torch_device import check_tensor, is_tensor, resolve
from recallk.score.retrieval_data import RetrievalData


def stand_in(x: Any) -> np.ndarray:
    """A read-only array of ``x``'s shape that holds nothing (zeros by broadcasting)."""
    return np.broadcast_to(np.zeros((), dtype=np.float32), tuple(x.shape))


def torch_data(query_emb: Any, gallery_emb: Any, query_labels: Sequence[Any], gallery_labels: Sequence[Any], *,
               query_ids: Sequence[Any] | None = None, gallery_ids: Sequence[Any] | None = None,
               exclude: Sequence[tuple[Any, Any]] = ()) -> tuple[RetrievalData, tuple | None]:
    """:class:`RetrievalData` of the arguments, and the embeddings as they are when both are
    torch tensors off the CPU (else None: the data holds them as arrays, as for every backend).

    Off-CPU tensors are checked where they live (:func:`~recallk.score.ranking.torch_device.check_tensor`)
    and never copied to numpy: the data holds stand-ins of their shape (labels, ids and exclusions are
    checked as always), and the query set is the gallery (leave-one-out) when the ids match and the
    tensors are equal. Tensors on two devices are refused by :func:`rank_torch`.
    """
    given = [x for x in (query_emb, gallery_emb) if is_tensor(x)]
    off_cpu = [x for x in given if x.device.type != "cpu"]
    if len({str(x.device) for x in given}) > 1 or (off_cpu and len(given) < 2):
        raise_mixed(query_emb, gallery_emb)  # two devices, or a GPU tensor beside a host array
    if not off_cpu:
        data = RetrievalData(query_emb, gallery_emb, query_labels, gallery_labels, query_ids=query_ids,
                             gallery_ids=gallery_ids, exclude=exclude)
        return data, None
    torch = import_torch()
    check_tensor(torch, query_emb, "query_emb")
    check_tensor(torch, gallery_emb, "gallery_emb")
    same = query_emb is gallery_emb or (query_emb.shape == gallery_emb.shape and bool(torch.equal(query_emb,
                                                                                                  gallery_emb)))
    data = RetrievalData(stand_in(query_emb), stand_in(gallery_emb), query_labels, gallery_labels,
                         query_ids=query_ids, gallery_ids=gallery_ids, exclude=exclude,
                         same_set=None if same and query_ids is None else same and query_ids is not None
                         and [str(i) for i in query_ids] == [str(i) for i in gallery_ids])
    return data, (query_emb, gallery_emb)


def raise_mixed(query_emb: Any, gallery_emb: Any) -> None:
    """Refuse a GPU tensor beside a host array (the two sets must live on one device)."""
    from recallk.errors import InputError

    where = {name: (str(x.device) if is_tensor(x) else "the host (an array)")
             for name, x in (("query_emb", query_emb), ("gallery_emb", gallery_emb))}
    raise InputError(f"`query_emb` is on {where['query_emb']} and `gallery_emb` on {where['gallery_emb']}: the "
                     "torch backend multiplies them on one device; move both there first (e.g. `.to('cuda')`).")


def rank_torch(data: RetrievalData, settings: Any, ranks: Pass, tensors: tuple | None = None) -> Ranking:
    """Rank ``data`` with ``settings``' torch fields (``device``, ``matmul``, ``shards``, ``max_memory_mb``)."""
    torch = import_torch()
    q, g = tensors if tensors is not None else (None, None)
    device = resolve(torch, settings.device, settings.matmul, q, g)
    ray = (settings.ray.address, settings.ray.num_cpus) if settings.engine == "ray" else None
    options = TorchOptions(device=device, precision=settings.matmul, shards=settings.shards, ray=ray)
    return rank_data_torch(data, ranks, settings.max_memory_mb, options, tensors)
