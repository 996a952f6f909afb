"""recallk.stats.resample: the bootstrap behind the score stage's intervals and recallk compare."""

from __future__ import annotations

import numpy as np
import pytest

from recallk.score import tables
from recallk.stats.resample import CELLS, bootstrap_means


def test_query_resamples_are_the_seeded_draws_of_queries():
    v = np.random.default_rng(0).random(50)
    means = bootstrap_means({"a": v}, resamples=300, seed=4)["a"]
    idx = np.random.default_rng(4).integers(0, 50, size=(300, 50))  # one chunk at this size
    np.testing.assert_array_equal(means, np.clip(v[idx].mean(axis=1), v[idx].min(axis=1), v[idx].max(axis=1)))


def test_draws_in_chunks_equal_one_draw(monkeypatch):
    v = np.random.default_rng(1).random(40)
    whole = bootstrap_means({"a": v}, resamples=97, seed=2)["a"]
    monkeypatch.setattr("recallk.stats.resample.CELLS", 40 * 5)  # 5 resamples per chunk
    assert CELLS > 40 * 97
    np.testing.assert_array_equal(bootstrap_means({"a": v}, resamples=97, seed=2)["a"], whole)


def test_label_resamples_take_whole_labels():
    # label x: two queries worth 1; label y: one query worth 0. A resample of labels [x, y] has mean 2/3,
    # [x, x] 1, [y, y] 0: the query bootstrap would give any mean k/3.
    v = np.array([1.0, 1.0, 0.0])
    means = bootstrap_means({"a": v}, resamples=400, seed=0, groups=np.array(["x", "x", "y"]))["a"]
    assert set(np.round(means, 12)) <= {0.0, round(2 / 3, 12), 1.0}
    assert {0.0, 1.0} <= set(means)


def test_label_unit_widens_the_interval_when_labels_are_correlated():
    rng = np.random.default_rng(3)
    labels = np.repeat([f"l{i}" for i in range(10)], 30)
    values = np.repeat(rng.random(10), 30)  # every query of a label has its label's value
    by_query = tables.bootstrap_ci({"m": values}, 500, 0.95, 0)
    by_label = tables.bootstrap_ci({"m": values}, 500, 0.95, 0, unit="label", labels=labels)
    assert by_label["m_ci_high"] - by_label["m_ci_low"] > 3 * (by_query["m_ci_high"] - by_query["m_ci_low"])


@pytest.mark.parametrize("unit", ["query", "label"])
def test_a_constant_metric_resamples_to_itself(unit):
    values = np.full(9, 0.7)
    ci = tables.bootstrap_ci({"m": values}, 200, 0.95, 1, unit=unit, labels=list("aaabbbccc"))
    assert ci == {"m_ci_low": 0.7, "m_ci_high": 0.7}
