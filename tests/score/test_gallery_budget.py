"""A gallery larger than the budget: unit rows normalised per tile (same bits), total extra memory within
``max_memory_mb``, and progress lines from the tiles when stderr is not a terminal."""

from __future__ import annotations

import logging
import re
import tracemalloc

import numpy as np
import pytest

from ranking_cases import BIG_KINDS, KINDS, METRICS, assert_same_ranking, make_big_case, make_case, rank_case
from recallk.score.metrics import retrieval_summary
from recallk.score.passes import Pass
from recallk.score.ranking import Budget, Problem, rank_positives
from recallk.score.ranking import fast as fast_module
from recallk.score.ranking import schedule as schedule_module
from recallk.score.ranking.problem import UnitRows
from recallk.score.retrieval_data import RetrievalData
from recallk.score.similarity import l2_normalize

MIB = 2**20


@pytest.mark.parametrize("dtype, scale", [
    (np.float32, 1.0),    # the usual embeddings
    (np.float64, 1e-60),  # tiny float64 values: normalised after dividing by each row's peak
    (np.int16, 1.0),      # integers: converted to float64 per chunk
])
def test_unit_rows_read_per_tile_have_the_bits_of_the_whole_normalised_array(dtype, scale):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(1500, 37)) * (1 if dtype is np.int16 else scale) * (50 if dtype is np.int16 else 1)
         ).astype(dtype)
    x[7] = 0  # a zero row stays zero
    order = rng.permutation(1500)
    whole, rows = l2_normalize(x, rows=order), UnitRows(x, order)
    assert rows.shape == whole.shape and rows.nbytes == 0  # nothing held
    for key in (slice(0, 1500), slice(3, 700), slice(1499, 1500), rng.integers(0, 1500, 900), np.array([], int)):
        assert rows[key].tobytes() == whole[key].tobytes()
    assert rows.subset(np.arange(10, 20))[2:5].tobytes() == whole[12:15].tobytes()
    assert np.asarray(rows).tobytes() == whole.tobytes()


@pytest.mark.parametrize("kind", KINDS + BIG_KINDS)
@pytest.mark.parametrize("metrics, taller_runs", [
    (METRICS, False),              # the complete ranking
    (["recall", "mrr"], False),    # the fast path
    (["recall", "mrr"], True),     # the fast path, query runs of several tiles' rows (each gallery tile read once)
    (["recall"], True),            # the same with a cap: queries leave a run's blocks as they stop
])
def test_rows_read_per_tile_never_change_a_number(kind, metrics, taller_runs, monkeypatch):
    # At the smallest budget no unit copy fits (read per tile); with a huge UNIT_SHARE both are held, as
    # before. The same tiles either way: every count, rank and tie must be identical.
    # Taller runs: a roomy budget with the smallest tiles (20 rows of 200 columns) and no direct path, so that
    # a run holds several tiles' rows (the budget does not cap them).
    case = make_big_case(kind, 1) if kind in BIG_KINDS else make_case(kind, 1)
    mb = 512 if taller_runs else 0.02
    ranks = Pass.first(cap=5) if metrics == ["recall"] else None  # recall alone: first ranks capped at 5
    if taller_runs:
        monkeypatch.setattr(Budget, "DIRECT_CELLS", 0)
        monkeypatch.setattr(fast_module, "_TILE_CELLS", Budget.MIN_PAIRS)
    with monkeypatch.context() as mp:
        if taller_runs:  # nothing held; one thread: one run of every query, in blocks of 20 rows
            mp.setattr(Budget, "UNIT_SHARE", 0.0)
            mp.setattr(fast_module, "worker_count", lambda: 1)
        read = rank_case(case, metrics, ranks=ranks, max_memory_mb=mb)
    monkeypatch.setattr(Budget, "UNIT_SHARE", 1e12)
    assert_same_ranking(rank_case(case, metrics, ranks=ranks, max_memory_mb=mb), read)


def test_problem_holds_only_the_copies_that_fit():
    rng = np.random.default_rng(0)
    q, g = rng.normal(size=(10, 8)).astype(np.float32), rng.normal(size=(100, 8)).astype(np.float32)
    labels = (np.zeros(10, int), np.zeros(100, int))
    data = RetrievalData(q, g, *labels)
    both = Problem.build(data, unit_bytes=4 * 8 * 110)
    queries_only = Problem.build(data, unit_bytes=4 * 8 * 109)
    neither = Problem.build(data, unit_bytes=4 * 8 * 9)
    assert isinstance(both.q, np.ndarray) and isinstance(both.gp, np.ndarray)
    assert isinstance(queries_only.q, np.ndarray) and isinstance(queries_only.gp, UnitRows)
    assert isinstance(neither.q, UnitRows) and isinstance(neither.gp, UnitRows)
    assert neither.gp[:].tobytes() == both.gp.tobytes() and neither.q[:].tobytes() == both.q.tobytes()


def _peak_mib(fn) -> float:
    """Peak of the numpy allocations (tracemalloc) made by ``fn()``, in MiB."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / MIB
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("metrics, leave_one_out", [
    (["recall"], False),           # the fast path with a cap (recall only)
    (["recall", "mrr"], False),    # the fast path, every first rank exact
    (["recall", "map@r"], False),  # the top-L pass (no full map)
    (["recall", "map"], False),    # the complete ranking (exact tiles)
    (["recall", "mrr"], True),     # leave-one-out: the queries are the gallery
])
def test_total_extra_memory_stays_within_the_budget_when_the_gallery_does_not_fit(metrics, leave_one_out):
    # 20,000 x 256-d: the unit copy alone would take 19.5 MiB, over twice the 8 MiB budget (leave-one-out:
    # 6,000 x 256-d, 5.9 MiB twice, the queries' and the sorted gallery's, over a 4 MiB budget). Everything the
    # call allocates (unit rows, label codes, positive lists, tiles) must stay under it.
    rng = np.random.default_rng(0)
    m, budget = (6_000, 4) if leave_one_out else (20_000, 8)
    g, gl = rng.normal(size=(m, 256)).astype(np.float32), rng.integers(0, 400, m)
    q, ql = (g, gl) if leave_one_out else (rng.normal(size=(300, 256)).astype(np.float32), rng.integers(0, 400, 300))
    peak = _peak_mib(lambda: retrieval_summary(q, g, ql, gl, ks=(1, 5), metrics=metrics, max_memory_mb=budget))
    print(f"peak {peak:.2f} MiB")
    assert peak <= budget, f"{peak:.1f} MiB allocated under a {budget} MiB budget"


def test_scoring_logs_progress_with_rate_and_time_left_when_not_a_terminal(caplog, monkeypatch):
    # One query run (200 queries) over 15 gallery tiles of 2,048 columns: the run reports each tile as it goes.
    monkeypatch.setattr(schedule_module, "_PROGRESS_INTERVAL", 0.0)  # a line at every update, not every 10 s
    rng = np.random.default_rng(0)
    q, g = rng.normal(size=(200, 16)).astype(np.float32), rng.normal(size=(30_000, 16)).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="recallk.score.ranking.schedule"):
        rank_positives(q, g, rng.integers(0, 9, 200), rng.integers(0, 9, 30_000), ranks=Pass.first())
    lines = [r.getMessage() for r in caplog.records if r.name == "recallk.score.ranking.schedule"]
    pattern = r"rank \(first positive\): (\d+)/15 tile \(\d+%\), [\d.]+ tile/s, (about \d+ s left|time left unknown)"
    assert all(re.fullmatch(pattern, line) for line in lines), lines
    assert [int(re.fullmatch(pattern, line).group(1)) for line in lines] == list(range(1, 15))  # none once done
