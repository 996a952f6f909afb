"""The ``index`` section: :class:`IndexSettings`, the approximate indexes the ``index`` stage scores against
the exact run (``index.kinds``, ``index.sweep``), and the rules only this section has.

Each bound of a param lives in its field's rule alone: the params check runs them on params.yaml, and
:func:`index_settings` runs the same rules, by the same route, on a settings object made in Python before
anything is built (:func:`recallk.index.sweep.score_index`). Only what depends on the data is checked when the
stage runs (:mod:`recallk.index.kinds`: a transform's or PQ's width against the embeddings', nprobe against a
kind's nlist, efSearch run at most at the gallery's size)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recallk.checks import integer, is_int
from recallk.errors import InputError, quote
from recallk.index.kinds import C_INT, MAX_THREADS, kind_problem
from recallk.settings.base import as_params, checked, from_mapping, setting


def kinds_problem(v: Any) -> str | None:
    """A list of distinct, non-blank strings, each a kind the stage builds (:func:`recallk.index.kinds.kind_problem`:
    its form and numbers; what depends on the embeddings' dimension is checked when the stage runs)."""
    if not isinstance(v, list) or not all(isinstance(k, str) and k.strip() for k in v) or len(set(v)) != len(v):
        return ("must be a list of distinct index kinds: FAISS factory strings such as `IVF1024,Flat` or `HNSW32`, "
                f"or `hnswlib`; `[]` turns the stage off. Got {quote(v)} instead.")
    return next(filter(None, map(kind_problem, v)), None)


def values_problem(v: Any) -> str | None:
    """A list of distinct integers from 1 to a C int's largest, ascending (the sweep's operating points: FAISS
    and hnswlib keep them in C ints)."""
    if not isinstance(v, list) or not all(is_int(x) and 1 <= x <= C_INT for x in v) or v != sorted(set(v)):
        return (f"must be distinct integers from 1 to {C_INT} (a C int, as FAISS keeps them), ascending, such as "
                f"[1, 8, 64]. Got {quote(v)} instead.")
    return None


def margin_problem(v: Any) -> str | None:
    """A number above 0 and below 1."""
    if not (is_int(v) or isinstance(v, float)) or isinstance(v, bool) or not 0.0 < v < 1.0:
        return f"must be a number above 0 and below 1, such as 0.01. Got {quote(v)} instead."
    return None


def optional_positive(v: Any) -> str | None:
    """A positive integer, or null."""
    if v is not None and (not is_int(v) or v < 1):
        return f"must be a positive integer or null. Got {quote(v)} instead."
    return None


def optional_threads(v: Any) -> str | None:
    """Null, or threads as ``index.build_threads`` takes them (1 to :data:`MAX_THREADS`)."""
    if v is not None and (not is_int(v) or not 1 <= v <= MAX_THREADS):
        return f"must be an integer between 1 and {MAX_THREADS}, or null (every core). Got {quote(v)} instead."
    return None


@dataclass(frozen=True)
class SweepSettings:
    """``index.sweep``: the operating points of each kind (a kind sweeps the one parameter it has; empty:
    the library's default)."""

    nprobe: tuple[int, ...] = setting([], values_problem,
                                      "IVF lists visited per query (FAISS kinds with an IVF stage), each 1 to nlist")
    efSearch: tuple[int, ...] = setting([], values_problem, "candidates kept while searching a FAISS HNSW graph, "
                                        "each 1 to 2^31 - 1 (a C int)")
    ef: tuple[int, ...] = setting([], values_problem, "candidates kept while searching an hnswlib graph, each 1 to "
                                  "2^31 - 1")


@dataclass(frozen=True)
class IndexSettings:
    """The ``index`` section: which indexes are scored against the exact run, at which operating points, and
    the margin of the non-inferiority verdict ([docs/index.md](index.md))."""

    kinds: tuple[str, ...] = setting([], kinds_problem,
                                     "FAISS factory strings (`Flat`, `IVF1024,Flat`, `IVF1024,PQ32`, `HNSW32`) and "
                                     "`hnswlib` / `hnswlib,M16,efc200`, on the cosine, each at most 100 characters "
                                     "of the parts and ranges in [index.md](index.md#what-is-built-and-on-what); "
                                     "`[]` (default): the stage writes placeholders and nothing is built")
    sweep: SweepSettings = setting(SweepSettings)
    margin: float = setting(0.01, margin_problem,
                            "non-inferiority margin: a point is non-inferior when the paired interval of every "
                            "label metric's Δ against exact lies above `-margin` (metrics a point's lists cannot "
                            "give exactly are not reported for it, nor judged)")
    depth: int | None = setting(None, optional_positive,
                                "items each ranked list keeps; `null`: max(ks), or the largest R when r_precision or "
                                "map@r is scored. A metric those lists cannot give exactly (map reads every "
                                "positive; mrr, r_precision and map@r need theirs listed) is not reported for a "
                                "point (`unreported_metrics`): raise the depth to have it")
    threads: int | None = setting(None, optional_threads,
                                  "threads of the timed all-cores search, 1 to 1024; `null`: every core")
    single_thread_queries: int = setting(1000, integer(1, 10_000_000),
                                         "queries of the one-thread timing (the first ones)")
    build_threads: int = setting(1, integer(1, MAX_THREADS),
                                 "threads of the build, 1 to 1024; 1 builds the same graph every run (HNSW "
                                 "inserts in a timing-dependent order on more)")
    seed: int = setting(0, integer(0, C_INT), "seed of the IVF k-means and of hnswlib's levels (below 2^31: "
                        "FAISS keeps it in a C int)")


def index_settings(settings: IndexSettings | None = None) -> IndexSettings:
    """``settings`` (default ``IndexSettings()``) checked by the params check's own route
    (:func:`recallk.settings.base.checked`: every field's rule, on the params ``settings`` stands for), as the
    settings object that route makes (lists as tuples); an :class:`~recallk.errors.InputError` names each problem
    as the params check does (``"`index.seed` must be an integer between 0 and 2147483647. Got -1 instead."``).

    :func:`recallk.index.sweep.score_index` runs it once, so a settings object made in Python meets the bounds
    params.yaml meets, and :mod:`recallk.index.kinds` keeps no copy of them (it checks what depends on the data)."""
    errors: list[str] = []
    values = checked(IndexSettings, as_params(settings if settings is not None else IndexSettings()), "index", errors)
    if errors:
        raise InputError(" ".join(errors))
    return from_mapping(IndexSettings, values)
