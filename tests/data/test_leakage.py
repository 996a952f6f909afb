"""Leakage checks without DVC: the three near-duplicate policies of prepare_all(), their params, and the
split stage's pairs table. The Hamming search and pHash are in test_phash.py, the embedding check in
tests/score/test_embedding_copies.py, the embeddings-only mode in test_embeddings_only.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import SPLIT_FRACTIONS, run_in_process
from leakage_helpers import LEAK_LABELS as LABELS
from leakage_helpers import LEAK_PLANTED as PLANTED
from leakage_helpers import planted_pairs, run_prepare, write_planted_images
from recallk.data import phash, prepare, splitting
from recallk.errors import InputError
from stages.params import validate_section

# ---------------------------------------------------------------------------------------- policies


@pytest.fixture
def planted_root(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    write_planted_images(tmp_path / "data", LABELS, PLANTED)
    return Path("data")


def test_report_lists_exactly_the_planted_pairs_with_their_splits(planted_root):
    out = run_prepare(planted_root)
    table = out.near_duplicates
    assert list(table.columns) == phash.PAIR_COLUMNS
    assert set(zip(table["id_a"], table["id_b"])) == planted_pairs()
    split_of = dict(zip(out.split["image_id"], out.split["split"]))
    assert (table["split_a"] == table["id_a"].map(split_of)).all()
    assert (table["split_b"] == table["id_b"].map(split_of)).all()
    assert table["distance"].is_monotonic_increasing and (table["distance"] <= 10).all()
    crossing = (table["split_a"] == "train") != (table["split_b"] == "train")
    qg = phash.query_gallery(table, dict(zip(out.split["image_id"], out.split["query"])),
                             dict(zip(out.split["image_id"], out.split["gallery"])))
    assert out.summary == {"policy": "report", "max_distance": 10, "pairs": 4,
                           "near_duplicates_train_eval": int(crossing.sum()),
                           "near_duplicates_query_gallery": int(qg.sum()),
                           "near_duplicates_cross_label": 1,
                           "near_duplicates_same_label_query_gallery": int((qg & table["label_a"].eq(
                               table["label_b"])).sum()),
                           "too_small_to_check": 0}
    # the report is deterministic
    pd.testing.assert_frame_equal(run_prepare(planted_root).near_duplicates, table)


@pytest.mark.parametrize("strategy", ["per_class", "class_disjoint"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_group_keeps_every_cluster_in_one_split(planted_root, strategy, seed):
    report = run_prepare(planted_root, strategy=strategy, seed=seed)
    grouped = run_prepare(planted_root, strategy=strategy, seed=seed,
                          near_duplicates={"policy": "group", "max_distance": 10})
    table = grouped.near_duplicates
    assert set(zip(table["id_a"], table["id_b"])) == planted_pairs()
    assert (table["split_a"] == table["split_b"]).all(), table
    assert grouped.summary["near_duplicates_train_eval"] == grouped.summary["near_duplicates_query_gallery"] == 0
    # the catalog never depends on the policy; labels without a cluster keep every split
    pd.testing.assert_frame_equal(report.catalog, grouped.catalog)
    if strategy == "per_class":
        untouched = ~report.split["image_id"].str.startswith(("l0/", "l1/", "l2/", "l3/"))
        assert (report.split["split"][untouched] == grouped.split["split"][untouched]).all()


def test_group_under_leave_one_out_keeps_clusters_off_the_train_eval_border(planted_root, caplog):
    out = run_prepare(planted_root, protocol="leave_one_out", near_duplicates={"policy": "group", "max_distance": 10})
    table = out.near_duplicates
    assert (table["split_a"] == table["split_b"]).all() and out.summary["near_duplicates_train_eval"] == 0
    eval_pairs = int(table["split_a"].eq("gallery").sum())  # every eval image is a query and a gallery item
    assert out.summary["near_duplicates_query_gallery"] == eval_pairs
    cross = int((table["split_a"].eq("gallery") & table["label_a"].ne(table["label_b"])).sum())
    if cross:  # a query and a gallery image of another label: warned, with the leave_one_out hint
        assert "under leave_one_out every eval image is a query" in caplog.text
    # same-label eval pairs are a query and its positive: counted apart, never warned (issue 38)
    assert out.summary["near_duplicates_same_label_query_gallery"] == eval_pairs - cross


def test_group_without_pairs_is_the_plain_assignment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_planted_images(tmp_path / "data", LABELS)
    for strategy in ("per_class", "class_disjoint"):
        plain = run_prepare(Path("data"), strategy=strategy)
        grouped = run_prepare(Path("data"), strategy=strategy, near_duplicates={"policy": "group", "max_distance": 10})
        assert plain.near_duplicates.empty
        pd.testing.assert_frame_equal(plain.split, grouped.split)


def test_group_warns_when_chained_pairs_make_a_large_cluster(caplog):
    frame = pd.DataFrame({"image_id": [f"i{k}" for k in range(100)], "label": ["a"] * 100})
    frame["sha256"] = frame["image_id"]
    chain = np.arange(11)  # i0~i1, i1~i2, ..., i10~i11: one cluster of 12
    keys = prepare.cluster_keys(frame, (chain, chain + 1, np.ones(11, dtype=np.int64)))
    assert keys[:12].nunique() == 1 and keys[12:].tolist() == frame["sha256"][12:].tolist()
    assert "the largest near-duplicate cluster holds 12 of 100 images (12%): pairs chain" in caplog.text
    caplog.clear()
    prepare.cluster_keys(frame, (chain[:9], chain[:9] + 1, np.ones(9, dtype=np.int64)))
    assert "largest" not in caplog.text


def test_group_under_class_disjoint_takes_joined_labels_together():
    frame = pd.DataFrame({"image_id": [f"{lab}/{i}" for lab in "abcd" for i in range(3)],
                          "label": [lab for lab in "abcd" for _ in range(3)]})
    frame["sha256"] = frame["image_id"]
    groups = frame["sha256"].copy()
    groups[frame["image_id"].isin(["a/0", "d/1"])] = "cluster"  # a cross-label cluster joins a and d
    for seed in range(6):
        result = splitting.assign_splits(frame, strategy="class_disjoint", protocol="query_gallery",
                                         fractions=SPLIT_FRACTIONS, seed=seed, groups=groups)
        side = result.eq("train").groupby(frame["label"]).agg(["all", "any"])
        assert (side["all"] == side["any"]).all()  # every label on one side
        assert side.loc["a", "all"] == side.loc["d", "all"]
        assert result[frame["image_id"] == "a/0"].iloc[0] == result[frame["image_id"] == "d/1"].iloc[0]


def test_error_names_the_leaking_pairs(planted_root):
    report = run_prepare(planted_root, seed=1)
    leaks = report.near_duplicates[phash.leaking(report.near_duplicates,
                                              dict(zip(report.split["image_id"], report.split["query"])),
                                              dict(zip(report.split["image_id"], report.split["gallery"])))]
    assert len(leaks), "seed 1 must put a planted pair across the split"
    with pytest.raises(InputError) as info:
        run_prepare(planted_root, seed=1, near_duplicates={"policy": "error", "max_distance": 10})
    message = str(info.value)
    assert f"{len(leaks)} near-duplicate pair(s) (pHash within 10 of 64 bits) leak across the split" in message
    for row in leaks.itertuples():
        assert f"'{row.id_a}' ({row.label_a}, {row.split_a}) ~ '{row.id_b}'" in message
    assert "split.near_duplicates.policy: group" in message


def test_error_passes_when_no_pair_leaks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_planted_images(tmp_path / "data", LABELS)
    out = run_prepare(Path("data"), near_duplicates={"policy": "error", "max_distance": 10})
    assert out.near_duplicates.empty and out.summary["pairs"] == 0


def test_group_under_given_stops_on_a_crossing_pair(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_planted_images(tmp_path / "data", {"a": [1, 2, 3]}, {"a/copy.png": ("a", 1)})
    rows = ["image_id,path,label,split", "x1,a/1.png,a,val", "x2,a/2.png,a,gallery", "x3,a/3.png,a,gallery",
            "xc,a/copy.png,a,gallery"]
    (tmp_path / "data" / "m.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(InputError, match=r"(?s)`split.strategy: given` fixes every split.*'x1' \(a, val\) ~ 'xc'"):
        run_prepare(Path("data"), csv="m.csv", strategy="given",
                    near_duplicates={"policy": "group", "max_distance": 10})

# ---------------------------------------------------------------------------------------- params


@pytest.mark.parametrize("section, key, value, match", [
    ("split", "images", "maybe", r"`split.images` must be one of auto, files, none"),
    ("split", "near_duplicates", {"policy": "drop"}, r"`split.near_duplicates.policy` must be one of report, group"),
    ("split", "near_duplicates", {"max_distance": 17}, r"`split.near_duplicates.max_distance` must be an integer "
                                                       r"between 0 and 16"),
    ("split", "near_duplicates", {"max_distance": -1}, r"between 0 and 16"),
    ("score", "embedding_copies", {"min_cosine": 0}, r"`score.embedding_copies.min_cosine` must be a cosine above 0"),
    ("score", "embedding_copies", {"min_cosine": 1.5}, r"must be a cosine above 0 and at most 1"),
    ("score", "embedding_copies", {"min_cosine": "0.9"}, r"Got '0.9' instead"),
    ("encode", "precomputed", {"path": None}, r"`encode.precomputed.path` must be a path: the encode stage depends "
                                             r"on it in dvc.yaml"),
])
def test_new_params_are_checked(section, key, value, match):
    with pytest.raises(InputError, match=match):
        validate_section({section: {key: value}}, section)


def test_new_params_defaults():
    split = validate_section({}, "split")
    assert split["images"] == "auto" and split["near_duplicates"] == {"policy": "report", "max_distance": 10}
    assert validate_section({}, "score")["embedding_copies"] == {"min_cosine": None}
    assert validate_section({"score": {"embedding_copies": {"min_cosine": 1}}}, "score")["embedding_copies"] == {
        "min_cosine": 1}


# ---------------------------------------------------------------------------------------- the split stage


@pytest.mark.stage
def test_split_stage_writes_the_pairs_and_their_counts(planted_root, tmp_path):
    params = {"split": {"data_root": "data", "strategy": "per_class", "seed": 1}}
    (tmp_path / "params.yaml").write_text(json.dumps(params))
    proc = run_in_process("split", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    pairs = pd.read_csv(tmp_path / "data/prepared/near_duplicates.csv", dtype=str, keep_default_na=False)
    assert list(pairs.columns) == phash.PAIR_COLUMNS and len(pairs) == 4
    prov = json.loads((tmp_path / "data/prepared/provenance.json").read_text())
    assert prov["images"] == "files" and prov["near_duplicates"]["pairs"] == 4
    assert prov["near_duplicates"]["near_duplicates_cross_label"] == 1
    counts = prov["near_duplicates"]
    if counts["near_duplicates_train_eval"] or (counts["near_duplicates_query_gallery"]
                                                 - counts["near_duplicates_same_label_query_gallery"]):
        assert "WARNING recallk.data.prepare: near-duplicates (pHash within 10 of 64 bits): 4 pair(s)" in proc.stderr
