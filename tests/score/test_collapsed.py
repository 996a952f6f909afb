"""Collapsed embeddings (a fine-tune that maps every image to one direction, or to one of two): most
similarities tie exactly, or lie closer than float32's error. The first-positive path then hands such a
query to the exact pass (more than ``HAND_OVER`` undecided cells, or near-best positives: re-scoring
pair by pair would cost seconds per thousand queries), and the exact pass splits the ties by gallery
index in a few passes per tile. The ranking still equals the brute-force oracle, those queries alone
are handed over, and the pairs re-scored one by one stay bounded."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from ranking_cases import _camera, assert_matches_oracle, case_oracle, case_summary, ranking_logs
from recallk.score.metrics import rank
from recallk.score.passes import Pass
from recallk.score.ranking import counting, positives
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import ScoreSettings

#: Small enough a budget that every case takes the tiles (not the direct path), in several tiles.
MB = 0.5


def collapsed_case(kind: str, leave_one_out: bool, exclude: bool, n: int = 150, m: int = 900, d: int = 32,
                   seed: int = 0) -> dict:
    """Retrieval kwargs whose gallery (and queries) have collapsed: ``identical`` (one vector), ``noise``
    (one direction plus 1e-6 noise: cosines within float32's error of each other), ``two_directions``
    (exactly +v or -v), ``half`` (half the rows collapsed, half random: only the collapsed queries tie)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=d)

    def rows(k: int) -> np.ndarray:
        x = np.tile(base, (k, 1))
        if kind == "noise":
            x += 1e-6 * rng.normal(size=(k, d))
        elif kind == "two_directions":
            x[rng.random(k) < 0.5] *= -1
        elif kind == "half":
            x[k // 2:] = rng.normal(size=(k - k // 2, d))
        else:
            assert kind == "identical"
        return x.astype(np.float32)

    g, gl = rows(m), rng.integers(0, 3, m)
    q, ql = (g, gl) if leave_one_out else (rows(n), rng.integers(0, 3, n))
    ids = list(range(m)) if leave_one_out else None
    cams = _camera(rng, m)
    pairs = [((cams if leave_one_out else _camera(rng, n)), cams)] if exclude else []
    return dict(query_emb=q, gallery_emb=g, query_labels=ql, gallery_labels=gl, query_ids=ids, gallery_ids=ids,
                exclude=pairs)


#: The metric sets, each through its own path: the first positive (the queries are handed to the exact pass),
#: the top-L pass, every rank (the exact pass splits the ties). One case, one oracle: the sets share it.
METRIC_SETS = (("recall",), ("recall", "mrr", "r_precision", "map@r"), None)


@pytest.mark.parametrize("kind, leave_one_out, exclude", [
    ("identical", False, False),      # every similarity one float32 value
    ("identical", True, True),        # leave-one-out, same-camera items excluded
    ("noise", False, True),           # cosines closer than the float32 error: every cell undecided
    ("noise", True, False),
    ("two_directions", False, False),  # two exact values, +1 and -1
    ("two_directions", True, True),
    ("half", False, False),           # half the queries collapsed: only they are handed over
    ("half", True, True),
])
def test_collapsed_embeddings_match_the_oracle(kind, leave_one_out, exclude):
    case = collapsed_case(kind, leave_one_out, exclude)
    expected, detail = case_oracle(case)
    for metrics in METRIC_SETS:
        assert_matches_oracle(case_summary(case, metrics=metrics, max_memory_mb=MB), expected)
    ranking = rank(RetrievalData(**case), ScoreSettings(metrics=("recall",), max_memory_mb=MB), Pass.first())
    np.testing.assert_array_equal(ranking.first_rank, [r[0] if r else -1 for r in detail["ranks"]])
    np.testing.assert_array_equal(ranking.first_rank_opposite, detail["opposite"])


def _handed(caplog) -> int:
    """Queries the first-positive path handed to the exact pass, from the engine's debug line (0 if none)."""
    lines = [line for line in ranking_logs(caplog) if "left the fast pass" in line]
    return sum(int(line.split()[0]) for line in lines)


@pytest.mark.parametrize("kind, leave_one_out, n_collapsed", [
    ("identical", False, 150),  # every query
    ("identical", True, 900),
    ("half", False, 75),        # the collapsed half of the queries: their gallery half ties (~450 cells)
    ("half", True, 450),
])
def test_only_the_collapsed_queries_are_handed_over(kind, leave_one_out, n_collapsed, caplog):
    """Every collapsed query, and of the others only the few whose best positive is a collapsed gallery row
    (the collapsed rows all tie with it, whatever the query)."""
    case = collapsed_case(kind, leave_one_out, exclude=False)
    with caplog.at_level(logging.DEBUG, logger="recallk.score.ranking.engine"):
        case_summary(case, metrics=("recall",), max_memory_mb=MB)
    n = len(case["query_labels"])
    assert n_collapsed <= _handed(caplog) <= n_collapsed + (n - n_collapsed) // 10


@pytest.mark.parametrize("leave_one_out", [False, True])
@pytest.mark.parametrize("cap", [None, 3])
def test_pairs_rescored_one_by_one_stay_bounded(monkeypatch, caplog, leave_one_out, cap):
    """At most HAND_OVER cells per query for its best positive and as many in the tiles, not n x m (the
    cost that made a collapsed 10,000 x 50,000 call take many minutes)."""
    rescored = []

    def counted(q, g, rows, cols):
        rescored.append(rows.size)
        return exact_pairs(q, g, rows, cols)

    exact_pairs = counting.exact_pairs
    monkeypatch.setattr(counting, "exact_pairs", counted)
    monkeypatch.setattr(positives, "exact_pairs", counted)
    n, m = 300, 1400
    case = collapsed_case("noise", leave_one_out, exclude=False, n=n, m=m)
    settings = ScoreSettings(metrics=("recall",), max_memory_mb=2)  # tiles, not the direct path
    with caplog.at_level(logging.DEBUG, logger="recallk.score.ranking.engine"):
        ranking = rank(RetrievalData(**case), settings, Pass.first(cap))
    assert "fast pass (first positive" in ranking_logs(caplog)[-1]  # the tiles, not the direct path
    queries = m if leave_one_out else n
    assert _handed(caplog) == queries
    assert sum(rescored) <= 2 * counting.HAND_OVER * queries < queries * m // 2
    every = rank(RetrievalData(**case), settings, Pass.every())  # the exact pass for all: the same first ranks
    most = m if cap is None else cap
    for got, want in ((ranking.first_rank, every.first_rank), (ranking.first_rank_opposite, every.first_rank_opposite)):
        np.testing.assert_array_equal(got, np.minimum(want, most))


def test_tie_splits_in_many_small_groups_of_rows(monkeypatch):
    """The exact pass's tie split, a few rows made again at a time (``_TIE_CELLS`` cut to one row's worth):
    the same ranking as in one piece, and the oracle's metrics, with two tied values per row and exclusions."""
    case = collapsed_case("two_directions", leave_one_out=True, exclude=True, m=400)
    settings = ScoreSettings(metrics=("map",), max_memory_mb=MB)
    whole = rank(RetrievalData(**case), settings, Pass.every())
    monkeypatch.setattr(counting, "_TIE_CELLS", 1)
    pieces = rank(RetrievalData(**case), settings, Pass.every())
    for field in ("n_positives", "offsets", "ranks", "first_rank_opposite"):
        np.testing.assert_array_equal(getattr(pieces, field), getattr(whole, field), err_msg=field)
    assert_matches_oracle(case_summary(case, metrics=None, max_memory_mb=MB), case_oracle(case)[0])
