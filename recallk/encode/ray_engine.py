"""``encode.engine: ray``: the cache misses encoded by Ray Data, on a cluster's CPUs or GPUs.

Only the files that miss the embedding cache are sent out, as rows ``(sha256, path)``:
:func:`ray_source` maps them with ``map_batches`` and :class:`BatchEncoder`, a callable class
that builds the backbone once per actor and decodes its batch from the paths in the worker
(:func:`~recallk.encode.batches.read_checked`, the local engine's checked reader). Ray does not
keep the order, so every output row carries its sha256; the driver streams the batches back
(``iter_batches``), and :func:`~recallk.encode.batches.encode_catalog` commits each to the cache
as it arrives and assembles the output in catalog order, as for the local engine: the same bytes.
A run killed midway keeps every batch that reached the driver, and the next run encodes the rest.

A worker's :class:`~recallk.errors.InputError` (a changed or undecodable image, a backbone's
bad output) reaches the caller as the same message as locally; a worker that dies more than
``max_restarts`` times ends the run with a message saying that a re-run resumes from the cache.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Iterator, Sequence

import numpy as np

from recallk.cluster import connect
from recallk.encode.base import Backbone
from recallk.encode.batches import BatchSource, read_checked, run_backbone
from recallk.encode.registry import get_backbone
from recallk.encode.settings import EncodeRaySettings
from recallk.errors import InputError
from recallk.images import DEFAULT_BACKGROUND

log = logging.getLogger(__name__)


def _deaths() -> tuple[type, ...]:
    import ray.exceptions

    return (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)

#: Restarts of a dead encoder actor (a lost node, an out-of-memory kill) before the run gives up.
MAX_RESTARTS = 3


class BatchEncoder:
    """One Ray Data actor: builds backbone ``name`` with ``options`` once, then encodes batches.

    Ray does not carry an exception's cause back to the driver, so an :class:`InputError` in the
    worker (a changed or undecodable image, a backbone's bad output, another fingerprint) comes back
    as data: a one-row batch whose ``error`` is the message, which the driver raises as it is.

    Parameters
    ----------
    name, options, runtime, background
        As for :func:`~recallk.encode.registry.get_backbone` (``runtime``: the device request of torch backbones;
        ``background``: the colour images' transparency is composited over, ``split.background``).
    fingerprint : str
        The driver's fingerprint of the backbone: a worker whose code, weights or libraries differ
        (another fingerprint) refuses to encode, so the cache never mixes two backbones.
    dim : int or None
        The dimension every batch must have (None: any, the same for every batch).
    """

    def __init__(self, name: str, options: dict[str, Any] | None, fingerprint: str, dim: int | None,
                 runtime: Any = None, background: str = DEFAULT_BACKGROUND) -> None:
        self.dim, self.error = dim, ""
        try:
            self.backbone = get_backbone(name, options, runtime=runtime, background=background)
        except InputError as exc:
            self.error = str(exc)
            return
        if self.backbone.fingerprint != fingerprint:
            self.error = (f"backbone {name!r} on a Ray worker has fingerprint {self.backbone.fingerprint}, the "
                          f"driver's is {fingerprint}: the worker runs other code, weights or library versions. "
                          "Install the same versions on every node (constraints.txt).")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``{"sha256", "path", "shown"}`` rows (``path`` absolute, ``shown`` the catalog's) ->
        ``{"sha256", "embedding", "error"}``: the embedding of each row as its float32 bytes
        (little-endian), ``error`` empty; or one row holding the error."""
        try:
            if self.error:
                raise InputError(self.error)
            images = [read_checked(str(path), str(sha), self.backbone.input_size, str(shown), self.backbone.background)
                      for path, sha, shown in zip(batch["path"], batch["sha256"], batch["shown"])]
            emb = np.ascontiguousarray(run_backbone(self.backbone, images, self.dim), dtype="<f4")
        except InputError as exc:
            return {"sha256": np.array([""]), "embedding": np.array([b""], dtype=object),
                    "error": np.array([str(exc)])}
        return {"sha256": batch["sha256"], "embedding": np.array([row.tobytes() for row in emb], dtype=object),
                "error": np.full(len(emb), "")}


def ray_source(backbone: Backbone, name: str, options: dict[str, Any] | None, ray_settings: EncodeRaySettings, *,
               max_restarts: int = MAX_RESTARTS, runtime: Any = None) -> BatchSource:
    """The Ray engine's :data:`~recallk.encode.batches.BatchSource`.

    Parameters
    ----------
    backbone : Backbone
        The driver's backbone (its fingerprint, dimension and background); each actor builds its own from
        ``name``, ``options`` and that background.
    ray_settings : EncodeRaySettings
        ``encode.ray``: ``address``, the cluster (:func:`recallk.cluster.connect`), joined only when there
        is a miss to encode; ``concurrency``, encoder actors (each builds the backbone once); ``num_gpus``,
        GPUs per actor (0: CPU only, one CPU each); ``batch_size``, images per backbone call (and per Ray block).
    max_restarts : int
        Restarts of a dead actor, each retrying its batch, before the run stops (0: stop at the first).
    runtime : recallk.encode.device.Request, optional
        Device, dtype and flags of a torch backbone, as in the driver: a worker that resolves them to
        another device (a GPU actor, a CPU driver) computes another fingerprint and refuses to encode.
    """
    address, concurrency = ray_settings.address, ray_settings.concurrency
    num_gpus, batch_size = ray_settings.num_gpus, ray_settings.batch_size

    def source(todo: list[str], paths: list[str], dim: int | None) -> Iterator[tuple[Sequence[str], np.ndarray]]:
        ray = connect(address, "encode.engine: ray")
        gpus = ray.cluster_resources().get("GPU", 0)
        if num_gpus > gpus:  # the actors would wait forever for a GPU
            raise InputError(f"`encode.ray.num_gpus` is {num_gpus:g} per actor, but the Ray cluster has {gpus:g} GPUs; "
                             "set it to 0 (CPU) or connect to a cluster with GPUs (RAY_ADDRESS).")
        # workers run in other folders (or on other nodes, over a shared file system): absolute paths
        rows = ray.data.from_items([{"sha256": sha, "path": os.path.abspath(path), "shown": path}
                                    for sha, path in zip(todo, paths)],
                                   override_num_blocks=-(-len(todo) // batch_size))  # one block, one batch
        remote: dict[str, Any] = {"max_restarts": max_restarts}
        if max_restarts:
            remote["max_task_retries"] = max_restarts
        with warnings.catch_warnings():  # Ray 2.60 takes actor restarts only as ray_remote_args (deprecated)
            warnings.simplefilter("ignore", DeprecationWarning)
            mapped = rows.map_batches(BatchEncoder,
                                      fn_constructor_args=(name, options, backbone.fingerprint, dim, runtime,
                                                           backbone.background),
                                      batch_size=batch_size, batch_format="numpy",
                                      compute=ray.data.ActorPoolStrategy(size=concurrency),
                                      num_cpus=0 if num_gpus else 1, num_gpus=num_gpus or None, **remote)
        log.info("encoding %d images on Ray: %d actor(s), batch %d, %g GPU(s) each", len(todo), concurrency,
                 batch_size, num_gpus)
        try:
            for batch in mapped.iter_batches(batch_size=None, batch_format="numpy"):
                errors = [str(e) for e in batch["error"] if e]
                if errors:
                    raise InputError(errors[0])
                emb = np.frombuffer(b"".join(batch["embedding"]), dtype="<f4").reshape(len(batch["sha256"]), -1)
                yield [str(s) for s in batch["sha256"]], emb.astype(np.float32)
        except ray.exceptions.RayError as exc:
            if any(isinstance(e, _deaths()) or "ActorDiedError" in str(e) for e in chain(exc)):
                raise InputError(f"a Ray encoder worker died ({_first_line(exc)}); the batches that came back "
                                 "before are in the embedding cache: re-run to encode the rest (a worker killed for "
                                 "memory: lower `encode.ray.batch_size` or `encode.ray.concurrency`).") from None
            raise
    return source


def _first_line(exc: BaseException) -> str:
    return next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)[:300]


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception behind it: Ray's ``cause``, ``__cause__`` and ``__context__``."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [x for x in (getattr(e, "cause", None), e.__cause__, e.__context__) if isinstance(x, BaseException)]
