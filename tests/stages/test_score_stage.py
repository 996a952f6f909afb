"""The score stage (stages/score.py) as a subprocess: the metrics file, the report block, leave-one-out,
and its user errors (damaged or stale inputs, params), each a clean message with no output left behind.

Read-only tests use the session's ``scored_base``; the others a private copy of it (``scored_project``).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from helpers import (
    CATALOG,
    COUNTS,
    EMBEDDINGS,
    ENCODE_OUTPUTS,
    IDS,
    METRICS,
    PER_QUERY,
    SCORE_OUTPUTS,
    SPLIT,
    assert_no_outputs,
    assert_user_error,
    edit_params,
    plant_stale,
    read_metrics,
    run_fails,
    run_in_process,
    run_module,
    run_ok,
    set_params,
)
from recallk import retrieval_summary

pytestmark = pytest.mark.stage  # every test here runs the stages (in process, helpers.run_in_process, unless it says)


def test_metrics_file_is_flat_and_matches_the_api(scored_base):
    metrics = read_metrics(scored_base)
    headline = ["recall@1", "recall@5", "recall@10", "precision@1", "precision@5", "precision@10", "r_precision",
                "map@r", "map", "mrr"]
    assert [k for k in metrics if k in headline] == headline
    # the one declared metrics file holds recall@K's means (dvc exp show, dvc metrics diff); the others lead
    # metrics/intervals.json (stages/score.py, declared_split)
    assert list(json.loads((scored_base / METRICS).read_text(encoding="utf-8"))) == headline[:3]
    # flat: dvc metrics diff shows every key (but counts.json's capped_ks, a list of K, which DVC skips)
    assert all(isinstance(v, (int, float)) for k, v in metrics.items() if k != "capped_ks")
    assert metrics["capped_ks"] == []  # ks 1, 5, 10 against a 50-image gallery
    split = pd.read_csv(scored_base / SPLIT)
    cat = pd.read_csv(scored_base / CATALOG, dtype=str).set_index("image_id")
    emb = np.load(scored_base / EMBEDDINGS)
    row = {i: n for n, i in enumerate(np.load(scored_base / IDS))}
    q = split.loc[split["query"], "image_id"].tolist()
    g = split.loc[split["gallery"], "image_id"].tolist()
    expected = retrieval_summary(emb[[row[i] for i in q]], emb[[row[i] for i in g]], cat.loc[q, "label"],
                                 cat.loc[g, "label"], ks=(1, 5, 10), query_ids=q, gallery_ids=g, metrics=None)
    assert {k: metrics[k] for k in expected} == expected
    assert metrics["num_queries"] + metrics["num_excluded_queries"] == len(q)
    assert metrics["num_gallery"] == len(g) and metrics["embedding_dim"] == 768
    assert 0.5 < metrics["recall@1"] <= metrics["recall@5"] <= metrics["recall@10"] <= 1.0


def test_report_block_is_printed(scored_base, scored_stdout):
    for line in ("[evaluation]", "num queries:", "num gallery:", "embedding_dim: 768", "[recall]", "recall@1:"):
        assert line in scored_stdout
    shown = run_module("stages.score", "--show", cwd=scored_base)
    assert shown.returncode == 0 and shown.stdout.strip() == scored_stdout.strip()


def test_a_k_at_or_above_the_gallery_is_marked(scored_project):
    """issue 38: recall@K at a K that holds every query's whole gallery is 1.0 by construction: counts.json names
    those K (capped_ks; recall.json, the declared metrics file, gains no key), the report block marks their lines
    and says which they are, and the K above the gallery is one warning line."""
    from recallk.report.block import CAPPED_MARK

    n = read_metrics(scored_project)["num_gallery"]  # query_gallery: every query may retrieve the whole gallery
    set_params(scored_project, {"score.ks": [1, n - 1, n, 5000]})
    proc = run_ok(scored_project, "score")
    metrics = read_metrics(scored_project)
    assert metrics["capped_ks"] == [n, 5000] and metrics[f"recall@{n}"] == metrics["recall@5000"] == 1.0
    assert "capped_ks" not in json.loads((scored_project / METRICS).read_text(encoding="utf-8"))
    marked = {line.split(":")[0].strip() for line in proc.stdout.splitlines() if line.endswith(CAPPED_MARK)}
    assert marked == {f"recall@{n}", "recall@5000", f"precision@{n}", "precision@5000"}
    assert f"  K = {n}, 5000: at or above every query's gallery, recall@K is 1.0 by construction" in proc.stdout
    assert [line for line in proc.stderr.splitlines() if "5000" in line] == [
        f"warning: K = 5000 is larger than every query's gallery (at most {n} retrievable items): recall@K is 1.0 "
        f"for every query with a positive there; use K up to {n} (`ks` / `score.ks`)."]
    shown = run_in_process("score", "--show", cwd=scored_project)  # the marks come back from counts.json
    assert shown.returncode == 0 and shown.stdout.strip() == proc.stdout.strip()


def test_leave_one_out_scores_every_eval_image(scored_project):
    # the catalog does not depend on split params, so the embeddings stay valid: split and score re-run
    set_params(scored_project, {"split.protocol": "leave_one_out"})
    run_ok(scored_project, "split", "score")
    metrics = read_metrics(scored_project)
    split = pd.read_csv(scored_project / SPLIT)
    assert (split["query"] == split["gallery"]).all()          # eval images are both
    n_eval = int(split["query"].sum())
    assert metrics["num_queries"] == metrics["num_gallery"] == n_eval
    assert metrics["num_excluded_queries"] == 0                 # 20 images per label: every query keeps 19 positives
    per_query = pd.read_csv(scored_project / PER_QUERY)
    assert (per_query["num_retrievable"] == n_eval - 1).all()   # a query never retrieves its own image
    assert (per_query["num_positives"] == 19).all()
    cat = pd.read_csv(scored_project / CATALOG, dtype=str).set_index("image_id")
    emb = np.load(scored_project / EMBEDDINGS)
    row = {i: n for n, i in enumerate(np.load(scored_project / IDS))}
    ids = split.loc[split["query"], "image_id"].tolist()
    vectors, labels = emb[[row[i] for i in ids]], cat.loc[ids, "label"]
    expected = retrieval_summary(vectors, vectors, labels, labels, ks=(1, 5, 10), query_ids=ids, gallery_ids=ids,
                                 metrics=None)
    assert {k: metrics[k] for k in expected} == expected


def test_stale_embeddings_are_refused(scored_project):
    ids = np.load(scored_project / IDS)
    emb = np.load(scored_project / EMBEDDINGS)
    split = pd.read_csv(scored_project / SPLIT)
    keep = ids != split.loc[split["query"], "image_id"].iloc[0]  # drop one query's embedding
    np.save(scored_project / IDS, ids[keep])
    np.save(scored_project / EMBEDDINGS, emb[keep])
    run_fails(scored_project, "score", "1 split images have no embedding", "run `dvc repro`")
    assert not (scored_project / METRICS).exists()


def _drop_catalog_row_of_first_query(project):
    split = pd.read_csv(project / "data/prepared/split.csv")
    query = split.loc[split["query"], "image_id"].iloc[0]
    cat = pd.read_csv(project / "data/prepared/catalog.csv", dtype=str)
    cat[cat["image_id"] != query].to_csv(project / "data/prepared/catalog.csv", index=False)


def _edit_npy(project, name, change):
    path = project / "data/embeddings" / name
    np.save(path, change(np.load(path)))


def _edit_split(project, change):
    split = pd.read_csv(project / "data/prepared/split.csv", dtype=str, keep_default_na=False)
    change(split)
    split.to_csv(project / "data/prepared/split.csv", index=False)


def _duplicate_first_catalog_row(project):
    cat = pd.read_csv(project / "data/prepared/catalog.csv", dtype=str, keep_default_na=False)
    pd.concat([cat, cat.iloc[:1]]).to_csv(project / "data/prepared/catalog.csv", index=False)


@pytest.mark.parametrize("damage, match", [
    # an empty embeddings file (a killed writer): no EOFError traceback
    (lambda p: (p / "data/embeddings/embeddings.npy").write_bytes(b""), "cannot load embeddings"),
    # embeddings of dimension 0
    (lambda p: _edit_npy(p, "embeddings.npy", lambda e: e[:, :0]), "do not align; re-run encode"),
    # ids.npy names one image twice (its second row is the first's id)
    (lambda p: _edit_npy(p, "ids.npy", lambda i: np.r_[i[:1], i[:1], i[2:]]), "ids.npy repeats image_id"),
    # the catalog lists one image twice
    (_duplicate_first_catalog_row, "image_id must be unique"),
    # query flags spelled in lower case: not silently read as False
    (lambda p: _edit_split(p, lambda s: s.__setitem__("query", s["query"].str.lower())),
     "query and gallery must be True or False"),
    # no query at all
    (lambda p: _edit_split(p, lambda s: s.__setitem__("query", "False")), "split.csv marks no image as a query"),
    # the split names an image the catalog does not have (outputs of two different runs)
    (lambda p: _drop_catalog_row_of_first_query(p), "1 split images are not in the catalog"),
    # the catalog is not a CSV any more
    (lambda p: (p / "data/prepared/catalog.csv").write_bytes(b"\x00\x01garbage"),
     "catalog.csv lacks column(s) image_id"),
    # the split file is gone
    (lambda p: (p / "data/prepared/split.csv").unlink(), "split.csv not found; run the earlier stages first"),
])
def test_score_reports_damaged_inputs(scored_project, damage, match):
    damage(scored_project)
    run_fails(scored_project, "score", match)
    assert not (scored_project / METRICS).exists()


def test_nan_embedding_names_the_file_and_the_image(scored_project):
    ids = np.load(scored_project / IDS)
    split = pd.read_csv(scored_project / SPLIT)
    gallery_id = split.loc[split["gallery"], "image_id"].iloc[3]
    _edit_npy(scored_project, "embeddings.npy", lambda e: np.where((ids == gallery_id)[:, None], np.nan, e))
    run_fails(scored_project, "score", f"embeddings.npy have NaN or inf for 1 image(s) (e.g. {gallery_id})")


@pytest.mark.parametrize("text", ["{bad", "{}", "[1]"])  # not JSON; JSON without a metric; not a mapping
def test_show_refuses_a_broken_metrics_file(scored_project, text):
    (scored_project / METRICS).write_text(text)
    run_fails(scored_project, "score", "recall.json is not a metrics file written by this stage", args=["--show"])


def test_show_needs_the_counts_beside_the_means(scored_project):
    (scored_project / COUNTS).unlink()
    run_fails(scored_project, "score", "metrics/counts.json not found", args=["--show"])
    (scored_project / COUNTS).write_text("{}")  # the counts' keys missing
    run_fails(scored_project, "score", "recall.json is not a metrics file written by this stage", args=["--show"])


def test_params_that_are_not_utf8_are_named(scored_project):
    with open(scored_project / "params.yaml", "ab") as fh:
        fh.write(b"# caf\xe9\n")
    run_fails(scored_project, "score", "params.yaml is not UTF-8 text")


def test_exclusion_that_excludes_every_query_names_the_param(scored_project):
    # every digit is 8 pixels wide: every positive shares it
    set_params(scored_project, {"score.exclude_same": ["width"]})
    run_fails(scored_project, "score",
              "with `score.exclude_same: ['width']` no query keeps a same-label gallery item")


def test_exclusion_typo_never_suggests_the_label(scored_project):
    set_params(scored_project, {"score.exclude_same": ["labl"]})
    proc = run_fails(scored_project, "score", "names ['labl'], which the catalog does not have")
    assert "Did you mean `label`" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------- params


@pytest.mark.parametrize("columns, fragments", [
    (["lens"], ["`score.exclude_same` names ['lens']"]),                              # no such catalog column
    (["camra"], ["['camra']", "Did you mean `camera`?"]),                              # a typo: the column suggested
    (["camera", "label"], ["['label']", "neither is an exclusion column"]),            # the label decides positives
    (["image_id"], ["['image_id']", "neither is an exclusion column"]),                # the id decides self-matches
])
def test_exclude_same_unknown_column(camera, columns, fragments):
    proj = camera
    set_params(proj, {"score.exclude_same": columns})
    plant_stale(proj, SCORE_OUTPUTS)
    proc = run_fails(proj, "score")
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr
    reserved = "neither is an exclusion column" in fragments
    listed = proc.stderr.split("name another catalog column" if reserved else "Catalog columns:", 1)[1]
    for column in ("path", "sha256", "width", "height", "camera") + (() if reserved else ("label",)):
        assert column in listed, proc.stderr
    assert_no_outputs(proj, SCORE_OUTPUTS)


def test_whitening_without_train_images_is_a_user_error(scored_project):
    set_params(scored_project, {"split.fractions": {"train": 0.0, "val": 0.5, "gallery": 0.5}, "score.whiten": "pca"})
    run_ok(scored_project, "split")
    plant_stale(scored_project, SCORE_OUTPUTS)
    proc = run_fails(scored_project, "score")
    assert "`score.whiten: pca`" in proc.stderr and "0 image(s)" in proc.stderr, proc.stderr
    assert "score.whiten: none" in proc.stderr
    assert_no_outputs(scored_project, SCORE_OUTPUTS)


def test_param_errors_are_reported_at_once(scored_project):
    set_params(scored_project, {"score.metrics": ["recal"], "score.backend": "fast", "score.bootstrap.confidence": 1.5,
                                "score.exclude_same": "camera", "score.bootsrap": {"seed": 1}})
    proc = run_fails(scored_project, "score")
    err = proc.stderr
    assert err.startswith("error: invalid params.yaml"), err
    for fragments in (["`score.metrics`", "'recal'", "Did you mean `recall`?"],
                      ["`score.backend` must be one of numpy, torch", "'fast'"],
                      ["`score.bootstrap.confidence` must be a number strictly between 0 and 1", "1.5"],
                      ["`score.exclude_same` must be a list", "'camera'"],
                      ["`score.bootsrap` is not a known param", "Did you mean `bootstrap`?"]):
        line = next((ln for ln in err.splitlines() if fragments[0] in ln), None)
        assert line is not None, err
        for fragment in fragments[1:]:
            assert fragment in line, line
    assert_no_outputs(scored_project, SCORE_OUTPUTS)


def test_unknown_key_in_another_section_is_reported(project):
    """params.py: every problem in the file (unknown keys anywhere, ...) is reported at once."""
    edit_params(project, lambda p: (p["split"].update(sed=1), p["score"].update(ks=[0])))
    run_fails(project, "score", "`split.sed`", "Did you mean `seed`?",
              "`score.ks` must be positive integers. Got [0] instead.")
    assert_no_outputs(project)


@pytest.mark.parametrize("ks, shown", [
    ([0], "[0]"),        # zero
    ([-1], "[-1]"),      # negative
    ([1.5], "[1.5]"),    # not an integer
    ("5", "'5'"),        # a string, not a list
    ([], "[]"),          # empty list
    ([True], "[True]"),  # a bool is not an integer
])
def test_score_rejects_bad_ks(project, ks, shown):
    set_params(project, {"score.ks": ks})
    proc = run_fails(project, "score", f"`score.ks` must be positive integers. Got {shown} instead.")
    assert "not found" not in proc.stderr  # params are checked before inputs are read
    assert_no_outputs(project)


def test_score_rejects_repeated_ks(project):
    set_params(project, {"score.ks": [1, 5, 1]})
    run_fails(project, "score", "`score.ks` must not repeat a value.")


def test_failing_score_removes_stale_metrics(scored_project):
    assert (scored_project / METRICS).is_file()
    set_params(scored_project, {"score.ks": [0]})
    run_fails(scored_project, "score", "`score.ks` must be positive integers.")
    assert not (scored_project / METRICS).exists()
    assert not list(scored_project.rglob("*.tmp"))


# ---------------------------------------------------------------- a tampered catalog (issue 25)
# Moved from the hostile corpus (test_hostile_trust.py).


def test_a_tampered_catalog_never_makes_encode_or_score_read_outside_the_data_or_draw_a_changed_file(
        scored_project, tmp_path):
    proj = scored_project  # split, encode and score done (a stage project: marked stage)
    original = (proj / CATALOG).read_text()
    first = original.splitlines()[1].split(",")  # image_id,path,label,sha256,...
    outside = proj.parent / "outside.png"
    outside.write_bytes((proj / first[1]).read_bytes())  # the same bytes: its sha256 matches the catalog's
    images = sorted((proj / "data" / "digits").rglob("*.png"))
    for image in images:  # every file swapped with other pixels of the same size
        Image.new("RGB", Image.open(image).size, (0, 255, 0)).save(image)
    assert_user_error(run_in_process("score", cwd=proj), "changed since split", "sha256")
    assert_no_outputs(proj, SCORE_OUTPUTS)
    # score, then encode (which read the outside file before: it had no path rule): each refuses before it
    # opens an image
    for stage, written in (("score", SCORE_OUTPUTS), ("encode", ENCODE_OUTPUTS)):
        for path in (str(outside),                                            # an absolute path outside
                     f"{first[1].rsplit('/', 2)[0]}/../../../outside.png"):  # a '..' path out of the data root
            (proj / CATALOG).write_text(original.replace(f",{first[1]},", f",{path},", 1))
            assert_user_error(run_in_process(stage, cwd=proj), "catalog.csv", "line 2", "not inside the data root",
                              path)
            assert_no_outputs(proj, written)
