"""The public wrappers of recallk.score.metrics (``recall_at_k``, ``first_positive_ranks``) and the API cases
that tests/score/test_ranking.py and test_metrics.py do not cover.

tests/score/test_ranking.py cross-checks ``retrieval_metrics``, ``retrieval_summary`` and ``rank`` against a
brute-force oracle (ties, ids, exclusion, memory bounds, scaling, orderings, errors); here the wrappers are
pinned to those functions on seeded cases, plus hand-checked cases found only here: a zero gallery vector
winning a tie, a lonely self-match with K above the gallery size, extreme float64 scales, labels compared
as text both ways, a few more input errors and the first-positive path's memory bound.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from recallk import recall_at_k, retrieval_summary
from recallk.score.metrics import first_positive_ranks, rank, retrieval_metrics
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import ScoreSettings

# --------------------------------------------------------------------------- the wrappers

def make_case(kind, seed):
    """Seeded synthetic query/gallery sets exercising one feature each."""
    rng = np.random.default_rng(seed)
    nq, ng, d = 17, 29, 6
    q_ids = g_ids = None
    q, g = rng.normal(size=(nq, d)), rng.normal(size=(ng, d))
    ql, gl = rng.integers(0, 5, nq), rng.integers(0, 5, ng)
    if kind == "duplicates":  # exact ties: repeated gallery rows, some queries equal to gallery rows
        g[1::3] = g[0:-1:3][: len(g[1::3])]
        q[:5] = g[:5]
    elif kind == "grid":  # integer vectors in {-1, 0, 1}: many equal cosines
        q, g = rng.integers(-1, 2, (nq, 3)), rng.integers(-1, 2, (ng, 3))
    elif kind == "leave_one_out":  # queries == gallery, self-match excluded by id
        q, ql = g, gl
        q_ids = g_ids = [f"img{j:03d}" for j in range(ng)]
    elif kind == "overlap_grid":  # partial overlap by id plus ties
        g = rng.integers(-1, 2, (ng, 3))
        q, ql = g[5:5 + nq], gl[5:5 + nq]
        g_ids = list(range(100, 100 + ng))
        q_ids = g_ids[5:5 + nq]
    elif kind == "absent_labels":  # labels 5..7 never occur in the gallery -> excluded queries
        ql = rng.integers(0, 8, nq)
    elif kind == "string_labels":
        ql = np.array([f"cls{x}" for x in ql])
        gl = [f"cls{x}" for x in gl]
    elif kind == "near_ties":  # 256-d, gallery = one direction + 1e-6 noise: cosines differ by ~1e-7,
        # below float32 product error, so only the exact float64 re-decision orders them right
        base = rng.normal(size=256)
        g = base + rng.normal(scale=1e-6, size=(ng, 256))
        q = base + rng.normal(scale=1e-6, size=(nq, 256))
    elif kind == "tiny_gallery":  # K far above the gallery size
        g, gl = g[:4], np.array([0, 1, 0, 2])
        ql = rng.integers(0, 3, nq)
    return q, g, ql, gl, q_ids, g_ids


KINDS = ["gaussian", "duplicates", "grid", "leave_one_out", "overlap_grid", "absent_labels", "string_labels",
         "near_ties", "tiny_gallery"]

KS = [1, 2, 5, 10, 40]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", KINDS)
def test_wrappers_are_the_suite_on_recall(kind, seed):
    # recall_at_k is retrieval_metrics on recall alone; first_positive_ranks is rank()'s first positive
    # and positive count, under any memory bound (0.001 MB: one query per block)
    q, g, ql, gl, q_ids, g_ids = make_case(kind, seed)
    recall = recall_at_k(q, g, ql, gl, query_ids=q_ids, gallery_ids=g_ids, ks=KS)
    assert list(recall) == [f"recall@{k}" for k in KS]
    assert recall == retrieval_metrics(q, g, ql, gl, query_ids=q_ids, gallery_ids=g_ids, ks=KS, metrics=["recall"])
    ranking = rank(RetrievalData(q, g, ql, gl, query_ids=q_ids, gallery_ids=g_ids), ScoreSettings(metrics=("recall",)))
    for memory in (512, 0.001):
        got_rank, got_pos = first_positive_ranks(q, g, ql, gl, query_ids=q_ids, gallery_ids=g_ids,
                                                 max_memory_mb=memory)
        np.testing.assert_array_equal(got_rank, ranking.first_rank)
        np.testing.assert_array_equal(got_pos, ranking.n_positives)


def test_api_recall_matches_summary_keys():
    rng = np.random.default_rng(0)
    q, g = rng.normal(size=(5, 3)), rng.normal(size=(7, 3))
    ql, gl = [0, 1, 0, 1, 2], [0, 1, 2, 0, 1, 2, 2]
    assert recall_at_k(q, g, ql, gl, ks=(2, 1)) == {k: v for k, v in retrieval_summary(q, g, ql, gl, ks=(2, 1)).items()
                                                     if k.startswith("recall@")}


def test_ks_order_preserved():
    q, g, ql, gl, _, _ = make_case("gaussian", 0)
    assert list(recall_at_k(q, g, ql, gl, ks=[10, 1, 5])) == ["recall@10", "recall@1", "recall@5"]


# --------------------------------------------------------------------------- toy cases


@pytest.mark.parametrize("g, gl, expected", [
    # zero vector has similarity 0 to everything: ties the orthogonal positive and wins by index
    ([[0, 0, 0], [0, 1, 0]], ["neg", "pos"], {"recall@1": 0.0, "recall@2": 1.0}),
])
def test_tie_rule(g, gl, expected):
    assert recall_at_k([[1, 0, 0]], g, ["pos"], gl, ks=[1, 2]) == expected


def test_self_match_excluded_even_when_k_exceeds_gallery():
    # The seed template flaw: with K >= n_gallery its masked self (-inf) re-enters the top K.
    g = [[1, 0], [0, 1], [1, 1]]
    gl, ids = ["lonely", "b", "b"], ["x", "y", "z"]
    summary = retrieval_summary(g, g, gl, gl, ks=[1, 3, 10], query_ids=ids, gallery_ids=ids)
    # "x" only matches itself -> excluded, not a hit at K=10 although only 2 items remain retrievable.
    # y finds z first; z ties x and y (cosine 0.707) and x wins by index -> y at rank 1.
    assert summary["num_excluded_queries"] == 1 and summary["num_queries"] == 2
    assert summary == {"recall@1": 0.5, "recall@3": 1.0, "recall@10": 1.0, "num_queries": 2,
                       "num_excluded_queries": 1, "num_gallery": 3, "embedding_dim": 2,
                       # z's hit at K=1 depends on the tie with x: y would win it under the opposite rule
                       "tie_sensitive@1": 1, "tie_sensitive@3": 0, "tie_sensitive@10": 0}
    rank, n_pos = first_positive_ranks(g, g, gl, gl, query_ids=ids, gallery_ids=ids)
    assert rank.tolist() == [-1, 0, 1] and n_pos.tolist() == [0, 1, 1]
    # a lone query whose only same-label item is itself: every query excluded -> NaN and a warning, never a hit
    with pytest.warns(RuntimeWarning, match="excluded"):
        lone = recall_at_k(g[:1], g, gl[:1], gl, ks=[10], query_ids=ids[:1], gallery_ids=ids)
    assert np.isnan(lone["recall@10"])


@pytest.mark.parametrize("scale", [1e-60, 1e60])
def test_extreme_float64_scale_is_invariant(scale):
    # Finite float64 rows at any scale are documented as accepted ("Any scale"). q0 = g1 (label b) -> rank 0;
    # q1 = g0 (label a) so its positive g1 is second -> rank 1; recall@1 = 0.5. A float32 cast before
    # normalising would turn 1e60 into inf (NaN similarities) and 1e-60 into zero vectors (all ties).
    q, g = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[0.0, 1.0], [1.0, 0.0]])
    with np.errstate(all="ignore"):
        assert first_positive_ranks(q * scale, g * scale, ["b", "b"], ["a", "b"])[0].tolist() == [0, 1]
        assert recall_at_k(q * scale, g * scale, ["b", "b"], ["a", "b"], ks=[1]) == {"recall@1": 0.5}


# labels, ids and exclusion values compared by value, and labels that cannot match: at the end of this file


# --------------------------------------------------------------------------- errors
# (the rest of the table is in tests/score/test_metrics.py)

def _kwargs(**over):
    kw = dict(query_emb=np.ones((2, 3)), gallery_emb=np.eye(3), query_labels=[0, 1], gallery_labels=[0, 1, 2],
              ks=[1])
    kw.update(over)
    return kw


INF = np.eye(3)
INF[2, 0] = np.inf


@pytest.mark.parametrize("kwargs, match", [
    (_kwargs(ks=[1, -5]), "positive integers"),  # negative
    (_kwargs(ks="5"), "positive integers"),  # a string, not a list
    (_kwargs(gallery_emb=INF), r"first rows \[2\]"),  # inf row named
    # every row named
    (_kwargs(query_emb=np.full((2, 3), np.nan)), r"`query_emb` has NaN or inf in 2 row\(s\), first rows \[0, 1\]"),
    (_kwargs(gallery_labels=[0, 1]), "gallery_labels` must have one entry per row"),  # 2 labels for 3 rows
])
def test_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        retrieval_summary(**kwargs)
    with pytest.raises(ValueError, match=match):
        recall_at_k(**kwargs)


# --------------------------------------------------------------------------- memory bound

def _peak_mib(fn) -> float:
    import tracemalloc
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_block_scratch_memory_stays_under_the_budget():
    """12,000 queries x 3,000 gallery: the full matrix would take 137 MiB in float32 alone."""
    rng = np.random.default_rng(0)
    q, g = rng.normal(size=(12000, 32)).astype(np.float32), rng.normal(size=(3000, 32)).astype(np.float32)
    ql, gl = rng.integers(0, 50, 12000), rng.integers(0, 50, 3000)
    run = lambda mb: _peak_mib(lambda: first_positive_ranks(q, g, ql, gl, max_memory_mb=mb))  # noqa: E731
    baseline = run(1)  # 1 MiB blocks: the O(n + m) copies (normalised inputs, labels) and at most 1 MiB of scratch
    for budget in (8, 64):
        scratch = run(budget) - baseline
        assert scratch <= budget, f"{scratch:.1f} MiB of block scratch over a {budget} MiB budget"
    assert run(64) - baseline > 8  # the budget is really used: bigger blocks, not a fixed size


# --------------------------------------------------------------------------- K beyond every gallery (issue 25)
# An undefined K passed without a word (moved from the hostile corpus, test_hostile_labels.py).


def embeddings(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 8))


def test_k_beyond_every_gallery_warns_once_naming_each_k():
    labels = [0, 1, 0, 1, 2, 2]
    with pytest.warns(UserWarning) as caught:
        retrieval_metrics(embeddings(6), embeddings(6, 1), labels, labels, ks=[1, 8, 20])
    said = [str(w.message) for w in caught if "larger than every query's gallery" in str(w.message)]
    assert said == ["K = 8, 20 is larger than every query's gallery (at most 6 retrievable items): recall@K is "
                    "1.0 for every query with a positive there; use K up to 6 (`ks` / `score.ks`)."]


def test_k_within_the_gallery_says_nothing():
    labels = [0, 1, 0, 1, 2, 2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        retrieval_metrics(embeddings(6), embeddings(6, 1), labels, labels, ks=[1, 6])


# --------------------------------------------------------------------------- labels, ids and exclusion values by value
# Labels, ids and exclusion values compare by value; kinds that can never match are an error, not NaN (moved
# from the hostile corpus, test_hostile_trust.py; issue 25).


Q, G = [[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]  # the query's label is the gallery's first (and top) item's


@pytest.mark.parametrize("query_labels, gallery_labels", [
    ([1], np.array([1.0, 2.0])),  # float gallery labels, int query labels (pytorch-metric-learning's own tests)
    (np.array([1.0]), [1, 2]),    # and the other way round
    (np.array([1], dtype=np.uint8), np.array([1, 2], dtype=np.int64)),  # integer widths and signs
    ([True], [1, 0]),             # True is 1
    ([0.5], [0.5, 1.5]),          # fractions compare by value too
    (np.array(["1"]), ["1", "2"]),  # text compares as text
])
def test_labels_compare_by_value(query_labels, gallery_labels):
    assert recall_at_k(Q, G, query_labels, gallery_labels, ks=[1]) == {"recall@1": 1.0}


@pytest.mark.parametrize("query_labels, gallery_labels, match", [
    ([1], ["1", "2"], "`query_labels` are numbers and `gallery_labels` are text"),  # kinds that never match
    (np.array(["1"]), np.array([1, 2]), "`gallery_labels` are numbers and `query_labels` are text"),
    ([7], [1.0, 2.0], "no query label occurs in `gallery_labels`"),  # no shared value: an error, not NaN
    (["x"], ["a", "b"], "no query label occurs in `gallery_labels`"),
])
def test_labels_that_cannot_match_are_an_error(query_labels, gallery_labels, match):
    with pytest.raises(ValueError, match=match):
        recall_at_k(Q, G, query_labels, gallery_labels, ks=[1])


@pytest.mark.parametrize("query_ids", [
    np.array([0.0, 1.0, 2.0]),  # float query ids against int gallery ids: the query's own image is still found
    [0.0, 1.0, 2.0],
    [0, 1, 2],                  # the same ids typed alike (the reference)
])
def test_numeric_ids_compare_by_value(query_ids):
    g = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])  # q0's only label-0 item is itself: it must be excluded
    got = retrieval_summary(g, g, [0, 1, 1], [0, 1, 1], ks=[1], query_ids=query_ids, gallery_ids=[0, 1, 2])
    assert (got["num_queries"], got["num_excluded_queries"]) == (2, 1)


def test_gallery_ids_equal_by_value_are_a_repeat():
    with pytest.raises(ValueError, match="`gallery_ids` must be unique"):
        recall_at_k(Q, G, [1], [1, 2], ks=[1], query_ids=[5], gallery_ids=[1, 1.0])


# ------------------------------------------------------------------------------ exclusion values in the API


QX, GX = [[1.0, 0.0]], [[1.0, 0.0], [0.8, 0.6], [0.6, 0.8]]  # the query's gallery items in rank order
GX_LABELS = [1, 2, 1]  # the top item and the third share the query's label


@pytest.mark.parametrize("query_values, gallery_values", [
    ([1.0], [1, 2, 2]),                         # float query values, int gallery values: item 0 is excluded
    (np.array([1]), np.array([1.0, 2.0, 2.0])),  # and the other way round
    (np.array([1], dtype=np.uint8), np.array([1, 2, 2], dtype=np.int64)),  # integer widths and signs
    ([True], [1, 0, 0]),                        # True is 1
    ([0.5], [0.5, 1.5, np.nan]),                # fractions by value; NaN is missing, never a match
    (np.array([[1.0, 0.0]]), np.array([[1, 0], [2, 0], [2, 0]])),  # a joint exclusion, column by column
    (["1"], ["1", "2", "2"]),                   # text compares as text (the reference)
])
def test_exclusion_values_compare_by_value(query_values, gallery_values):
    got = recall_at_k(QX, GX, [1], GX_LABELS, ks=[1], exclude=[(query_values, gallery_values)])
    assert got == {"recall@1": 0.0}  # the top item is excluded: the first positive left is at rank 3
    assert recall_at_k(QX, GX, [1], GX_LABELS, ks=[1]) == {"recall@1": 1.0}  # without the exclusion


def test_missing_exclusion_values_never_match():
    assert recall_at_k(QX, GX, [1], GX_LABELS, ks=[1], exclude=[([np.nan], [np.nan, 2.0, 2.0])]) == {"recall@1": 1.0}
    assert recall_at_k(QX, GX, [1], GX_LABELS, ks=[1], exclude=[([None], ["", 2, 2])]) == {"recall@1": 1.0}


@pytest.mark.parametrize("query_values, gallery_values, match", [
    ([1], ["1", "2", "2"], r"query values of `exclude\[0\]` are numbers and the gallery values of `exclude\[0\]` are"),
    (["1"], [1.0, 2.0, np.nan], r"gallery values of `exclude\[0\]` are numbers and the query values of `exclude\[0\]`"),
    ([[1, "x"]], [[1, "x"], [2, "x"], [2, "y"]], None),  # a column of each kind: fine, each compares alike
    ([[1.0, 0]], [["1", 0], ["2", 0], ["2", 0]], r"`exclude\[0\]` \(column 0\)"),
])
def test_exclusion_values_that_cannot_match_are_an_error(query_values, gallery_values, match):
    def run():
        return recall_at_k(QX, GX, [1], GX_LABELS, ks=[1], exclude=[(np.array(query_values, dtype=object),
                                                                   np.array(gallery_values, dtype=object))])
    if match is None:
        assert run() == {"recall@1": 0.0}
    else:
        with pytest.raises(ValueError, match=match):
            run()
