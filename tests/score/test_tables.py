"""The score stage's report outputs: per-class and per-query tables, the recall curve, bootstrap
intervals, ``exclude_same``, PCA whitening, the faiss backend, param errors and ``dvc plots``.

Stages run as subprocesses (like ``dvc repro`` would run them) in copies of module-scoped
projects that already ran split and encode, so each test pays only for the score runs it needs.
Expected values come from a brute-force oracle written from the formulas in the
:mod:`recallk.score.metrics` docstring (rank by descending cosine similarity, ties by gallery index),
not from the ranking engine.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from recallk.score import suite, tables as report
from recallk.score.suite import score_split
from stages.score_inputs import load_inputs
from recallk.errors import InputError
from recallk.score.metrics import first_positive_ranks, mean, metric_keys, retrieval_metrics
from stages.params import load_section
from recallk.score.similarity import cosine_block, l2_normalize

from conftest import ROOT, copy_digits, dvc, git, run_module

PER_LABEL = 20
KS = [1, 5, 10]
METRIC_KEYS = metric_keys(["recall", "precision", "r_precision", "map@r", "map", "mrr"], KS)
CATALOG = "data/prepared/catalog.csv"
SPLIT = "data/prepared/split.csv"
EMBEDDINGS = "data/embeddings/embeddings.npy"
IDS = "data/embeddings/ids.npy"
METRICS = "metrics/recall.json"
PER_CLASS = "metrics/per_class.csv"
CURVE = "metrics/recall_curve.csv"
PER_QUERY = "data/scores/per_query.csv"
OUTPUTS = (METRICS, PER_CLASS, CURVE, PER_QUERY)
CAMERAS = ("cam0", "cam1", "cam2")


# ---------------------------------------------------------------------------------------------- helpers


def set_params(project: Path, changes: dict) -> None:
    """Set dotted params (``score.bootstrap.seed``) in the project's params.yaml."""
    path = project / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    for dotted, value in changes.items():
        node = params
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


def run_ok(project: Path, *stages: str):
    proc = None
    for stage in stages:
        proc = run_module(f"stages.{stage}", cwd=project)
        assert proc.returncode == 0, f"{stage} failed:\n{proc.stderr}"
    return proc


def run_fails(project: Path, stage: str = "score"):
    """Run a stage that must fail as a user error: exit 2, one ``error:`` message, no traceback."""
    proc = run_module(f"stages.{stage}", cwd=project)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return proc


def plant_stale_outputs(project: Path) -> None:
    for rel in OUTPUTS:
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text("stale\n")


def assert_no_outputs(project: Path) -> None:
    left = [rel for rel in OUTPUTS if (project / rel).exists()]
    assert not left, f"a failed score run left {left} behind"
    for rel in OUTPUTS:
        if (project / rel).parent.exists():
            assert not list((project / rel).parent.glob(".*.tmp")), "stray temp files"


def read_metrics(project: Path) -> dict:
    return json.loads((project / METRICS).read_text(encoding="utf-8"))


def read_per_query(project: Path) -> pd.DataFrame:
    return pd.read_csv(project / PER_QUERY, dtype={"image_id": str, "label": str})


def copy_project(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    return dest


def eval_sets(project: Path) -> dict:
    """Queries and gallery as the score stage sees them (split order), with their embeddings and catalog rows."""
    split = pd.read_csv(project / SPLIT, dtype={"image_id": str})
    cat = pd.read_csv(project / CATALOG, dtype=str, keep_default_na=False).set_index("image_id")
    emb = np.load(project / EMBEDDINGS)
    row = {i: n for n, i in enumerate(np.load(project / IDS).astype(str))}
    q = split.loc[split["query"], "image_id"].tolist()
    g = split.loc[split["gallery"], "image_id"].tolist()
    train = split.loc[split["split"].eq("train") & ~split["query"] & ~split["gallery"], "image_id"].tolist()
    return {"q": q, "g": g, "train": train, "cat": cat, "emb": emb, "row": row,
            "q_emb": emb[[row[i] for i in q]], "g_emb": emb[[row[i] for i in g]],
            "q_lab": cat.loc[q, "label"].to_numpy(), "g_lab": cat.loc[g, "label"].to_numpy()}


def oracle(q_emb, g_emb, q_lab, g_lab, q_ids, g_ids, ks, exclude=()):
    """Brute force, one query at a time, straight from the formulas in the recallk.score.metrics docstring.

    ``exclude``: (query values, gallery values) pairs; a shared non-missing value hides the item.
    Returns per-query arrays: n_pos, n_ret, first (1-based, 0 = none), first_opp, and values by metric key.
    """
    sims = cosine_block(l2_normalize(np.asarray(q_emb)), l2_normalize(np.asarray(g_emb)).T)
    q_lab, g_lab = np.asarray(q_lab, dtype=str), np.asarray(g_lab, dtype=str)
    g_ids = np.asarray(g_ids, dtype=object)
    n = len(q_ids)
    out = {"n_pos": np.zeros(n, int), "n_ret": np.zeros(n, int), "first": np.zeros(n, int),
           "first_opp": np.zeros(n, int)}
    values = {k: np.full(n, np.nan) for k in metric_keys(["recall", "precision", "r_precision", "map@r", "map",
                                                           "mrr"], ks)}
    for i in range(n):
        allowed = g_ids != q_ids[i]
        for qv, gv in exclude:
            v = qv[i]
            if v is not None and v == v and v != "":
                allowed &= np.asarray([w != v for w in gv])
        idx = np.flatnonzero(allowed)
        s = sims[i, idx]
        order = idx[np.lexsort((idx, -s))]            # descending similarity, smaller gallery index first
        order_opp = idx[np.lexsort((-idx, -s))]       # the other tie rule
        r = np.flatnonzero(g_lab[order] == q_lab[i]) + 1.0
        M, R = idx.size, r.size
        out["n_ret"][i], out["n_pos"][i] = M, R
        if R == 0:
            continue
        out["first"][i] = int(r[0])
        out["first_opp"][i] = int(np.flatnonzero(g_lab[order_opp] == q_lab[i])[0]) + 1
        j = np.arange(1, R + 1)
        for k in ks:
            values[f"recall@{k}"][i] = float(r[0] <= k)
            values[f"precision@{k}"][i] = np.count_nonzero(r <= k) / min(k, M)
        values["r_precision"][i] = np.count_nonzero(r <= R) / R
        values["map@r"][i] = math.fsum((j / r)[r <= R]) / R
        values["map"][i] = math.fsum(j / r) / R
        values["mrr"][i] = 1.0 / r[0]
    out["values"] = values
    return out


def fmean(values) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return math.fsum(kept) / len(kept)


def approx(x, rel=1e-9):
    return pytest.approx(x, rel=rel, abs=1e-12)


# ---------------------------------------------------------------------------------------------- fixtures


def _new_project(dest: Path) -> Path:
    dest.mkdir(parents=True)
    shutil.copy2(ROOT / "params.yaml", dest / "params.yaml")
    return dest


@pytest.fixture(scope="module")
def prepared_base(tmp_path_factory) -> Path:
    """Digits (20, 22 or 24 images per label) with split and encode done; never modified.

    Unequal label sizes make the per-class (unweighted) means differ from the per-query ones.
    """
    proj = _new_project(tmp_path_factory.mktemp("prepared") / "proj")
    root = copy_digits(proj / "data" / "digits", per_label=PER_LABEL + 4)
    for n, label_dir in enumerate(sorted(p for p in root.iterdir() if p.is_dir())):
        for img in sorted(label_dir.iterdir())[PER_LABEL + 2 * (n % 3):]:
            img.unlink()
    run_ok(proj, "split", "encode")
    return proj


@pytest.fixture(scope="module")
def scored_base(prepared_base, tmp_path_factory) -> Path:
    """``prepared_base`` plus one score run with the committed params; never modified."""
    proj = copy_project(prepared_base, tmp_path_factory.mktemp("scored") / "proj")
    run_ok(proj, "score")
    return proj


@pytest.fixture
def prepared(prepared_base, tmp_path) -> Path:
    return copy_project(prepared_base, tmp_path / "proj")


@pytest.fixture
def scored(scored_base, tmp_path) -> Path:
    return copy_project(scored_base, tmp_path / "proj")


@pytest.fixture(scope="module")
def camera_base(tmp_path_factory) -> Path:
    """A manifest data root (path,label,camera) with real digit images; split and encode done."""
    proj = _new_project(tmp_path_factory.mktemp("camera") / "proj")
    root = copy_digits(proj / "data" / "cams", per_label=PER_LABEL)
    rows = []
    for label_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for n, img in enumerate(sorted(label_dir.iterdir())):
            rows.append({"path": f"{label_dir.name}/{img.name}", "label": label_dir.name,
                         "camera": CAMERAS[n % len(CAMERAS)]})
    pd.DataFrame(rows).to_csv(root / "manifest.csv", index=False)
    set_params(proj, {"split.data_root": "data/cams", "split.csv": "manifest.csv"})
    run_ok(proj, "split", "encode")
    return proj


# ---------------------------------------------------------------------------------------------- 1: tables and curve


def test_all_outputs_are_written_with_their_columns(scored_base):
    for rel in OUTPUTS:
        assert (scored_base / rel).is_file(), rel
    per_class = pd.read_csv(scored_base / PER_CLASS)
    assert list(per_class.columns) == ["label", "num_queries", *METRIC_KEYS]
    curve = pd.read_csv(scored_base / CURVE)
    assert list(curve.columns) == ["k", "recall"]
    per_query = read_per_query(scored_base)
    assert list(per_query.columns) == ["image_id", "label", "num_positives", "num_retrievable", "first_positive_rank",
                                       "first_positive_rank_other_tie_rule", "ap", "ap@r"]
    m = read_metrics(scored_base)
    assert list(m)[:len(METRIC_KEYS)] == METRIC_KEYS
    for key in METRIC_KEYS:
        for suffix in ("_class_mean", "_ci_low", "_ci_high"):
            assert key + suffix in m
    assert m["num_queries"] + m["num_excluded_queries"] == len(per_query)


def test_per_query_table_matches_the_oracle_and_the_api(scored_base):
    s = eval_sets(scored_base)
    pq = read_per_query(scored_base)
    assert pq["image_id"].tolist() == sorted(s["q"])          # one row per query, sorted by id
    want = oracle(s["q_emb"], s["g_emb"], s["q_lab"], s["g_lab"], s["q"], s["g"], KS)
    by_id = pq.set_index("image_id").loc[s["q"]]              # back to split (query) order
    assert by_id["label"].tolist() == list(s["q_lab"])
    assert by_id["num_positives"].tolist() == want["n_pos"].tolist()
    assert by_id["num_retrievable"].tolist() == want["n_ret"].tolist()
    assert by_id["first_positive_rank"].tolist() == want["first"].tolist()
    assert by_id["first_positive_rank_other_tie_rule"].tolist() == want["first_opp"].tolist()
    assert by_id["ap"].tolist() == approx(want["values"]["map"].tolist())
    assert by_id["ap@r"].tolist() == approx(want["values"]["map@r"].tolist())

    first, n_pos = first_positive_ranks(s["q_emb"], s["g_emb"], s["q_lab"], s["g_lab"], s["q"], s["g"])
    assert by_id["first_positive_rank"].tolist() == (first + 1).tolist()
    assert by_id["num_positives"].tolist() == n_pos.tolist()

    m = read_metrics(scored_base)
    assert fmean(pq["ap"]) == approx(m["map"])
    assert fmean(pq["ap@r"]) == approx(m["map@r"])
    for key in METRIC_KEYS:                                   # headline means = oracle means
        assert m[key] == approx(fmean(want["values"][key]), rel=1e-12), key
    for k in KS:
        assert m[f"tie_sensitive@{k}"] == int(np.count_nonzero((want["first"] <= k) != (want["first_opp"] <= k)))
    assert 0.5 < m["recall@1"] < 1.0, "the digits subset should give a non-trivial recall@1"


def test_per_class_table_is_the_per_label_mean_of_per_query_values(scored_base):
    s = eval_sets(scored_base)
    want = oracle(s["q_emb"], s["g_emb"], s["q_lab"], s["g_lab"], s["q"], s["g"], KS)
    per_class = pd.read_csv(scored_base / PER_CLASS, dtype={"label": str}).set_index("label")
    labels = sorted(set(s["q_lab"]))
    assert per_class.index.tolist() == labels
    for label in labels:
        mine = (s["q_lab"] == label) & (want["n_pos"] > 0)
        assert per_class.loc[label, "num_queries"] == int(mine.sum())
        for key in METRIC_KEYS:
            assert per_class.loc[label, key] == approx(fmean(want["values"][key][mine])), (label, key)

    # the same from the stage's own per-query table (the columns it derives from)
    pq = read_per_query(scored_base)
    for label, rows in pq.groupby("label"):
        rank = rows["first_positive_rank"].dropna()
        derived = {"map": rows["ap"].dropna(), "map@r": rows["ap@r"].dropna(), "mrr": 1.0 / rank,
                   **{f"recall@{k}": (rank <= k).astype(float) for k in KS}}
        for key, column in derived.items():
            assert per_class.loc[label, key] == approx(fmean(column)), (label, key)

    m = read_metrics(scored_base)
    assert per_class["num_queries"].nunique() > 1, "the fixture should give labels of different sizes"
    assert m["map_class_mean"] != approx(m["map"]), "class mean must weigh labels, not queries"
    for key in METRIC_KEYS:
        assert m[f"{key}_class_mean"] == approx(fmean(per_class[key])), key
        label_means = [fmean(want["values"][key][(s["q_lab"] == lab) & (want["n_pos"] > 0)]) for lab in labels]
        assert m[f"{key}_class_mean"] == approx(fmean(label_means), rel=1e-12), key


def test_exact_ties_fill_the_other_tie_rule_column(prepared):
    """Two gallery items (labels A and B) and one query of each label share one embedding: each query's
    positive ties exactly with a negative, so its first-positive rank is 1 under one tie rule and 2 under the other."""
    s = eval_sets(prepared)
    q_a = s["q"][0]
    label_a = s["cat"].loc[q_a, "label"]
    q_b = next(q for q in s["q"] if s["cat"].loc[q, "label"] != label_a)
    label_b = s["cat"].loc[q_b, "label"]
    g_a = next(g for g in s["g"] if s["cat"].loc[g, "label"] == label_a)
    g_b = next(g for g in s["g"] if s["cat"].loc[g, "label"] == label_b)
    emb = s["emb"].copy()
    for image in (q_a, q_b, g_b):
        emb[s["row"][image]] = emb[s["row"][g_a]]
    np.save(prepared / EMBEDDINGS, emb)
    run_ok(prepared, "score")

    pq = read_per_query(prepared).set_index("image_id")
    a_first = s["g"].index(g_a) < s["g"].index(g_b)        # smaller gallery index wins an exact tie
    assert tuple(pq.loc[q_a, ["first_positive_rank", "first_positive_rank_other_tie_rule"]]) == \
        ((1, 2) if a_first else (2, 1))
    assert tuple(pq.loc[q_b, ["first_positive_rank", "first_positive_rank_other_tie_rule"]]) == \
        ((2, 1) if a_first else (1, 2))
    s = eval_sets(prepared)
    want = oracle(s["q_emb"], s["g_emb"], s["q_lab"], s["g_lab"], s["q"], s["g"], KS)
    assert pq.loc[s["q"], "first_positive_rank"].tolist() == want["first"].tolist()
    assert pq.loc[s["q"], "first_positive_rank_other_tie_rule"].tolist() == want["first_opp"].tolist()
    m = read_metrics(prepared)
    assert m["tie_sensitive@1"] == int(np.count_nonzero((want["first"] <= 1) != (want["first_opp"] <= 1))) >= 2
    for key in METRIC_KEYS:
        assert m[key] == approx(fmean(want["values"][key]), rel=1e-12), key

    # the faiss backend resolves the exact ties the same way
    before = {rel: (prepared / rel).read_bytes() for rel in OUTPUTS}
    set_params(prepared, {"score.backend": "faiss"})
    run_ok(prepared, "score")
    for rel in OUTPUTS:
        assert (prepared / rel).read_bytes() == before[rel], rel


def test_recall_curve_matches_recall_at_k_and_never_decreases(scored_base):
    curve = pd.read_csv(scored_base / CURVE)
    m = read_metrics(scored_base)
    pq = read_per_query(scored_base)
    assert curve["k"].tolist() == list(range(1, len(curve) + 1))
    assert len(curve) == min(max(max(KS), suite.CURVE_K), int(pq["num_retrievable"].max()))
    assert (np.diff(curve["recall"]) >= 0).all()
    assert curve["recall"].between(0, 1).all()
    for k in KS:
        assert curve.loc[curve["k"] == k, "recall"].item() == approx(m[f"recall@{k}"]), k
    ranks = pq["first_positive_rank"].dropna()
    for k, recall in zip(curve["k"], curve["recall"]):
        assert recall == approx(float((ranks <= k).mean())), k


# ---------------------------------------------------------------------------------------------- 2: bootstrap


def test_confidence_intervals_contain_the_means(scored_base):
    m = read_metrics(scored_base)
    for key in METRIC_KEYS:
        assert m[f"{key}_ci_low"] <= m[key] <= m[f"{key}_ci_high"], key
    assert m["map_ci_low"] < m["map_ci_high"], "map varies over queries: its interval has width"


def test_rerun_is_byte_identical(scored, scored_base):
    run_ok(scored, "score")
    for rel in OUTPUTS:
        assert (scored / rel).read_bytes() == (scored_base / rel).read_bytes(), rel


def test_bootstrap_seed_moves_intervals_not_means(scored, scored_base):
    set_params(scored, {"score.bootstrap.seed": 1})
    run_ok(scored, "score")
    old, new = read_metrics(scored_base), read_metrics(scored)
    assert list(old) == list(new)
    ci = [k for k in old if k.endswith(("_ci_low", "_ci_high"))]
    assert {k: new[k] for k in old if k not in ci} == {k: old[k] for k in old if k not in ci}
    assert any(new[k] != old[k] for k in ci), "another seed must resample differently"
    for key in METRIC_KEYS:
        assert new[f"{key}_ci_low"] <= new[key] <= new[f"{key}_ci_high"], key
    for rel in (PER_CLASS, CURVE, PER_QUERY):
        assert (scored / rel).read_bytes() == (scored_base / rel).read_bytes(), rel


def test_zero_resamples_drop_the_intervals(scored, scored_base):
    set_params(scored, {"score.bootstrap.resamples": 0})
    proc = run_ok(scored, "score")
    old, new = read_metrics(scored_base), read_metrics(scored)
    assert not [k for k in new if "_ci_" in k]
    assert new == {k: v for k, v in old.items() if "_ci_" not in k}
    assert "recall@1:" in proc.stdout


def test_bootstrap_ci_unit():
    assert report.bootstrap_ci({"a": np.full(7, 0.25)}, resamples=200, confidence=0.9, seed=3) == \
        {"a_ci_low": 0.25, "a_ci_high": 0.25}
    rng = np.random.default_rng(1)
    v = rng.random(40)
    one = report.bootstrap_ci({"a": v, "b": 1.0 - v, "c": v.copy()}, resamples=500, confidence=0.95, seed=7)
    assert one == report.bootstrap_ci({"a": v, "b": 1.0 - v, "c": v.copy()}, resamples=500, confidence=0.95, seed=7)
    assert one["a_ci_low"] < v.mean() < one["a_ci_high"]
    # every metric uses the same resampled queries
    assert (one["c_ci_low"], one["c_ci_high"]) == (one["a_ci_low"], one["a_ci_high"])
    assert one["b_ci_low"] == pytest.approx(1.0 - one["a_ci_high"]) and \
        one["b_ci_high"] == pytest.approx(1.0 - one["a_ci_low"])
    other = report.bootstrap_ci({"a": v}, resamples=500, confidence=0.95, seed=8)
    assert (other["a_ci_low"], other["a_ci_high"]) != (one["a_ci_low"], one["a_ci_high"])
    narrow = report.bootstrap_ci({"a": v}, resamples=500, confidence=0.5, seed=7)
    assert one["a_ci_low"] <= narrow["a_ci_low"] <= narrow["a_ci_high"] <= one["a_ci_high"]
    # NaN marks an excluded query: dropped before resampling
    with_nan = np.insert(v, [3, 10], np.nan)
    assert report.bootstrap_ci({"a": with_nan}, 500, 0.95, 7) == report.bootstrap_ci({"a": v}, 500, 0.95, 7)
    assert report.bootstrap_ci({"a": v}, resamples=0, confidence=0.95, seed=7) == {}


@pytest.mark.parametrize("value, n", [(0.7, 6), (0.1, 3), (1 / 3, 7), (0.9, 11)])  # means that round off
def test_constant_metric_interval_is_its_mean(value, n):
    # every query has the same value: the headline and both ends of the interval are that value exactly
    values = np.full(n, value)
    assert report.bootstrap_ci({"a": values}, resamples=300, confidence=0.95, seed=0) == \
        {"a_ci_low": value, "a_ci_high": value}
    assert mean(values) == value


# ---------------------------------------------------------------------------------------------- 3: exclude_same


@pytest.mark.parametrize("protocol", ["query_gallery", "leave_one_out"])
def test_exclude_same_camera(camera_base, tmp_path, protocol):
    proj = copy_project(camera_base, tmp_path / "proj")
    set_params(proj, {"split.protocol": protocol})
    if protocol != "query_gallery":
        run_ok(proj, "split")          # the catalog (and so the embeddings) do not depend on split params
    run_ok(proj, "score")
    plain = read_metrics(proj)
    plain_pq = read_per_query(proj)
    set_params(proj, {"score.exclude_same": ["camera"]})
    run_ok(proj, "score")
    excl = read_metrics(proj)
    pq = read_per_query(proj).set_index("image_id")

    s = eval_sets(proj)
    cam = s["cat"]["camera"]
    assert set(cam) == set(CAMERAS)
    gallery = set(s["g"])
    for qid in s["q"]:
        hidden = {g for g in gallery if cam[g] == cam[qid]} | ({qid} & gallery)
        assert pq.loc[qid, "num_retrievable"] == len(gallery) - len(hidden), qid
        assert pq.loc[qid, "num_positives"] == sum(
            1 for g in gallery - hidden if s["cat"].loc[g, "label"] == s["cat"].loc[qid, "label"]), qid
    assert (plain_pq["num_retrievable"] == len(gallery) - (protocol == "leave_one_out")).all()

    want = oracle(s["q_emb"], s["g_emb"], s["q_lab"], s["g_lab"], s["q"], s["g"], KS,
                  exclude=[(cam[s["q"]].to_numpy(), cam[s["g"]].to_numpy())])
    assert pq.loc[s["q"], "first_positive_rank"].fillna(0).astype(int).tolist() == want["first"].tolist()
    for key in METRIC_KEYS:
        assert excl[key] == approx(fmean(want["values"][key]), rel=1e-12), key
    assert excl["num_gallery"] == plain["num_gallery"] == len(gallery)
    assert [k for k in METRIC_KEYS if excl[k] != plain[k]], "excluding same-camera items must change the metrics"

    # the faiss backend applies the same exclusion (and self-match) rules
    before = {rel: (proj / rel).read_bytes() for rel in OUTPUTS}
    set_params(proj, {"score.backend": "faiss"})
    run_ok(proj, "score")
    for rel in OUTPUTS:
        assert (proj / rel).read_bytes() == before[rel], rel


@pytest.mark.parametrize("columns, fragments", [
    (["lens"], ["`score.exclude_same` names ['lens']"]),
    (["camra"], ["['camra']", "Did you mean `camera`?"]),
    (["camera", "label"], ["['label']", "neither is an exclusion column"]),
    (["image_id"], ["['image_id']", "neither is an exclusion column"]),
])
def test_exclude_same_unknown_column(camera_base, tmp_path, columns, fragments):
    proj = copy_project(camera_base, tmp_path / "proj")
    set_params(proj, {"score.exclude_same": columns})
    plant_stale_outputs(proj)
    proc = run_fails(proj)
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr
    reserved = "neither is an exclusion column" in fragments
    listed = proc.stderr.split("name another catalog column" if reserved else "Catalog columns:", 1)[1]
    for column in ("path", "sha256", "width", "height", "camera") + (() if reserved else ("label",)):
        assert column in listed, proc.stderr
    assert_no_outputs(proj)


def test_exclude_missing_values_never_match():
    rng = np.random.default_rng(5)
    q, g = rng.normal(size=(6, 4)), rng.normal(size=(9, 4))
    ql, gl = ["a", "b", "a", "b", "a", "b"], ["a", "b", "a", "b", "a", "b", "a", "b", "a"]
    qc = np.array(["x", None, "", "y", np.nan, "x"], dtype=object)
    gc = np.array(["x", None, "", "y", np.nan, "x", "", None, "y"], dtype=object)
    got = retrieval_metrics(q, g, ql, gl, ks=KS, exclude=[(qc, gc)])
    want = oracle(q, g, ql, gl, [f"q{i}" for i in range(6)], [f"g{i}" for i in range(9)], KS, exclude=[(qc, gc)])
    assert got == {k: approx(fmean(v), rel=1e-12) for k, v in want["values"].items()}


# ---------------------------------------------------------------------------------------------- 4: whitening


def _score_in_process(project: Path, **overrides):
    params = load_section("score", project / "params.yaml")
    params.update(overrides)
    inputs = load_inputs(str(project / CATALOG), str(project / SPLIT), str(project / EMBEDDINGS), str(project / IDS),
                         train=params["whiten"] == "pca")
    return score_split(inputs.emb, inputs.row, inputs.catalog, queries=inputs.queries, gallery=inputs.gallery,
                       train=inputs.train, same_set=inputs.same_set, **params)


@pytest.fixture
def pca_spy(monkeypatch):
    calls = []
    real = suite.pca_whitening

    def spy(train, *sets):
        result = real(train, *sets)
        calls.append({"train": np.array(train, copy=True), "sets": [np.array(x, copy=True) for x in sets],
                      "result": [np.array(x, copy=True) for x in result]})
        return result

    monkeypatch.setattr(suite, "pca_whitening", spy)
    return calls


def _row_set(arr: np.ndarray) -> list[bytes]:
    return sorted(r.tobytes() for r in np.ascontiguousarray(arr))


def test_whitening_is_fitted_on_train_images_only(prepared, pca_spy):
    s = eval_sets(prepared)
    out, tables = _score_in_process(prepared, whiten="pca")
    assert len(pca_spy) == 1
    call = pca_spy[0]
    train_rows = s["emb"][[s["row"][i] for i in s["train"]]]
    assert len(s["train"]) >= 2 and not set(s["train"]) & (set(s["q"]) | set(s["g"]))
    assert call["train"].shape == train_rows.shape
    assert _row_set(call["train"]) == _row_set(train_rows)
    eval_rows = set(_row_set(np.concatenate([s["q_emb"], s["g_emb"]])))
    assert not eval_rows & set(_row_set(call["train"])), "an eval embedding entered the whitening fit"
    assert [x.tolist() for x in call["sets"]] == [s["q_emb"].tolist(), s["g_emb"].tolist()]

    # an independent fit on the train rows gives the transform the stage applied
    from sklearn.decomposition import PCA

    unit = l2_normalize(train_rows).astype(np.float64)
    var = PCA(whiten=True, svd_solver="full").fit(unit).explained_variance_
    keep = int(np.count_nonzero(var > var.max() * 1e-10))
    pca = PCA(n_components=keep, whiten=True, svd_solver="full").fit(unit)
    q_w, g_w = call["result"]
    np.testing.assert_allclose(q_w, pca.transform(l2_normalize(s["q_emb"]).astype(np.float64)), atol=1e-4)
    np.testing.assert_allclose(g_w, pca.transform(l2_normalize(s["g_emb"]).astype(np.float64)), atol=1e-4)
    assert out["embedding_dim"] == keep <= len(s["train"]) - 1

    # and the metrics are those of the whitened embeddings
    want = oracle(q_w, g_w, s["q_lab"], s["g_lab"], s["q"], s["g"], KS)
    for key in METRIC_KEYS:
        assert out[key] == approx(fmean(want["values"][key]), rel=1e-12), key
    plain, _ = _score_in_process(prepared, whiten="none")
    assert len(pca_spy) == 1, "whiten: none must not whiten"
    assert [k for k in METRIC_KEYS if plain[k] != out[k]], "whitening should change the metrics"


def test_eval_embeddings_do_not_change_the_whitening(prepared, pca_spy):
    s = eval_sets(prepared)
    _score_in_process(prepared, whiten="pca")
    emb = s["emb"].copy()
    rng = np.random.default_rng(0)
    changed_q, changed_g = s["q"][0], s["g"][-1]
    for image in (changed_q, changed_g):
        emb[s["row"][image]] = rng.random(emb.shape[1]).astype(emb.dtype) * 5
    np.save(prepared / EMBEDDINGS, emb)
    _score_in_process(prepared, whiten="pca")
    (q0, g0), (q1, g1) = pca_spy[0]["result"], pca_spy[1]["result"]
    assert np.array_equal(pca_spy[0]["train"], pca_spy[1]["train"])
    assert np.array_equal(q0[1:], q1[1:]) and np.array_equal(g0[:-1], g1[:-1])
    assert not np.array_equal(q0[0], q1[0]) and not np.array_equal(g0[-1], g1[-1])

    # whereas one changed train embedding changes the transform of every eval image
    emb[s["row"][s["train"][0]]] = rng.random(emb.shape[1]).astype(emb.dtype)
    np.save(prepared / EMBEDDINGS, emb)
    _score_in_process(prepared, whiten="pca")
    q2 = pca_spy[2]["result"][0]
    assert q2.shape != q1.shape or not np.allclose(q1[1:], q2[1:])


def test_whitening_needs_two_train_images(prepared):
    split = pd.read_csv(prepared / SPLIT, dtype=str, keep_default_na=False)
    first_train = split.index[split["split"].eq("train")][0]
    split[~split["split"].eq("train") | (split.index == first_train)].to_csv(prepared / SPLIT, index=False)
    with pytest.raises(InputError, match=r"`score.whiten: pca` fits on the train split, which has 1 image"):
        _score_in_process(prepared, whiten="pca")


def test_whitening_without_train_images_is_a_user_error(prepared):
    set_params(prepared, {"split.fractions": {"train": 0.0, "val": 0.5, "gallery": 0.5}, "score.whiten": "pca"})
    run_ok(prepared, "split")
    plant_stale_outputs(prepared)
    proc = run_fails(prepared)
    assert "`score.whiten: pca`" in proc.stderr and "0 image(s)" in proc.stderr, proc.stderr
    assert "score.whiten: none" in proc.stderr
    assert_no_outputs(prepared)


# ---------------------------------------------------------------------------------------------- 5: faiss


def test_faiss_backend_matches_numpy(scored, scored_base):
    import faiss  # noqa: F401  -- part of the test environment: a missing faiss fails here, never skips

    set_params(scored, {"score.backend": "faiss"})
    run_ok(scored, "score")
    assert read_metrics(scored) == read_metrics(scored_base)
    for rel in OUTPUTS:
        assert (scored / rel).read_bytes() == (scored_base / rel).read_bytes(), rel


# ---------------------------------------------------------------------------------------------- 6: param errors


def test_param_errors_are_reported_at_once(scored):
    set_params(scored, {"score.metrics": ["recal"], "score.backend": "fast", "score.bootstrap.confidence": 1.5,
                        "score.exclude_same": "camera", "score.bootsrap": {"seed": 1}})
    proc = run_fails(scored)
    err = proc.stderr
    assert err.startswith("error: invalid params.yaml"), err
    for fragments in (["`score.metrics`", "'recal'", "Did you mean `recall`?"],
                      ["`score.backend` must be one of numpy, faiss", "'fast'"],
                      ["`score.bootstrap.confidence` must be a number strictly between 0 and 1", "1.5"],
                      ["`score.exclude_same` must be a list", "'camera'"],
                      ["`score.bootsrap` is not a known param", "Did you mean `bootstrap`?"]):
        line = next((ln for ln in err.splitlines() if fragments[0] in ln), None)
        assert line is not None, err
        for fragment in fragments[1:]:
            assert fragment in line, line
    assert_no_outputs(scored)


# ---------------------------------------------------------------------------------------------- 7: dvc plots


@pytest.mark.pipeline
def test_dvc_plots_show_the_recall_curve(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for package in ("stages", "recallk"):  # the stages' code deps (dvc.yaml)
        shutil.copytree(ROOT / package, repo / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for rel in (".dvc/config", ".dvc/.gitignore", ".dvcignore", ".gitignore", "dvc.yaml", "params.yaml"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, repo / rel)
    copy_digits(repo / "data" / "digits", per_label=5)
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "init", cwd=repo)
    dvc("repro", cwd=repo)
    proc = dvc("plots", "show", "--json", cwd=repo)
    assert CURVE in proc.stdout
    shown = json.loads(proc.stdout)
    assert not shown.get("errors"), shown
    (plot,) = shown["data"][CURVE]
    values = plot["content"]["data"]["values"]
    curve = pd.read_csv(repo / CURVE)
    assert [(int(v["k"]), float(v["recall"])) for v in values] == list(zip(curve["k"], curve["recall"]))
    assert plot["content"]["encoding"]["x"]["field"] == "k"
    html = dvc("plots", "show", "-o", "plots_out", cwd=repo)
    assert html.returncode == 0
    page = (repo / "plots_out" / "index.html").read_text(encoding="utf-8")
    assert "recall_curve" in page
