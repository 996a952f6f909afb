"""The top-L pass (recallk/score/ranking/top.py) against the brute-force oracle and the complete ranking:
every metric it serves, the ranks within each query's first L, first ranks and tie sensitivity, through
each of its routes (candidates pruned, queries too deep or overflowing, first ranks beyond L)."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
from hypothesis import assume, given

from ranking_cases import (
    BIG_KINDS,
    KS,
    PROPERTY,
    assert_matches_oracle,
    assert_scratch_within_budget,
    case_oracle,
    make_big_case,
    make_case,
    rank_case,
    ranking_logs,
)
from ranking_strategies import integer_problems
from recallk.score import metrics as metrics_module
from recallk.score.metrics import METRICS, metric_keys, per_query, retrieval_metrics
from recallk.score.passes import Pass
from recallk.score.ranking import Budget, Problem
from recallk.score.ranking import engine as ranking
from recallk.score.ranking import top as top_module
from recallk.score.ranking.problem import UnitRows
from recallk.score.ranking.schedule import threads
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import ScoreSettings

#: The metrics the top-L pass serves (everything but full map).
TOP_METRICS = ["recall", "precision", "r_precision", "map@r", "mrr"]
TOP_KEYS = metric_keys(TOP_METRICS, KS)
DEPTH = max(KS)
ROUTE_KINDS = BIG_KINDS + ["near_ties", "duplicates", "zero_rows", "exclude_two_pairs", "leave_one_out_exclude"]


#: The pass's own depth rule, read before the fixture below widens it.
DEFAULT_DEPTH_SHARE = Budget.TOP_DEPTH_SHARE


@pytest.fixture(autouse=True)
def _tiles_for_every_depth(monkeypatch):
    """Every test here takes the tiles (no direct path), and the pass serves every depth: its share of the
    gallery (Budget.TOP_DEPTH_SHARE, a speed rule) would send most of these small cases to the complete
    ranking."""
    monkeypatch.setattr(Budget, "DIRECT_CELLS", 0)
    monkeypatch.setattr(Budget, "TOP_DEPTH_SHARE", 1.0)


def _case(kind, seed=0):
    return make_big_case(kind, seed) if kind in BIG_KINDS else make_case(kind, seed)


def _top_logs(caplog) -> list[str]:
    return [line for line in ranking_logs(caplog) if "top-L pass" in line]


def _route_counts(line: str) -> dict[str, int]:
    """The log note's counts: queries served by the pass, by the complete ranking, first ranks beyond L."""
    found = re.search(r"(\d+) served, (\d+) by the complete ranking \((\d+) overflowed\), (\d+) first", line)
    return dict(zip(("served", "deep", "overflow", "beyond"), (int(x) for x in found.groups())))


def _assert_cut_of(top, full, depth=DEPTH):
    """``top`` (a depth ranking) is ``full`` (the complete ranking) cut at each query's depth."""
    assert top.depth is not None and full.depth is None
    np.testing.assert_array_equal(top.n_positives, full.n_positives)
    np.testing.assert_array_equal(top.n_retrievable, full.n_retrievable)
    np.testing.assert_array_equal(top.first_rank, full.first_rank)
    np.testing.assert_array_equal(top.first_rank_opposite, full.first_rank_opposite)
    for i in range(full.n_positives.size):
        every = full.ranks[full.offsets[i]:full.offsets[i + 1]]
        np.testing.assert_array_equal(top.ranks[top.offsets[i]:top.offsets[i + 1]], every[every < top.depth[i]])
        assert top.depth[i] == min(max(full.n_positives[i], depth), full.n_retrievable[i])


@pytest.mark.parametrize("route", ["pruned", "deep", "overflow", "capped"])
def test_every_route_of_the_top_pass_gives_the_complete_rankings_numbers(route, monkeypatch, caplog):
    # Each route is forced on every case, and shown taken by the engine's log note:
    memory, depth, cap, ks = 512, max(KS), None, KS
    if route == "pruned":  # 3-column tiles: thresholds from pruned buffers, not from one first tile
        monkeypatch.setattr(top_module, "TILE_WIDTH", 3)
    elif route == "deep":  # no query shallow enough: the complete ranking, cut at each query's L
        monkeypatch.setattr(Budget, "TOP_DEPTH_SHARE", 0.0)
    elif route == "overflow":  # one thread, 2-column tiles, buffers of a few rows that may not grow: the
        monkeypatch.setattr(top_module, "TILE_WIDTH", 2)  # rows whose cells tie (zero rows, copies) overflow
        memory, depth, ks = 0.003, 2, (1, 2)
    else:  # first ranks beyond L are not re-ranked by the fast path: they read the cap
        depth, cap, ks = 2, 2, (1, 2)
    names = ["recall", "precision", "r_precision", "map@r"] + ([] if cap else ["mrr"])
    seen = {"served": 0, "deep": 0, "overflow": 0, "beyond": 0}
    with threads(1):
        for kind in ROUTE_KINDS:
            case = _case(kind)
            full = rank_case(case, TOP_METRICS, max_memory_mb=memory)
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger="recallk.score.ranking.engine"):
                top = rank_case(case, names, ranks=Pass.top(depth, cap), max_memory_mb=memory)
            for name, count in _route_counts(_top_logs(caplog)[0]).items():
                seen[name] += count
            if cap is None:
                _assert_cut_of(top, full, depth)
            else:  # first ranks of cap or more read cap; everything else as the complete ranking's
                np.testing.assert_array_equal(top.first_rank, np.minimum(full.first_rank, cap))
                np.testing.assert_array_equal(top.first_rank_opposite, np.minimum(full.first_rank_opposite, cap))
            settings = ScoreSettings(ks=ks, metrics=tuple(names))
            assert metrics_module.summarize(top, settings)[0] == metrics_module.summarize(full, settings)[0]
    taken = {"pruned": "served", "deep": "deep", "overflow": "overflow", "capped": "beyond"}[route]
    assert seen[taken] > 0, seen


@pytest.mark.parametrize("memory", [1e-6, 0.02, 512])  # one-row runs (every query too deep); a few runs; one
@pytest.mark.parametrize("kind", ROUTE_KINDS)
def test_memory_bound_never_changes_a_top_number(kind, memory, monkeypatch):
    case = _case(kind)
    _assert_cut_of(rank_case(case, TOP_METRICS, ranks=Pass.top(max(KS)), max_memory_mb=memory),
                   rank_case(case, TOP_METRICS, max_memory_mb=512))


def test_few_large_labels_take_the_complete_ranking_by_the_default_rule(monkeypatch, caplog):
    # Two labels of about 450 gallery items each (L = R, far over a twentieth of the gallery) and 40 small
    # labels: the large ones' queries go to the complete ranking, cut at L, the small ones' to the pass
    monkeypatch.setattr(Budget, "TOP_DEPTH_SHARE", DEFAULT_DEPTH_SHARE)
    rng = np.random.default_rng(2)
    gl = np.r_[np.zeros(450, int), np.ones(450, int), rng.integers(2, 42, 600)]
    ql = np.r_[np.zeros(30, int), np.ones(30, int), rng.integers(2, 42, 140)]
    g, q = rng.normal(size=(gl.size, 6)), rng.normal(size=(ql.size, 6))
    with caplog.at_level(logging.DEBUG, logger="recallk.score.ranking.engine"):
        top = ranking.rank_positives(q, g, ql, gl, ranks=Pass.top(10))
    counts = _route_counts(_top_logs(caplog)[0])
    assert counts["deep"] == 60 and counts["served"] == 140
    _assert_cut_of(top, ranking.rank_positives(q, g, ql, gl), 10)


def test_a_gallery_read_when_needed_takes_tall_runs_in_blocks(monkeypatch):
    # A gallery whose unit copy does not fit a quarter of the budget is normalised tile by tile (UnitRows); a
    # run then holds several blocks of rows (here 4-row blocks, 16-column tiles) for each tile read
    monkeypatch.setattr(Budget, "TOP_MAX_ROWS", 4)
    monkeypatch.setattr(top_module, "TILE_WIDTH", 16)
    rng = np.random.default_rng(1)
    q, g = rng.normal(size=(300, 8)), rng.normal(size=(3000, 8))
    ql, gl = rng.integers(0, 100, 300), rng.integers(0, 100, 3000)
    assert isinstance(Problem.build(RetrievalData(q, g, ql, gl), unit_bytes=Budget(0.4).unit_bytes()).gp, UnitRows)
    made = []
    monkeypatch.setattr(top_module.TopWorker, "query_run", _recording(top_module.TopWorker.query_run, made))
    top = ranking.rank_positives(q, g, ql, gl, ranks=Pass.top(10), max_memory_mb=0.4)
    assert max(made) > Budget.TOP_MAX_ROWS  # runs taller than a block
    _assert_cut_of(top, ranking.rank_positives(q, g, ql, gl), 10)


def _recording(method, sizes: list):
    """``method`` of a worker, recording the size of each run it is given."""
    def run(self, rows):
        sizes.append(rows.size)
        return method(self, rows)
    return run


@pytest.mark.parametrize("metrics, ks", [(["map"], (1,)),              # full map needs every positive's rank
                                         (["precision"], (1, 50))])    # precision@50 beyond a depth of 5
def test_a_top_ranking_serves_only_what_its_depth_holds(metrics, ks, monkeypatch):
    rng = np.random.default_rng(0)
    g, gl = rng.normal(size=(80, 4)), rng.integers(0, 20, 80)
    top = ranking.rank_positives(g[:10], g, gl[:10], gl, ranks=Pass.top(5))
    assert (top.depth < 50).any()
    with pytest.raises(ValueError, match="top of each query's ranking"):
        per_query(top, ScoreSettings(ks=ks, metrics=tuple(metrics)))


@pytest.mark.parametrize("names, path", [
    (["recall", "precision", "r_precision", "map@r"], "top-L pass"),  # the metric-learning suite
    (["recall", "mrr"], "fast pass"),                                   # first positive only
    (METRICS, "exact pass"),                                            # full map: every positive
])
def test_the_cheapest_pass_that_serves_the_metrics_is_taken(names, path, monkeypatch, caplog):
    case = make_big_case("big_query_gallery", 0)
    with caplog.at_level(logging.DEBUG, logger="recallk.score.ranking.engine"):
        got = retrieval_metrics(ks=KS, metrics=names, **case)
    assert path in ranking_logs(caplog)[0]
    expected, _ = case_oracle(case)
    assert_matches_oracle(got, {key: expected[key] for key in got})


def test_top_pass_scratch_stays_under_the_budget(monkeypatch):
    # 2,000 x 2,000 cells with 40 labels (L = 50): tiles and candidate buffers on each core stay within the
    # budget
    rng = np.random.default_rng(0)
    q, g = rng.normal(size=(2000, 32)).astype(np.float32), rng.normal(size=(2000, 32)).astype(np.float32)
    ql, gl = rng.integers(0, 40, 2000), rng.integers(0, 40, 2000)

    assert_scratch_within_budget(lambda mb: ranking.rank_positives(q, g, ql, gl, ranks=Pass.top(10), max_memory_mb=mb),
                                 "top-pass scratch")


@PROPERTY
@given(case=integer_problems())
def test_property_top_pass_is_the_complete_ranking_cut_at_its_depth(case):
    # integer embeddings: exact ties everywhere, zero rows, ids and exclusions
    assume(set(case["query_labels"]) & set(case["gallery_labels"]))  # else an error (tests/score/test_properties.py)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Budget, "DIRECT_CELLS", 0)
        patch.setattr(Budget, "TOP_DEPTH_SHARE", 1.0)
        top = rank_case(case, TOP_METRICS, ranks=Pass.top(max(KS)))
        full = rank_case(case, TOP_METRICS)
    _assert_cut_of(top, full)
