"""The index stage end to end on a scored digits project: placeholders by default, a sweep whose Flat control
pairs to Δ = 0 (and whose per-query tables `recallk compare` reads), and a bad kind refused with one error line
and no output left behind."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from extras import extra
from helpers import OUTS, assert_no_outputs, assert_user_error, run_in_process, run_module, run_ok, set_params
from recallk.index.sweep import TIMING_KEYS
from stages import index as index_stage

pytestmark = pytest.mark.stage

INDEX_OUTPUTS = OUTS["index"]


MEASURED = tuple(index_stage.MEASURED.values())


def test_default_writes_placeholders_only(scored_project) -> None:
    run_ok(scored_project, "index")
    document = json.loads((scored_project / "metrics/index.json").read_text(encoding="utf-8"))
    assert document == {"skipped": index_stage.SKIPPED, "points": {}}
    speed = json.loads((scored_project / "metrics/index_speed.json").read_text(encoding="utf-8"))
    assert speed["points"] == {} and speed["cheapest_non_inferior"] is None
    assert (scored_project / "metrics/index_speed.csv").read_text(encoding="utf-8").startswith("point,kind,")
    header = (scored_project / "metrics/index/points.csv").read_text(encoding="utf-8").splitlines()
    assert header[0].startswith("point,kind,") and "queries_per_second" not in header[0] and len(header) == 1
    assert [p.name for p in (scored_project / "metrics/index").iterdir()] == ["points.csv"]
    assert Image.open(scored_project / "plots/index_pareto.png").size == (1, 1)


def test_a_sweep_then_a_bad_kind(scored_project) -> None:
    extra("faiss", "faiss")
    set_params(scored_project, {"index.kinds": ["Flat", "IVF4,Flat"], "index.sweep.nprobe": [1, 4]})
    proc = run_ok(scored_project, "index", cli=True)  # a fresh interpreter: the one that first imports faiss
    # issue 38: faiss's loader says nothing at INFO ("Could not load library with AVX512 support due to: ...")
    assert "faiss.loader" not in proc.stderr and "Could not load library" not in proc.stderr, proc.stderr
    results = (scored_project / "metrics/index.json").read_bytes()
    tables = {p.name: p.read_bytes() for p in (scored_project / "metrics/index").iterdir()}
    document = json.loads(results)
    flat = document["points"]["Flat"]
    assert not set(TIMING_KEYS) & set(flat)  # the DVC out holds results only: the timings are apart
    speed = json.loads((scored_project / "metrics/index_speed.json").read_text(encoding="utf-8"))
    assert set(speed["points"]["Flat"]) == {*TIMING_KEYS, "table"} and speed["points"]["Flat"]["build_seconds"] >= 0
    assert speed["cheapest_non_inferior"] in document["points"]
    deltas = {k: v for k, v in flat.items() if k.startswith("delta_")}  # every metric Flat reports: Δ = 0
    assert {"delta_recall@1", "delta_precision@5", "delta_r_precision", "delta_map@r"} <= set(deltas)
    assert set(deltas.values()) == {0.0}
    # the exact block is the score stage's metrics, bit for bit (one correctly rounded mean, full per-query values)
    # (recall@K's in metrics/recall.json, the other means in metrics/intervals.json)
    means = {**json.loads((scored_project / "metrics/recall.json").read_text(encoding="utf-8")),
             **json.loads((scored_project / "metrics/intervals.json").read_text(encoding="utf-8"))}
    assert document["exact"] and document["exact"] == {k: means[k] for k in document["exact"]}
    assert flat["knn_recall@10_ann_benchmarks"] == flat["knn_recall@10_big_ann_benchmarks"] == 1.0
    assert document["points"]["IVF4,Flat nprobe=4"]["delta_map@r"] == 0.0  # every list visited: exact
    assert document["points"]["IVF4,Flat nprobe=1"]["trained_on"].startswith("train split")
    page = (scored_project / "reports/ann_index.html").read_text(encoding="utf-8")
    assert "IVF4,Flat nprobe=1" in page and "data:image/png;base64," in page
    assert Image.open(scored_project / "plots/index_pareto.png").width > 100
    proc = run_module("recallk.compare", "metrics/per_query.csv", f"metrics/index/{flat['table']}",
                      cwd=scored_project)
    assert proc.returncode == 0, proc.stderr
    assert "recall@1      " in proc.stdout and "+0.0000  [+0.0000, +0.0000]" in proc.stdout

    run_ok(scored_project, "index")  # again: the timings differ, the results are the same bytes
    assert (scored_project / "metrics/index.json").read_bytes() == results
    assert {p.name: p.read_bytes() for p in (scored_project / "metrics/index").iterdir()} == tables

    set_params(scored_project, {"index.kinds": ["Flat", "IVF4,Flt"]})
    proc = run_in_process("index", cwd=scored_project)
    assert_user_error(proc, "`index.kinds` entry 'IVF4,Flt' is not a FAISS factory string")
    assert_no_outputs(scored_project, INDEX_OUTPUTS + MEASURED)  # the earlier run's outputs are gone too
