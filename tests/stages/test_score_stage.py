"""The score stage end to end on a digits subset: metrics file, report block, stale inputs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from recallk import recall_at_k, retrieval_summary

from conftest import run_module


@pytest.fixture
def scored(project):
    for stage in ("stages.split", "stages.encode", "stages.score"):
        proc = run_module(stage, cwd=project)
        assert proc.returncode == 0, proc.stderr
    return project, proc


def test_metrics_file_is_flat_and_matches_the_api(scored):
    project, proc = scored
    metrics = json.loads((project / "metrics/recall.json").read_text())
    headline = ["recall@1", "recall@5", "recall@10", "precision@1", "precision@5", "precision@10", "r_precision",
                "map@r", "map", "mrr"]
    assert list(metrics)[:10] == headline
    assert all(isinstance(v, (int, float)) for v in metrics.values())  # flat: dvc metrics diff shows every key
    split = pd.read_csv(project / "data/prepared/split.csv")
    cat = pd.read_csv(project / "data/prepared/catalog.csv", dtype=str).set_index("image_id")
    emb = np.load(project / "data/embeddings/embeddings.npy")
    row = {i: n for n, i in enumerate(np.load(project / "data/embeddings/ids.npy"))}
    q = split.loc[split["query"], "image_id"].tolist()
    g = split.loc[split["gallery"], "image_id"].tolist()
    expected = retrieval_summary(emb[[row[i] for i in q]], emb[[row[i] for i in g]], cat.loc[q, "label"],
                                 cat.loc[g, "label"], ks=(1, 5, 10), query_ids=q, gallery_ids=g, metrics=None)
    assert {k: metrics[k] for k in expected} == expected
    assert metrics["num_queries"] + metrics["num_excluded_queries"] == len(q)
    assert metrics["num_gallery"] == len(g) and metrics["embedding_dim"] == 768
    assert 0.5 < metrics["recall@1"] <= metrics["recall@5"] <= metrics["recall@10"] <= 1.0


def test_report_block_is_printed(scored):
    project, proc = scored
    for line in ("[evaluation]", "num queries:", "num gallery:", "embedding_dim: 768", "[recall]", "recall@1:"):
        assert line in proc.stdout
    shown = run_module("stages.score", "--show", cwd=project)
    assert shown.returncode == 0 and shown.stdout.strip() == proc.stdout.strip()


def test_leave_one_out_scores_every_eval_image(project):
    params = (project / "params.yaml").read_text().replace("protocol: query_gallery", "protocol: leave_one_out")
    (project / "params.yaml").write_text(params)
    for stage in ("stages.split", "stages.encode", "stages.score"):
        assert run_module(stage, cwd=project).returncode == 0
    metrics = json.loads((project / "metrics/recall.json").read_text())
    split = pd.read_csv(project / "data/prepared/split.csv")
    assert (split["query"] == split["gallery"]).all()          # eval images are both
    assert metrics["num_queries"] == metrics["num_gallery"] == int(split["query"].sum())
    assert metrics["recall@1"] < 1.0 or metrics["num_excluded_queries"] == 0


def test_stale_embeddings_are_refused(scored):
    project, _ = scored
    ids = np.load(project / "data/embeddings/ids.npy")
    emb = np.load(project / "data/embeddings/embeddings.npy")
    split = pd.read_csv(project / "data/prepared/split.csv")
    keep = ids != split.loc[split["query"], "image_id"].iloc[0]  # drop one query's embedding
    np.save(project / "data/embeddings/ids.npy", ids[keep])
    np.save(project / "data/embeddings/embeddings.npy", emb[keep])
    proc = run_module("stages.score", cwd=project)
    assert proc.returncode == 2
    assert "1 split images have no embedding" in proc.stderr and "run `dvc repro`" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (project / "metrics/recall.json").exists()


def test_api_recall_matches_summary_keys():
    rng = np.random.default_rng(0)
    q, g = rng.normal(size=(5, 3)), rng.normal(size=(7, 3))
    ql, gl = [0, 1, 0, 1, 2], [0, 1, 2, 0, 1, 2, 2]
    assert recall_at_k(q, g, ql, gl, ks=(2, 1)) == {k: v for k, v in retrieval_summary(q, g, ql, gl, ks=(2, 1)).items()
                                                     if k.startswith("recall@")}


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
    (lambda p: (p / "data/prepared/catalog.csv").write_bytes(b"\x00\x01garbage"), "catalog.csv lacks column(s) image_id"),
    # the split file is gone
    (lambda p: (p / "data/prepared/split.csv").unlink(), "split.csv not found; run the earlier stages first"),
])
def test_score_reports_damaged_inputs(scored, damage, match):
    project, _ = scored
    damage(project)
    proc = run_module("stages.score", cwd=project)
    assert proc.returncode == 2 and match in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (project / "metrics/recall.json").exists()


def test_nan_embedding_names_the_file_and_the_image(scored):
    project, _ = scored
    ids = np.load(project / "data/embeddings/ids.npy")
    split = pd.read_csv(project / "data/prepared/split.csv")
    gallery_id = split.loc[split["gallery"], "image_id"].iloc[3]
    _edit_npy(project, "embeddings.npy", lambda e: np.where((ids == gallery_id)[:, None], np.nan, e))
    proc = run_module("stages.score", cwd=project)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"embeddings.npy have NaN or inf for 1 image(s) (e.g. {gallery_id})" in proc.stderr, proc.stderr


@pytest.mark.parametrize("text", ["{bad", "{}", "[1]"])  # not JSON; JSON without the counts; not a mapping
def test_show_refuses_a_broken_metrics_file(scored, text):
    project, _ = scored
    (project / "metrics/recall.json").write_text(text)
    proc = run_module("stages.score", "--show", cwd=project)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "recall.json is not a metrics file written by this stage" in proc.stderr


def test_params_that_are_not_utf8_are_named(scored):
    project, _ = scored
    with open(project / "params.yaml", "ab") as fh:
        fh.write(b"# caf\xe9\n")
    proc = run_module("stages.score", cwd=project)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "params.yaml is not UTF-8 text" in proc.stderr


def _set_score(project, **values):
    import yaml

    params = yaml.safe_load((project / "params.yaml").read_text())
    params["score"].update(values)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def test_exclusion_that_excludes_every_query_names_the_param(scored):
    project, _ = scored
    _set_score(project, exclude_same=["width"])  # every digit is 8 pixels wide: every positive shares it
    proc = run_module("stages.score", cwd=project)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "with `score.exclude_same: ['width']` no query keeps a same-label gallery item" in proc.stderr


def test_exclusion_typo_never_suggests_the_label(scored):
    project, _ = scored
    _set_score(project, exclude_same=["labl"])
    proc = run_module("stages.score", cwd=project)
    assert proc.returncode == 2 and "names ['labl'], which the catalog does not have" in proc.stderr
    assert "Did you mean `label`" not in proc.stderr, proc.stderr


def test_faiss_backend_keeps_its_loader_quiet(scored):
    project, _ = scored
    _set_score(project, backend="faiss")
    proc = run_module("stages.score", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert "faiss" not in proc.stderr.lower(), proc.stderr
