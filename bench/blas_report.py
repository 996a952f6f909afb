"""Which BLAS each contender of ``bench/score_bench.py`` runs: library, version, kernel and threads.

faiss-cpu bundles its own, older OpenBLAS, which may not know a new CPU and fall back
to a generic kernel (``Prescott``) where numpy's OpenBLAS runs an optimised one. To
compare like with like the FAISS child starts with ``OPENBLAS_CORETYPE`` set to the
kernel numpy's OpenBLAS chose (:func:`numpy_kernel`, :func:`child_env`; pytorch-metric-learning's child
too, as it searches with faiss), and every child reports the
library and kernel it ran (:func:`ran_blas`), read with threadpoolctl after its imports.
"""

from __future__ import annotations

import os
from pathlib import Path

THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE")
#: Contenders whose products run in faiss (pytorch-metric-learning finds its neighbours with faiss).
FAISS_METHODS = ("faiss", "pml", "pml full", "small pml")


def blas_libraries() -> list[dict]:
    """The BLAS libraries loaded in this process (``threadpoolctl.threadpool_info``); [] without threadpoolctl."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [p for p in threadpool_info() if p["user_api"] == "blas"]


def numpy_kernel() -> str | None:
    """The kernel (``architecture``) of numpy's OpenBLAS. Call it before importing a library that brings its
    own BLAS (faiss), so that numpy's is the only one loaded; None when it is not an OpenBLAS."""
    return next((p["architecture"] for p in blas_libraries() if p.get("architecture")), None)


def describe(p: dict) -> str:
    """One library: API, version, kernel, threads and file."""
    kernel = f" {p['architecture']}" if p.get("architecture") else ""
    return (f"{p['internal_api']} {p.get('version') or ''}{kernel}, {p['num_threads']} threads "
            f"({Path(p['filepath']).name})")


def ran_blas(method: str, numpy_paths: set[str]) -> str:
    """In a child, after its imports: the BLAS that ``method`` ran. The :data:`FAISS_METHODS` run the
    libraries that came with faiss (those not loaded with numpy, ``numpy_paths``; numpy's when it shares
    them), every other method numpy's."""
    libs = blas_libraries()
    if not libs:
        return "unknown (threadpoolctl not installed)"
    in_faiss = method in FAISS_METHODS
    mine = [p for p in libs if (p["filepath"] not in numpy_paths) == in_faiss]
    where = "faiss's own" if in_faiss and mine else "numpy's"
    mine = mine or [p for p in libs if p["filepath"] in numpy_paths]
    forced = os.environ.get("OPENBLAS_CORETYPE")
    taken = not forced or all((p.get("architecture") or "").lower() == forced.lower() for p in mine)
    note = f" [OPENBLAS_CORETYPE={forced}{'' if taken else ': not taken'}]" if forced else ""
    return f"{where} {'; '.join(describe(p) for p in mine)}{note}"


def blas_lines(results: dict[str, dict]) -> list[str]:
    """One line per BLAS the children of a scenario ran, naming the contenders that ran it."""
    groups: dict[str, list[str]] = {}
    for method, r in results.items():
        if "blas" in r:
            groups.setdefault(r["blas"], []).append(method)
    return [f"  BLAS of {', '.join(methods)}: {text}" for text, methods in groups.items()]


def child_env(method: str, kernel: str | None, extra: dict[str, str]) -> dict[str, str]:
    """A child's environment: this one plus ``extra``, and for the :data:`FAISS_METHODS` ``OPENBLAS_CORETYPE``
    set to numpy's ``kernel``."""
    env = dict(os.environ, **extra)
    if kernel and method in FAISS_METHODS:
        env["OPENBLAS_CORETYPE"] = kernel
    return env


def blas_summary() -> list[str]:
    """The parent's header lines: every BLAS and OpenMP library once faiss is imported, and the thread variables."""
    lines = []
    try:
        import faiss  # noqa: F401  (so its OpenBLAS / OpenMP show up)
        from threadpoolctl import threadpool_info
        for p in threadpool_info():
            who = "numpy" if "numpy" in p["filepath"] else "faiss" if "faiss" in p["filepath"] else "?"
            extra = f", {p.get('threading_layer')}, {p.get('architecture')}" if p["user_api"] == "blas" else ""
            lines.append(f"  {who:5s} {p['internal_api']} {p.get('version') or ''} threads={p['num_threads']}"
                         f"{extra} ({Path(p['filepath']).name})")
    except ImportError:
        import numpy as np
        cfg = np.show_config(mode="dicts") if "mode" in np.show_config.__code__.co_varnames else {}
        blas = cfg.get("Build Dependencies", {}).get("blas", {}) if cfg else {}
        lines.append(f"  numpy blas: {blas.get('name', '?')} {blas.get('version', '')} (threadpoolctl not installed)")
    env = {k: os.environ[k] for k in THREAD_ENV if k in os.environ}
    lines.append(f"  cpus={os.cpu_count()} env={env or 'no thread env vars'}")
    return lines
