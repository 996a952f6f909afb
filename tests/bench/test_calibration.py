"""A short run of bench/compare_calibration.py's simulation: the tests and intervals hold their level.

The full run (4,000 nulls per scenario, docs/runs/compare_calibration.txt) checks [0.04, 0.06] and
[0.94, 0.96]; this one draws 600 nulls, so its bands are about three standard errors wide.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # the study lives beside its benchmark
import calibration  # noqa: E402

DESIGN = calibration.Design(labels=40, per_label=5, resamples=400, permutations=400)


@pytest.fixture(scope="module")
def rates():
    return calibration.null_rates(600, DESIGN, seed=3, batch=300)


@pytest.mark.parametrize("key", [
    "independent/query",    # independent differences: every analysis is valid
    "independent/label",
    "clustered/label",      # label-clustered differences: the label-level test is the valid one
    "clustered/two-level",  # (its test flips labels too)
])
def test_type_one_error_is_near_alpha_where_the_analysis_is_valid(rates, key):
    assert 0.025 <= rates[key]["type1"] <= 0.08


def test_the_query_level_analysis_is_optimistic_under_label_clusters(rates):
    assert rates["clustered/query"]["type1"] > 0.1 and rates["clustered/query"]["coverage"] < 0.88


@pytest.mark.parametrize("key, low, high", [
    ("independent/query", 0.92, 0.975),
    ("clustered/label", 0.91, 0.975),      # 40 labels: the percentile interval runs a little short
    ("independent/two-level", 0.92, 0.975),  # variance-matched: the within-label spread counted once
    ("clustered/two-level", 0.92, 0.975),
])
def test_bootstrap_coverage(rates, key, low, high):
    assert low <= rates[key]["coverage"] <= high


def test_predicted_power_and_mde_agree_with_simulation():
    rows = calibration.power_curve(300, DESIGN, multiples=(0.0, 2.0), seed=5, batch=300)
    for row in rows:
        assert abs(row["simulated"] - row["predicted"]) <= 0.09  # 300 draws: SE of a power near 0.5 is 0.029
    assert rows[-1]["at_mde"] and abs(rows[-1]["simulated"] - 0.8) <= 0.09
