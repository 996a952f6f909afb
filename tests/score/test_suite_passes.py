"""recallk.score.suite: the score stage's computation gives the same numbers and tables whichever ranking
pass its metrics pick (the top-L pass without full map, the complete ranking with it)."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest

from recallk.score.ranking import Budget
from recallk.score.settings import BootstrapSettings, FailureSettings, ScoreSettings
from recallk.score.suite import SplitSets, score_split

TOP = ["recall", "precision", "r_precision", "map@r", "mrr"]


def _split(leave_one_out: bool):
    """600 images of 25 clustered labels; 250 queries x 350 gallery items, or leave-one-out over 400."""
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 25, 600)
    emb = rng.normal(size=(25, 16))[labels] + 1.5 * rng.normal(size=(600, 16))
    emb[7] = 0.0  # an all-zero embedding ties every cell
    emb[11] = emb[12]  # an exact copy: ties by gallery index
    ids = np.array([f"img{i:03d}" for i in range(600)])
    catalog = pd.DataFrame({"label": [f"c{x}" for x in labels]}, index=pd.Index(ids, name="image_id"))
    row = pd.Series(np.arange(600), index=ids)
    queries, gallery = (ids[:400], ids[:400]) if leave_one_out else (ids[:250], ids[250:])
    return SplitSets(emb, row, queries, gallery, ids[400:], leave_one_out), catalog


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_score_split_numbers_do_not_depend_on_the_pass(leave_one_out, monkeypatch, caplog):
    monkeypatch.setattr(Budget, "DIRECT_CELLS", 0)  # the tiles, as on a real data set
    sets, catalog = _split(leave_one_out)
    common = dict(ks=(1, 5, 10), max_memory_mb=64, backend="numpy", exclude_same=(), whiten="none",
                  bootstrap=BootstrapSettings(resamples=50, confidence=0.95, seed=0), failures=FailureSettings(0, 0))
    with caplog.at_level(logging.DEBUG, logger="recallk.score.ranking.engine"):
        top, top_frames = score_split(sets, catalog, ScoreSettings(metrics=tuple(TOP), **common))
        full, full_frames = score_split(sets, catalog, ScoreSettings(metrics=(*TOP, "map"), **common))
    passes = [r.getMessage() for r in caplog.records if r.name == "recallk.score.ranking.engine"]
    assert "top-L pass" in passes[0] and "exact pass" in passes[-1]
    assert top == {k: v for k, v in full.items() if k != "map" and not k.startswith("map_")}  # map@r stays
    for name, frame in top_frames.items():
        other = full_frames[name]
        if name == "failures":  # the failure gallery's rows (none drawn here), not a frame
            assert frame == other == []
            continue
        pd.testing.assert_frame_equal(frame, other[[c for c in other.columns if c in frame.columns]], obj=name)
