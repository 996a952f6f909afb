"""The score stage's report tables and intervals (stages/score.py), which depended on what things are called
(the hostile corpus of issue 25, part 4).

* ``silent`` — bootstrap intervals moved when files were renamed (the resamples drew queries in catalog
  order, i.e. by file name); now they draw in content order (sha256, then image_id).
* ``injection`` — labels and ids beginning with ``=``, ``+``, ``-``, ``@`` were written verbatim into the
  CSVs users open in spreadsheets; now they are quoted with ``'``, and ``recallk compare`` reads them back.

Each case failed on the code before this file and passes after (real stages, in process).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from helpers import STAGES, new_project, run_module, run_ok, save_image, set_params
from recallk.compare.sources import read_table
from recallk.tables_contract import neutralise_formulas, restore_formulas

REPORT_TABLES = ("metrics/per_class.csv", "metrics/confusions.csv", "metrics/per_query.csv",
                 "data/scores/per_query.csv", "data/scores/neighbors.csv")


def project(where: Path, labels: list[str], per_label: int, names=lambda i: f"{i}.png") -> Path:
    proj = new_project(where, per_label=None)
    set_params(proj, {"encode.pixels.resolution": 4, "score.ks": [1, 2], "score.bootstrap.resamples": 200,
                      "split.strategy": "per_class", "score.failures.queries": 0})
    for j, label in enumerate(labels):
        for i in range(per_label):
            save_image(proj / "data" / "digits" / label / names(i), seed=1000 * j + i, size=(8, 8))
    return proj


def intervals(proj: Path) -> dict:
    return json.loads((proj / "metrics/intervals.json").read_text(encoding="utf-8"))


@pytest.mark.stage
def test_renaming_files_never_moves_the_bootstrap_bounds(tmp_path):
    labels = [f"l{j}" for j in range(6)]
    before = project(tmp_path / "before", labels, 8)
    after = project(tmp_path / "after", labels, 8, names=lambda i: f"z{9 - i}_renamed.png")  # reversed name order
    for proj in (before, after):
        run_ok(proj, *STAGES)
    a, b = intervals(before), intervals(after)
    headline = "metrics/recall.json"
    assert json.loads((before / headline).read_text()) == json.loads((after / headline).read_text())
    assert a == b  # every bound of every metric, and the class means
    lows = {k: v for k, v in a.items() if k.endswith("_ci_low")}
    assert len(set(lows.values())) > 1  # not a degenerate case: the intervals are real


@pytest.mark.stage
def test_renaming_files_never_moves_the_curve_band(tmp_path):
    labels = [f"l{j}" for j in range(4)]
    runs = []
    for name, names in (("x", lambda i: f"{i}.png"), ("y", lambda i: f"q{7 - i}.png")):
        proj = project(tmp_path / name, labels, 6, names=names)
        set_params(proj, {"score.bootstrap.unit": "label"})  # label clusters are ordered by content too
        run_ok(proj, *STAGES)
        runs.append((proj / "metrics/intervals.json").read_text())
    assert runs[0] == runs[1]


FORMULAS = ["=cmd", "@SUM", "+1+1", "-2+3"]


@pytest.fixture(scope="module")
def formula_run(tmp_path_factory) -> Path:
    proj = project(tmp_path_factory.mktemp("formulas") / "proj", FORMULAS + ["plain"], 4)
    set_params(proj, {"split.strategy": "per_class"})
    run_ok(proj, *STAGES)
    return proj


@pytest.mark.stage
@pytest.mark.parametrize("rel", REPORT_TABLES)
def test_formula_like_labels_are_quoted_in_report_tables(formula_run, rel):
    raw = pd.read_csv(formula_run / rel, dtype=str, keep_default_na=False)
    text_cells = [v for c in raw.columns for v in raw[c] if any(v.lstrip("'").startswith(f) for f in FORMULAS)]
    assert text_cells, f"no formula-like label in {rel}"
    assert all(v.startswith("'") for v in text_cells), f"{rel}: unquoted {[v for v in text_cells if v[0] != chr(39)]}"
    assert not [v for c in raw.columns for v in raw[c] if v[:1] in "=+@"], rel


@pytest.mark.stage
def test_per_class_numbers_are_untouched(formula_run):
    raw = pd.read_csv(formula_run / "metrics/per_class.csv", dtype=str, keep_default_na=False)
    assert sorted(raw["label"]) == sorted(["'" + f for f in FORMULAS] + ["plain"])
    assert raw["num_queries"].astype(int).gt(0).all()
    assert raw["recall@1"].astype(float).between(0, 1).all()


@pytest.mark.stage
def test_compare_reads_the_quoted_labels_back(formula_run):
    text = (formula_run / "metrics/per_query.csv").read_text(encoding="utf-8")
    table = read_table(text, "metrics/per_query.csv")
    assert set(table["label"]) == set(FORMULAS + ["plain"])
    assert {v.split("/")[0] for v in table["image_id"]} == set(FORMULAS + ["plain"])
    proc = run_module("recallk.compare", "metrics/per_query.csv", "metrics/per_query.csv", cwd=formula_run)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("value, written", [
    ("=cmd|' /C calc'!A0", "'=cmd|' /C calc'!A0"),  # the classic DDE payload
    ("@SUM(A1)", "'@SUM(A1)"),
    ("+1+1", "'+1+1"),
    ("-2+3", "'-2+3"),
    ("\tx", "'\tx"),       # a tab, then text
    ("-1", "-1"),          # a number stays a number
    ("+2.5", "+2.5"),
    ("'=x", "''=x"),       # already quoted by the user: one more, so reading back is exact
    ("a=b", "a=b"),        # only the first character matters
    ("", ""),
])
def test_neutralise_and_restore_are_exact_inverses(value, written):
    frame = pd.DataFrame({"label": [value], "recall@1": [1.0]})
    out = neutralise_formulas(frame)
    assert out["label"].tolist() == [written] and out["recall@1"].tolist() == [1.0]
    assert restore_formulas(out).equals(frame)


# ---------------------------------------------------------------- every output names what was evaluated


@pytest.mark.stage
def test_every_report_csv_names_what_was_evaluated(formula_run):
    """Issue 13: the CSV outputs did not say what they measured; now a last column ``evaluated`` holds the
    id that metrics/evaluated.json spells out (a column, so the files stay plain CSV for dvc plots)."""
    evaluated = json.loads((formula_run / "metrics/evaluated.json").read_text(encoding="utf-8"))
    assert len(evaluated["id"]) == 12
    for rel in REPORT_TABLES + ("metrics/recall_curve.csv", "data/scores/embedding_copies.csv"):
        frame = pd.read_csv(formula_run / rel, dtype=str, keep_default_na=False)
        assert frame.columns[-1] == "evaluated", rel
        assert set(frame["evaluated"]) <= {evaluated["id"]}, rel  # embedding_copies.csv: header only (check off)


def test_the_evaluation_id_follows_what_is_measured_not_how():
    from recallk.report.provenance import evaluation_id

    split = {"data_root": "data/digits", "num_images": 10, "strategy": "per_class", "seed": 0}
    encode = {"backbone": "pixels", "fingerprint": "abc", "embedding_dim": 48}
    score = {"ks": [1, 5], "metrics": ["recall"], "exclude_same": [], "whiten": "none",
             "embedding_copies": {"min_cosine": None}, "backend": "numpy", "max_memory_mb": 512,
             "bootstrap": {"resamples": 10, "seed": 0}, "failures": {"queries": 8, "k": 5}}
    base = evaluation_id(split, encode, score)
    assert base == evaluation_id(split, encode, dict(score))  # deterministic
    for how in ({"backend": "torch"}, {"max_memory_mb": 64}, {"bootstrap": {"resamples": 0, "seed": 3}},
                {"failures": {"queries": 0, "k": 0}}):
        assert evaluation_id(split, encode, {**score, **how}) == base, how
    for what in ({"ks": [1]}, {"whiten": "pca"}, {"exclude_same": ["camera"]}, {"metrics": ["map"]}):
        assert evaluation_id(split, encode, {**score, **what}) != base, what
    assert evaluation_id(split, {**encode, "fingerprint": "abd"}, score) != base
    assert evaluation_id({**split, "seed": 1}, encode, score) != base
