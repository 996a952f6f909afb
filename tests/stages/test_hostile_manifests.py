"""Hostile-input corpus, part 1b: manifests (paths, labels, BOMs, duplicates), data shapes that leave
nothing to score, a callable returning NaN, precomputed embeddings and params, as real stage subprocesses
on the tiny project of tests/hostile_cases.py (the contract: tests/stages/test_hostile_corpus.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import (
    CATALOG,
    EMBEDDINGS,
    IDS,
    SCORE_OUTPUTS,
    SPLIT,
    SPLIT_OUTPUTS,
    assert_no_outputs,
    assert_user_error,
    plant_stale,
    read_csv,
    read_metrics,
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
    rgb_block,
)
from recallk.data import contract

pytestmark = pytest.mark.stage  # every test here runs stage scripts as subprocesses


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
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "no '..' part")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, '../outside.png,a')}", "'../outside.png'")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'a/../b/0.png,b')}", "'a/../b/0.png'")
    assert_no_outputs(proj)


def test_manifest_absolute_path_is_rejected(proj, tmp_path):
    inside = (data_root(proj) / "a" / "0.png").resolve()   # absolute, though it points into the root
    outside = save_image(tmp_path / "abs" / "x.png", seed=12)
    rows = base_rows()[1:] + [f"{inside},a", f"{outside},b"]
    manifest(proj, rows)
    proc = run_module("stages.split", cwd=proj)
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
    proc = run_module("stages.split", cwd=proj)
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
    pipeline(proj)
    assert sorted(read_csv(proj, CATALOG)["label"].unique()) == sorted(names.values())
    per_class = read_csv(proj, "metrics/per_class.csv")
    assert sorted(per_class["label"]) == sorted(names.values())
    assert per_class["num_queries"].tolist() == ["2"] * len(LABELS)
    assert read_metrics(proj)["num_queries"] == 2 * len(LABELS)
    # each query's positives are its own label's single gallery image, never another look-alike label
    assert set(read_csv(proj, "data/scores/per_query.csv")["num_positives"]) == {"1"}


def test_manifest_duplicate_rows_are_rejected(proj):
    rows = base_rows() + ["b/1.png,b"]
    manifest(proj, rows)
    proc = run_module("stages.split", cwd=proj)
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
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, f"{contract.PATH_ONCE_RULE}: 2 row(s)")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'x1,c/0.png,c,val')}", "'c/0.png'", "image_id 'x1'")
    assert_line_names(proc.stderr, f"CSV line {line_of(rows, 'x2,c/0.png,c,gallery')}", "'c/0.png'", "image_id 'x2'")
    assert_no_outputs(proj)


def test_manifest_path_that_does_not_exist_is_rejected(proj):
    rows = base_rows() + ["a/ghost.png,a"]
    manifest(proj, rows)
    proc = run_module("stages.split", cwd=proj)
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
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "0 gallery images", "`split.fractions`")
    assert_no_outputs(proj)


def test_every_query_excluded_is_a_clear_error_from_score(proj):
    rows = given_rows({"a": ("val",) * 3, "b": ("gallery",) * 3, "c": ("train",) * 3, "d": ("gallery",) * 3})
    manifest(proj, rows, header="path,label,split", strategy="given")
    split_proc = run_ok(proj, "split")
    assert "3 queries (labels: a) have no gallery image" in split_proc.stderr
    run_ok(proj, "encode")
    plant_stale(proj, SCORE_OUTPUTS)
    proc = run_module("stages.score", cwd=proj)
    # no query label is in the gallery at all: refused when the data is built (RetrievalData), before ranking
    assert_user_error(proc, "no query label occurs in", "'a'", "gallery")
    assert_no_outputs(proj, SCORE_OUTPUTS)


def test_same_file_in_train_and_gallery_is_a_contract_error(proj):
    shutil.copy(data_root(proj) / "c" / "0.png", data_root(proj) / "c" / "copy.png")
    rows = given_rows({"a": ("val", "gallery", "gallery"), "b": ("val", "gallery", "gallery"),
                       "c": ("train", "val", "gallery"), "d": ("train",) * 3}) + ["c/copy.png,c,gallery"]
    manifest(proj, rows, header="path,label,split", strategy="given")
    proc = run_module("stages.split", cwd=proj)
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


# ================================================================ embeddings


HOSTILE_ENCODER = '''\
import numpy as np


def embed(images):
    """Mean colour, but NaN for a pure red image, +inf for pure green, -inf for pure blue."""
    out = []
    for img in images:
        arr = np.asarray(img, dtype=np.float64)
        v = arr.mean(axis=(0, 1)) / 255 + 0.01
        corner = tuple(int(x) for x in arr[0, 0])
        if corner == (255, 0, 0):
            v[0] = np.nan
        elif corner == (0, 255, 0):
            v[1] = np.inf
        elif corner == (0, 0, 255):
            v[2] = -np.inf
        out.append(v)
    return np.asarray(out, dtype=np.float32)
'''


def test_callable_backbone_returning_nan_or_inf_names_the_images(proj):
    (proj / "hostile_encoder.py").write_text(HOSTILE_ENCODER)
    bad = {"a/red.png": (255, 0, 0), "b/green.png": (0, 255, 0), "c/blue.png": (0, 0, 255)}
    for rel, colour in bad.items():
        Image.fromarray(rgb_block(8, 8, colour), "RGB").save(data_root(proj) / rel)
    set_params(proj, {"encode.backbone": "callable:hostile_encoder:embed",
                      "encode.callable.module_file": "hostile_encoder.py"})
    run_ok(proj, "split")
    plant_stale(proj, (EMBEDDINGS, IDS))
    proc = run_module("stages.encode", cwd=proj)
    assert_user_error(proc, "NaN, inf or all-zero", f"{len(bad)} image(s)", *bad)
    for good in ("a/0.png", "b/0.png"):
        assert good not in proc.stderr
    assert_no_outputs(proj, (EMBEDDINGS, IDS))


@pytest.fixture(scope="module")
def split_template(tmp_path_factory):
    """A project whose split already ran (the precomputed cases only re-run encode)."""
    proj = make_project(tmp_path_factory.mktemp("split_template"))
    run_ok(proj, "split")
    return proj


def _precomputed(ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    emb = np.random.default_rng(0).normal(size=(len(ids), 5)).astype(np.float32)
    return np.asarray(ids), emb


PRECOMPUTED_CASES = {
    # (ids, emb) -> arrays to save, fragments the error must contain
    "vector_not_matrix": (lambda ids, emb: (ids, emb[:, 0]), ["2-D", "(n, d)"]),
    "three_dims": (lambda ids, emb: (ids, emb[:, :, None]), ["2-D", "(n, d)"]),
    "zero_width": (lambda ids, emb: (ids, emb[:, :0]), []),
    "ids_rows_mismatch": (lambda ids, emb: (ids, np.vstack([emb, emb[:1]])), ["ids of shape"]),
    "missing_ids": (lambda ids, emb: (ids[2:], emb[2:]), ["2 catalog image(s) have no embedding", "{0}", "{1}"]),
    "zero_vectors": (lambda ids, emb: (ids, np.where(np.isin(np.arange(len(ids)), [1, 4])[:, None], 0, emb)),
                     ["all-zero", "2 image(s)", "{1}", "{4}"]),
}


@pytest.mark.parametrize("case", list(PRECOMPUTED_CASES), ids=list(PRECOMPUTED_CASES))
def test_precomputed_embeddings_errors(split_template, tmp_path, case):
    proj = tmp_path / "proj"
    shutil.copytree(split_template, proj, symlinks=True)
    ids = read_csv(proj, CATALOG)["image_id"].tolist()
    make, fragments = PRECOMPUTED_CASES[case]
    stored_ids, stored = make(*_precomputed(ids))
    np.savez(proj / "emb.npz", ids=stored_ids, embeddings=stored)
    set_params(proj, {"encode.backbone": "precomputed", "encode.precomputed.path": "emb.npz"})
    plant_stale(proj, (EMBEDDINGS, IDS))
    proc = run_module("stages.encode", cwd=proj)
    assert_user_error(proc, "emb.npz", *(f.format(*ids) for f in fragments))
    assert_no_outputs(proj, (EMBEDDINGS, IDS))


# ================================================================ params


@pytest.mark.parametrize("key, value, message", [
    ("split.seed", "x", "`split.seed` must be an integer >= 0. Got 'x' instead."),
    ("split.seed", True, "`split.seed` must be an integer >= 0. Got True instead."),
    ("split.fractions.train", "0.5", "`split.fractions.train` must be a number between 0 and 1. Got '0.5' instead."),
], ids=["seed_string", "seed_bool", "fraction_string"])
def test_params_wrong_type(proj, key, value, message):
    set_params(proj, {key: value})
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "invalid params.yaml", message)
    assert_no_outputs(proj)


def test_params_unknown_key_typo_gets_a_suggestion(proj):
    set_params(proj, {"split.sed": 3})
    proc = run_module("stages.encode", cwd=proj)  # any stage sees a typo in any section
    assert_user_error(proc, "`split.sed` is not a known param", "Did you mean `seed`?", "Known keys: ")
    assert_no_outputs(proj)


def test_params_out_of_range_fraction(proj):
    set_params(proj, {"split.fractions.val": 2})
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "`split.fractions.val` must be a number between 0 and 1. Got 2 instead.")
    assert_no_outputs(proj)


def test_params_fractions_not_summing_to_1(proj):
    set_params(proj, {"split.fractions": {"train": 0.6, "val": 0.3, "gallery": 0.3}})
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "`split.fractions` train + val + gallery must sum to 1. Got 1.2 instead.")
    assert_no_outputs(proj)


def test_params_empty_ks(proj):
    set_params(proj, {"score.ks": []})
    plant_stale(proj, SCORE_OUTPUTS)
    proc = run_module("stages.score", cwd=proj)
    assert_user_error(proc, "`score.ks` must be positive integers. Got [] instead.")
    assert "not found" not in proc.stderr  # params are judged before the inputs are looked for
    assert_no_outputs(proj, SCORE_OUTPUTS)


def test_params_several_errors_reported_together_before_any_work(proj):
    """One run names every params problem, before any data is read and with no output left."""
    (data_root(proj) / "a" / "0.png").write_bytes(b"")  # a data problem that must not be reached
    set_params(proj, {"split.seed": "x", "split.sed": 1, "split.fractions.train": 1.5,
                        "split.on_bad_image": "sometimes", "score.kss": [1]})
    plant_stale(proj, SPLIT_OUTPUTS)
    proc = run_module("stages.split", cwd=proj)
    assert_user_error(proc, "invalid params.yaml",
                      "`split.seed` must be an integer >= 0. Got 'x' instead.",
                      "`split.sed` is not a known param", "Did you mean `seed`?",
                      "`split.fractions.train` must be a number between 0 and 1. Got 1.5 instead.",
                      "`split.on_bad_image`", "`score.kss` is not a known param", "Did you mean `ks`?")
    assert "a/0.png" not in proc.stderr and "data contract" not in proc.stderr
    assert_no_outputs(proj)
