"""The index kinds of ``index.kinds``: FAISS factory strings and hnswlib, built, tuned and searched alike.

A kind is a FAISS factory string (``Flat``, ``IVF1024,Flat``, ``IVF1024,PQ32``, ``HNSW32``, ... on the inner
product of unit rows, i.e. the cosine) or ``hnswlib`` / ``hnswlib,M<m>`` / ``hnswlib,M<m>,efc<e>`` (hnswlib's
``ip`` space; M 16 and ef_construction 200 by default). Each kind has the sweep parameters it has:
``nprobe`` (any FAISS index with an IVF stage: 1 to its nlist), ``efSearch`` (FAISS HNSW) and ``ef``
(hnswlib). FAISS and hnswlib are imported when a kind is made (the ``faiss`` and ``hnswlib`` extras).
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from recallk.errors import InputError, clip

#: The sweep parameters, by the library that has them.
#: ``hnswlib``, ``hnswlib,M16``, ``hnswlib,M16,efc200``.
HNSWLIB = re.compile(r"^hnswlib(?:,M([1-9][0-9]*))?(?:,efc([1-9][0-9]*))?$")
#: Examples named by the messages.
EXAMPLES = "`Flat`, `IVF1024,Flat`, `IVF1024,PQ32`, `HNSW32`, `hnswlib,M16`"


def faiss_module() -> Any:
    """faiss, or an InputError naming the extra. Its loader's INFO lines while it is imported (``Could not load
    library with AVX512 support due to: ModuleNotFoundError ...``, one per instruction set it tries: noise in
    a stage's log, where INFO is on) are held back; its errors are not."""
    loader = logging.getLogger("faiss.loader")
    level = loader.level
    loader.setLevel(max(level, logging.WARNING))
    try:
        import faiss
    except ImportError:
        raise InputError("`index.kinds` names a FAISS index but faiss is not installed; "
                         "`pip install 'recall-at-k-runner[faiss]'`.") from None
    finally:
        loader.setLevel(level)
    return faiss


@dataclass
class Kind:
    """One entry of ``index.kinds``, checked against the embedding dimension ``dim``.

    Attributes
    ----------
    name : str
        As written in params.yaml.
    library : {"faiss", "hnswlib"}
    params : dict
        Each sweep parameter this kind has -> its largest allowed value (None: unbounded).
    needs_training : bool
        The index learns from data (IVF centroids, PQ codebooks) before items are added.
    """

    name: str
    library: str
    params: dict[str, int | None]
    needs_training: bool
    dim: int
    m: int = 16
    ef_construction: int = 200

    def empty(self) -> Any:
        """A new, empty FAISS index of this kind (FAISS kinds only)."""
        faiss = faiss_module()
        return faiss.index_factory(self.dim, self.name, faiss.METRIC_INNER_PRODUCT)


def parse_kind(name: str, dim: int) -> Kind:
    """The :class:`Kind` of one ``index.kinds`` entry; InputError for a string neither library can build."""
    match = HNSWLIB.match(name)
    if match:
        return Kind(name, "hnswlib", {"ef": None}, False, dim, int(match.group(1) or 16), int(match.group(2) or 200))
    if name.startswith("hnswlib"):
        raise InputError(f"`index.kinds`: {clip(name)!r} is not an hnswlib kind; write `hnswlib`, `hnswlib,M16` or "
                         "`hnswlib,M16,efc200`.")
    faiss = faiss_module()
    try:
        index = faiss.index_factory(dim, name, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        why = str(exc).rsplit("Error: ", 1)[-1].strip()
        raise InputError(f"`index.kinds`: {clip(name)!r} is not a FAISS factory string FAISS can build for "
                         f"{dim}-d embeddings (faiss: {clip(why, 160)}). Examples: {EXAMPLES}.") from None
    params: dict[str, int | None] = {}
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        params["nprobe"] = int(ivf.nlist)
    try:
        faiss.ParameterSpace().set_index_parameter(index, "efSearch", 16)
        params["efSearch"] = None
    except RuntimeError:
        pass
    return Kind(name, "faiss", params, not index.is_trained, dim)


def points(kind: Kind, sweep: dict[str, tuple[int, ...]]) -> list[dict[str, int]]:
    """The operating points of ``kind``: one per value of the sweep parameter it has (``sweep[name]``, when
    given), or one point at the library's defaults. InputError for a value beyond what the index has."""
    given = [(name, values) for name, values in sweep.items() if values and name in kind.params]
    if len(given) > 1:
        raise InputError(f"`index.sweep`: {kind.name} has both {given[0][0]} and {given[1][0]}, and both are swept; "
                         "a kind sweeps one parameter: empty one of the two lists.")
    if not given:
        return [{}]
    name, values = given[0]
    top = kind.params[name]
    too_big = [v for v in values if top is not None and v > top]
    if too_big:
        raise InputError(f"`index.sweep.{name}`: {kind.name} has {top} lists (nlist), so {name} can be 1 to {top}. "
                         f"Got {too_big[0]} instead; remove it or use a kind with more lists.")
    return [{name: int(v)} for v in values]


def unused_sweep(kinds: list[Kind], sweep: dict[str, tuple[int, ...]]) -> str | None:
    """A sentence naming a swept parameter no kind has (a typo or a missing kind), else None."""
    for name, values in sweep.items():
        if values and not any(name in kind.params for kind in kinds):
            has = {kind.name: sorted(kind.params) or ["nothing to sweep"] for kind in kinds}
            return (f"`index.sweep.{name}` is set but no kind of `index.kinds` has {name} (" +
                    "; ".join(f"{k}: {', '.join(v)}" for k, v in has.items()) +
                    "); remove it or add a kind that has it (nprobe: an IVF kind; efSearch: HNSW; ef: hnswlib).")
    return None


@dataclass
class Built:
    """An index built on the gallery, with what it cost."""

    kind: Kind
    index: Any
    build_seconds: float
    memory_bytes: int


def build(kind: Kind, gallery: np.ndarray, train: np.ndarray, threads: int, seed: int) -> Built:
    """Train (on ``train``, when the kind needs it) and fill an index with the unit rows ``gallery``.

    The build runs on ``threads`` threads (1 gives the same graph every run: FAISS HNSW and hnswlib insert in
    parallel in an order that depends on timing). InputError when the kind cannot train on so few rows.
    """
    start = time.perf_counter()
    if kind.library == "hnswlib":
        import hnswlib
        index = hnswlib.Index(space="ip", dim=kind.dim)
        index.init_index(max_elements=max(len(gallery), 1), M=kind.m, ef_construction=kind.ef_construction,
                         random_seed=seed)
        index.add_items(gallery, np.arange(len(gallery)), num_threads=threads)
        seconds = time.perf_counter() - start
        return Built(kind, index, seconds, hnswlib_bytes(index))
    faiss = faiss_module()
    faiss.omp_set_num_threads(threads)
    index = kind.empty()
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.cp.seed = seed
    if kind.needs_training:
        try:
            index.train(train)
        except RuntimeError as exc:
            why = str(exc).rsplit("Error: ", 1)[-1].strip()
            raise InputError(f"`index.kinds`: {kind.name} cannot train on {len(train)} rows ({clip(why, 200)}); "
                             "use fewer lists (IVF<n> with n at most the rows) or fewer PQ bits, or give the "
                             "train split more images.") from None
    index.add(gallery)
    seconds = time.perf_counter() - start
    return Built(kind, index, seconds, faiss_bytes(faiss, index))


def faiss_bytes(faiss: Any, index: Any) -> int:
    """The size of a FAISS index as serialized (``faiss.serialize_index``'s length, without copying it out)."""
    writer = faiss.VectorIOWriter()
    faiss.write_index(index, writer)
    return int(writer.data.size())


def hnswlib_bytes(index: Any) -> int:
    """The size of an hnswlib index as saved (its graph and vectors)."""
    fd, path = tempfile.mkstemp(suffix=".hnsw")
    os.close(fd)
    try:
        index.save_index(path)
        return os.path.getsize(path)
    finally:
        os.unlink(path)


def search(built: Built, queries: np.ndarray, k: int, point: dict[str, int],
           threads: int) -> tuple[np.ndarray, np.ndarray, float, dict[str, int]]:
    """The top ``k`` of each unit row of ``queries`` at ``point``, on ``threads`` threads.

    Returns the gallery rows (int64, -1: none), the index's similarities (float32), the seconds the search
    took and the point as it ran (hnswlib and FAISS HNSW search with at least ``k`` candidates: an ``ef`` or
    ``efSearch`` below ``k`` runs at ``k``).
    """
    k = max(int(k), 1)
    ran = dict(point)
    if built.kind.library == "hnswlib":
        index = built.index
        ef = max(point.get("ef", 10), k)
        ran["ef"] = ef
        index.set_ef(ef)
        start = time.perf_counter()
        try:
            labels, distances = index.knn_query(queries, k=min(k, index.get_current_count()), num_threads=threads)
        except RuntimeError as exc:  # hnswlib cannot fill k results from its graph
            raise InputError(f"`index.kinds`: {built.kind.name} could not return {k} items per query at ef {ef} "
                             f"(hnswlib: {clip(str(exc), 160)}); raise `index.sweep.ef` or M.") from None
        seconds = time.perf_counter() - start
        ids = np.full((len(queries), k), -1, dtype=np.int64)
        scores = np.full((len(queries), k), np.nan, dtype=np.float32)
        ids[:, :labels.shape[1]], scores[:, :labels.shape[1]] = labels, 1.0 - distances  # ip space: 1 - <q, g>
        return ids, scores, seconds, ran
    faiss = faiss_module()
    faiss.omp_set_num_threads(threads)
    space = faiss.ParameterSpace()
    for name, value in point.items():
        if name == "efSearch":
            value = max(value, k)
            ran[name] = value
        space.set_index_parameter(built.index, name, value)
    start = time.perf_counter()
    scores, ids = built.index.search(queries, k)
    seconds = time.perf_counter() - start
    return ids.astype(np.int64, copy=False), scores, seconds, ran
