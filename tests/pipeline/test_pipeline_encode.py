"""The encode stage under real DVC: the embedding cache and backbone experiments."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import copy_digits, dvc, git, save_image
from test_pipeline import commit, copy_project, git_init, metrics, repro

pytestmark = pytest.mark.pipeline

ENCODED_RE = re.compile(r"encoded (\d+) images, served (\d+) from the cache")


def encode_counts(out: str) -> tuple[int, int]:
    found = ENCODED_RE.findall(out)
    assert len(found) == 1, out
    return int(found[0][0]), int(found[0][1])


def test_adding_10_images_to_1000_encodes_only_those_10(tmp_path: Path) -> None:
    repo = copy_project(tmp_path / "repo")
    copy_digits(repo / "data" / "digits", per_label=100)  # 10 labels x 100 = 1,000 images
    git_init(repo)
    ran, _, out = repro(repo)
    assert "encode" in ran and encode_counts(out) == (1000, 0)
    commit(repo, "repro")
    for i in range(10):  # 10 new, distinct 8x8 grayscale images, one per label
        save_image(repo / "data" / "digits" / str(i) / f"new_{i}.png", seed=1000 + i, size=(8, 8), mode="L")
    ran, _, out = repro(repo)
    assert ran == {"split", "encode", "score"}, out
    assert encode_counts(out) == (10, 1000)
    assert metrics(repo)["num_gallery"] + metrics(repo)["num_queries"] + metrics(repo)["num_excluded_queries"] > 0


def test_forced_encode_with_unchanged_data_encodes_nothing(tmp_path: Path) -> None:
    repo = copy_project(tmp_path / "repo")
    git_init(repo)
    repro(repo)
    commit(repo, "repro")
    before = (repo / "data/embeddings/embeddings.npy").read_bytes()
    ran, _, out = repro(repo, "--force", "encode")
    assert "encode" in ran and encode_counts(out) == (0, 200)
    assert (repo / "data/embeddings/embeddings.npy").read_bytes() == before
    assert git("status", "--porcelain", cwd=repo).stdout == ""


def test_backbone_experiment_flow(tmp_path: Path) -> None:
    """README recipe: `dvc exp run -S encode.backbone=efficientnet_lite0`, then compare with pixels."""
    repo = copy_project(tmp_path / "repo")
    git_init(repo)
    repro(repo)
    commit(repo, "pixels baseline")
    baseline = metrics(repo)
    proc = dvc("exp", "run", "-S", "encode.backbone=efficientnet_lite0", cwd=repo)
    out = proc.stdout + proc.stderr
    assert "Running stage 'encode'" in out and "Running stage 'split'" not in out, out
    assert encode_counts(out) == (200, 0)
    lite = metrics(repo)
    assert lite["embedding_dim"] == 1280 and baseline["embedding_dim"] == 768
    assert lite["num_queries"] == baseline["num_queries"]  # same split, other backbone

    diff = json.loads(dvc("metrics", "diff", "--json", cwd=repo).stdout)["metrics/recall.json"]
    assert diff["embedding_dim"] == {"old": 768, "new": 1280, "diff": 512}
    assert diff["recall@1"]["old"] == pytest.approx(baseline["recall@1"])
    assert diff["recall@1"]["new"] == pytest.approx(lite["recall@1"])

    shown = json.dumps(json.loads(dvc("exp", "show", "--json", cwd=repo).stdout))
    assert "efficientnet_lite0" in shown and "recall@1" in shown
