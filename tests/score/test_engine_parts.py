"""The engine's parts: the Budget's rules, Problem.build and same_set, the direct path against the tiles."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

from ranking_cases import (
    BIG_KINDS,
    KINDS,
    LOO_KINDS,
    MIB,
    assert_same_ranking,
    make_big_case,
    make_case,
    rank_case,
    ranking_logs,
    tile_count,
)
from recallk.errors import InputError
from recallk.score.metrics import METRICS
from recallk.score.ranking import Budget, Problem
from recallk.score.ranking import engine as ranking
from recallk.score.retrieval_data import RetrievalData


@pytest.mark.parametrize("mb, rule, args, expected", [
    (1, "label_rows", (1024,), 42),                # 2**20 B at 24 B per cell of a 1,024-column label
    (1e-6, "label_rows", (1024,), 1),              # never below one row
    (1, "chunk_positives", (), 5041),              # a quarter of 2**20 B at 52 B per positive
    (1e-9, "chunk_positives", (), 1),              # never below one positive
    (3, "tiles", (MIB, 0), 1.6),                   # 80% of the 2 MiB left after 1 MiB of unit copies
    (4, "tiles", (0, 2**16), 1.0),                 # 3.25 MiB of lists leave 0.75 MiB: the floor, a quarter
    (1, "fast_tile_cells", (2, 2**20), 65536),     # 3/4 of each core's 2**19 B at 6 B per cell
    (1, "fast_tile_side", (2, 16), 1024),          # 1/4 of each core's 2**19 B for two float32 sides of d = 16
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


@pytest.mark.parametrize("kind", ["exclude_two_pairs", "leave_one_out_exclude", "grid"])
def test_smaller_budget_tiles_never_change_a_number(kind, monkeypatch, caplog):
    # Without the MIN_PAIRS floor the smallest budget makes one-cell tiles: the drivers ask the Budget.
    case = make_case(kind, 0)
    for names in (METRICS, ["recall"]):
        with caplog.at_level(logging.DEBUG, logger="recallk.score.ranking.engine"):
            caplog.clear()
            expected = rank_case(case, names, max_memory_mb=1e-6)
            monkeypatch.setattr(Budget, "MIN_PAIRS", 1)
            got = rank_case(case, names, max_memory_mb=1e-6)
            monkeypatch.undo()
        before, after = ranking_logs(caplog)
        assert tile_count(after) > tile_count(before), (before, after)
        assert_same_ranking(got, expected)


@pytest.mark.parametrize("kind, same_set", [("leave_one_out", True),         # same vectors, labels and ids
                                            ("leave_one_out_exclude", True),  # and the same exclusion values
                                            ("same_set_no_ids", True),        # no ids on either side
                                            ("same_set_other_exclusions", False),  # other exclusion values
                                            ("partial_overlap", False)])      # some queries are gallery items
def test_problem_detects_the_same_set(kind, same_set):
    problem = Problem.build(RetrievalData(**make_case(kind, 0)))
    assert problem.same_set is same_set
    assert problem.queries(np.arange(3)).same_set is False  # a chunk of queries is never the gallery


@pytest.mark.parametrize("kind, same_set", [(k, True) for k in LOO_KINDS]      # the score stage's leave_one_out
                         + [(k, False) for k in LOO_KINDS + ["same_set_no_ids"]])  # a symmetric case as query x gallery
def test_explicit_same_set_gives_the_ranks_of_detection(kind, same_set, caplog):
    # same_set=True takes the path detection takes; False multiplies every tile: the same ranks either way.
    case = make_case(kind, 0)
    for names in (METRICS, ["recall"]):
        with caplog.at_level(logging.DEBUG, logger="recallk.score.ranking.engine"):
            caplog.clear()
            detected = rank_case(case, names)
            explicit = rank_case(case, names, same_set=same_set)
        assert ["leave-one-out" in line for line in ranking_logs(caplog)] == [True, same_set]
        assert_same_ranking(explicit, detected)


ROW_FOR_ROW = "`same_set=True` needs the queries to be the gallery row for row"


@pytest.mark.parametrize("change, message", [
    ({"query_ids": [f"q{j}" for j in range(29)]}, ROW_FOR_ROW),              # other ids
    ({"query_ids": [f"img{j:03d}" for j in range(29)][::-1]}, ROW_FOR_ROW),  # the same ids in another order
    ({"query_ids": None, "gallery_ids": None}, ROW_FOR_ROW),                 # no ids to match the rows by
    ({"gallery_ids": None}, "pass both `query_ids` and `gallery_ids`"),      # ids on one side only: refused first
])
def test_same_set_true_needs_the_gallery_row_for_row(change, message):
    case = dict(make_case("leave_one_out", 0), **change)
    with pytest.raises(InputError, match=re.escape(message)):
        ranking.rank_positives(**case, same_set=True)


def _long_tail_case(seed):
    """Labels from 1 to 300 items (a long tail), quantised rows (exact ties) and a camera exclusion: stacks of
    many sizes, padded rows and columns, and one label too large to stack."""
    rng = np.random.default_rng(seed)
    sizes = np.r_[1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 300]
    gl = np.repeat(np.arange(sizes.size), sizes)
    g = np.round(rng.normal(size=(gl.size, 8)) * 2).astype(np.float32)  # few distinct values: many ties
    pick = rng.choice(gl.size, 150, replace=False)
    cams = rng.choice(np.array(["a", "b", "c"], dtype=object), gl.size)
    return dict(query_emb=g[pick], gallery_emb=g, query_labels=gl[pick], gallery_labels=gl,
                query_ids=pick.tolist(), gallery_ids=list(range(gl.size)), exclude=[(cams[pick], cams)])


@pytest.mark.parametrize("kind", [*KINDS, *BIG_KINDS, "long_tail"])
@pytest.mark.parametrize("mb, held", [(512, True),   # everything held, big stacks
                                      (1e-3, False)])  # one label a stack, rows normalised when read
def test_stacked_small_labels_give_the_positives_of_one_product_per_run(kind, mb, held, monkeypatch):
    # The first-positive lists (best positive, its last exact tie, the counts) of the stacked products
    # (_stacked_best) must equal, bit for bit, those of one product per run of labels (_best_positives),
    # which every label takes when none counts as small.
    from recallk.score.ranking import positives

    case = _long_tail_case(0) if kind == "long_tail" else \
        make_big_case(kind, 1) if kind in BIG_KINDS else make_case(kind, 1)
    p = Problem.build(RetrievalData(**case), unit_bytes=None if held else 0)
    stacked = positives.find_positives(p, Budget(mb), first_only=True)
    assert positives._small_labels(p).any()
    monkeypatch.setattr(positives, "_POSITIVE_CELLS", 0)  # no label is small: one product per label
    assert not positives._small_labels(p).any()
    alone = positives.find_positives(p, Budget(mb), first_only=True)
    for got, want in zip(stacked, alone):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
