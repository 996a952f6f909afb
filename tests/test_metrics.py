"""The metric suite (recallk.score.metrics): recall@K, precision@K, r_precision, map@r, map, mrr.

* A brute-force oracle (python sort per query) cross-checks every metric, the
  ranks themselves and tie sensitivity on seeded synthetic cases, for the
  complete ranking, the first-positive path, the faiss backend and the
  smallest memory bound (FAISS-contrib style).
* Hand-checkable toy tables pin the formulas of the module docstring
  (scikit-learn metrics-test style), including the README example.
* Hypothesis checks the oracle on arbitrary small integer problems (ties,
  zero vectors, self-matches, exclusion) and the metric invariants.
* Error tables pin the messages of bad input.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import tracemalloc

import faiss  # noqa: F401  (the faiss backend is under test; CI installs faiss-cpu)
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from recallk.errors import InputError
from recallk.score.metrics import (METRICS, mean, metric_keys, per_query, rank, retrieval_metrics, retrieval_summary)
from recallk.score import metrics as metrics_module
from recallk.score.ranking import Budget, Problem
from recallk.score.ranking import counting as counting_module
from recallk.score.ranking import engine as ranking
from recallk.score.ranking import fast as fast_module
from recallk.score.ranking import scan as scan_module
from recallk.score.similarity import cosine_block, l2_normalize

KS = (1, 2, 3, 5, 10, 40)
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


def _oracle(case, ks=KS):
    return oracle(case["query_emb"], case["gallery_emb"], case["query_labels"], case["gallery_labels"], ks,
                  case["query_ids"], case["gallery_ids"], case["exclude"])


def _rank(case, metrics=METRICS, **kw):
    return rank(case["query_emb"], case["gallery_emb"], case["query_labels"], case["gallery_labels"],
                case["query_ids"], case["gallery_ids"], metrics, case["exclude"], **kw)


def _summary(case, ks=KS, metrics=None, **kw):
    return retrieval_summary(ks=ks, metrics=metrics, **case, **kw)


def _assert_matches_oracle(got, expected):
    """Every metric key to rel=1e-12, the counts and tie sensitivity exactly."""
    for key, value in got.items():
        if key in ("num_gallery", "embedding_dim"):
            continue
        if key.startswith(("tie_sensitive", "num_")):
            assert value == expected[key], key
        else:
            assert value == pytest.approx(expected[key], rel=1e-12, abs=0), key


def _ranks_per_query(ranking):
    return [ranking.ranks[a:b].tolist() for a, b in zip(ranking.offsets[:-1], ranking.offsets[1:])]


def _assert_same_ranking(a, b):
    for field in ("n_positives", "n_retrievable", "offsets", "ranks", "first_rank_opposite", "first_rank"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


# --------------------------------------------------------------------------- 1. oracle cross-check

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", KINDS)
def test_every_metric_matches_brute_force(kind, seed):
    case = make_case(kind, seed)
    expected, detail = _oracle(case)
    got = _summary(case)
    assert list(got) == ALL_KEYS + ["num_queries", "num_excluded_queries"] + [f"tie_sensitive@{k}" for k in KS] \
        + ["num_gallery", "embedding_dim"]
    _assert_matches_oracle(got, expected)
    assert (got["num_gallery"], got["embedding_dim"]) == np.asarray(case["gallery_emb"]).shape
    # retrieval_metrics: the same numbers, only the metric keys, in report order
    metrics = retrieval_metrics(ks=KS, **case)
    assert list(metrics) == ALL_KEYS
    assert metrics == {key: got[key] for key in ALL_KEYS}

    # the ranking itself: every positive's rank, M_q and the opposite-rule first rank
    ranking = _rank(case)
    assert ranking.complete
    assert _ranks_per_query(ranking) == detail["ranks"]
    assert ranking.n_retrievable.tolist() == detail["n_retrievable"]
    assert ranking.first_rank_opposite.tolist() == detail["opposite"]
    assert ranking.first_rank.tolist() == [r[0] if r else -1 for r in detail["ranks"]]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", KINDS)
def test_first_positive_path_matches_brute_force(kind, seed):
    # recall and mrr need only the first positive: a cheaper pass (fast float32 product + exact window)
    case = make_case(kind, seed)
    expected, detail = _oracle(case)
    got = _summary(case, metrics=["recall", "mrr"])
    assert list(got)[:len(KS) + 1] == [f"recall@{k}" for k in KS] + ["mrr"]
    _assert_matches_oracle(got, expected)
    ranking = _rank(case, metrics=["recall", "mrr"])
    assert not ranking.complete
    assert ranking.first_rank.tolist() == [r[0] if r else -1 for r in detail["ranks"]]
    assert ranking.n_positives.tolist() == [len(r) for r in detail["ranks"]]
    assert ranking.n_retrievable.tolist() == detail["n_retrievable"]
    assert ranking.first_rank_opposite.tolist() == detail["opposite"]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", KINDS)
def test_recall_only_capped_path_matches_brute_force(kind, seed):
    # recall@K alone lets a query stop counting once max(K) items surely beat its best positive
    case = make_case(kind, seed)
    expected, detail = _oracle(case)
    _assert_matches_oracle(_summary(case, metrics=["recall"]), expected)
    assert retrieval_metrics(ks=KS, metrics=["recall"], **case) == {f"recall@{k}": expected[f"recall@{k}"] for k in KS}
    first = np.array([r[0] if r else -1 for r in detail["ranks"]])
    opposite = np.array(detail["opposite"])
    for cap in (1, 2, 5):  # ranks of cap or more read cap (the opposite-rule rank too); -1 stays -1
        ranking = _rank(case, metrics=["recall"], cap=cap)
        assert ranking.cap == cap
        np.testing.assert_array_equal(ranking.first_rank, np.minimum(first, cap))
        np.testing.assert_array_equal(ranking.first_rank_opposite, np.minimum(opposite, cap))


@pytest.mark.parametrize("memory", [1e-6, 0.02, 512])  # one-row tiles; a few tiles (partly live); one tile
@pytest.mark.parametrize("kind", BIG_KINDS + ["near_ties", "duplicates", "leave_one_out_exclude"])
def test_capped_ranks_are_the_full_ranks_cut_at_the_cap(kind, memory):
    # Queries stop counting at different tiles, leave-one-out tiles shrink to their live rows and
    # columns: every first rank (and the opposite-rule one) must still be min(full rank, cap).
    case = make_big_case(kind, 4) if kind in BIG_KINDS else make_case(kind, 4)
    full = _rank(case, ["recall"], max_memory_mb=memory)
    for cap in (1, 3, 10_000):
        capped = _rank(case, ["recall"], max_memory_mb=memory, cap=cap)
        np.testing.assert_array_equal(capped.first_rank, np.minimum(full.first_rank, cap))
        np.testing.assert_array_equal(capped.first_rank_opposite, np.minimum(full.first_rank_opposite, cap))
        np.testing.assert_array_equal(capped.n_positives, full.n_positives)


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_queries_that_surely_miss_stop_counting(leave_one_out, monkeypatch):
    # Random vectors: nearly every query's best positive ranks far below 5, so with recall@{1,5} the
    # engine must scan well under half of the cells (about 30% leave-one-out, 15% else), with the same numbers.
    rng = np.random.default_rng(0)
    n_g = 6000 if leave_one_out else 20_000  # ~50 positives per query: its best ranks near n_g / 50
    g = rng.standard_normal((n_g, 16)).astype(np.float32)
    q = g if leave_one_out else rng.standard_normal((300, 16)).astype(np.float32)
    gl = rng.integers(0, n_g // 50, len(g))
    ql = gl if leave_one_out else rng.integers(0, n_g // 50, len(q))
    ids = np.arange(len(g)) if leave_one_out else None
    scanned = []
    scan = fast_module._scan
    monkeypatch.setattr(fast_module, "_scan", lambda sims, *a: scanned.append(sims.size) or scan(sims, *a))
    kw = dict(query_ids=ids, gallery_ids=ids, max_memory_mb=1)  # small tiles: many chances to stop
    got = retrieval_summary(q, g, ql, gl, ks=(1, 5), metrics=["recall"], **kw)
    capped, scanned[:] = sum(scanned), []
    full = retrieval_summary(q, g, ql, gl, ks=(1, 5), metrics=["recall", "mrr"], **kw)  # mrr: no cap
    assert {k: got[k] for k in got} == {k: full[k] for k in got}
    assert capped < 0.5 * sum(scanned), (capped, sum(scanned))  # without stopping: all of them


@pytest.mark.parametrize("kw, message", [
    ({"cap": 0}, "`cap` must be a positive integer"),                   # nothing to stop at
    ({"cap": 2.5}, "`cap` must be a positive integer"),                 # not an integer
    ({"cap": True}, "`cap` must be a positive integer"),                # bools are not counts
    ({"cap": 3, "complete": True}, "`cap` must be a positive integer, with complete=False"),  # every positive
])
def test_rank_positives_rejects_bad_caps(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ranking.rank_positives([[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], ["a"], ["a", "b"], **{"complete": False, **kw})


@pytest.mark.parametrize("metrics, ks", [(["recall", "mrr"], (1,)),   # MRR needs the exact first rank
                                          (["recall"], (1, 5)),         # K above the cap
                                          (["recall", "map"], (1,))])   # every positive's rank
def test_capped_ranking_serves_only_recall_up_to_its_cap(metrics, ks):
    capped = rank([[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], ["a"], ["a", "b"], metrics=["recall"], cap=2)
    with pytest.raises(ValueError, match="capped at 2|need the complete ranking"):
        per_query(capped, ks, metrics)


@pytest.mark.parametrize("kind", BIG_KINDS)
def test_big_cases_match_brute_force(kind):
    case = make_big_case(kind, 0)
    expected, detail = _oracle(case)
    _assert_matches_oracle(_summary(case), expected)
    _assert_matches_oracle(_summary(case, metrics=["recall", "mrr"]), expected)
    assert _ranks_per_query(_rank(case)) == detail["ranks"]


# --------------------------------------------------------------------------- 2. block-size invariance

@pytest.mark.parametrize("memory", [1e-6, 0.02])
@pytest.mark.parametrize("kind", BIG_KINDS + ["near_ties", "exclude_two_pairs", "leave_one_out_exclude"])
def test_memory_bound_never_changes_a_number(kind, memory):
    # 1e-6 MB: the smallest blocks (one gallery column per exact block, one row/column per symmetric exact
    # block, 4096 cells per fast block); 0.02 MB: a few blocks. Counts are integers: results are identical.
    case = make_big_case(kind, 1) if kind in BIG_KINDS else make_case(kind, 1)
    for names in (METRICS, ["recall"]):  # complete ranking and first-positive path
        _assert_same_ranking(_rank(case, names, max_memory_mb=memory), _rank(case, names))
    assert _summary(case, max_memory_mb=memory) == _summary(case)


@pytest.mark.parametrize("window_cells", [0, 5])  # undecided cells handed on one chunk at a time; every few
@pytest.mark.parametrize("kind", BIG_KINDS + ["duplicates", "zero_rows", "near_ties"])
def test_handing_on_undecided_cells_never_changes_a_number(kind, window_cells, monkeypatch):
    # The scan hands its undecided cells on to be re-decided once too many have gathered (from both
    # threads at once on leave-one-out mirror blocks): the counts must be those of one final hand-over.
    case = make_big_case(kind, 3) if kind in BIG_KINDS else make_case(kind, 3)
    expected = _rank(case, ["recall"], max_memory_mb=0.02)
    monkeypatch.setattr(scan_module, "_CHUNK_CELLS", 7)
    monkeypatch.setattr(counting_module, "_WINDOW_CELLS", window_cells)
    _assert_same_ranking(_rank(case, ["recall"], max_memory_mb=0.02), expected)


@pytest.mark.parametrize("few_lines", [0, 10**9])  # always compare only the lines that reach; never
@pytest.mark.parametrize("kind", BIG_KINDS + ["near_ties", "duplicates", "zero_rows"])
def test_comparing_only_lines_that_reach_their_window_never_changes_a_number(kind, few_lines, monkeypatch):
    # A scan skips lines whose maximum is below their window and, when few lines remain, compares a
    # copy of those lines only (rows, or leave-one-out columns): counts and cells must map back exactly.
    case = make_big_case(kind, 5) if kind in BIG_KINDS else make_case(kind, 5)
    expected = _rank(case, ["recall", "mrr"], max_memory_mb=0.02)
    monkeypatch.setattr(scan_module, "_FEW_LINES", few_lines)
    monkeypatch.setattr(scan_module, "_CHUNK_CELLS", 64)
    _assert_same_ranking(_rank(case, ["recall", "mrr"], max_memory_mb=0.02), expected)


def test_all_zero_queries_stay_within_the_memory_bound():
    # A zero query has cosine 0 with every item, so every cell ties with its best positive and is
    # undecided: without a bound on the undecided cells held at once this took ~60 B per cell (~370 MB).
    rng = np.random.default_rng(0)
    g = rng.standard_normal((20_000, 8)).astype(np.float32)
    gl, ql = rng.integers(0, 50, 20_000), rng.integers(0, 50, 300)
    tracemalloc.start()
    try:
        s = retrieval_summary(np.zeros((300, 8), np.float32), g, ql, gl, ks=(1,), metrics=["recall"],
                              max_memory_mb=64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 160 * 2**20, f"{peak / 2**20:.0f} MB"  # blocks and both threads' scan scratch (~105 MB)
    # all ties, broken by gallery index: the first gallery item is the top hit of every query
    assert s["recall@1"] == np.mean(ql == gl[0])


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_complete_ranking_scratch_stays_under_the_budget(leave_one_out):
    # Every positive's rank: float64 tiles, their float32 rounding, sorted and (leave-one-out) transposed
    # copies on each core. 2,500 x 2,500 cells would take 48 MiB as one float64 matrix.
    rng = np.random.default_rng(0)
    g, gl = rng.normal(size=(2500, 32)).astype(np.float32), rng.integers(0, 50, 2500)
    q, ql = (g, gl) if leave_one_out else (rng.normal(size=(2500, 32)).astype(np.float32), rng.integers(0, 50, 2500))

    def peak(mb: float) -> float:
        tracemalloc.start()
        try:
            ranking.rank_positives(q, g, ql, gl, max_memory_mb=mb)
            return tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()

    baseline = peak(1e-6)  # the smallest tiles: what remains is the unit copies and the positive lists
    for budget in (4, 16):
        scratch = peak(budget) - baseline
        assert scratch <= budget, f"{scratch:.1f} MiB of tile scratch over a {budget} MiB budget"


@pytest.mark.parametrize("kind", KINDS + BIG_KINDS)
def test_queries_in_chunks_never_change_a_number(kind, monkeypatch):
    # Few, large labels: the complete ranking takes the queries in chunks whose positive lists fit the
    # budget. Here every chunk is as small as it gets (about one query each); leave-one-out chunks are
    # not symmetric, so they take the query x gallery path. Counts are integers: results are identical.
    case = make_big_case(kind, 2) if kind in BIG_KINDS else make_case(kind, 2)
    expected = _rank(case)
    monkeypatch.setattr(Budget, "POSITIVE_BYTES", 2**40)
    _assert_same_ranking(_rank(case), expected)


@pytest.mark.parametrize("counts, most, runs", [
    ([3, 3, 3], 10, [(0, 3)]),                 # the total fits: one run
    ([3, 3, 3], 3, [(0, 1), (1, 2), (2, 3)]),  # each entry fills a run
    ([5, 0, 0, 5], 5, [(0, 1), (1, 4)]),       # empty entries go with the next run
    ([12, 1, 1], 5, [(0, 1), (1, 3)]),         # an entry over `most` stands alone
    ([2, 2, 2, 2], 5, [(0, 3), (3, 4)]),       # a run ends after the entry that crosses `most`
    ([], 4, [(0, 0)]),                         # no entries: one empty run
])
def test_consecutive_runs(counts, most, runs):
    assert ranking.consecutive_runs(np.array(counts, dtype=np.int64), most) == runs


@pytest.mark.parametrize("span", [1, 7])  # at most one query per span (a query's positives never split); a few
@pytest.mark.parametrize("kind", KINDS + BIG_KINDS)
def test_per_query_values_in_spans_never_change_a_number(kind, span, monkeypatch):
    # per_query takes spans of queries with at most _SPAN_PAIRS positives between them at a time.
    case = make_big_case(kind, 4) if kind in BIG_KINDS else make_case(kind, 4)
    ranked = _rank(case)
    expected = per_query(ranked, KS, METRICS)
    monkeypatch.setattr(metrics_module, "_SPAN_PAIRS", span)
    got = per_query(ranked, KS, METRICS)
    assert list(got) == list(expected)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


def test_complete_ranking_of_few_large_labels_stays_near_the_budget():
    # Two labels in a 3,000-item leave-one-out set: 4.5 M (query, positive) pairs, whose lists and counters
    # took ~230 MB at once. In runs of queries they take a quarter of the budget at a time; what remains is
    # the result (8 B per pair).
    rng = np.random.default_rng(0)
    g, gl = rng.normal(size=(3000, 32)).astype(np.float32), rng.integers(0, 2, 3000)
    ids = list(range(3000))
    tracemalloc.start()
    try:
        got = ranking.rank_positives(g, g, gl, gl, ids, ids, max_memory_mb=16)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    pairs = int(got.n_positives.sum())
    assert pairs > 4_000_000
    assert peak <= 16 + 8 * pairs / 2**20 + 4, f"{peak:.0f} MiB"  # + 4: unit copies, labels and ids
    assert _ranks_per_query(got) == _ranks_per_query(ranking.rank_positives(g, g, gl, gl, ids, ids))


def test_per_query_temporaries_stay_bounded_with_few_large_labels(monkeypatch):
    # 4.5 M (query, positive) pairs: every per-positive temporary of per_query at once took ~200 MB.
    rng = np.random.default_rng(0)
    g, gl = rng.normal(size=(3000, 8)).astype(np.float32), rng.integers(0, 2, 3000)
    ids = list(range(3000))
    ranked = ranking.rank_positives(g, g, gl, gl, ids, ids)
    expected = per_query(ranked, KS, METRICS)
    monkeypatch.setattr(metrics_module, "_SPAN_PAIRS", 2**16)  # spans of ~65 k positives: a few MB each
    tracemalloc.start()
    try:
        got = per_query(ranked, KS, METRICS)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    assert peak < 16, f"{peak:.0f} MiB"
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


def test_recall_only_memory_grows_with_queries_not_with_positive_pairs():
    # One label for everything: 300 queries x 30,000 positives = 9M (query, positive) pairs. recall@K
    # and MRR need only each query's best positive; holding every pair took ~240 MB at this budget.
    rng = np.random.default_rng(0)
    g = rng.standard_normal((30_000, 64)).astype(np.float32)
    q = rng.standard_normal((300, 64)).astype(np.float32)
    tracemalloc.start()
    try:
        s = retrieval_summary(q, g, np.zeros(300, int), np.zeros(30_000, int), ks=(1,), metrics=["recall", "mrr"],
                              max_memory_mb=32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MB"
    assert s["recall@1"] == 1.0 and s["mrr"] == 1.0  # every gallery item is a positive


@pytest.mark.parametrize("shape, axis", [((600, 7), 0),      # more rows than a uint8 sum can hold: 3 segments
                                          ((255, 3), 0),      # exactly one uint8 segment, every byte set below
                                          ((3, 70_000), 1),   # wider than a uint16 sum can hold: 2 segments
                                          ((0, 5), 0), ((5, 0), 1)])  # empty sides
def test_byte_sums_never_overflow(shape, axis):
    rng = np.random.default_rng(0)
    mask = rng.random(shape) < 0.9
    mask[:, :1] = True  # a full line on each side: the largest possible count
    np.testing.assert_array_equal(scan_module._byte_sums(mask, axis), mask.sum(axis=axis))


@pytest.mark.parametrize("chunk_cells", [1, 7, 64])  # one row per compare chunk; a few rows; a whole block
@pytest.mark.parametrize("kind", BIG_KINDS + ["near_ties", "duplicates"])
def test_compare_chunk_size_never_changes_a_number(kind, chunk_cells, monkeypatch):
    # The fast path compares each block in cache-sized chunks of rows: chunk boundaries, in rows
    # (query x gallery) and in the mirror's columns (leave-one-out), must not change a count.
    case = make_big_case(kind, 2) if kind in BIG_KINDS else make_case(kind, 2)
    expected = _rank(case, ["recall"], max_memory_mb=0.02)
    monkeypatch.setattr(scan_module, "_CHUNK_CELLS", chunk_cells)
    _assert_same_ranking(_rank(case, ["recall"], max_memory_mb=0.02), expected)


@pytest.mark.parametrize("kind, memory", [("leave_one_out_grid", 1e-6), ("leave_one_out_exclude", 1e-6),
                                          ("same_set_no_ids", 1e-6), ("big_leave_one_out", 512),
                                          ("big_same_set_no_ids", 512)])
def test_symmetric_path_equals_query_gallery_path(kind, memory):
    # Equal query and gallery arrays take the symmetric (upper-triangle) path; the gallery scaled by 2 is
    # no longer equal, so it takes the query x gallery path, with exactly the same unit vectors.
    case = make_big_case(kind, 0) if kind.startswith("big") else make_case(kind, 0)
    doubled = dict(case, gallery_emb=np.asarray(case["gallery_emb"]) * 2.0)
    for metrics in (None, ["recall"]):
        names = METRICS if metrics is None else metrics
        _assert_same_ranking(_rank(case, names, max_memory_mb=memory), _rank(doubled, names, max_memory_mb=memory))
        assert _summary(case, metrics=metrics, max_memory_mb=memory) == _summary(doubled, metrics=metrics,
                                                                                 max_memory_mb=memory)


@pytest.mark.parametrize("kind, seed", [(k, s) for k in KINDS for s in SEEDS] + [(k, 0) for k in BIG_KINDS])
def test_direct_path_equals_the_tiles(kind, seed, monkeypatch, caplog):
    # Small problems take the direct path (one exact product of every cell, ranks from order keys); the
    # Budget's DIRECT_CELLS forces each path. Every field of the Ranking must be identical, and the oracle's.
    case = make_big_case(kind, seed) if kind in BIG_KINDS else make_case(kind, seed)
    _, detail = _oracle(case)
    oracle_first = np.array([r[0] if r else -1 for r in detail["ranks"]])
    for names, cap in ((METRICS, None), (["recall", "mrr"], None), (["recall"], 1), (["recall"], 5)):
        got = {}
        for path, cells in (("direct", 2**40), ("tiles", 0)):
            with monkeypatch.context() as patch, caplog.at_level(logging.DEBUG, logger="recallk.score.ranking.engine"):
                patch.setattr(Budget, "DIRECT_CELLS", cells)
                caplog.clear()
                got[path] = _rank(case, names, cap=cap)
            assert ("direct path" in _ranking_logs(caplog)[0]) is (path == "direct")
        for field in dataclasses.fields(ranking.Ranking):
            a, b = getattr(got["direct"], field.name), getattr(got["tiles"], field.name)
            assert type(a) is type(b), field.name
            np.testing.assert_array_equal(a, b, err_msg=field.name)
            if isinstance(a, np.ndarray):
                assert a.dtype == b.dtype, field.name
        direct = got["direct"]
        np.testing.assert_array_equal(direct.first_rank, oracle_first if cap is None else np.minimum(oracle_first, cap))
        np.testing.assert_array_equal(direct.first_rank_opposite, detail["opposite"] if cap is None
                                      else np.minimum(detail["opposite"], cap))
        assert direct.n_retrievable.tolist() == detail["n_retrievable"]
        if direct.complete:
            assert _ranks_per_query(direct) == detail["ranks"]


# --------------------------------------------------------------------------- 3. faiss backend

@pytest.mark.parametrize("kind, seed", [(k, s) for k in KINDS for s in SEEDS] + [(k, 0) for k in BIG_KINDS])
def test_faiss_backend_is_identical_to_numpy(kind, seed):
    case = make_big_case(kind, seed) if kind in BIG_KINDS else make_case(kind, seed)
    _assert_same_ranking(_rank(case, backend="faiss"), _rank(case))
    assert _summary(case, backend="faiss") == _summary(case)
    assert retrieval_metrics(ks=KS, backend="faiss", **case) == retrieval_metrics(ks=KS, **case)


def test_faiss_backend_small_memory_bound():
    # one query per FAISS search block
    case = make_case("exclude_two_pairs", 0)
    assert _summary(case, backend="faiss", max_memory_mb=1e-6) == _summary(case)


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


@pytest.mark.parametrize("q, g, ql, gl, ks, extra, expected", TOY)
def test_hand_checked_values(q, g, ql, gl, ks, extra, expected):
    got = retrieval_summary(q, g, ql, gl, ks, metrics=None, **extra)
    assert {key: got[key] for key in expected} == pytest.approx(expected, rel=1e-12, abs=0)
    # the oracle agrees with the hand computation (it checks the oracle, too)
    ref = oracle(q, g, ql, gl, ks, extra.get("query_ids"), extra.get("gallery_ids"), extra.get("exclude", ()))[0]
    assert {key: ref[key] for key in expected} == pytest.approx(expected, rel=1e-12, abs=0)
    assert got["num_queries"] + got["num_excluded_queries"] == len(q)


def test_readme_example_ranking_and_cosines():
    q, g = [[1.0, 0.0]], [[0.9, 0.1], [0.8, 0.6], [0.6, 0.8], [0.0, 1.0]]
    np.testing.assert_allclose(similarities(q, g)[0], [0.9939, 0.8, 0.6, 0.0], atol=1e-4)
    ranking = rank(q, g, ["a"], ["a", "b", "a", "b"])
    assert ranking.ranks.tolist() == [0, 2] and ranking.n_positives.tolist() == [2]
    assert ranking.n_retrievable.tolist() == [4]
    out = retrieval_metrics(q, g, ["a"], ["a", "b", "a", "b"], ks=[1, 2])
    assert out == {"recall@1": 1.0, "recall@2": 1.0, "precision@1": 1.0, "precision@2": 0.5, "r_precision": 0.5,
                   "map@r": 0.5, "map": pytest.approx(0.8333333333333334, rel=1e-15), "mrr": 1.0}


@pytest.mark.parametrize("query_id, gallery_ids, own", [
    ("1", [1, 2], 0),  # text id "1" is gallery id 1: compared as strings, like the labels
    (1, ["x", "1"], 1),  # and the other way round
    (1.0, [1, 2], -1),  # "1.0" is not "1" (as labels: 1 and 1.0 differ)
    (np.int64(2), [1, 2], 1),  # numpy integers read like Python ones
])
def test_ids_are_compared_as_strings(query_id, gallery_ids, own):
    ranking = rank([[1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]], ["a"], ["a", "a"], [query_id], gallery_ids)
    assert ranking.n_positives.tolist() == [1 if own >= 0 else 2]


def test_ids_repeated_as_text_are_refused():
    with pytest.raises(ValueError, match=r"`gallery_ids` must be unique \(compared as text\)"):
        rank([[1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]], ["a"], ["a", "a"], ["q"], [1, "1"])


def test_readme_example_with_a_tie():
    # README: g1 and g2 tied -> g1 first (lower index): precision@2 stays 1/2; the first positive g0 ranks
    # first under either rule, so no hit flips and tie_sensitive@2 is 0
    q, g = [[1.0, 0.0]], [[0.9, 0.1], [0.8, 0.6], [0.8, 0.6], [0.0, 1.0]]
    out = retrieval_summary(q, g, ["a"], ["a", "b", "a", "b"], ks=[2], metrics=["precision"])
    assert out["precision@2"] == 0.5 and out["tie_sensitive@2"] == 0


@pytest.mark.parametrize("values, expected", [
    ([0.7] * 6, 0.7),  # fsum 4.2 / 6 is 0.6999999999999998: kept within the values' range
    ([0.1] * 3, 0.1),  # 0.30000000000000004 / 3
    ([0.25, np.nan, 0.75], 0.5),  # NaN marks an excluded query
    ([np.nan], None),  # nothing included: NaN
])
def test_mean_is_exact_for_constants(values, expected):
    got = mean(np.array(values))
    assert (np.isnan(got) if expected is None else got == expected)


@pytest.mark.parametrize("metrics, ks, keys", [
    # report order follows `metrics`, recall/precision expand per K in the order of `ks`
    (["mrr", "precision", "map"], [5, 1], ["mrr", "precision@5", "precision@1", "map"]),
    ("map@r", [3], ["map@r"]),  # a single name as a string
    (None, [2], ["recall@2", "precision@2", "r_precision", "map@r", "map", "mrr"]),  # default: all
])
def test_metric_key_order(metrics, ks, keys):
    case = make_case("gaussian", 0)
    assert list(retrieval_metrics(ks=ks, metrics=metrics, **case)) == keys


def test_summary_default_is_recall_only():
    case = make_case("gaussian", 0)
    assert list(retrieval_summary(ks=(5, 2), **case)) == [
        "recall@5", "recall@2", "num_queries", "num_excluded_queries", "tie_sensitive@5", "tie_sensitive@2",
        "num_gallery", "embedding_dim"]


# --------------------------------------------------------------------------- 5. properties (hypothesis)

@st.composite
def integer_problems(draw):
    """Small problems with integer embeddings in [-2, 2]: exact ties, zero vectors, optional ids/exclusion."""
    d = draw(st.integers(1, 3))
    m = draw(st.integers(1, 8))
    g = draw(hnp.arrays(np.int64, (m, d), elements=st.integers(-2, 2)))
    gl = draw(st.lists(st.integers(0, 2), min_size=m, max_size=m))
    mode = draw(st.sampled_from(["query_gallery", "leave_one_out", "same_set_no_ids"]))
    if mode == "query_gallery":
        n = draw(st.integers(1, 6))
        q = draw(hnp.arrays(np.int64, (n, d), elements=st.integers(-2, 2)))
        ql = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        with_ids = draw(st.booleans())
        g_ids = draw(st.lists(st.integers(0, 9), min_size=m, max_size=m, unique=True)) if with_ids else None
        q_ids = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)) if with_ids else None
    else:
        n, q, ql = m, g, gl
        q_ids = g_ids = list(range(m)) if mode == "leave_one_out" else None
    exclude = []
    if draw(st.booleans()):
        values = st.sampled_from(["c0", "c1", None, ""])
        exclude.append((draw(st.lists(values, min_size=n, max_size=n)),
                        draw(st.lists(values, min_size=m, max_size=m))))
    return dict(query_emb=q, gallery_emb=g, query_labels=ql, gallery_labels=gl, query_ids=q_ids,
                gallery_ids=g_ids, exclude=exclude)


@PROPERTY
@given(integer_problems(), st.sampled_from(["numpy", "faiss"]))
def test_property_matches_oracle_on_small_integer_problems(case, backend):
    ks = (1, 2, 4, 9)
    expected, detail = _oracle(case, ks)
    if expected["num_queries"] == 0:
        with pytest.raises(ValueError, match="every one of the"):
            _summary(case, ks, backend=backend)
        return
    _assert_matches_oracle(_summary(case, ks, backend=backend), expected)
    _assert_matches_oracle(_summary(case, ks, metrics=["recall", "mrr"], backend=backend), expected)
    assert _ranks_per_query(_rank(case, backend=backend)) == detail["ranks"]
    assert _rank(case, backend=backend).first_rank_opposite.tolist() == detail["opposite"]


@st.composite
def gaussian_problems(draw):
    """Continuous random problems (no exact ties): sizes and label counts drawn, values from a drawn seed."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n, m, d, labels = draw(st.integers(1, 12)), draw(st.integers(1, 20)), draw(st.integers(2, 8)), draw(
        st.integers(1, 4))  # d >= 2: in 1-D every cosine is +-1
    return dict(query_emb=rng.normal(size=(n, d)), gallery_emb=rng.normal(size=(m, d)),
                query_labels=rng.integers(0, labels, n), gallery_labels=rng.integers(0, labels, m),
                query_ids=None, gallery_ids=None, exclude=()), rng


def _has_positive(case):
    return bool(set(map(str, case["query_labels"])) & set(map(str, case["gallery_labels"])))


@PROPERTY
@given(gaussian_problems())
def test_property_shuffling_gallery_and_queries_changes_nothing(problem):
    case, rng = problem
    assume(_has_positive(case))
    sims = similarities(case["query_emb"], case["gallery_emb"])
    assume(all(np.unique(row).size == row.size for row in sims))  # no exact ties
    pg, pq = rng.permutation(len(case["gallery_emb"])), rng.permutation(len(case["query_emb"]))
    shuffled = dict(case, gallery_emb=case["gallery_emb"][pg], gallery_labels=case["gallery_labels"][pg],
                    query_emb=case["query_emb"][pq], query_labels=case["query_labels"][pq])
    before = _summary(case)
    assert _summary(shuffled) == before
    assert all(before[f"tie_sensitive@{k}"] == 0 for k in KS)  # no ties, nothing to flip


@PROPERTY
@given(integer_problems(), st.lists(st.integers(-30, 30), min_size=20, max_size=20))
def test_property_power_of_two_row_scaling_is_exactly_invariant(case, exponents):
    # scaling rows by 2**e is exact, so even the many exact ties of integer data must stay where they are
    q, g = np.asarray(case["query_emb"], dtype=np.float64), np.asarray(case["gallery_emb"], dtype=np.float64)
    assume(oracle(q, g, case["query_labels"], case["gallery_labels"], KS, case["query_ids"], case["gallery_ids"],
                  case["exclude"])[0]["num_queries"] > 0)
    scale = np.exp2(np.array(exponents, dtype=np.float64))
    scaled = dict(case, query_emb=q * scale[:len(q), None], gallery_emb=g * scale[::-1][:len(g), None])
    _assert_same_ranking(_rank(scaled), _rank(dict(case, query_emb=q, gallery_emb=g)))
    assert _summary(scaled) == _summary(case)


@PROPERTY
@given(gaussian_problems(), st.floats(1e-3, 1e3), st.floats(1e-3, 1e3))
def test_property_positive_scaling_is_invariant(problem, a, b):
    case, rng = problem
    assume(_has_positive(case))
    row_scale = rng.uniform(0.1, 10.0, size=(len(case["gallery_emb"]), 1))
    scaled = dict(case, query_emb=case["query_emb"] * a, gallery_emb=case["gallery_emb"] * b * row_scale)
    got, ref = _summary(scaled), _summary(case)
    _assert_matches_oracle(got, ref)


@PROPERTY
@given(integer_problems())
def test_property_metric_bounds_and_orderings(case):
    ks = tuple(range(1, 12))
    expected = _oracle(case, ks)[0]
    assume(expected["num_queries"] > 0)
    got = _summary(case, ks)
    values = {key: got[key] for key in metric_keys(METRICS, ks)}
    assert all(0.0 <= v <= 1.0 for v in values.values()), values
    recall = [got[f"recall@{k}"] for k in ks]
    assert all(a <= b for a, b in zip(recall, recall[1:]))  # recall@K never decreases as K grows
    assert recall[-1] == 1.0  # K=11 >= gallery size: every included query hits
    assert got["precision@1"] == got["recall@1"]
    assert all(got[f"precision@{k}"] <= got[f"recall@{k}"] + 1e-12 for k in ks)
    assert got["map@r"] <= got["r_precision"] + 1e-12
    assert got["map@r"] <= got["map"] + 1e-12
    assert got["mrr"] >= got["recall@1"] - 1e-12
    assert all(0 <= got[f"tie_sensitive@{k}"] <= got["num_queries"] for k in ks)


@PROPERTY
@given(gaussian_problems())
def test_property_gallery_with_copies_of_every_query_gives_recall_1(problem):
    case, rng = problem
    q, ql = case["query_emb"], case["query_labels"]
    g = np.vstack([case["gallery_emb"], q])
    gl = np.concatenate([case["gallery_labels"], ql])
    order = rng.permutation(len(g))  # the copies anywhere in the gallery
    with_copies = dict(case, gallery_emb=g[order], gallery_labels=gl[order])
    got = _summary(with_copies, metrics=["recall", "mrr", "precision"])
    assert got["recall@1"] == 1.0 and got["mrr"] == 1.0 and got["precision@1"] == 1.0
    assert got["num_excluded_queries"] == 0 and got["num_queries"] == len(q)
    assert got == _summary(with_copies, metrics=["recall", "mrr", "precision"], backend="faiss")


# --------------------------------------------------------------------------- 6. edge cases and errors

def _kwargs(**over):
    kw = dict(query_emb=np.ones((2, 3)), gallery_emb=np.eye(3), query_labels=[0, 1], gallery_labels=[0, 1, 2],
              ks=[1])
    kw.update(over)
    return kw


NAN_ROW2 = np.eye(4, 3)
NAN_ROW2[2, 1] = np.nan
INF_ROWS = np.ones((2, 3))
INF_ROWS[1, 0] = -np.inf


@pytest.mark.parametrize("kwargs, match", [
    (_kwargs(gallery_emb=np.empty((0, 3)), gallery_labels=[]), "gallery_emb` is empty"),  # no gallery
    (_kwargs(query_emb=np.empty((0, 3)), query_labels=[]), "query_emb` is empty"),  # no queries
    (_kwargs(query_labels=["x", "y"]), "every one of the 2 queries is excluded"),  # no label in the gallery
    # every positive shares the query's camera -> nothing left to find
    (_kwargs(exclude=[(["c", "c"], ["c", "c", "d"])]), "every one of the 2 queries is excluded"),
    # a query's only positive is itself
    (_kwargs(query_ids=["a", "b"], gallery_ids=["a", "b", "c"]), "every one of the 2 queries"),
    (_kwargs(gallery_emb=NAN_ROW2, gallery_labels=[0, 1, 2, 3]),
     r"`gallery_emb` has NaN or inf in 1 row\(s\), first rows \[2\]"),  # NaN row named
    (_kwargs(query_emb=INF_ROWS), r"`query_emb` has NaN or inf in 1 row\(s\), first rows \[1\]"),  # -inf
    (_kwargs(gallery_emb=np.eye(4), gallery_labels=[0, 1, 2, 3]), "same dimension. Got 3 and 4 instead"),
    (_kwargs(query_emb=np.ones(3), query_labels=[0, 1, 2]), "2-D"),  # 1-D embeddings
    (_kwargs(query_emb=np.array([["a", "b", "c"]] * 2)), "real numbers"),  # strings, not numbers
    (_kwargs(metrics=["recall", "recall"]), "`metrics` must be distinct names"),  # repeated
    (_kwargs(metrics=[]), "`metrics` must be distinct names"),  # empty
    (_kwargs(metrics=["recal"]), r"Did you mean `recall`\?"),  # typo -> suggestion
    (_kwargs(metrics=["map@R"]), r"Did you mean `map@r`\?"),  # case matters
    (_kwargs(metrics=["ndcg"]), r"Got \['ndcg'\] instead\.$"),  # no close name: no suggestion
    (_kwargs(backend="Faiss"), re.escape("`backend` must be one of numpy, faiss. Got 'Faiss' instead. Did you mean `faiss`?")),
    (_kwargs(backend="torch"), "`backend` must be one of numpy, faiss"),
    (_kwargs(ks=[0, 5]), re.escape("`ks` must be positive integers. Got [0, 5] instead.")),
    (_kwargs(ks=[2.0]), "positive integers"),  # float, even integral
    (_kwargs(ks=[True]), "positive integers"),  # bool is not a count
    (_kwargs(ks=[]), "positive integers"),  # empty
    (_kwargs(query_ids=["a", "b"], gallery_ids=["a", "a", "c"]), "`gallery_ids` must be unique"),
    (_kwargs(query_labels=[0]), "query_labels` must have one entry per row"),  # 1 label for 2 rows
    (_kwargs(exclude=[(["c"], ["c", "c", "d"])]), r"each `exclude` entry must be a \(query values"),
    (_kwargs(exclude=[(["c", "d"], ["c", "d"])]), r"each `exclude` entry must be a \(query values"),
    (_kwargs(exclude=[["c", "d"]]), r"each `exclude` entry must be a \(query values"),  # not a pair
    (_kwargs(exclude=None), r"each `exclude` entry must be a \(query values"),  # not a list
    (_kwargs(exclude=[(np.zeros((2, 2)), np.zeros((3, 2)))]), r"pair of 1-D sequences"),  # 2-D values
    (_kwargs(ks=5), "`ks` must be positive integers. Got 5 instead."),  # a bare number
    (_kwargs(ks=None), "`ks` must be positive integers. Got None instead."),  # nothing
    (_kwargs(ks=[1, 1]), re.escape("`ks` must not repeat a value. Got [1, 1] instead.")),  # as score.ks
    (_kwargs(ks=[2**64]), r"`ks` must be at most 2\*\*62"),  # beyond int64: no OverflowError
    (_kwargs(metrics=5), "`metrics` must be distinct names"),  # a bare number
    (_kwargs(query_emb=np.ones((2, 0)), gallery_emb=np.ones((3, 0))), r"`query_emb` has dimension 0"),
    (_kwargs(query_emb=[[1.0, 0.0, 0.0], [1.0]]), "rows of one length"),  # ragged rows
    (_kwargs(query_ids=["a", "b"]), r"pass both `query_ids` and `gallery_ids`"),  # else self-matches count
    (_kwargs(gallery_ids=["a", "b", "c"]), r"pass both `query_ids` and `gallery_ids`"),
    (_kwargs(query_labels=[[0, 1], [1, 0]]), r"`query_labels` must be a 1-D sequence.*Got shape \(2, 2\)"),
    (_kwargs(query_labels=[0, None]), r"`query_labels` has missing .* at rows \[1\]"),  # None is no class
    (_kwargs(gallery_labels=[0.0, np.nan, 2.0]), r"`gallery_labels` has missing .* at rows \[1\]"),  # NaN
    (_kwargs(gallery_labels=["a", "", "c"]), r"`gallery_labels` has missing .* at rows \[1\]"),  # empty
    (_kwargs(query_ids=[None, "b"], gallery_ids=[None, "x", "y"]), r"`query_ids` has missing"),  # no self-match
    (_kwargs(query_ids=[{1}, {2}], gallery_ids=["a", "b", "c"]), r"`query_ids` has missing or unhashable"),
    (_kwargs(max_memory_mb=0), re.escape("`max_memory_mb` must be a positive number. Got 0 instead.")),
    (_kwargs(max_memory_mb=-1.0), "`max_memory_mb` must be a positive number"),  # negative
    (_kwargs(max_memory_mb=float("nan")), "`max_memory_mb` must be a positive number"),  # NaN
    (_kwargs(max_memory_mb=float("inf")), "`max_memory_mb` must be a positive number"),  # no bound at all
    (_kwargs(max_memory_mb="512"), "`max_memory_mb` must be a positive number"),  # text
    (_kwargs(max_memory_mb=True), "`max_memory_mb` must be a positive number"),  # a bool is not a size
])
def test_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        retrieval_metrics(**kwargs)
    with pytest.raises(ValueError, match=match):
        retrieval_summary(**{**kwargs, "metrics": kwargs.get("metrics")})


def test_faiss_backend_reports_the_same_errors():
    with pytest.raises(ValueError, match="gallery_emb` is empty"):
        retrieval_metrics(**_kwargs(gallery_emb=np.empty((0, 3)), gallery_labels=[], backend="faiss"))
    with pytest.raises(ValueError, match="every one of the 2 queries"):
        retrieval_metrics(**_kwargs(query_labels=["x", "y"], backend="faiss"))


def test_incomplete_ranking_refuses_metrics_that_need_every_positive():
    ranking = rank([[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], ["a"], ["a", "a"], metrics=["recall"])
    assert not ranking.complete
    with pytest.raises(ValueError, match=r"metrics \['map'\] need the complete ranking"):
        per_query(ranking, [1], ["recall", "map"])


def test_zero_vectors_tie_at_similarity_zero():
    # q0 is a zero vector: similarity 0 to everything -> gallery order g0(b) g1(a) g2(a), positives at 2, 3.
    # q1=[1,0]: g0 (b, 1.0), then g1 ([0,1]) and g2 (zero vector) tie at 0 -> g1 first: positives at 2, 3.
    q = [[0.0, 0.0], [1.0, 0.0]]
    g = [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    got = retrieval_summary(q, g, ["a", "a"], ["b", "a", "a"], ks=[1, 2], metrics=None)
    assert not any(isinstance(v, float) and math.isnan(v) for v in got.values())
    assert _ranks_per_query(rank(q, g, ["a", "a"], ["b", "a", "a"])) == [[1, 2], [1, 2]]
    assert got == {"recall@1": 0.0, "recall@2": 1.0, "precision@1": 0.0, "precision@2": 0.5,
                   "r_precision": 0.5, "map@r": 0.25, "map": pytest.approx((1 / 2 + 2 / 3) / 2, rel=1e-15),
                   "mrr": 0.5, "num_queries": 2, "num_excluded_queries": 0,
                   # q0's hit at 1 is a pure tie: larger index first would put g2 (a) on top; q1's g0 is strict
                   "tie_sensitive@1": 1, "tie_sensitive@2": 0, "num_gallery": 3, "embedding_dim": 2}
    np.testing.assert_array_equal(similarities(q, g)[0], [0.0, 0.0, 0.0])


def test_exclude_values_compared_as_strings_and_missing_never_match():
    q, g = [[1.0, 0.0]] * 4, [[1.0, 0.0], [0.6, 0.8]]
    # query cameras: int 1 (== "1"), NaN, None, "" -> only the first one excludes g0
    cams_q, cams_g = [1, float("nan"), None, ""], ["1", float("nan")]
    got = rank(q, g, ["a"] * 4, ["a", "a"], exclude=[(cams_q, cams_g)])
    assert got.n_retrievable.tolist() == [1, 2, 2, 2]
    assert _ranks_per_query(got) == [[0], [0, 1], [0, 1], [0, 1]]


@pytest.mark.parametrize("nan", [
    float("nan"),  # python float
    np.float64("nan"),  # a float subclass
    np.float32("nan"),  # a numpy scalar that is not a python float (a list of float32 values, object columns)
    np.float16("nan"),
], ids=["float", "float64", "float32", "float16"])
@pytest.mark.parametrize("container", [list, lambda v: np.array(v, dtype=object)], ids=["list", "object_array"])
def test_nan_exclusion_value_never_matches_whatever_its_float_type(nan, container):
    # documented: missing values (None, NaN, "") never match; query NaN and gallery NaN must not exclude g0
    q, g = [[1.0, 0.0]], [[1.0, 0.0], [0.6, 0.8]]
    got = rank(q, g, ["a"], ["a", "a"], exclude=[(container([nan]), container([nan, "x"]))])
    assert got.n_retrievable.tolist() == [2]
    assert _ranks_per_query(got) == [[0, 1]]


def test_self_and_exclusion_counted_once_in_m_q():
    # query 0 is gallery item 0 (by id) and shares its camera: M_q = 3 - 1, not 3 - 2; precision@5 = 1/2
    g = [[1.0, 0.0], [0.8, 0.6], [0.6, 0.8]]
    out = retrieval_summary(g[:1], g, ["a"], ["a", "b", "a"], ks=[5], query_ids=[0], gallery_ids=[0, 1, 2],
                            metrics=["precision"], exclude=[(["c"], ["c", None, "d"])])
    assert out["precision@5"] == 0.5
    assert rank(g[:1], g, ["a"], ["a", "b", "a"], [0], [0, 1, 2], exclude=[(["c"], ["c", None, "d"])]
                ).n_retrievable.tolist() == [2]


# --------------------------------------------------------------------------- 7. tie sensitivity

TIES = [
    # positive (index 1) ties a negative with a smaller index (0) at cosine 1: miss at 1, flips to a hit
    ([[1, 0], [2, 0]], ["neg", "pos"], {"recall@1": 0.0, "recall@2": 1.0, "tie_sensitive@1": 1, "tie_sensitive@2": 0}),
    # positive first in gallery order: hit at 1, which the opposite rule would turn into a miss
    ([[2, 0], [1, 0]], ["pos", "neg"], {"recall@1": 1.0, "recall@2": 1.0, "tie_sensitive@1": 1, "tie_sensitive@2": 0}),
    # no ties at all: nothing can flip
    ([[1, 0.1], [1, 0.5]], ["neg", "pos"], {"recall@1": 0.0, "recall@2": 1.0, "tie_sensitive@1": 0, "tie_sensitive@2": 0}),
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


@pytest.mark.parametrize("g, gl, expected", TIES)
@pytest.mark.parametrize("backend", ["numpy", "faiss"])
@pytest.mark.parametrize("metrics", [["recall"], None])
def test_tie_sensitivity(g, gl, expected, backend, metrics):
    ks = sorted({int(key.split("@")[1]) for key in expected})
    got = retrieval_summary([[1.0, 0.0]], g, ["pos"], gl, ks=ks, metrics=metrics, backend=backend)
    assert {key: got[key] for key in expected} == expected


def test_tie_sensitivity_counts_only_included_queries_on_the_symmetric_path():
    # leave-one-out: items 0 and 1 are copies (labels a, b), item 2 (label a) is orthogonal.
    # q0 (a): retrievable g1 (b, cos 1), g2 (a, cos 0) -> miss at 1, no tie with its positive -> 0 flips.
    # q1 (b): its only positive would be itself -> excluded, not counted.
    # q2 (a): g0 (a) and g1 (b) tie at 0 -> hit by index, flips under the opposite rule.
    g = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    labels, ids = ["a", "b", "a"], [0, 1, 2]
    got = retrieval_summary(g, g, labels, labels, ks=[1, 2], query_ids=ids, gallery_ids=ids, metrics=None)
    assert (got["num_queries"], got["num_excluded_queries"]) == (2, 1)
    assert (got["recall@1"], got["recall@2"], got["tie_sensitive@1"], got["tie_sensitive@2"]) == (0.5, 1.0, 1, 0)
    assert got == retrieval_summary(g, g.copy() + 0.0, labels, labels, ks=[1, 2], query_ids=ids, gallery_ids=ids,
                                    metrics=None, max_memory_mb=1e-6)


# --------------------------------------------------------------------------- 8. engine parts

MIB = 2**20


@pytest.mark.parametrize("mb, rule, args, expected", [
    (1, "label_rows", (1024,), 42),                # 2**20 B at 24 B per cell of a 1,024-column label
    (1e-6, "label_rows", (1024,), 1),              # never below one row
    (1, "chunk_positives", (), 5041),              # a quarter of 2**20 B at 52 B per positive
    (1e-9, "chunk_positives", (), 1),              # never below one positive
    (3, "tiles", (MIB, 0), 1.6),                   # 80% of the 2 MiB left after 1 MiB of unit copies
    (4, "tiles", (0, 2**16), 1.0),                 # 3.25 MiB of lists leave 0.75 MiB: the floor, a quarter
    (1, "fast_tile_cells", (2, 2**20), 87381),     # 2**20 B over 2 cores at 6 B per cell
    (64, "fast_tile_cells", (2, 2**20), 2**20),    # at most the cache-sized tile
    (1e-6, "fast_tile_cells", (2, 2**20), 4096),   # at least MIN_PAIRS
    (1, "exact_tile_cells", (2, 2**21), 19660),    # 3/4 of each core's 2**19 B at 20 B per cell
    (1e-6, "exact_tile_cells", (2, 2**21), 4096),  # at least MIN_PAIRS
    (1, "exact_tile_side", (2, 16), 512),          # 1/4 of each core's 2**19 B for two float64 sides of d = 16
    (1, "exact_tile_side", (2, 512), 64),          # 16 would fit at d = 512: at least the side of MIN_PAIRS
    (1, "search_rows", (1000,), 87),               # 2**20 B at 12 B per searched cell of a 1,000-item gallery
    (1e-6, "search_rows", (1000,), 1),             # never below one query
])
def test_budget_rules(mb, rule, args, expected):
    got = getattr(Budget(mb), rule)(*args)
    assert (got.max_memory_mb if rule == "tiles" else got) == expected


def _ranking_logs(caplog) -> list[str]:
    """The engine's debug lines, one per ranking."""
    return [r.getMessage() for r in caplog.records if r.name == "recallk.score.ranking.engine"]


def _tiles(line: str) -> int:
    return int(re.search(r"(\d+) tiles", line).group(1))


@pytest.mark.parametrize("kind", ["exclude_two_pairs", "leave_one_out_exclude", "grid"])
def test_smaller_budget_tiles_never_change_a_number(kind, monkeypatch, caplog):
    # Without the MIN_PAIRS floor the smallest budget makes one-cell tiles: the drivers ask the Budget.
    case = make_case(kind, 0)
    for names in (METRICS, ["recall"]):
        with caplog.at_level(logging.DEBUG, logger="recallk.score.ranking.engine"):
            caplog.clear()
            expected = _rank(case, names, max_memory_mb=1e-6)
            monkeypatch.setattr(Budget, "MIN_PAIRS", 1)
            got = _rank(case, names, max_memory_mb=1e-6)
            monkeypatch.undo()
        before, after = _ranking_logs(caplog)
        assert _tiles(after) > _tiles(before), (before, after)
        _assert_same_ranking(got, expected)


@pytest.mark.parametrize("kind, same_set", [("leave_one_out", True),         # same vectors, labels and ids
                                            ("leave_one_out_exclude", True),  # and the same exclusion values
                                            ("same_set_no_ids", True),        # no ids on either side
                                            ("same_set_other_exclusions", False),  # other exclusion values
                                            ("partial_overlap", False)])      # some queries are gallery items
def test_problem_detects_the_same_set(kind, same_set):
    problem = Problem.build(**make_case(kind, 0))
    assert problem.same_set is same_set
    assert problem.queries(np.arange(3)).same_set is False  # a chunk of queries is never the gallery


LOO_KINDS = ["leave_one_out", "leave_one_out_grid", "leave_one_out_exclude"]


@pytest.mark.parametrize("kind, same_set", [(k, True) for k in LOO_KINDS]      # the score stage's leave_one_out
                         + [(k, False) for k in LOO_KINDS + ["same_set_no_ids"]])  # a symmetric case as query x gallery
def test_explicit_same_set_gives_the_ranks_of_detection(kind, same_set, caplog):
    # same_set=True takes the path detection takes; False multiplies every tile: the same ranks either way.
    case = make_case(kind, 0)
    for names in (METRICS, ["recall"]):
        with caplog.at_level(logging.DEBUG, logger="recallk.score.ranking.engine"):
            caplog.clear()
            detected = _rank(case, names)
            explicit = _rank(case, names, same_set=same_set)
        assert ["leave-one-out" in line for line in _ranking_logs(caplog)] == [True, same_set]
        _assert_same_ranking(explicit, detected)


@pytest.mark.parametrize("change", [
    {"query_ids": [f"q{j}" for j in range(29)]},                # other ids
    {"query_ids": [f"img{j:03d}" for j in range(29)][::-1]},    # the same ids in another order
    {"query_ids": None, "gallery_ids": None},                   # no ids to match the rows by
    {"gallery_ids": None},                                      # ids on one side only
])
def test_same_set_true_needs_the_gallery_row_for_row(change):
    case = dict(make_case("leave_one_out", 0), **change)
    with pytest.raises(InputError, match=re.escape("`same_set=True` needs the queries to be the gallery row for row")):
        ranking.rank_positives(**case, same_set=True)
