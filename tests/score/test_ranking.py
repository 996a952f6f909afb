"""The exact ranking engine's parts against a brute-force oracle: the smallest memory bounds, the caps, chunks, spans
and scratch bounds (FAISS-contrib style). Every path on every seeded case against the oracle:
tests/score/test_paths.py."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from ranking_cases import (
    BIG_KINDS,
    KINDS,
    KS,
    assert_matches_oracle,
    assert_same_ranking,
    assert_scratch_within_budget,
    case_oracle,
    case_summary,
    make_big_case,
    make_case,
    rank_case,
    ranks_per_query,
)
from recallk.score import values as values_module
from recallk.score.metrics import METRICS, per_query, retrieval_summary
from recallk.score.passes import Pass
from recallk.score.ranking import Budget, consecutive_runs
from recallk.score.ranking import counting as counting_module
from recallk.score.ranking import engine as ranking
from recallk.score.ranking import fast as fast_module
from recallk.score.ranking import scan as scan_module
from recallk.score.settings import ScoreSettings

# --------------------------------------------------------------------------- 1. oracle cross-check


@pytest.mark.parametrize("memory", [1e-6, 0.02, 512])  # one-row tiles; a few tiles (partly live); one tile
@pytest.mark.parametrize("kind", BIG_KINDS + ["near_ties", "duplicates", "leave_one_out_exclude"])
def test_capped_ranks_are_the_full_ranks_cut_at_the_cap(kind, memory):
    # Queries stop counting at different tiles, leave-one-out tiles shrink to their live rows and
    # columns: every first rank (and the opposite-rule one) must still be min(full rank, cap).
    case = make_big_case(kind, 4) if kind in BIG_KINDS else make_case(kind, 4)
    full = rank_case(case, ["recall"], max_memory_mb=memory)
    for cap in (1, 3, 10_000):
        capped = rank_case(case, ["recall"], ranks=Pass.first(cap), max_memory_mb=memory)
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
    scan = fast_module.scan_block
    monkeypatch.setattr(fast_module, "scan_block", lambda sims, *a: scanned.append(sims.size) or scan(sims, *a))
    kw = dict(query_ids=ids, gallery_ids=ids, max_memory_mb=1)  # small tiles: many chances to stop
    got = retrieval_summary(q, g, ql, gl, ks=(1, 5), metrics=["recall"], **kw)
    capped, scanned[:] = sum(scanned), []
    full = retrieval_summary(q, g, ql, gl, ks=(1, 5), metrics=["recall", "mrr"], **kw)  # mrr: no cap
    assert {k: got[k] for k in got} == {k: full[k] for k in got}
    assert capped < 0.5 * sum(scanned), (capped, sum(scanned))  # without stopping: all of them


@pytest.mark.parametrize("metrics, ks", [(["recall", "mrr"], (1,)),   # MRR needs the exact first rank
                                          (["recall"], (1, 5)),         # K above the cap
                                          (["recall", "map"], (1,))])   # every positive's rank
def test_capped_ranking_serves_only_recall_up_to_its_cap(metrics, ks):
    capped = ranking.rank_positives([[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], ["a"], ["a", "b"], ranks=Pass.first(2))
    with pytest.raises(ValueError, match="capped at 2|need the complete ranking"):
        per_query(capped, ScoreSettings(ks=ks, metrics=tuple(metrics)))


@pytest.mark.parametrize("kind", BIG_KINDS)
def test_big_cases_match_brute_force(kind):
    case = make_big_case(kind, 0)
    expected, detail = case_oracle(case)
    assert_matches_oracle(case_summary(case), expected)
    assert_matches_oracle(case_summary(case, metrics=["recall", "mrr"]), expected)
    assert ranks_per_query(rank_case(case)) == detail["ranks"]


# --------------------------------------------------------------------------- 2. block-size invariance

@pytest.mark.parametrize("memory", [1e-6, 0.02])
@pytest.mark.parametrize("kind", BIG_KINDS + ["near_ties", "exclude_two_pairs", "leave_one_out_exclude"])
def test_memory_bound_never_changes_a_number(kind, memory):
    # 1e-6 MB: the smallest blocks (one gallery column per exact block, one row/column per symmetric exact
    # block, 4096 cells per fast block); 0.02 MB: a few blocks. Counts are integers: results are identical.
    case = make_big_case(kind, 1) if kind in BIG_KINDS else make_case(kind, 1)
    for names in (METRICS, ["recall"]):  # complete ranking and first-positive path
        assert_same_ranking(rank_case(case, names, max_memory_mb=memory), rank_case(case, names))
    assert case_summary(case, max_memory_mb=memory) == case_summary(case)


@pytest.mark.parametrize("window_cells", [0, 5])  # undecided cells handed on one chunk at a time; every few
@pytest.mark.parametrize("kind", BIG_KINDS + ["duplicates", "zero_rows", "near_ties"])
def test_handing_on_undecided_cells_never_changes_a_number(kind, window_cells, monkeypatch):
    # The scan hands its undecided cells on to be re-decided once too many have gathered (from both
    # threads at once on leave-one-out mirror blocks): the counts must be those of one final hand-over.
    case = make_big_case(kind, 3) if kind in BIG_KINDS else make_case(kind, 3)
    expected = rank_case(case, ["recall"], max_memory_mb=0.02)
    monkeypatch.setattr(scan_module, "_CHUNK_CELLS", 7)
    monkeypatch.setattr(counting_module, "_WINDOW_CELLS", window_cells)
    assert_same_ranking(rank_case(case, ["recall"], max_memory_mb=0.02), expected)


@pytest.mark.parametrize("few_lines", [0, 10**9])  # always compare only the lines that reach; never
@pytest.mark.parametrize("kind", BIG_KINDS + ["near_ties", "duplicates", "zero_rows"])
def test_comparing_only_lines_that_reach_their_window_never_changes_a_number(kind, few_lines, monkeypatch):
    # A scan skips lines whose maximum is below their window and, when few lines remain, compares a
    # copy of those lines only (rows, or leave-one-out columns): counts and cells must map back exactly.
    case = make_big_case(kind, 5) if kind in BIG_KINDS else make_case(kind, 5)
    expected = rank_case(case, ["recall", "mrr"], max_memory_mb=0.02)
    monkeypatch.setattr(scan_module, "_FEW_LINES", few_lines)
    monkeypatch.setattr(scan_module, "_CHUNK_CELLS", 64)
    assert_same_ranking(rank_case(case, ["recall", "mrr"], max_memory_mb=0.02), expected)


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

    assert_scratch_within_budget(lambda mb: ranking.rank_positives(q, g, ql, gl, max_memory_mb=mb), "tile scratch")


@pytest.mark.parametrize("kind", KINDS + BIG_KINDS)
def test_queries_in_chunks_never_change_a_number(kind, monkeypatch):
    # Few, large labels: the complete ranking takes the queries in chunks whose positive lists fit the
    # budget. Here every chunk is as small as it gets (about one query each); leave-one-out chunks are
    # not symmetric, so they take the query x gallery path. Counts are integers: results are identical.
    case = make_big_case(kind, 2) if kind in BIG_KINDS else make_case(kind, 2)
    expected = rank_case(case)
    monkeypatch.setattr(Budget, "POSITIVE_BYTES", 2**40)
    assert_same_ranking(rank_case(case), expected)


@pytest.mark.parametrize("counts, most, runs", [
    ([3, 3, 3], 10, [(0, 3)]),                 # the total fits: one run
    ([3, 3, 3], 3, [(0, 1), (1, 2), (2, 3)]),  # each entry fills a run
    ([5, 0, 0, 5], 5, [(0, 1), (1, 4)]),       # empty entries go with the next run
    ([12, 1, 1], 5, [(0, 1), (1, 3)]),         # an entry over `most` stands alone
    ([2, 2, 2, 2], 5, [(0, 3), (3, 4)]),       # a run ends after the entry that crosses `most`
    ([], 4, [(0, 0)]),                         # no entries: one empty run
])
def test_consecutive_runs(counts, most, runs):
    assert consecutive_runs(np.array(counts, dtype=np.int64), most) == runs


@pytest.mark.parametrize("span", [1, 7])  # at most one query per span (a query's positives never split); a few
@pytest.mark.parametrize("kind", KINDS + BIG_KINDS)
def test_per_query_values_in_spans_never_change_a_number(kind, span, monkeypatch):
    # per_query takes spans of queries with at most SPAN_PAIRS positives between them at a time.
    case = make_big_case(kind, 4) if kind in BIG_KINDS else make_case(kind, 4)
    ranked = rank_case(case)
    settings = ScoreSettings(ks=KS, metrics=METRICS)
    expected = per_query(ranked, settings)
    monkeypatch.setattr(values_module, "SPAN_PAIRS", span)
    got = per_query(ranked, settings)
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
        got = ranking.rank_positives(g, g, gl, gl, query_ids=ids, gallery_ids=ids, max_memory_mb=16)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    pairs = int(got.n_positives.sum())
    assert pairs > 4_000_000
    assert peak <= 16 + 8 * pairs / 2**20 + 4, f"{peak:.0f} MiB"  # + 4: unit copies, labels and ids
    assert ranks_per_query(got) == ranks_per_query(ranking.rank_positives(g, g, gl, gl, query_ids=ids,
                                                                             gallery_ids=ids))


def test_per_query_temporaries_stay_bounded_with_few_large_labels(monkeypatch):
    # 4.5 M (query, positive) pairs: every per-positive temporary of per_query at once took ~200 MB.
    rng = np.random.default_rng(0)
    g, gl = rng.normal(size=(3000, 8)).astype(np.float32), rng.integers(0, 2, 3000)
    ids = list(range(3000))
    ranked = ranking.rank_positives(g, g, gl, gl, query_ids=ids, gallery_ids=ids)
    settings = ScoreSettings(ks=KS, metrics=METRICS)
    expected = per_query(ranked, settings)
    monkeypatch.setattr(values_module, "SPAN_PAIRS", 2**16)  # spans of ~65 k positives: a few MB each
    tracemalloc.start()
    try:
        got = per_query(ranked, settings)
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
    expected = rank_case(case, ["recall"], max_memory_mb=0.02)
    monkeypatch.setattr(scan_module, "_CHUNK_CELLS", chunk_cells)
    assert_same_ranking(rank_case(case, ["recall"], max_memory_mb=0.02), expected)


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
        assert_same_ranking(rank_case(case, names, max_memory_mb=memory),
                            rank_case(doubled, names, max_memory_mb=memory))
        assert case_summary(case, metrics=metrics, max_memory_mb=memory) == case_summary(doubled, metrics=metrics,
                                                                                 max_memory_mb=memory)


