"""The index kinds of ``index.kinds``: FAISS factory strings and hnswlib, built, tuned and searched alike.

A kind is a FAISS factory string (``Flat``, ``IVF1024,Flat``, ``IVF1024,PQ32``, ``HNSW32``, ... on the inner
product of unit rows, i.e. the cosine) or ``hnswlib`` / ``hnswlib,M<m>`` / ``hnswlib,M<m>,efc<e>`` (hnswlib's
``ip`` space; M 16 and ef_construction 200 by default). Each kind has the sweep parameters it has:
``nprobe`` (any FAISS index with an IVF stage: 1 to its nlist), ``efSearch`` (FAISS HNSW) and ``ef``
(hnswlib). FAISS and hnswlib are imported when a kind is made (the ``faiss`` and ``hnswlib`` extras).

FAISS's factory crashes the process on some strings (a segfault, an abort: no error line), so a kind is read
here first (:func:`kind_problem`, the params check's rule): only the parts of :data:`PARTS`, in their order and
within their ranges, reach FAISS. Every FAISS or hnswlib call that makes, trains, fills or searches an index
runs inside :func:`library_call`, so a library failure is one InputError naming the kind.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from recallk.errors import InputError, clip

#: The sweep parameters, by the library that has them.
#: ``hnswlib``, ``hnswlib,M16``, ``hnswlib,M16,efc200`` (the numbers' ranges are checked apart).
HNSWLIB = re.compile(r"^hnswlib(?:,M([0-9]+))?(?:,efc([0-9]+))?$")
#: Examples named by the messages.
EXAMPLES = "`Flat`, `IVF1024,Flat`, `IVF1024,PQ32`, `HNSW32`, `hnswlib,M16`"
#: The largest value a C int holds: FAISS keeps its parameters (efSearch, seeds) in one. The bounds on the params
#: (``index.seed``, ``index.sweep``, the threads) are their rules in :mod:`recallk.index.settings`, checked once
#: (:func:`recallk.index.settings.index_settings`); this module checks only what depends on the kind or the data.
C_INT = 2**31 - 1
#: The longest kind: FAISS's factory parser crashes (a segfault) on a string of some kilobytes.
MAX_KIND_CHARS = 100
#: M of an HNSW graph (FAISS's and hnswlib's): below 2 both crash (FAISS divides by log M); hnswlib caps M at
#: 10,000 (with a warning) and each item's links grow with M.
HNSW_M = (2, 10_000)
#: IVF lists: 0 lists build an index that fails every search; FAISS allocates every list when it makes the
#: index (2**31 of them: bad_alloc), and training needs a row per list.
IVF_LISTS = (1, 2**22)
#: Bits of a PQ code: 0 crashes FAISS (SIGFPE); each sub-quantizer trains 2**bits centroids.
PQ_BITS = (1, 16)
#: Transforms (PCA, OPQ) before the index.
MAX_TRANSFORMS = 3
#: Threads of a build or a search (``index.build_threads``, ``index.threads``).
MAX_THREADS = 1024


@dataclass(frozen=True)
class Part:
    """A part of a FAISS factory string the stage builds (``IVF1024``, ``PQ32x8``): its role and numbers."""

    text: str
    role: str  # transform, coarse, codes, graph, refine
    numbers: dict[str, int]


#: Each part the stage builds: its role, its pattern, and each number's (name, smallest, largest, why).
PARTS: tuple[tuple[str, re.Pattern, dict[str, tuple[str, int, int, str]]], ...] = (
    ("transform", re.compile(r"PCAW?R?(?P<d>[0-9]+)"), {"d": ("its output dimension", 1, C_INT, "")}),
    ("transform", re.compile(r"OPQ(?P<m>[0-9]+)(?:_(?P<d>[0-9]+))?"),
     {"m": ("its sub-quantizers", 1, C_INT, ""), "d": ("its output dimension", 1, C_INT, "")}),
    ("coarse", re.compile(r"IVF(?P<nlist>[0-9]+)(?:_HNSW(?P<M>[0-9]+))?"),
     {"nlist": ("its lists (nlist)", *IVF_LISTS, ": FAISS fails every search of 0 lists and allocates every list "
                "when it makes the index"),
      "M": ("M of its HNSW quantizer", *HNSW_M, ": FAISS crashes on a graph of M below 2")}),
    ("codes", re.compile(r"Flat|SQ4|SQ6|SQ8|SQfp16|SQbf16"), {}),
    ("codes", re.compile(r"PQ(?P<m>[0-9]+)(?:x(?P<bits>[0-9]+))?"),
     {"m": ("its sub-quantizers", 1, C_INT, ""),
      "bits": ("its bits per code", *PQ_BITS, ": FAISS crashes on 0, and each sub-quantizer trains 2^bits "
               "centroids")}),
    ("graph", re.compile(r"HNSW(?P<M>[0-9]+)"), {"M": ("M", *HNSW_M, ": FAISS crashes on a graph of M below 2")}),
    ("refine", re.compile(r"RFlat"), {}),
)
#: The parts, as the messages name them.
PART_NAMES = ("PCA<d>, PCAR<d>, PCAW<d>, PCAWR<d>, OPQ<m> or OPQ<m>_<d> (transforms, first); IVF<n> or "
              "IVF<n>_HNSW<M> (an IVF stage); Flat, PQ<m>, PQ<m>x<bits>, SQ4, SQ6, SQ8, SQfp16, SQbf16 (the codes); "
              "HNSW<M> (a graph, alone or before its codes); RFlat (exact re-ranking, last)")
#: The orders of the roles after the transforms and before RFlat.
CORES = (("codes",), ("coarse", "codes"), ("graph",), ("graph", "codes"))
#: Parts FAISS builds that the stage cannot use, and why.
REFUSED = {"IDMap": "an IDMap index takes the caller's ids and FAISS refuses the stage's add, which numbers the "
                    "gallery by row; drop the IDMap part"}
#: Each role, as the messages name it.
ROLES = {"transform": "a transform", "coarse": "an IVF stage", "codes": "codes", "graph": "an HNSW graph",
         "refine": "a re-ranking"}


def faiss_parts(name: str) -> tuple[list[Part], str | None]:
    """The parts of the FAISS factory string ``name``, or a sentence (for after "`index.kinds`") saying why the
    stage does not build it: too long, a part outside :data:`PARTS`, a number out of its range, or the parts
    in an order other than transforms, then :data:`CORES`, then RFlat (``name`` at most :data:`MAX_KIND_CHARS`
    long). FAISS itself is not called: its factory crashes the process on some strings (a long one, ``HNSW0``),
    so only these forms reach it."""
    parts: list[Part] = []
    for text in name.split(","):
        known = next(((role, m, ranges) for role, pattern, ranges in PARTS if (m := pattern.fullmatch(text))), None)
        if known is None:
            refused = next((why for prefix, why in REFUSED.items() if text.startswith(prefix)), None)
            return [], (f"entry {name!r} is not a FAISS factory string the stage builds: its part {clip(text, 40)!r} " +
                        (f"is refused: {refused}." if refused else f"is none of {PART_NAMES}.") +
                        f" Examples: {EXAMPLES}.")
        role, match, ranges = known
        numbers = {key: int(value) for key, value in match.groupdict().items() if value is not None}
        for key, value in numbers.items():
            what, low, high, why = ranges[key]
            if not low <= value <= high:
                return [], (f"entry {name!r}: {what} in {text!r} must be {low} to {high}{why}. Got {value} "
                            f"instead; write e.g. `HNSW32`, `IVF1024,Flat` or `IVF1024,PQ32x8`.")
        parts.append(Part(text, role, numbers))
    roles = [p.role for p in parts]
    start = next((i for i, r in enumerate(roles) if r != "transform"), len(roles))
    core = roles[start:-1] if roles[-1] == "refine" else roles[start:]
    if start > MAX_TRANSFORMS or tuple(core) not in CORES:
        return [], (f"entry {name!r} is not a FAISS factory string the stage builds: write at most "
                    f"{MAX_TRANSFORMS} transforms (PCA, OPQ), then codes alone (`Flat`, `PQ32`, `SQ8`), an IVF "
                    "stage and its codes (`IVF1024,Flat`) or an HNSW graph with or without codes (`HNSW32`, "
                    "`HNSW32,SQ8`), then `RFlat` at most once. Got " +
                    ", ".join(f"{p.text} ({ROLES[p.role]})" for p in parts) + ".")
    return parts, None


def hnswlib_problem(name: str) -> str | None:
    """Why ``name`` (``hnswlib...``) is not an hnswlib kind (for after "`index.kinds`"), else None."""
    match = HNSWLIB.match(name)
    if not match:
        return (f"entry {clip(name, 40)!r} is not an hnswlib kind; write `hnswlib`, `hnswlib,M16` or "
                "`hnswlib,M16,efc200`.")
    m, efc = (int(g) if g is not None else None for g in match.groups())
    if m is not None and not HNSW_M[0] <= m <= HNSW_M[1]:
        return (f"entry {name!r}: M must be {HNSW_M[0]} to {HNSW_M[1]} (hnswlib fails on a graph of M below 2 "
                f"and caps it at {HNSW_M[1]}). Got {m} instead; write e.g. `hnswlib,M16`.")
    if efc is not None and not 1 <= efc <= C_INT:
        return (f"entry {name!r}: efc (ef_construction) must be 1 to {C_INT} (a C int). Got {efc} instead; write "
                "e.g. `hnswlib,M16,efc200`.")
    return None


def kind_problem(name: str) -> str | None:
    """Why the stage does not build the kind ``name`` (a sentence for after "`index.kinds`"), else None: the
    params check's rule, run before FAISS or hnswlib is imported (:func:`faiss_parts`, :func:`hnswlib_problem`)."""
    if len(name) > MAX_KIND_CHARS:
        return (f"entry {clip(name, 40)!r} is {len(name)} characters long; a kind has at most {MAX_KIND_CHARS} "
                f"(FAISS's factory crashes on very long strings). Examples: {EXAMPLES}.")
    if name.startswith("hnswlib"):
        return hnswlib_problem(name)
    return faiss_parts(name)[1]


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
        Each sweep parameter this kind has -> the largest value the kind takes (nlist for nprobe), or None
        (efSearch, ef: bounded by the params' rule alone, :func:`recallk.index.settings.values_problem`).
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
    """The :class:`Kind` of one ``index.kinds`` entry; InputError for a string the stage does not build
    (:func:`kind_problem`: checked before FAISS sees it), a transform widening the embeddings, or one FAISS
    cannot build for ``dim``-d embeddings."""
    problem = kind_problem(name)
    if problem:
        raise InputError(f"`index.kinds` {problem}")
    match = HNSWLIB.match(name)
    if match:
        return Kind(name, "hnswlib", {"ef": None}, False, dim, int(match.group(1) or 16), int(match.group(2) or 200))
    width = dim
    for part in faiss_parts(name)[0]:
        out = part.numbers.get("d", width) if part.role == "transform" else width
        if out > width:
            raise InputError(f"`index.kinds` entry {name!r}: {part.text} maps {width}-d rows to {out}-d; a "
                             f"transform keeps at most the dimensions it is given: write at most {width} there.")
        split = part.numbers.get("m") if part.text.startswith(("OPQ", "PQ")) else None
        if split and out % split:
            raise InputError(f"`index.kinds` entry {name!r}: {part.text} splits {out}-d rows into {split} "
                             f"sub-quantizers, which must divide {out}: write a divisor of {out} there.")
        width = out
    faiss = faiss_module()
    try:
        index = faiss.index_factory(dim, name, faiss.METRIC_INNER_PRODUCT)
    except (RuntimeError, MemoryError) as exc:
        raise InputError(f"`index.kinds` entry {name!r} is not a FAISS factory string FAISS can build for "
                         f"{dim}-d embeddings (faiss: {clip(why(exc), 160)}). Examples: {EXAMPLES}.") from None
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


#: FAISS's preamble of an error: ``Error in <function> at <file>:<line>: `` and, for a failed check, ``Error: ``.
FAISS_PREAMBLE = re.compile(r"^Error in .*? at \S+:[0-9]+: (?:Error: )?", re.S)


def why(exc: BaseException) -> str:
    """What a FAISS or hnswlib exception says, without FAISS's preamble (:data:`FAISS_PREAMBLE`)."""
    return FAISS_PREAMBLE.sub("", str(exc)).strip() or type(exc).__name__


@contextmanager
def library_call(kind: Kind, what: str, fix: str) -> Iterator[None]:
    """A FAISS or hnswlib call on ``kind`` (making, training, filling or searching its index): its failure (a
    C++ exception: RuntimeError, MemoryError for bad_alloc, ValueError, OverflowError) is one InputError naming
    the kind, what it ``cannot`` do (``add 1797 rows``) and the ``fix``."""
    try:
        yield
    except InputError:
        raise
    except (RuntimeError, MemoryError, ValueError, OverflowError) as exc:
        raise InputError(f"`index.kinds`: {kind.name} cannot {what} ({kind.library}: {clip(why(exc), 200)}); "
                         f"{fix}.") from None


def points(kind: Kind, sweep: dict[str, tuple[int, ...]]) -> list[dict[str, int]]:
    """The operating points of ``kind``: one per value of the sweep parameter it has (``sweep[name]``, when
    given), or one point at the library's defaults. InputError for an nprobe beyond the kind's lists (nlist); the
    values' own bounds are the params' rule (:func:`recallk.index.settings.values_problem`), checked before."""
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
    parallel in an order that depends on timing). ``threads`` and ``seed`` are taken as ``index.build_threads`` and
    ``index.seed`` allow them (checked with the settings: :func:`recallk.index.settings.index_settings`).
    InputError when the kind cannot train on so few rows, or when the library fails to make or fill the index
    (:func:`library_call`).
    """
    start = time.perf_counter()
    fill = (f"add {len(gallery)} rows", "use a smaller kind (fewer lists, a smaller M) or fewer build threads")
    if kind.library == "hnswlib":
        import hnswlib
        with library_call(kind, *fill):
            index = hnswlib.Index(space="ip", dim=kind.dim)
            index.init_index(max_elements=max(len(gallery), 1), M=kind.m, ef_construction=kind.ef_construction,
                             random_seed=seed)
            index.add_items(gallery, np.arange(len(gallery)), num_threads=threads)
        seconds = time.perf_counter() - start
        return Built(kind, index, seconds, hnswlib_bytes(index))
    faiss = faiss_module()
    with library_call(kind, f"build for {kind.dim}-d embeddings", "use a smaller kind (fewer lists, a smaller M)"):
        faiss.omp_set_num_threads(threads)
        index = kind.empty()
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.cp.seed = seed
    if kind.needs_training:
        with library_call(kind, f"train on {len(train)} rows", "use fewer lists (IVF<n> with n at most the rows) "
                          "or fewer PQ bits, or give the train split more images"):
            index.train(train)
    with library_call(kind, *fill):
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
    ``efSearch`` below ``k`` runs at ``k``; FAISS gets an ``efSearch`` above the gallery size as that size,
    the same search, without a candidate list of the size asked). InputError when the library fails.
    """
    k = max(int(k), 1)
    ran = dict(point)
    if built.kind.library == "hnswlib":
        index = built.index
        ef = max(point.get("ef", 10), k)
        ran["ef"] = ef
        # hnswlib fails when its graph cannot fill k results
        with library_call(built.kind, f"return {k} items per query at ef {ef}", "raise `index.sweep.ef` or M"):
            index.set_ef(ef)
            start = time.perf_counter()
            labels, distances = index.knn_query(queries, k=min(k, index.get_current_count()), num_threads=threads)
            seconds = time.perf_counter() - start
        ids = np.full((len(queries), k), -1, dtype=np.int64)
        scores = np.full((len(queries), k), np.nan, dtype=np.float32)
        ids[:, :labels.shape[1]], scores[:, :labels.shape[1]] = labels, 1.0 - distances  # ip space: 1 - <q, g>
        return ids, scores, seconds, ran
    faiss = faiss_module()
    at = ", ".join(f"{name} {value}" for name, value in point.items()) or "its defaults"
    with library_call(built.kind, f"search {len(queries)} queries for {k} items at {at}",
                      "use another kind or sweep value"):
        faiss.omp_set_num_threads(threads)
        space = faiss.ParameterSpace()
        for name, value in point.items():
            if name == "efSearch":
                value = max(value, k)
                ran[name] = value
                # FAISS allocates (and fills) a candidate list of efSearch entries per query and thread: 2^31 of
                # them exhaust memory. Above the items the graph holds it is the same search (the list never
                # fills: every reachable item is visited either way), so it runs at that size
                value = min(value, max(int(built.index.ntotal), k))
            space.set_index_parameter(built.index, name, value)
        start = time.perf_counter()
        scores, ids = built.index.search(queries, k)
        seconds = time.perf_counter() - start
    return ids.astype(np.int64, copy=False), scores, seconds, ran
