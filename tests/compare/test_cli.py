"""recallk compare's decisions: verdict lines, gates with and without margins, exit codes, rendering."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from recallk.compare import cli, paired
from recallk.errors import InputError


def metric(delta: float, low: float, high: float, p_holm: float, mde: float = 0.01) -> dict:
    return {"delta": delta, "ci_low": low, "ci_high": high, "p_holm": p_holm, "mde": mde}


@pytest.mark.parametrize("spec, m, outcome", [
    ("map@r", metric(-0.02, -0.03, -0.01, 0.001), "worse"),          # plain: significantly worse
    ("map@r", metric(-0.02, -0.05, 0.01, 0.30), "pass"),             # plain: worse but not significant passes
    ("map@r:0.005", metric(-0.02, -0.05, 0.01, 0.30), "inconclusive"),  # the margin catches it: cannot tell
    ("map@r:0.005", metric(0.001, -0.004, 0.006, 0.70), "pass"),     # lower end -0.004 above -0.005
    ("map@r:0.005", metric(-0.002, -0.004, -0.001, 0.01), "pass"),   # significantly worse, but within the margin
    ("map@r:0.005", metric(-0.02, -0.03, -0.01, 0.001), "worse"),    # the whole interval below -0.005
    ("map@r:0", metric(0.01, 0.002, 0.02, 0.01), "pass"),            # margin 0: superiority's lower end
])
def test_gate_outcomes(spec, m, outcome):
    assert cli.gate({"metrics": {"map@r": m}}, spec, 0.05)["outcome"] == outcome


@pytest.mark.parametrize("outcomes, code", [
    ([], 0),                                  # no gate
    (["pass", "pass"], 0),
    (["pass", "inconclusive"], 3),
    (["inconclusive", "worse"], 1),           # worse wins over inconclusive
])
def test_exit_codes(outcomes, code):
    assert cli.exit_code([{"outcome": o} for o in outcomes]) == code


@pytest.mark.parametrize("spec, message", [
    ("map@r:-0.1", "margin >= 0"),       # a negative margin
    ("map@r:abc", "METRIC:MARGIN"),      # not a number
    ("map@r:nan", "METRIC:MARGIN"),      # not finite
    (":0.1", "METRIC:MARGIN"),           # no metric
])
def test_bad_gates_are_refused(spec, message):
    with pytest.raises(InputError, match=message):
        cli.parse_gate(spec)


@pytest.mark.parametrize("m, want", [
    (metric(0.041, 0.02, 0.06, 0.001), "B better on recall@1: +0.0410 [+0.0200, +0.0600], Holm p 0.0010"),
    (metric(-0.041, -0.06, -0.02, 0.001), "B worse on recall@1: -0.0410 [-0.0600, -0.0200], Holm p 0.0010"),
    (metric(0.002, -0.008, 0.012, 0.6, 0.015),
     "recall@1: no detectable difference: the interval allows -0.0080 to +0.0120 (Holm p 0.6000; "
     "detectable at 80% power: ±0.0150)"),
])
def test_verdict_lines(m, want):
    assert cli.verdict("recall@1", m, 0.05) == want


def test_no_difference_on_any_query_is_said_so_and_has_no_mde():
    m = {**metric(0.0, 0.0, 0.0, 1.0, 0.0), "wins": 0, "ties": 5, "losses": 0}
    assert cli.verdict("recall@5", m, 0.05) == "recall@5: the same on every query"


def write(path, hits: list[int], aps: list[float], labels: list[str]) -> str:
    n = len(hits)
    pd.DataFrame({"image_id": [f"q{i:03d}" for i in range(n)], "label": labels, "num_positives": "2",
                  "num_retrievable": "9", "hit@1": [float(h) for h in hits], "ap": aps}).to_csv(path, index=False)
    return str(path)


def test_cli_margins_exit_codes_and_rendering(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n = 60
    labels = [f"l{i % 6}" for i in range(n)]
    hits = rng.integers(0, 2, n).tolist()
    aps = rng.random(n).round(4).tolist()
    a = write(tmp_path / "a.csv", hits, aps, labels)
    b = write(tmp_path / "b.csv", hits, [x + 0.001 * (i % 3 - 1) for i, x in enumerate(aps)], labels)
    small = ["--resamples", "500", "--permutations", "500"]
    # B equals A on recall@1 (every difference 0): the margin passes; d_z of all-zero differences is 0
    assert cli.main([a, b, "--fail-if-worse", "recall@1:0.01", *small]) == 0
    # a margin far tighter than the noise of map: inconclusive, exit 3, said on stderr
    code = cli.main([a, b, "--fail-if-worse", "map:0.00001", "--by", "two-level", "--delta", "0.05",
                     "--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md"), *small])
    out, err = capsys.readouterr()
    assert code == 3 and "inconclusive: cannot tell whether B is worse by more than the margin 1e-05 on map" in err
    assert "resampling labels, then queries within labels (two-level)" in out and "queries for Δ=0.05" in out
    md = (tmp_path / "r.md").read_text()
    assert "querys" not in md and "- **inconclusive**" in md and "two-level" in md
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["gates"][0]["outcome"] == "inconclusive" and result["by"] == "two-level"
    assert result["draws"]["units"] == 6 and result["metrics"]["map"]["queries_needed"] >= 1
    assert cli.main([a, b, "--fail-if-worse", "map:-1", *small]) == 2  # bad margin: input error


def test_undefined_d_z_is_printed_as_undefined():
    a = pd.DataFrame({"image_id": ["q0", "q1", "q2"], "label": "x", "num_positives": "1", "num_retrievable": "5",
                      "hit@1": ["0.0", "0.0", "0.0"]})
    b = a.assign(**{"hit@1": ["1.0", "1.0", "1.0"]})  # every difference +1: no spread, d_z unbounded
    result = paired.compare(a, b, paired.CompareSettings(resamples=50, permutations=50))
    assert result["metrics"]["recall@1"]["dz"] is None
    assert cli.rows(result)[0][8] == "undefined"


def test_draws_are_capped_and_reported(caplog):
    n = 3000
    a = pd.DataFrame({"image_id": [f"q{i}" for i in range(n)], "label": "x", "num_positives": "1",
                      "num_retrievable": "5", "hit@1": (np.arange(n) % 2).astype(float)})
    b = a.assign(**{"hit@1": (np.arange(n) % 3 == 0).astype(float)})
    result = paired.compare(a, b, paired.CompareSettings(resamples=5000, permutations=5000, max_draws=3_000_000))
    assert result["draws"]["resamples"] == 1000 and result["draws"]["resamples_asked"] == 5000
    assert "capped from 5,000" in cli.draws_line(result) and "resamples capped at 1000 of 5000" in caplog.text
