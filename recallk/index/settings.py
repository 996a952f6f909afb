"""The ``index`` section: :class:`IndexSettings`, the approximate indexes the ``index`` stage scores against
the exact run (``index.kinds``, ``index.sweep``), and the rules only this section has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recallk.checks import integer, is_int
from recallk.errors import quote
from recallk.settings.base import setting


def kinds_problem(v: Any) -> str | None:
    """A list of distinct, non-blank strings (each is checked against FAISS / hnswlib when the stage runs)."""
    if not isinstance(v, list) or not all(isinstance(k, str) and k.strip() for k in v) or len(set(v)) != len(v):
        return ("must be a list of distinct index kinds: FAISS factory strings such as `IVF1024,Flat` or `HNSW32`, "
                f"or `hnswlib`; `[]` turns the stage off. Got {quote(v)} instead.")
    return None


def values_problem(v: Any) -> str | None:
    """A list of distinct positive integers, ascending (the sweep's operating points)."""
    if not isinstance(v, list) or not all(is_int(x) and x >= 1 for x in v) or v != sorted(set(v)):
        return f"must be distinct positive integers, ascending, such as [1, 8, 64]. Got {quote(v)} instead."
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


@dataclass(frozen=True)
class SweepSettings:
    """``index.sweep``: the operating points of each kind (a kind sweeps the one parameter it has; empty:
    the library's default)."""

    nprobe: tuple[int, ...] = setting([], values_problem,
                                      "IVF lists visited per query (FAISS kinds with an IVF stage), each 1 to nlist")
    efSearch: tuple[int, ...] = setting([], values_problem, "candidates kept while searching a FAISS HNSW graph")
    ef: tuple[int, ...] = setting([], values_problem, "candidates kept while searching an hnswlib graph")


@dataclass(frozen=True)
class IndexSettings:
    """The ``index`` section: which indexes are scored against the exact run, at which operating points, and
    the margin of the non-inferiority verdict ([docs/index.md](index.md))."""

    kinds: tuple[str, ...] = setting([], kinds_problem,
                                     "FAISS factory strings (`Flat`, `IVF1024,Flat`, `IVF1024,PQ32`, `HNSW32`) and "
                                     "`hnswlib` / `hnswlib,M16,efc200`, on the cosine; `[]` (default): the stage "
                                     "writes placeholders and nothing is built")
    sweep: SweepSettings = setting(SweepSettings)
    margin: float = setting(0.01, margin_problem,
                            "non-inferiority margin: a point is non-inferior when the paired interval of every "
                            "label metric's Δ against exact lies above `-margin` (metrics the depth cuts short "
                            "are reported but not judged)")
    depth: int | None = setting(None, optional_positive,
                                "items each ranked list keeps; `null`: max(ks), or the largest R when r_precision or "
                                "map@r is scored. map and mrr are then computed on lists of that depth (a positive "
                                "beyond counts as not retrieved, as in a deployed list): exact only with a depth "
                                "of the whole gallery")
    threads: int | None = setting(None, optional_positive,
                                  "threads of the timed all-cores search; `null`: every core")
    single_thread_queries: int = setting(1000, integer(1, 10_000_000),
                                         "queries of the one-thread timing (the first ones)")
    build_threads: int = setting(1, integer(1, 1024),
                                 "threads of the build; 1 builds the same graph every run (HNSW inserts in a "
                                 "timing-dependent order on more)")
    seed: int = setting(0, integer(0), "seed of the IVF k-means and of hnswlib's levels")
