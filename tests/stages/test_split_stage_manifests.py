"""The split stage (stages/split.py) on manifests (paths, labels, BOMs, duplicates) and on data shapes that leave
nothing to score (the hostile-input corpus of issue 25, part 1b), on the tiny project of tests/hostile_cases.py;
the contract is tests/stages/test_split_stage_images.py's. A refusal runs in process
(:func:`helpers.run_in_process`), one through the command line."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import (
    CATALOG,
    IDS,
    SCORE_OUTPUTS,
    SPLIT,
    SPLIT_OUTPUTS,
    assert_no_outputs,
    assert_user_error,
    plant_stale,
    read_csv,
    read_metrics,
    run_in_process,
    run_module,
    run_ok,
    save_image,
    set_params,
)
from hostile_cases import (
    LABELS,
    PER_LABEL,
    assert_line_names,
    base_rows,
    data_root,
    given_rows,
    line_of,
    make_project,
    manifest,
    pipeline,
)
from recallk.data import contract

pytestmark = pytest.mark.stage  # every test here runs the stages (in process but one: helpers.run_in_process)


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    return make_project(tmp_path)


UNICODE_LABELS = ("café crème", "日本 語", "Ünïcödé", "plain")
UNICODE_FILES = ("naïve file 1.png", "🐱 cat 2.png", "quote\"d, comma 3.png")


def test_unicode_and_spaces_in_names_work_end_to_end(tmp_path):
    proj = make_project(tmp_path, labels=UNICODE_LABELS, per_label=0)
    expected = []
    for j, label in enumerate(UNICODE_LABELS):
        for i, name in enumerate(UNICODE_FILES):
            save_image(data_root(proj) / label / name, seed=500 + 10 * j + i, size=(8, 8))
            expected.append(f"{label}/{name}")
    pipeline(proj)
    cat = read_csv(proj, CATALOG)
    assert sorted(cat["image_id"]) == sorted(expected)
    assert set(cat["label"]) == set(UNICODE_LABELS)
    assert sorted(np.load(proj / IDS).tolist()) == sorted(expected)
    per_query = read_csv(proj, "data/scores/per_query.csv")
    assert len(per_query) == read_metrics(proj)["num_queries"] + read_metrics(proj)["num_excluded_queries"] > 0
    assert set(per_query["image_id"]) <= set(expected)
    assert set(read_csv(proj, "metrics/per_class.csv")["label"]) <= set(UNICODE_LABELS)


# ================================================================ CSV manifest


def test_manifest_path_with_dotdot_is_rejected(proj):
    save_image(proj / "data" / "outside.png", seed=11)  # exists: rejected for the '..', not as missing
    rows = base_rows() + ["../outside.png,a", "a/../b/0.png,b"]
    manifest(proj, rows)
    proc = run_module("stages.split", cwd=proj)  # the command line's error path, once: the others run in process
    assert_user_error(proc, "no '..' part")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, '../outside.png,a')}", "'../outside.png'")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'a/../b/0.png,b')}", "'a/../b/0.png'")
    assert_no_outputs(proj)


def test_manifest_absolute_path_is_rejected(proj, tmp_path):
    inside = (data_root(proj) / "a" / "0.png").resolve()   # absolute, though it points into the root
    outside = save_image(tmp_path / "abs" / "x.png", seed=12)
    rows = base_rows()[1:] + [f"{inside},a", f"{outside},b"]
    manifest(proj, rows)
    proc = run_in_process("split", cwd=proj)
    assert_user_error(proc, "path must be relative to the data root")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, f'{inside},a')}", str(inside))
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, f'{outside},b')}", str(outside))
    assert_no_outputs(proj)


def test_manifest_with_utf8_bom_works(proj):
    rows = [f"id-{r.split(',')[0].replace('/', '-')},{r}" for r in base_rows()]
    manifest(proj, rows, header="image_id,path,label", bom=True)
    run_ok(proj, "split")
    cat = read_csv(proj, CATALOG)
    assert list(cat.columns)[:3] == ["image_id", "path", "label"]
    assert sorted(cat["image_id"]) == sorted(r.split(",")[0] for r in rows)  # not defaulted to the path


def test_manifest_extra_columns_are_kept_in_the_catalog(proj):
    rows = [f"{r},g{i % 2},\"note {i}, with \"\"quotes\"\"\"" if i else f"{r},g0," for i, r in enumerate(base_rows())]
    manifest(proj, rows, header="path,label,group,note")
    run_ok(proj, "split")
    cat = read_csv(proj, CATALOG).set_index("image_id")
    assert list(cat.columns) == ["path", "label", "sha256", "width", "height", "phash", "group", "note"]
    assert cat.loc["a/0.png", "group"] == "g0" and cat.loc["a/0.png", "note"] == ""
    assert cat.loc["a/1.png", "group"] == "g1" and cat.loc["a/1.png", "note"] == 'note 1, with "quotes"'


def test_manifest_empty_label_is_rejected(proj):
    rows = base_rows()
    rows[0], rows[4] = "a/0.png,", 'b/1.png,"  "'
    manifest(proj, rows)
    proc = run_in_process("split", cwd=proj)
    assert_user_error(proc, "label must not be")
    assert_line_names(proc.stderr, "CSV line 2", "'a/0.png'")
    assert_line_names(proc.stderr, "CSV line 6", "'b/1.png'")
    assert_no_outputs(proj)


@pytest.mark.parametrize("texts", [
    ("NaN", "null", "None", "N/A"),  # every cell is text: NaN-like words are ordinary labels (only '' is missing)
    ("1", "1.0", "01", "1e0"),       # README: labels are compared as text, so these are four labels, end to end
], ids=["nan_like_labels_are_plain_text", "labels_1_and_1_0_are_different"])
def test_manifest_labels_are_text(proj, texts):
    names = dict(zip(LABELS, texts))
    manifest(proj, [f"{label}/{i}.png,{names[label]}" for label in LABELS for i in range(PER_LABEL)])
    set_params(proj, {"split.fractions": {"train": 0.0, "val": 0.5, "gallery": 0.5}})
    split = pipeline(proj)[0]
    # issue 38: never silent; one warning naming the labels that are one number, with their counts
    warned = [line for line in split.stderr.splitlines() if "same number" in line]
    assert warned == ([] if texts[0] == "NaN" else [
        "WARNING recallk.data.prepare: labels 1, 1.0, 01 and 1e0 are the same number but different text: 12 images "
        "in 4 classes (1: 3, 1.0: 3, 01: 3, 1e0: 3); they are scored as different labels (a query never counts an "
        "image of the other spelling as a match). Write each number one way in the manifest (or the label folders' "
        "names)."]), split.stderr
    assert sorted(read_csv(proj, CATALOG)["label"].unique()) == sorted(names.values())
    per_class = read_csv(proj, "metrics/per_class.csv")
    assert sorted(per_class["label"]) == sorted(names.values())
    assert per_class["num_queries"].tolist() == ["2"] * len(LABELS)
    assert read_metrics(proj)["num_queries"] == 2 * len(LABELS)
    # each query's positives are its own label's single gallery image, never another look-alike label
    assert set(read_csv(proj, "data/scores/per_query.csv")["num_positives"]) == {"1"}


def test_label_folders_that_are_one_number_are_warned_once(tmp_path):
    """issue 38: folders 7, 7.0 and 07 are three classes (recall drops, the labels look alike): one warning names
    them and their counts; the other labels (x, 8) are not named."""
    proj = make_project(tmp_path, labels=("7", "7.0", "07", "x", "8"))
    proc = run_ok(proj, "split")
    warned = [line for line in proc.stderr.splitlines() if "same number" in line]
    assert len(warned) == 1, proc.stderr
    assert ("labels 07, 7 and 7.0 are the same number but different text: 9 images in 3 classes (07: 3, 7: 3, "
            "7.0: 3); they are scored as different labels") in warned[0] and "8" not in warned[0]


def test_manifest_duplicate_rows_are_rejected(proj):
    rows = base_rows() + ["b/1.png,b"]
    manifest(proj, rows)
    proc = run_in_process("split", cwd=proj)
    assert_user_error(proc, "image_id must be unique")
    assert_line_names(proc.stderr, "CSV line 6", "'b/1.png'")
    assert_line_names(proc.stderr, f"CSV line {len(rows) + 1}", "'b/1.png'")
    assert_no_outputs(proj)


def test_manifest_same_file_under_two_ids_is_rejected(proj):
    """The same path as query (x1) and gallery item (x2) would let x1 retrieve its own file (its only
    same-label gallery item), since the score stage tells images apart by image_id: the data contract
    rejects it (PATH_ONCE_RULE), naming both CSV lines, and the split writes nothing."""
    rows = [f"{label}{i},{label}/{i}.png,{label},{s}"
            for label in "ab" for i, s in enumerate(("val", "gallery", "gallery"))]
    rows += ["x1,c/0.png,c,val", "x2,c/0.png,c,gallery"] + [f"d{i},d/{i}.png,d,train" for i in range(PER_LABEL)]
    manifest(proj, rows, header="image_id,path,label,split", strategy="given")
    plant_stale(proj, SPLIT_OUTPUTS)
    proc = run_in_process("split", cwd=proj)
    assert_user_error(proc, f"{contract.PATH_ONCE_RULE}: 2 row(s)")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'x1,c/0.png,c,val')}", "'c/0.png'", "image_id 'x1'")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'x2,c/0.png,c,gallery')}", "'c/0.png'", "image_id 'x2'")
    assert_no_outputs(proj)


def test_manifest_path_that_does_not_exist_is_rejected(proj):
    rows = base_rows() + ["a/ghost.png,a"]
    manifest(proj, rows)
    proc = run_in_process("split", cwd=proj)
    assert_user_error(proc, "fix the path or remove the row")
    assert_line_names(proc.stderr, f"CSV line {len(rows) + 1}", "'a/ghost.png'", "does not exist")
    assert_no_outputs(proj)


# ================================================================ data shape


def test_single_image_label_query_is_excluded_and_counted(proj):
    save_image(data_root(proj) / "solo" / "only.png", seed=77, size=(8, 8))
    set_params(proj, {"split.protocol": "leave_one_out",
                        "split.fractions": {"train": 0.0, "val": 0.5, "gallery": 0.5}})
    split_proc, *_ = pipeline(proj)
    assert "1 queries (labels: solo)" in split_proc.stderr
    m = read_metrics(proj)
    assert m["num_excluded_queries"] == 1
    assert m["num_queries"] == len(LABELS) * PER_LABEL
    row = read_csv(proj, "data/scores/per_query.csv").set_index("image_id").loc["solo/only.png"]
    assert row["first_positive_rank"] == "" and row["num_positives"] == "0"


def test_label_only_in_train_is_not_scored(proj):
    rows = given_rows({"a": ("val", "gallery", "gallery"), "b": ("val", "gallery", "gallery"),
                       "c": ("val", "gallery", "gallery"), "d": ("train",) * 3})
    manifest(proj, rows, header="path,label,split", strategy="given")
    pipeline(proj)
    m = read_metrics(proj)
    assert (m["num_queries"], m["num_excluded_queries"], m["num_gallery"]) == (3, 0, 6)
    assert sorted(read_csv(proj, "metrics/per_class.csv")["label"]) == ["a", "b", "c"]
    assert "d" not in set(read_csv(proj, "data/scores/per_query.csv")["label"])


def test_empty_gallery_is_a_clear_error(proj):
    set_params(proj, {"split.fractions": {"train": 0.5, "val": 0.5, "gallery": 0.0}})
    plant_stale(proj, SPLIT_OUTPUTS)
    proc = run_in_process("split", cwd=proj)
    assert_user_error(proc, "0 gallery images", "`split.fractions`")
    assert_no_outputs(proj)


def test_every_query_excluded_is_a_clear_error_from_score(proj):
    rows = given_rows({"a": ("val",) * 3, "b": ("gallery",) * 3, "c": ("train",) * 3, "d": ("gallery",) * 3})
    manifest(proj, rows, header="path,label,split", strategy="given")
    split_proc = run_ok(proj, "split")
    assert "3 queries (labels: a) have no gallery image" in split_proc.stderr
    run_ok(proj, "encode")
    plant_stale(proj, SCORE_OUTPUTS)
    proc = run_in_process("score", cwd=proj)
    # no query label is in the gallery at all: refused when the data is built (RetrievalData), before ranking
    assert_user_error(proc, "no query label occurs in", "'a'", "gallery")
    assert_no_outputs(proj, SCORE_OUTPUTS)


def test_same_file_in_train_and_gallery_is_a_contract_error(proj):
    shutil.copy(data_root(proj) / "c" / "0.png", data_root(proj) / "c" / "copy.png")
    rows = given_rows({"a": ("val", "gallery", "gallery"), "b": ("val", "gallery", "gallery"),
                       "c": ("train", "val", "gallery"), "d": ("train",) * 3}) + ["c/copy.png,c,gallery"]
    manifest(proj, rows, header="path,label,split", strategy="given")
    proc = run_in_process("split", cwd=proj)
    assert_user_error(proc, "the same file (equal sha256) must not be in train and in val/gallery")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'c/0.png,c,train')}", "'c/0.png'")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'c/copy.png,c,gallery')}", "'c/copy.png'")
    assert_no_outputs(proj)


def test_near_identical_images_across_splits_are_allowed(proj):
    """Only byte-identical files are leakage; a one-level change in one pixel is another image."""
    arr = np.asarray(Image.open(data_root(proj) / "c" / "0.png")).copy()
    arr[0, 0, 0] ^= 1
    Image.fromarray(arr, "RGB").save(data_root(proj) / "c" / "near.png")
    rows = given_rows({"a": ("val", "gallery", "gallery"), "b": ("val", "gallery", "gallery"),
                       "c": ("train", "val", "gallery"), "d": ("train",) * 3}) + ["c/near.png,c,gallery"]
    manifest(proj, rows, header="path,label,split", strategy="given")
    run_ok(proj, "split")
    split = read_csv(proj, SPLIT).set_index("image_id")["split"]
    assert (split["c/0.png"], split["c/near.png"]) == ("train", "gallery")
