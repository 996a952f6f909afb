"""Leakage checks and the embeddings-only mode under real ``dvc repro``, in temporary git repositories.

One repo holds smooth colour images with planted near-copies (``test_leakage.LABELS`` / ``PLANTED``):
the three ``split.near_duplicates`` policies and ``score.embedding_copies.min_cosine`` run on it. Another
holds a manifest of ids and precomputed embeddings: replacing the embeddings file in place re-runs
encode and score (the file is a DVC dependency of encode).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import PROJECT_CACHE, ROOT, cache_in, dvc, git, read_metrics, run_module, set_params
from leakage_helpers import LEAK_LABELS as LABELS
from leakage_helpers import LEAK_PLANTED as PLANTED
from leakage_helpers import planted_pairs
from leakage_helpers import write_planted_images as write_images

pytestmark = pytest.mark.pipeline

FILES = ("dvc.yaml", "params.yaml", ".dvc/config", ".dvc/.gitignore", ".dvcignore", ".gitignore")
RAN_RE = re.compile(r"Running stage '([^']+)'")
SKIPPED_RE = re.compile(r"Stage '([^']+)' didn't change, skipping")
PAIRS = "data/prepared/near_duplicates.csv"


def make_repo(dest: Path, params: dict) -> Path:
    """The project's pipeline (stages, library, dvc.yaml, params.yaml with ``params`` set) in a new git repo."""
    dest.mkdir(parents=True)
    for package in ("stages", "recallk"):
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for rel in FILES:
        if (ROOT / rel).exists():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    set_params(dest, params)
    return dest


def commit(repo: Path, message: str) -> None:
    git("add", "-A", cwd=repo)
    git("commit", "-q", "--allow-empty", "-m", message, cwd=repo)


def repro(repo: Path, check: bool = True) -> tuple[set[str], set[str], str, int]:
    proc = dvc("repro", cwd=repo, check=check)
    out = proc.stdout + proc.stderr
    return set(RAN_RE.findall(out)), set(SKIPPED_RE.findall(out)), out, proc.returncode


def read(repo: Path, rel: str) -> pd.DataFrame:
    return pd.read_csv(repo / rel, dtype=str, keep_default_na=False)


def recall_json(repo: Path) -> dict:
    """The means and counts (metrics/recall.json and metrics/counts.json) and the intervals."""
    return read_metrics(repo)


def copy_repo(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    return dest


@pytest.fixture(scope="module")
def images_base(tmp_path_factory) -> Path:
    """Planted near-copies, reproduced once under ``policy: report`` and committed."""
    repo = make_repo(tmp_path_factory.mktemp("leak") / "repo",
                     {"split.data_root": "data/images", "split.strategy": "per_class", "split.seed": 1,
                      "score.failures.queries": 2, "score.bootstrap.resamples": 50})
    write_images(repo / "data" / "images", LABELS, PLANTED)
    git("init", "-q", "-b", "main", cwd=repo)
    commit(repo, "pipeline and images")
    with cache_in(repo):  # its own embedding cache, copied with it
        ran, _, out, _ = repro(repo)
    assert ran == {"split", "encode", "score", "index"}, out
    commit(repo, "dvc repro")
    return repo


@pytest.fixture
def images_repo(images_base, tmp_path, monkeypatch) -> Path:
    repo = copy_repo(images_base, tmp_path / "repo")
    monkeypatch.setenv("RECALLK_CACHE_DIR", str(repo / PROJECT_CACHE))
    return repo


def _crossing(pairs: pd.DataFrame, split: pd.DataFrame) -> tuple[int, int]:
    query = dict(zip(split["image_id"], split["query"].eq("True")))
    gallery = dict(zip(split["image_id"], split["gallery"].eq("True")))
    train_eval = ((pairs["split_a"] == "train") != (pairs["split_b"] == "train")).sum()
    qg = sum((query[a] and gallery[b]) or (query[b] and gallery[a]) for a, b in zip(pairs["id_a"], pairs["id_b"]))
    return int(train_eval), int(qg)


def test_report_lists_the_pairs_counts_them_in_the_metrics_and_warns(images_base):
    repo = images_base
    pairs = read(repo, PAIRS)
    assert set(zip(pairs["id_a"], pairs["id_b"])) == planted_pairs()
    train_eval, query_gallery = _crossing(pairs, read(repo, "data/prepared/split.csv"))
    assert train_eval + query_gallery > 0, "the seed must put a planted pair across the split"
    metrics = recall_json(repo)
    assert metrics["near_duplicates_train_eval"] == train_eval
    assert metrics["near_duplicates_query_gallery"] == query_gallery
    assert metrics["near_duplicates_cross_label"] == 1
    provenance = json.loads((repo / "data/prepared/provenance.json").read_text())
    assert provenance["near_duplicates"] == {"policy": "report", "max_distance": 10, "pairs": 4,
                                             **{k: metrics[k] for k in metrics if k.startswith("near_duplicates_")},
                                             "too_small_to_check": 0}
    shown = dvc("status", cwd=repo).stdout  # committed and up to date
    assert "up to date" in shown, shown
    report = run_module("stages.score", "--show", cwd=repo, check=True).stdout
    positives = metrics["near_duplicates_same_label_query_gallery"]  # a query and its positive: no warning
    assert "[near-duplicates]" in report
    assert ("warning:" in report) == bool(train_eval + query_gallery - positives)
    assert f"train-eval pairs:    {train_eval}" in report


def test_group_keeps_the_clusters_together_and_only_resplits(images_repo):
    repo = images_repo
    catalog = (repo / "data/prepared/catalog.csv").read_bytes()
    set_params(repo, {"split.near_duplicates.policy": "group"})
    ran, skipped, out, _ = repro(repo)
    assert ran == {"split", "score", "index"} and skipped == {"encode"}, out  # the catalog does not change
    assert (repo / "data/prepared/catalog.csv").read_bytes() == catalog
    pairs = read(repo, PAIRS)
    assert set(zip(pairs["id_a"], pairs["id_b"])) == planted_pairs()
    assert (pairs["split_a"] == pairs["split_b"]).all(), pairs
    metrics = recall_json(repo)
    assert metrics["near_duplicates_train_eval"] == metrics["near_duplicates_query_gallery"] == 0
    assert "warning:" not in out


def test_error_stops_the_split_and_names_the_pairs(images_repo):
    repo = images_repo
    set_params(repo, {"split.near_duplicates.policy": "error"})
    ran, _, out, code = repro(repo, check=False)
    assert code != 0 and ran == {"split"}, out
    assert "near-duplicate pair(s) (pHash within 10 of 64 bits) leak across the split" in out, out
    assert re.search(r"'l\d/(copy_\w+|\d+)\.png' \(l\d, (train|val|gallery)\) ~ ", out), out
    assert "Traceback" not in out
    assert not (repo / "data/prepared/split.csv").exists() and not (repo / PAIRS).exists()


def test_embedding_check_flags_the_copies_and_reports_without_them(images_repo):
    repo = images_repo
    before = recall_json(repo)
    set_params(repo, {"score.embedding_copies.min_cosine": 0.99})
    ran, skipped, out, _ = repro(repo)
    assert ran == {"score", "index"} and skipped == {"split", "encode"}, out
    split = read(repo, "data/prepared/split.csv")
    query = dict(zip(split["image_id"], split["query"].eq("True")))
    gallery = dict(zip(split["image_id"], split["gallery"].eq("True")))
    expected = {(a, b) for a, b in planted_pairs() if query[a] and gallery[b]} | {
        (b, a) for a, b in planted_pairs() if query[b] and gallery[a]}
    flagged = read(repo, "data/scores/embedding_copies.csv")
    assert set(zip(flagged["image_id"], flagged["gallery_id"])) == expected and expected
    metrics = recall_json(repo)
    assert metrics["num_embedding_copy_queries"] == len({q for q, _ in expected})
    assert {k: metrics[k] for k in before} == before  # the other numbers stay
    assert "recall@1_without_embedding_copies" in metrics and "map@r_without_embedding_copies" in metrics
    assert "in pixels embeddings" in out and "queries with a near copy (embeddings)" in out


# ---------------------------------------------------------------------------------------- embeddings only


def _embeddings(ids: list[str], labels: list[str], noise: float, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    classes = sorted(set(labels))
    centres = rng.normal(size=(len(classes), 16))
    emb = centres[[classes.index(lab) for lab in labels]] + noise * rng.normal(size=(len(ids), 16))
    order = rng.permutation(len(ids))  # any row order: the stage aligns by id
    return {"ids": np.array(ids)[order], "embeddings": emb[order].astype(np.float32)}


def test_embeddings_only_runs_and_replacing_the_file_in_place_reencodes(tmp_path):
    repo = make_repo(tmp_path / "repo", {"split.data_root": "data/ids", "split.csv": "manifest.csv",
                                         "encode.backbone": "precomputed",
                                         "encode.precomputed.path": "embeddings/emb.npz",
                                         "score.bootstrap.resamples": 50})
    ids = [f"item{i:04d}" for i in range(400)]
    labels = [f"c{i % 20}" for i in range(400)]
    (repo / "data/ids").mkdir(parents=True)
    (repo / "data/ids/manifest.csv").write_text("image_id,label\n" + "".join(f"{i},{lab}\n" for i, lab in
                                                                             zip(ids, labels)))
    (repo / "embeddings").mkdir()
    np.savez(repo / "embeddings/emb.npz", **_embeddings(ids, labels, noise=0.5, seed=0))
    git("init", "-q", "-b", "main", cwd=repo)
    commit(repo, "ids and embeddings")
    ran, _, out, _ = repro(repo)
    assert ran == {"split", "encode", "score", "index"}, out
    assert "near-dups:     unavailable (embeddings-only catalog" in out
    catalog = read(repo, "data/prepared/catalog.csv")
    assert (catalog["path"] == "").all() and len(catalog) == 400
    assert json.loads((repo / "data/prepared/provenance.json").read_text())["near_duplicates"] is None
    first = recall_json(repo)
    assert not any(k.startswith("near_duplicates_") for k in first)
    commit(repo, "repro")

    # the same path, new content: DVC sees the dependency change
    np.savez(repo / "embeddings/emb.npz", **_embeddings(ids, labels, noise=2.0, seed=1))
    ran, skipped, out, _ = repro(repo)
    assert ran == {"encode", "score", "index"} and skipped == {"split"}, out
    assert recall_json(repo)["recall@1"] != first["recall@1"]
    ran, skipped, out, _ = repro(repo)
    assert not ran and skipped == {"split", "encode", "score", "index"}, out

    # without the precomputed backbone there is nothing to encode: one clear message
    set_params(repo, {"encode.backbone": "pixels"})
    ran, _, out, code = repro(repo, check=False)
    assert code != 0 and ran == {"encode"}, out
    assert "so `encode.backbone: pixels` has nothing to encode; set `encode.backbone: precomputed`" in out, out
    assert "Traceback" not in out
