"""The data and the timed methods of ``bench/score_bench.py`` (each runs in its own child process there).

Scenarios A and C: 10,000 queries x 50,000 gallery x 512-d (random; clustered), B: leave-one-out 20,000,
D: 5,000 x 20,000 clustered. Methods: the engine's passes (``run_engine``, ``run_ranks``, ``run_top``,
``run_suite``), FAISS, pytorch-metric-learning's AccuracyCalculator (``run_pml``, ``run_pml_full``), a full
N x M matrix and the bare products (``run_floor``).
"""

from __future__ import annotations

import time

import numpy as np

import pml_anchor
from full_matrix import full_matrix_recall
from full_matrix import unit as _unit

KS = (1, 5, 10)
DIM = 512
MAX_MEMORY_MB = 512
#: The top metrics: everything but full map and mrr (the top-L pass, no exact first rank beyond L).
TOP_METRICS = ("recall", "precision", "r_precision", "map@r")
CLUSTER_NOISE = 3.6  # per-dimension noise around unit-variance class centres: recall@10 about 0.66


def sizes(quick: bool) -> dict:
    f = 20 if quick else 1
    a = {"n_query": 10_000 // f, "n_gallery": 50_000 // f, "classes": 1_000 // f}
    return {"A": a, "B": {"n": 20_000 // f, "classes": 1_000 // f}, "C": a,
            "D": {"n_query": 5_000 // f, "n_gallery": 20_000 // f, "classes": 1_000 // f}}


# --------------------------------------------------------------------------- data

def _labels(rng: np.random.Generator, n: int, classes: int) -> np.ndarray:
    """Balanced labels (every class present ``n // classes`` or one more times), shuffled."""
    return rng.permutation(np.arange(n, dtype=np.int64) % classes)


#: The performance table (``score_bench.py --table``; docs/internals/benchmarks.md): the issue's sizes, each on
#: clustered and on random data: (label, queries, gallery (None: leave-one-out, the queries are the gallery), classes).
TABLE_SIZES = {
    "qg": ("recall@K, {q} × {g} × 512", 10_000, 50_000, 1_000),
    "loo20k": ("recall@K, leave-one-out {q} × 512", 20_000, None, 1_000),
    "loo6k": ("recall@K, leave-one-out {q} × 512 (CUB-sized: {c} classes)", 6_000, None, 100),
    "qg2k": ("recall@K, {q} × {g} × 512 ({c} classes)", 2_000, 10_000, 200),
}
TABLE_KINDS = ("clustered", "random")
#: ``score_bench.py --collapsed``: the benchmark sizes people run, on clustered data and on collapsed embeddings
#: (every row one direction plus 1e-6 noise: the cosines lie closer than float32's error, as after a fine-tune
#: collapses), per pass (recall only, the top-L pass's metrics, every metric) and FAISS.
COLLAPSED_SIZES, COLLAPSED_KINDS = ("qg2k", "loo6k"), ("clustered", "collapsed")


def table_label(size: str, quick: bool) -> str:
    """A table row's label at the sizes run (``quick``: 20x smaller)."""
    label, n_query, n_gallery, classes = TABLE_SIZES[size]
    f = 20 if quick else 1
    return label.format(q=f"{n_query // f:,}", g=f"{(n_gallery or 0) // f:,}", c=f"{max(2, classes // f):,}")


def table_scenario(size: str, kind: str) -> str:
    """The child's ``--scenario`` of one table cell."""
    return f"T:{size}:{kind}"


def _table_data(scenario: str, quick: bool, seed: int) -> dict:
    """A table cell's seeded data: clustered (class centres plus :data:`CLUSTER_NOISE`, as C) or random normal
    rows, balanced labels; leave-one-out cells pass ids (the queries are the gallery)."""
    _, size, kind = scenario.split(":")
    _, n_query, n_gallery, classes = TABLE_SIZES[size]
    f = 20 if quick else 1
    n_query, classes = n_query // f, max(2, classes // f)
    loo = n_gallery is None
    kinds = TABLE_KINDS + ("collapsed",)
    rng = np.random.default_rng([seed, ord("T"), list(TABLE_SIZES).index(size), kinds.index(kind)])
    ql = _labels(rng, n_query, classes)
    gl = ql if loo else _labels(rng, n_gallery // f, classes)
    rows = [ql] if loo else [ql, gl]
    if kind == "clustered":
        centres = rng.standard_normal((classes, DIM), dtype=np.float32)
        sets = [centres[lab] for lab in rows]
        for x in sets:
            x += CLUSTER_NOISE * rng.standard_normal(x.shape, dtype=np.float32)
    elif kind == "collapsed":  # one direction for every row, 1e-6 apart: every cosine within float32's error
        base = rng.standard_normal(DIM, dtype=np.float32)
        sets = [base + np.float32(1e-6) * rng.standard_normal((lab.size, DIM), dtype=np.float32) for lab in rows]
    else:
        sets = [rng.standard_normal((lab.size, DIM), dtype=np.float32) for lab in rows]
    q, g = sets[0], sets[-1]
    ids = np.arange(n_query, dtype=np.int64) if loo else None
    return {"q": q, "g": g, "ql": ql, "gl": gl, "qid": ids, "gid": ids}


def make_data(scenario: str, quick: bool, seed: int) -> dict:
    """Seeded data; float32 generated in place (no float64 temporary) to keep the RSS baseline honest."""
    if scenario.startswith("T:"):
        return _table_data(scenario, quick, seed)
    s = sizes(quick)[scenario]
    rng = np.random.default_rng([seed, ord(scenario)])
    if scenario in ("C", "D"):
        centres = rng.standard_normal((s["classes"], DIM), dtype=np.float32)
        ql, gl = _labels(rng, s["n_query"], s["classes"]), _labels(rng, s["n_gallery"], s["classes"])
        q, g = centres[ql], centres[gl]
        for x in (q, g):
            x += CLUSTER_NOISE * rng.standard_normal(x.shape, dtype=np.float32)
        return {"q": q, "g": g, "ql": ql, "gl": gl, "qid": None, "gid": None}
    if scenario == "A":
        q = rng.standard_normal((s["n_query"], DIM), dtype=np.float32)
        g = rng.standard_normal((s["n_gallery"], DIM), dtype=np.float32)
        return {"q": q, "g": g, "ql": _labels(rng, s["n_query"], s["classes"]),
                "gl": _labels(rng, s["n_gallery"], s["classes"]), "qid": None, "gid": None}
    x = rng.standard_normal((s["n"], DIM), dtype=np.float32)
    lab = _labels(rng, s["n"], s["classes"])
    ids = np.arange(s["n"], dtype=np.int64)
    return {"q": x, "g": x, "ql": lab, "gl": lab, "qid": ids, "gid": ids}


# --------------------------------------------------------------------------- methods

def _recall_from_neighbours(nbr: np.ndarray, ql: np.ndarray, gl: np.ndarray, n_pos: np.ndarray, ks) -> dict:
    """recall@K from sorted neighbour indices (n, k); queries with ``n_pos == 0`` are excluded."""
    k = nbr.shape[1]
    hit = (gl[np.maximum(nbr, 0)] == ql[:, None]) & (nbr >= 0)
    first = np.where(hit.any(axis=1), hit.argmax(axis=1), k)
    inc = n_pos > 0
    n_inc = int(inc.sum())
    f = first[inc]
    out = {f"recall@{kk}": float(np.count_nonzero(f < kk) / n_inc) for kk in ks}
    out["num_queries"] = n_inc
    return out


def run_engine(d: dict, metrics=("recall",)) -> dict:
    from recallk.score.metrics import retrieval_summary
    s = retrieval_summary(d["q"], d["g"], d["ql"], d["gl"], ks=KS, query_ids=d["qid"], gallery_ids=d["gid"],
                          max_memory_mb=MAX_MEMORY_MB, metrics=metrics)
    return {k: v for k, v in s.items()
            if k.startswith("recall@") or k in ("num_queries", *pml_anchor.FULL_KEYS.values())}


def run_ranks(d: dict) -> dict:
    return run_engine(d, metrics=("recall", "mrr"))


def run_top(d: dict) -> dict:
    return run_engine(d, metrics=TOP_METRICS)


def run_suite(d: dict) -> dict:
    return run_engine(d, metrics=None)


def run_faiss(d: dict) -> dict:
    import faiss
    q, g, ql, gl = _unit(d["q"]), _unit(d["g"]), d["ql"], d["gl"]
    loo = d["qid"] is not None
    n_q, n_g = q.shape[0], g.shape[0]
    k = min(max(KS), n_g - int(loo))
    index = faiss.IndexFlatIP(g.shape[1])
    index.add(g)
    _, nbr = index.search(q, k + int(loo))
    # positives per query: same-label gallery items, minus the query itself (labels are int codes here)
    per_label = np.bincount(gl, minlength=int(max(ql.max(), gl.max())) + 1)
    n_pos = per_label[ql].astype(np.int64)
    if loo:
        col = {int(i): j for j, i in enumerate(d["gid"])}
        self_col = np.array([col.get(int(i), -1) for i in d["qid"]], dtype=np.int64)
        n_pos -= (self_col >= 0) & (gl[np.maximum(self_col, 0)] == ql)
        drop = nbr == self_col[:, None]
        drop[~drop.any(axis=1), -1] = True     # self not in the k+1: drop the last one instead
        nbr = nbr[~drop].reshape(n_q, k)
    return _recall_from_neighbours(nbr, ql, gl, n_pos, KS)


def run_pml(d: dict, full: bool = False) -> dict:
    return pml_anchor.pml_metrics(pml_anchor.calculator(full), _unit(d["q"]), _unit(d["g"]), d["ql"], d["gl"],
                                  d["qid"] is not None, full=full)


def run_pml_full(d: dict) -> dict:
    return run_pml(d, full=True)


def run_full_matrix(d: dict) -> dict:
    return full_matrix_recall(d["q"], d["g"], d["ql"], d["gl"], KS, d["qid"], d["gid"])


def run_floor(d: dict, dtype=np.float32) -> tuple[dict, float]:
    """Untimed setup (unit rows in ``dtype``), then the timed bare blocked product; returns (info, seconds).

    float32: the compute floor of the engine's fast blocks. float64: the floor of any exact
    ranking of every positive (the suite), whose float64 products cost about twice as much.
    """
    q, g = _unit(d["q"]).astype(dtype), _unit(d["g"]).astype(dtype)
    g_t = g.T                                   # a view: BLAS reads it transposed, no copy
    item = np.dtype(dtype).itemsize
    block = max(1, MAX_MEMORY_MB * 2**20 // (2 * item * g.shape[0]))   # the engine's fast-block rows (float32)
    buf = np.empty((min(block, q.shape[0]), g.shape[0]), dtype=dtype)
    sink = 0.0
    t0 = time.perf_counter()
    for start in range(0, q.shape[0], block):
        stop = min(start + block, q.shape[0])
        out = buf[: stop - start]
        np.matmul(q[start:stop], g_t, out=out)
        sink += float(out[0, 0]) + float(out[-1, -1])   # keeps the work observable, costs nothing
    secs = time.perf_counter() - t0
    return {"block_rows": block, "sink": sink}, secs


#: Each timed method (not the floors, which time themselves) by name.
RUNS = {"engine": run_engine, "engine ranks": run_ranks, "engine top": run_top, "engine suite": run_suite,
        "faiss": run_faiss, "pml": run_pml, "pml full": run_pml_full, "full matrix": run_full_matrix}
