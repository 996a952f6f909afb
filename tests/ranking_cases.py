"""Shared by the ranking and metric tests (tests/score/test_ranking.py, test_metrics.py, test_properties.py,
test_engine_parts.py): a brute-force oracle, seeded synthetic cases, strategies and small helpers."""

from __future__ import annotations

import math
import re
import tracemalloc

import numpy as np
import pytest
from hypothesis import settings

from extras import has_extra
from recallk.score.metrics import METRICS, metric_keys, rank, retrieval_summary, score_settings
from recallk.score.passes import Pass
from recallk.score.registry import FIRST_ONLY
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import ScoreSettings
from recallk.score.similarity import cosine_block, l2_normalize
from recallk.score.values import summarize

KS = (1, 2, 3, 5, 10, 40)
#: The rankings a property test draws from: the engine, and the FAISS oracle (tests/faiss_oracle.py) where its
#: extra is installed (always under make test).
BACKENDS = ("numpy", "faiss") if has_extra("faiss") else ("numpy",)
ALL_KEYS = metric_keys(METRICS, KS)
PROPERTY = settings(max_examples=40, deadline=None, derandomize=True)


# --------------------------------------------------------------------------- oracle

def _value(v):
    """An exclusion value as the oracle compares it: None when missing (None, NaN, ""), else its string."""
    if v is None or (isinstance(v, (float, np.floating)) and math.isnan(v)) or (isinstance(v, str) and v == ""):
        return None
    return str(v)


def similarities(q, g):
    """The documented similarity: float64-accumulated dot of L2-normalised float32 rows, rounded to float32."""
    return cosine_block(l2_normalize(np.asarray(q)), l2_normalize(np.asarray(g)).astype(np.float64).T)


def oracle(q, g, ql, gl, ks=KS, q_ids=None, g_ids=None, exclude=()):
    """Brute force of every metric: python sort per query by (-similarity, gallery index).

    Returns (summary, detail): ``summary`` holds every metric key, the counts and
    ``tie_sensitive@K``; ``detail`` holds per query the 0-based positive ranks, the
    number of retrievable items and the first positive's rank under the opposite tie rule.
    """
    sims = similarities(q, g)
    n, m = sims.shape
    ql, gl = [str(x) for x in ql], [str(x) for x in gl]
    pairs = [([_value(v) for v in qv], [_value(v) for v in gv]) for qv, gv in exclude]
    use_ids = q_ids is not None and g_ids is not None
    values = {key: [] for key in metric_keys(METRICS, ks)}
    flips = {k: 0 for k in ks}
    detail = {"ranks": [], "n_retrievable": [], "opposite": []}
    for i in range(n):
        cand = [j for j in range(m)
                if not (use_ids and g_ids[j] == q_ids[i])
                and not any(qv[i] is not None and qv[i] == gv[j] for qv, gv in pairs)]
        order = sorted(cand, key=lambda j: (-float(sims[i, j]), j))
        reverse = sorted(cand, key=lambda j: (-float(sims[i, j]), -j))  # ties: larger index first
        pos = [r for r, j in enumerate(order, 1) if gl[j] == ql[i]]  # 1-based ranks of the positives
        opp = [r for r, j in enumerate(reverse, 1) if gl[j] == ql[i]]
        M, R = len(order), len(pos)
        detail["ranks"].append([r - 1 for r in pos])
        detail["n_retrievable"].append(M)
        detail["opposite"].append(opp[0] - 1 if opp else -1)
        if not R:
            continue
        for k in ks:
            values[f"recall@{k}"].append(float(pos[0] <= k))
            values[f"precision@{k}"].append(sum(r <= k for r in pos) / min(k, M))
            flips[k] += (pos[0] <= k) != (opp[0] <= k)
        values["r_precision"].append(sum(r <= R for r in pos) / R)
        values["map@r"].append(sum(j / r for j, r in enumerate(pos, 1) if r <= R) / R)
        values["map"].append(sum(j / r for j, r in enumerate(pos, 1)) / R)
        values["mrr"].append(1 / pos[0])
    kept = len(values["mrr"])
    summary = {key: (math.fsum(v) / kept if kept else math.nan) for key, v in values.items()}
    summary.update(num_queries=kept, num_excluded_queries=n - kept)
    summary.update({f"tie_sensitive@{k}": flips[k] for k in ks})
    return summary, detail


# --------------------------------------------------------------------------- synthetic cases

def _grid(rng, rows, d=3):
    return rng.integers(-1, 2, (rows, d)).astype(np.float64)


def _camera(rng, size, values=("c0", "c1", "c2", None, float("nan"), "")):
    """A camera-like column: a few values plus missing ones (None, NaN, "") that never match."""
    return [values[i] for i in rng.integers(0, len(values), size)]


def make_case(kind, seed, nq=17, ng=29, d=6):
    """Seeded synthetic query/gallery sets exercising one feature each (dict of retrieval kwargs)."""
    rng = np.random.default_rng(seed)
    q, g = rng.normal(size=(nq, d)), rng.normal(size=(ng, d))
    ql, gl = rng.integers(0, 5, nq), rng.integers(0, 5, ng)
    q_ids = g_ids = None
    exclude = ()
    if kind == "duplicates":  # repeated gallery rows -> exact ties; some queries equal gallery rows
        g[1::3] = g[0:-1:3][: len(g[1::3])]
        q[:5] = g[:5]
    elif kind == "grid":  # integer vectors in {-1, 0, 1}: many exactly equal cosines, zero rows too
        q, g = _grid(rng, nq), _grid(rng, ng)
    elif kind == "leave_one_out":  # the query set is the gallery, same ids: symmetric path, self skipped
        q, ql = g, gl
        q_ids = g_ids = [f"img{j:03d}" for j in range(ng)]
    elif kind == "leave_one_out_grid":  # symmetric path with many exact ties
        g = _grid(rng, ng)
        q, ql = g, gl
        q_ids = g_ids = list(range(ng))
    elif kind == "same_set_no_ids":  # query set == gallery, no ids: each query may retrieve itself
        g = _grid(rng, ng)
        q, ql = g, gl
    elif kind == "partial_overlap":  # 10 queries are gallery items (by id), 7 are new images; ties
        g = _grid(rng, ng)
        q = np.vstack([g[5:15], _grid(rng, nq - 10)])
        ql = np.concatenate([gl[5:15], rng.integers(0, 5, nq - 10)])
        g_ids = list(range(100, 100 + ng))
        q_ids = g_ids[5:15] + list(range(500, 500 + nq - 10))
    elif kind == "absent_labels":  # labels 5..7 never occur in the gallery -> excluded queries
        ql = rng.integers(0, 8, nq)
    elif kind == "string_labels":  # strings; an int label 3 equals the string "3"
        ql = [f"cls{x}" if x != 3 else 3 for x in ql]
        gl = np.array([f"cls{x}" if x != 3 else "3" for x in gl])
    elif kind == "exclude_camera":  # same-camera items are not retrievable; missing cameras never match
        q, g = _grid(rng, nq), _grid(rng, ng)
        exclude = [(_camera(rng, nq), _camera(rng, ng))]
    elif kind == "exclude_two_pairs":  # camera OR session excludes; ids overlap the exclusion groups
        q, g = _grid(rng, nq), _grid(rng, ng)
        g_ids = list(range(ng))
        q_ids = list(rng.permutation(ng)[:nq])
        exclude = [(_camera(rng, nq), _camera(rng, ng)),
                   (list(rng.integers(0, 4, nq)), [int(x) if x < 3 else None for x in rng.integers(0, 5, ng)])]
    elif kind == "leave_one_out_exclude":  # symmetric path with a camera exclusion
        g = _grid(rng, ng)
        q, ql = g, gl
        q_ids = g_ids = list(range(ng))
        cams = _camera(rng, ng)
        exclude = [(cams, cams)]
    elif kind == "same_set_other_exclusions":  # same vectors, labels and ids, but the query-side exclusion
        # values differ from the gallery side: not symmetric, so the symmetric path must not be taken
        g = _grid(rng, ng)
        q, ql = g, gl
        q_ids = g_ids = list(range(ng))
        exclude = [(_camera(rng, ng), _camera(rng, ng))]
    elif kind == "tiny_gallery":  # K far above the gallery size (M_q = 3 or 4)
        g, gl = g[:4], np.array([0, 1, 0, 2])
        ql = rng.integers(0, 3, nq)
        g_ids, q_ids = ["a", "b", "c", "d"], ["a"] + [f"q{i}" for i in range(nq - 1)]
    elif kind == "zero_rows":  # zero vectors: similarity 0 to everything, no NaN
        q[::4] = 0.0
        g[::5] = 0.0
    elif kind == "near_ties":  # 256-d, one direction + 1e-6 noise: cosines closer than the float32 error
        base = rng.normal(size=256)
        g = base + rng.normal(scale=1e-6, size=(ng, 256))
        q = base + rng.normal(scale=1e-6, size=(nq, 256))
    else:
        assert kind == "gaussian"
    return dict(query_emb=q, gallery_emb=g, query_labels=ql, gallery_labels=gl, query_ids=q_ids,
                gallery_ids=g_ids, exclude=exclude)


KINDS = ["gaussian", "duplicates", "grid", "leave_one_out", "leave_one_out_grid", "same_set_no_ids",
         "partial_overlap", "absent_labels", "string_labels", "exclude_camera", "exclude_two_pairs",
         "leave_one_out_exclude", "same_set_other_exclusions", "tiny_gallery", "zero_rows", "near_ties"]
SEEDS = range(3)


def make_big_case(kind, seed):
    """Cases large enough that the smallest memory bound splits every path into many blocks."""
    rng = np.random.default_rng(seed)
    if kind == "big_query_gallery":  # 100 x 200, ties, duplicates, partial id overlap, camera exclusion
        g = _grid(rng, 200, d=4)
        g[1::4] = g[0:-1:4][: len(g[1::4])]
        q = np.vstack([g[:40], _grid(rng, 60, d=4)])
        gl = rng.integers(0, 6, 200)
        ql = np.concatenate([gl[:40], rng.integers(0, 6, 60)])
        g_ids = list(range(200))
        q_ids = g_ids[:40] + list(range(1000, 1060))
        return dict(query_emb=q, gallery_emb=g, query_labels=ql, gallery_labels=gl, query_ids=q_ids,
                    gallery_ids=g_ids, exclude=[(_camera(rng, 100), _camera(rng, 200))])
    g = _grid(rng, 90, d=4)  # > 64 items: the fast symmetric path's smallest block is 64 x 64
    gl = rng.integers(0, 6, 90)
    if kind == "big_leave_one_out":  # symmetric path: ids, ties and a camera exclusion
        cams = _camera(rng, 90)
        return dict(query_emb=g, gallery_emb=g, query_labels=gl, gallery_labels=gl, query_ids=list(range(90)),
                    gallery_ids=list(range(90)), exclude=[(cams, cams)])
    if kind == "big_same_set_other_exclusions":  # same set and ids, different query/gallery exclusion values
        return dict(query_emb=g, gallery_emb=g, query_labels=gl, gallery_labels=gl, query_ids=list(range(90)),
                    gallery_ids=list(range(90)), exclude=[(_camera(rng, 90), _camera(rng, 90))])
    assert kind == "big_same_set_no_ids"  # symmetric path, self retrievable
    return dict(query_emb=g, gallery_emb=g.copy(), query_labels=gl, gallery_labels=list(gl), query_ids=None,
                gallery_ids=None, exclude=())


BIG_KINDS = ["big_query_gallery", "big_leave_one_out", "big_same_set_no_ids", "big_same_set_other_exclusions"]


def case_oracle(case, ks=KS):
    return oracle(case["query_emb"], case["gallery_emb"], case["query_labels"], case["gallery_labels"], ks,
                  case["query_ids"], case["gallery_ids"], case["exclude"])


def rank_case(case, metrics=METRICS, ranks=None, same_set=None, **settings_fields):
    """rank() of a case dict, with ``metrics`` and any other ScoreSettings field; ``ranks`` (a Pass) default:
    the uncut ranking the metrics read (the first positive's for recall/mrr alone, else every rank).
    ``backend="faiss"``: the FAISS oracle's complete ranking (tests/faiss_oracle.py)."""
    if settings_fields.get("backend") == "faiss":
        from faiss_oracle import rank_data_faiss

        return rank_data_faiss(RetrievalData(**case, same_set=same_set), settings_fields.get("max_memory_mb", 512))
    if ranks is None:
        ranks = Pass.first() if set(metrics) <= FIRST_ONLY else Pass.every()
    return rank(RetrievalData(**case, same_set=same_set), ScoreSettings(metrics=tuple(metrics), **settings_fields),
                ranks)


def case_summary(case, ks=KS, metrics=None, **kw):
    """retrieval_summary() of a case dict; ``backend="faiss"``: the same summary of the FAISS oracle's ranking."""
    if kw.get("backend") == "faiss":
        from faiss_oracle import rank_data_faiss

        settings = score_settings(ks=ks, metrics=metrics, max_memory_mb=kw.get("max_memory_mb"))
        data = RetrievalData(**case)
        summary, _ = summarize(rank_data_faiss(data, settings.max_memory_mb), settings, all_excluded="nan")
        return {**summary, "num_gallery": int(data.n_gallery), "embedding_dim": int(data.gallery_emb.shape[1])}
    return retrieval_summary(ks=ks, metrics=metrics, **case, **kw)


def assert_matches_oracle(got, expected):
    """Every metric key to rel=1e-12, the counts and tie sensitivity exactly."""
    for key, value in got.items():
        if key in ("num_gallery", "embedding_dim"):
            continue
        if key.startswith(("tie_sensitive", "num_")):
            assert value == expected[key], key
        else:
            assert value == pytest.approx(expected[key], rel=1e-12, abs=0), key


def ranks_per_query(ranking):
    return [ranking.ranks[a:b].tolist() for a, b in zip(ranking.offsets[:-1], ranking.offsets[1:])]


def assert_same_ranking(a, b):
    for field in ("n_positives", "n_retrievable", "offsets", "ranks", "first_rank_opposite", "first_rank"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


# --------------------------------------------------------------------------- 4. hand-checked toy examples

TOY = [
    # README example: cosines g0 .994, g1 .8, g2 .6, g3 0 -> g0(a) g1(b) g2(a) g3(b); positives at 1 and 3, R=2
    ([[1, 0]], [[0.9, 0.1], [0.8, 0.6], [0.6, 0.8], [0, 1]], ["a"], ["a", "b", "a", "b"], [1, 2], {},
     {"recall@1": 1.0, "recall@2": 1.0, "precision@1": 1.0, "precision@2": 0.5, "r_precision": 0.5,
      "map@r": 0.5, "map": (1 / 1 + 2 / 3) / 2, "mrr": 1.0}),
    # angles 10..50 degrees -> b a b a a; positives at 2, 4, 5; R=3: one positive within R
    ([[1, 0]], [[math.cos(math.radians(t)), math.sin(math.radians(t))] for t in (10, 20, 30, 40, 50)],
     ["a"], ["b", "a", "b", "a", "a"], [1, 2, 5], {},
     {"recall@1": 0.0, "recall@2": 1.0, "recall@5": 1.0, "precision@1": 0.0, "precision@2": 0.5,
      "precision@5": 0.6, "r_precision": 1 / 3, "map@r": (1 / 2) / 3, "map": (1 / 2 + 2 / 4 + 3 / 5) / 3,
      "mrr": 0.5}),
    # K above M_q: two retrievable items, both positive -> precision@5 divides by 2, not 5
    ([[1, 0]], [[1, 1], [0, 1]], ["a"], ["a", "a"], [5], {},
     {"recall@5": 1.0, "precision@5": 1.0, "r_precision": 1.0, "map@r": 1.0, "map": 1.0, "mrr": 1.0}),
    # K above M_q with a negative ranked first: precision@5 = 1/2, the positive is outside R=1
    ([[1, 0]], [[1, 0], [0, 1]], ["a"], ["b", "a"], [1, 5], {},
     {"recall@1": 0.0, "recall@5": 1.0, "precision@1": 0.0, "precision@5": 0.5, "r_precision": 0.0,
      "map@r": 0.0, "map": 0.5, "mrr": 0.5}),
    # two queries averaged: q0 ranks a b a (AP 5/6), q1=[0,1] ranks a(1.0) b(.8) a(0) with label b (AP 1/2)
    ([[1, 0], [0, 1]], [[1, 0], [0.6, 0.8], [0, 1]], ["a", "b"], ["a", "b", "a"], [1, 2], {},
     {"recall@1": 0.5, "recall@2": 1.0, "precision@1": 0.5, "precision@2": 0.5, "r_precision": 0.25,
      "map@r": 0.25, "map": (5 / 6 + 1 / 2) / 2, "mrr": 0.75}),
    # a query whose label is not in the gallery is left out of every mean
    ([[1, 0], [1, 0]], [[0, 1], [1, 0]], ["a", "z"], ["a", "b"], [1], {},
     {"recall@1": 0.0, "precision@1": 0.0, "r_precision": 0.0, "map@r": 0.0, "map": 0.5, "mrr": 0.5,
      "num_queries": 1, "num_excluded_queries": 1}),
    # self-match by id: the query's own image (cosine 1, same label) is neither retrieved nor a positive
    ([[1, 0]], [[1, 0], [0.8, 0.6], [0.6, 0.8]], ["a"], ["a", "b", "a"], [1, 5],
     {"query_ids": ["x"], "gallery_ids": ["x", "y", "z"]},
     {"recall@1": 0.0, "recall@5": 1.0, "precision@1": 0.0, "precision@5": 0.5, "r_precision": 0.0,
      "map@r": 0.0, "map": 0.5, "mrr": 0.5}),
    # exclude same camera: g0 and g3 share camera 1; g2's missing camera never matches -> b(.8) a(.6)
    ([[1, 0]], [[1, 0], [0.8, 0.6], [0.6, 0.8], [0, 1]], ["a"], ["a", "b", "a", "a"], [2, 10],
     {"exclude": [([1], [1, 2, None, 1])]},
     {"recall@2": 1.0, "recall@10": 1.0, "precision@2": 0.5, "precision@10": 0.5, "r_precision": 0.0,
      "map@r": 0.0, "map": 0.5, "mrr": 0.5}),
    # same gallery, query camera missing: nothing excluded -> a b a a, positives at 1, 3, 4, R=3
    ([[1, 0]], [[1, 0], [0.8, 0.6], [0.6, 0.8], [0, 1]], ["a"], ["a", "b", "a", "a"], [2, 10],
     {"exclude": [([None], [1, 2, None, 1])]},
     {"recall@2": 1.0, "precision@2": 0.5, "precision@10": 0.75, "r_precision": 2 / 3,
      "map@r": (1 / 1 + 2 / 3) / 3, "map": (1 / 1 + 2 / 3 + 3 / 4) / 3, "mrr": 1.0}),
    # two exclusion pairs: camera excludes g0, session excludes g1 -> a(.6) b(0): positive first
    ([[1, 0]], [[1, 0], [0.8, 0.6], [0.6, 0.8], [0, 1]], ["a"], ["a", "b", "a", "b"], [1],
     {"exclude": [(["c1"], ["c1", "c2", "c2", "c2"]), ([7], [None, 7, 8, 8])]},
     {"recall@1": 1.0, "precision@1": 1.0, "r_precision": 1.0, "map@r": 1.0, "map": 1.0, "mrr": 1.0}),
    # 1-D embeddings: cosines are +-1 only; ties by index -> g1(a) g2(b) at +1, then g0(a) g3(b) at -1
    ([[3]], [[-1], [2], [5], [-4]], ["a"], ["a", "a", "b", "b"], [1, 2, 3], {},
     {"recall@1": 1.0, "precision@2": 0.5, "precision@3": 2 / 3, "r_precision": 0.5, "map@r": 0.5,
      "map": (1 / 1 + 2 / 3) / 2, "mrr": 1.0}),
]


# --------------------------------------------------------------------------- 5. properties (hypothesis)
# the strategies: tests/ranking_strategies.py (integer_problems, gaussian_problems)

def has_positive(case):
    return bool(set(map(str, case["query_labels"])) & set(map(str, case["gallery_labels"])))


# --------------------------------------------------------------------------- 6. edge cases and errors

def call_kwargs(**over):
    kw = dict(query_emb=np.ones((2, 3)), gallery_emb=np.eye(3), query_labels=[0, 1], gallery_labels=[0, 1, 2],
              ks=[1])
    kw.update(over)
    return kw


NAN_ROW2 = np.eye(4, 3)
NAN_ROW2[2, 1] = np.nan
INF_ROWS = np.ones((2, 3))
INF_ROWS[1, 0] = -np.inf


# --------------------------------------------------------------------------- 7. tie sensitivity

TIES = [
    # positive (index 1) ties a negative with a smaller index (0) at cosine 1: miss at 1, flips to a hit
    ([[1, 0], [2, 0]], ["neg", "pos"], {"recall@1": 0.0, "recall@2": 1.0, "tie_sensitive@1": 1, "tie_sensitive@2": 0}),
    # positive first in gallery order: hit at 1, which the opposite rule would turn into a miss
    ([[2, 0], [1, 0]], ["pos", "neg"], {"recall@1": 1.0, "recall@2": 1.0, "tie_sensitive@1": 1, "tie_sensitive@2": 0}),
    # no ties at all: nothing can flip
    ([[1, 0.1], [1, 0.5]], ["neg", "pos"],
     {"recall@1": 0.0, "recall@2": 1.0, "tie_sensitive@1": 0, "tie_sensitive@2": 0}),
    # two positives tied with each other only: the first positive is at rank 1 either way
    ([[1, 0], [3, 0], [0, 1]], ["pos", "pos", "neg"], {"recall@1": 1.0, "tie_sensitive@1": 0, "tie_sensitive@2": 0}),
    # a strictly better negative, then a tie of negative (1) and positive (2) at 0: flips at K=2 only
    ([[1, 0], [0, 1], [0, 2]], ["neg", "neg", "pos"],
     {"recall@1": 0.0, "recall@2": 0.0, "recall@3": 1.0, "tie_sensitive@1": 0, "tie_sensitive@2": 1,
      "tie_sensitive@3": 0}),
    # positive tied with two negatives, one on each side by index: rank 2 -> opposite rank 2 as well
    ([[1, 0], [1, 0], [1, 0]], ["neg", "pos", "neg"], {"recall@1": 0.0, "recall@2": 1.0, "tie_sensitive@1": 0,
                                                       "tie_sensitive@2": 0}),
]


# --------------------------------------------------------------------------- 8. engine parts

MIB = 2**20


def ranking_logs(caplog) -> list[str]:
    """The engine's debug lines, one per ranking."""
    return [r.getMessage() for r in caplog.records if r.name == "recallk.score.ranking.engine"]


def tile_count(line: str) -> int:
    return int(re.search(r"(\d+) tiles", line).group(1))


LOO_KINDS = ["leave_one_out", "leave_one_out_grid", "leave_one_out_exclude"]


def assert_scratch_within_budget(rank_at, what: str) -> None:
    """``rank_at(max_memory_mb)`` ranks one problem; its traced peak at 4 and 16 MiB, less the peak with 1 MiB
    tiles (what remains: the unit copies, the lists held and at most 1 MiB of scratch), stays within the
    budget, so the scratch is bounded to within 1 MiB. (The smallest tiles would give the exact baseline,
    but take minutes under tracemalloc.)"""
    def peak(mb: float) -> float:
        tracemalloc.start()
        try:
            rank_at(mb)
            return tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()

    baseline = peak(1)
    for budget in (4, 16):
        scratch = peak(budget) - baseline
        assert scratch <= budget, f"{scratch:.1f} MiB of {what} over a {budget} MiB budget"

