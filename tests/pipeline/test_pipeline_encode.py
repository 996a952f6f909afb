"""The encode stage under real DVC: the embedding cache and backbone experiments."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from extras import extra
from helpers import (
    EMBEDDINGS,
    SPLIT,
    commit,
    copy_digits,
    copy_pipeline,
    dvc,
    git,
    git_init,
    read_csv,
    read_metrics,
    repro,
    save_image,
)

pytestmark = pytest.mark.pipeline

ENCODED_RE = re.compile(r"encoded (\d+) images, served (\d+) from the cache")


def encode_counts(out: str) -> tuple[int, int]:
    found = ENCODED_RE.findall(out)
    assert len(found) == 1, out
    return int(found[0][0]), int(found[0][1])


def scored_images(metrics: dict) -> int:
    """Images the metrics count: every query (scored or excluded) and every gallery item."""
    return metrics["num_queries"] + metrics["num_excluded_queries"] + metrics["num_gallery"]


def test_adding_10_images_to_1000_encodes_only_those_10(tmp_path: Path) -> None:
    repo = copy_pipeline(tmp_path / "repo", per_label=0)
    copy_digits(repo / "data" / "digits", per_label=100)  # 10 labels x 100 = 1,000 images
    git_init(repo)
    ran, _, out = repro(repo)
    assert "encode" in ran and encode_counts(out) == (1000, 0)
    before = read_metrics(repo)
    commit(repo, "repro")
    for i in range(10):  # 10 new, distinct 8x8 grayscale images, one per label
        save_image(repo / "data" / "digits" / str(i) / f"new_{i}.png", seed=1000 + i, size=(8, 8), mode="L")
    ran, _, out = repro(repo)
    assert ran == {"split", "encode", "score", "index"}, out
    assert encode_counts(out) == (10, 1000)
    # score re-ran on the grown split: its counts are the new split's, and the new eval images are in them
    split = read_csv(repo, SPLIT)
    assert len(split) == 1010
    new_eval = split[split["image_id"].str.contains("/new_") & split["split"].isin(["val", "gallery"])]
    assert len(new_eval) == 5  # class_disjoint, train 0.5: one new image in each of the 5 eval labels
    after = read_metrics(repo)
    assert after["num_queries"] + after["num_excluded_queries"] == (split["query"] == "True").sum()
    assert after["num_gallery"] == (split["gallery"] == "True").sum()
    assert scored_images(after) == scored_images(before) + len(new_eval)


def test_forced_encode_with_unchanged_data_encodes_nothing(repo: Path) -> None:
    before = (repo / EMBEDDINGS).read_bytes()
    ran, _, out = repro(repo, "--force", "encode")
    assert "encode" in ran and encode_counts(out) == (0, 200)
    assert (repo / EMBEDDINGS).read_bytes() == before
    assert git("status", "--porcelain", cwd=repo).stdout == ""


def test_backbone_experiment_flow(repo: Path) -> None:
    """README recipe: `dvc exp run -S encode.backbone=efficientnet_lite0`, then compare with pixels."""
    extra("torch", "torch")  # efficientnet_lite0 is the torch extra's: skipped without it (make test: fails)
    baseline = read_metrics(repo)
    proc = dvc("exp", "run", "-S", "encode.backbone=efficientnet_lite0", cwd=repo)
    out = proc.stdout + proc.stderr
    assert "Running stage 'encode'" in out and "Running stage 'split'" not in out, out
    assert encode_counts(out) == (200, 0)
    lite = read_metrics(repo)
    assert lite["embedding_dim"] == 1280 and baseline["embedding_dim"] == 768
    assert lite["num_queries"] == baseline["num_queries"]  # same split, other backbone

    diff = json.loads(dvc("metrics", "diff", "--json", cwd=repo).stdout)["metrics/recall.json"]
    assert "embedding_dim" not in diff  # a count: metrics/counts.json, not a declared metrics file
    counts = json.loads(dvc("metrics", "diff", "--targets", "metrics/counts.json", "--json", cwd=repo).stdout)
    assert counts["metrics/counts.json"]["embedding_dim"] == {"old": 768, "new": 1280, "diff": 512}
    assert diff["recall@1"]["old"] == pytest.approx(baseline["recall@1"])
    assert diff["recall@1"]["new"] == pytest.approx(lite["recall@1"])

    shown = json.dumps(json.loads(dvc("exp", "show", "--json", cwd=repo).stdout))
    assert "efficientnet_lite0" in shown and "recall@1" in shown
