"""recallk.score.passes: the engine's pass is one explicit value (Pass.first / top / every), checked when built,
and the engine computes exactly the ranks it names."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from recallk.score.passes import Pass, Ranks
from recallk.score.ranking import Budget, rank_positives


@pytest.mark.parametrize("build, message", [
    (lambda: Pass.first(0), "`cap` must be a positive integer. Got 0 instead."),        # nothing to stop at
    (lambda: Pass.first(2.5), "`cap` must be a positive integer. Got 2.5 instead."),    # not an integer
    (lambda: Pass.first(True), "`cap` must be a positive integer. Got True instead."),  # bools are not counts
    (lambda: Pass.top(0), "`depth` must be a positive integer. Got 0 instead."),        # not positive
    (lambda: Pass.top(True), "`depth` must be a positive integer"),                      # a bool is not a depth
    (lambda: Pass.top(2.5), "`depth` must be a positive integer"),                       # not an integer
    (lambda: Pass.top(3, cap=4), "`cap` must be at most `depth` (3). Got 4 instead."),   # a cap deeper than L
    (lambda: Pass(Ranks.EVERY, cap=3), "the complete ranking (Pass.every) is never capped"),  # every rank exact
    (lambda: Pass(Ranks.FIRST, depth=3), "only the top-L pass (Pass.top) has a `depth`"),   # no depth to cut at
    (lambda: Pass(Ranks.TOP), "the top-L pass (Pass.top) needs a `depth`"),
    (lambda: Pass("first"), "`ranks` must be a Ranks member. Got 'first' instead."),
])
def test_a_pass_is_checked_when_built(build, message):
    with pytest.raises(ValueError, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}"):
        build()


def test_pass_values():
    assert Pass.first() == Pass(Ranks.FIRST) and Pass.first().first_only
    assert Pass.top(np.int64(10), cap=5) == Pass(Ranks.TOP, 10, 5) and not Pass.top(10).first_only
    assert Pass.every() == Pass(Ranks.EVERY) and not Pass.every().first_only
    assert [repr(p) for p in (Pass.first(), Pass.first(3), Pass.top(10, cap=5), Pass.every())] == \
        ["Pass.first()", "Pass.first(cap=3)", "Pass.top(10, cap=5)", "Pass.every()"]
    assert Ranks.FIRST < Ranks.TOP < Ranks.EVERY  # the pass serving several metrics: the largest of their needs
    with pytest.raises(dataclasses.FrozenInstanceError):
        Pass.first().cap = 3


@pytest.mark.parametrize("ranks, complete, cap, has_depth", [
    (Pass.first(), False, None, False),        # one entry per query: its first positive's rank
    (Pass.first(2), False, 2, False),          # first ranks of 2 or more read 2
    (Pass.top(3), True, None, True),           # the positives within each query's first max(R, 3) ranks
    (Pass.every(), True, None, False),         # every positive
])
def test_the_engine_computes_the_ranks_its_pass_names(ranks, complete, cap, has_depth, monkeypatch):
    monkeypatch.setattr(Budget, "DIRECT_CELLS", 0)  # the tiles (the direct path gives every rank for a top pass)
    rng = np.random.default_rng(0)
    q, g = rng.normal(size=(30, 4)), rng.normal(size=(80, 4))
    ql, gl = rng.integers(0, 4, 30), rng.integers(0, 4, 80)
    got = rank_positives(q, g, ql, gl, ranks=ranks)
    every = rank_positives(q, g, ql, gl)
    assert (got.complete, got.cap, got.depth is not None) == (complete, cap, has_depth)
    np.testing.assert_array_equal(got.first_rank, every.first_rank if cap is None else
                                  np.minimum(every.first_rank, cap))
    if not complete:
        assert got.ranks.size == np.count_nonzero(every.n_positives)  # one rank per query with positives
    elif not has_depth:
        np.testing.assert_array_equal(got.ranks, every.ranks)
    else:  # within each query's depth only
        assert got.ranks.size < every.ranks.size
