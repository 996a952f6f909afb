"""score.engine: ray (recallk.score.ranking.ray_tiles): the engine's tile jobs on the session's real
local Ray cluster give the local engine's ranking, array for array: query x gallery and leave-one-out,
every positive and the first one (with and without a cap), exact ties, exclusions, chunks of queries."""

from __future__ import annotations

import numpy as np
import pytest

from recallk.score.metrics import rank
from recallk.score.passes import Pass
from recallk.score.ranking import rank_positives
from recallk.score.ranking.ray_tiles import RayTiles
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import RaySettings, ScoreSettings

pytestmark = pytest.mark.ray


def tied_problem(n: int, m: int, d: int, leave_one_out: bool, seed: int = 0):
    """Small integer vectors (many exact ties), 4 labels, a camera column for exclusions."""
    rng = np.random.default_rng(seed)
    g = rng.integers(-1, 2, size=(m, d)).astype(np.float32)
    g[~g.any(axis=1), 0] = 1.0  # no all-zero vector
    g_lab = rng.integers(0, 4, size=m)
    g_ids = np.array([f"g{i}" for i in range(m)])
    g_cam = rng.integers(0, 3, size=m)
    if leave_one_out:
        return g, g, g_lab, g_lab, g_ids, g_ids, g_cam, g_cam
    q = rng.integers(-1, 2, size=(n, d)).astype(np.float32)
    q[~q.any(axis=1), 0] = 1.0
    q[:10] = g[:10]  # some queries tie exactly with gallery items
    return q, g, rng.integers(0, 4, size=n), g_lab, None, None, rng.integers(0, 3, size=n), g_cam


def assert_same_ranking(got, want):
    for name in ("n_positives", "n_retrievable", "offsets", "ranks", "first_rank_opposite"):
        a, b = np.asarray(getattr(got, name)), np.asarray(getattr(want, name))
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name
    assert (got.complete, got.cap) == (want.complete, want.cap)


@pytest.mark.parametrize("leave_one_out, complete, cap, exclude, mb, passes", [
    # a 0.02 MB budget makes the smallest tiles: many jobs a pass (first positive with the gallery read per
    # tile: taller query runs, fewer jobs), shared by the 3 tasks
    (False, True, None, False, 0.02, 1),  # query x gallery, every positive
    (False, False, None, True, 0.02, 1),  # first positive, exclude_same (camera)
    (False, False, 3, False, 0.02, 1),    # first positive with a cap: each task stops counting on its own
    (True, True, None, True, 0.02, 1),    # leave-one-out: tiles on and above the diagonal, with exclusions
    (True, False, None, False, 0.02, 1),  # leave-one-out, first positive
    (True, False, 2, True, 0.02, 1),      # leave-one-out, capped, exclusions
    (False, True, None, False, 0.4, 4),   # every positive in chunks of queries (the lists exceed the budget)
    (False, True, None, False, 512, 1),   # small enough for the local direct path: Ray's tiles agree with it
])
def test_ray_ranking_byte_identical_to_local(ray_cluster, leave_one_out, complete, cap, exclude, mb, passes):
    q, g, q_lab, g_lab, q_ids, g_ids, q_cam, g_cam = tied_problem(230, 410, 6, leave_one_out)
    pairs = [(q_cam, g_cam)] if exclude else []
    args = (q, g, q_lab, g_lab)
    options = dict(query_ids=q_ids, gallery_ids=g_ids, exclude=pairs, same_set=leave_one_out or None,
                   ranks=Pass.every() if complete else Pass.first(cap), max_memory_mb=mb)
    want = rank_positives(*args, **options)
    tiles = RayTiles(shares=3)
    got = rank_positives(*args, **options, count_tiles=tiles)
    assert_same_ranking(got, want)
    assert tiles.passes >= passes and (tiles.jobs >= 3 or mb == 512)  # the work was really split: a job per task
    assert (want.first_rank != want.first_rank_opposite).any()  # the data really has ties that matter


def test_ray_engine_through_rank_and_the_stage_param(ray_cluster):
    q, g, q_lab, g_lab, _, _, q_cam, g_cam = tied_problem(120, 150, 5, False, seed=1)
    exclude = [(q_cam, g_cam)]
    data = RetrievalData(q, g, q_lab, g_lab, exclude=exclude)
    local = rank(data, ScoreSettings(max_memory_mb=1))
    remote = rank(data, ScoreSettings(max_memory_mb=1, engine="ray", ray=RaySettings(num_cpus=1)))
    assert_same_ranking(remote, local)


def test_ray_engine_serves_the_top_metrics_with_the_complete_ranking(ray_cluster, monkeypatch):
    # Without full map the local engine takes its top-L pass (tiles forced: no direct path); on Ray the tiles
    # are the complete ranking's, and a cap given with the depth (no mrr) changes nothing: the same numbers
    from recallk.score.metrics import summarize
    from recallk.score.ranking import Budget

    monkeypatch.setattr(Budget, "DIRECT_CELLS", 0)
    q, g, q_lab, g_lab, _, _, q_cam, g_cam = tied_problem(120, 150, 5, False, seed=2)
    names, ks = ["recall", "precision", "r_precision", "map@r"], (1, 5)
    data, settings = RetrievalData(q, g, q_lab, g_lab, exclude=[(q_cam, g_cam)]), ScoreSettings(ks=ks, metrics=names,
                                                                                                max_memory_mb=1)
    local = rank(data, settings, Pass.top(5, cap=5))
    remote = rank(data, ScoreSettings(ks=ks, metrics=names, max_memory_mb=1, engine="ray", ray=RaySettings(num_cpus=1)),
                  Pass.top(5, cap=5))
    assert local.depth is not None and remote.depth is None and remote.cap is None
    assert summarize(remote, settings)[0] == summarize(local, settings)[0]


@pytest.mark.parametrize("leave_one_out, cap", [(False, None), (True, None), (True, 3)])
def test_ray_tasks_hand_collapsed_queries_to_the_exact_pass(ray_cluster, leave_one_out, cap):
    """Collapsed embeddings (one direction for half the rows): each task hands the queries whose cells mostly
    tie to the exact pass on its own; the driver takes every task's, and the ranking is the local one's."""
    rng = np.random.default_rng(3)
    g = rng.normal(size=(1200, 8)).astype(np.float32)
    g[:1000] = g[0]  # collapsed: 1,000 identical rows, each tied with ~750 non-positives, ~375 in each task
    g_lab = rng.integers(0, 4, size=1200)
    q, q_lab = (g, g_lab) if leave_one_out else (np.vstack([g[:150], g[1000:]]), rng.integers(0, 4, size=350))
    ids = [f"g{i}" for i in range(1200)] if leave_one_out else None
    options = dict(query_ids=ids, gallery_ids=ids, same_set=leave_one_out or None, ranks=Pass.first(cap),
                   max_memory_mb=0.2)
    want = rank_positives(q, g, q_lab, g_lab, **options)
    tiles = RayTiles(shares=2)
    got = rank_positives(q, g, q_lab, g_lab, **options, count_tiles=tiles)
    assert_same_ranking(got, want)
    assert tiles.passes >= 2  # the first-positive pass, then the exact pass for the handed queries


def test_a_task_skips_the_queries_the_driver_already_handed_over():
    """count_share, called here as a task would run it: the queries whose positives crowd their best (marked by
    the driver's find_positives) hold placeholder thresholds, so the task must not count them at all."""
    from dataclasses import replace

    from recallk.score.ranking.budget import Budget
    from recallk.score.ranking.positives import find_positives
    from recallk.score.ranking.problem import Problem
    from recallk.score.ranking.ray_tiles import count_share

    rng = np.random.default_rng(4)
    g = rng.normal(size=(900, 8)).astype(np.float32)
    g[:600] = g[0]  # label 0's 600 items and the first 100 queries are one vector: 600 positives tie the best
    g_lab = np.r_[np.zeros(600, dtype=int), rng.integers(1, 4, 300)]
    q = np.vstack([g[:100], rng.normal(size=(100, 8)).astype(np.float32)])
    q_lab = np.r_[np.zeros(100, dtype=int), rng.integers(1, 4, 100)]
    p = Problem.build(RetrievalData(q, g, q_lab, g_lab), unit_bytes=Budget(512.0).unit_bytes())
    budget = Budget(0.2)
    crowded = np.zeros(200, dtype=bool)
    off, val, col, _, _ = find_positives(p, budget, first_only=True, crowded=crowded)
    assert crowded[:100].all() and not crowded[100:].any()
    rest = replace(p, gp=np.empty((0, p.gp.shape[1]), dtype=p.gp.dtype))
    gt, eq_lt, eq_gt, handed, jobs, _ = count_share(rest, p.gp, (off, val, col, crowded), budget.tiles(0, val.size),
                                                    Pass.first(), 0, 1, 1)
    assert jobs > 1 and handed[:100].all()
    assert not gt[off[:100]].any() and not eq_lt[off[:100]].any()  # never counted against a placeholder
    assert gt[off[100:200]].any()  # the others were
