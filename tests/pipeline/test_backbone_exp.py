"""Backbone families under real DVC: `dvc exp run -S encode.backbone=timm:<model> -S encode.timm.weights=<file>`
in a temp git repo, offline, and a weights file replaced in place re-runs encode (a DVC dep)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from extras import extra
from helpers import EMBEDDINGS, copy_pipeline, dvc, git_init, read_metrics

extra("timm", "timm")  # without it, this file is skipped
import timm
import torch

from torch_helpers import save_state_dict

pytestmark = pytest.mark.pipeline

ENCODED_RE = re.compile(r"encoded (\d+) images, served (\d+) from the cache")
WEIGHTS = "weights/test_vit.safetensors"


def encode_counts(out: str) -> tuple[int, int]:
    found = ENCODED_RE.findall(out)
    assert len(found) == 1, out
    return int(found[0][0]), int(found[0][1])


def write_weights(repo: Path, seed: int) -> None:
    torch.manual_seed(seed)
    save_state_dict(timm.create_model("test_vit", pretrained=False).state_dict(), repo / WEIGHTS)


def exp_run(repo: Path, *args: str) -> str:
    proc = dvc("exp", "run", *args, cwd=repo)
    return proc.stdout + proc.stderr


def test_timm_experiment_with_a_local_weights_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may come from the network
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf_home"))
    repo = copy_pipeline(tmp_path / "repo", per_label=6)  # 60 digits
    write_weights(repo, seed=0)
    git_init(repo)

    out = exp_run(repo, "-S", "encode.backbone=timm:test_vit", "-S", f"encode.timm.weights={WEIGHTS}")
    assert "Running stage 'encode'" in out and encode_counts(out) == (60, 0), out
    first = np.load(repo / EMBEDDINGS)
    assert first.shape == (60, 64) and first.dtype == np.float32  # test_vit's pooled features
    assert read_metrics(repo)["embedding_dim"] == 64
    provenance = json.loads((repo / "data/embeddings/provenance.json").read_text())
    assert provenance["backbone"] == "timm:test_vit"

    write_weights(repo, seed=1)  # the same file name, other weights: DVC sees the dep change
    out = exp_run(repo)
    assert "Running stage 'encode'" in out and "Running stage 'split'" not in out, out
    assert encode_counts(out) == (60, 0)  # another fingerprint: nothing served from the cache
    assert not np.array_equal(np.load(repo / EMBEDDINGS), first)

    write_weights(repo, seed=0)  # back to the first weights: DVC's run-cache restores the first outputs
    out = exp_run(repo)
    assert "Stage 'encode' is cached - skipping run" in out, out
    assert np.load(repo / EMBEDDINGS).tobytes() == first.tobytes()


def test_missing_weights_fail_the_experiment_with_one_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf_home"))
    repo = copy_pipeline(tmp_path / "repo", per_label=2)
    git_init(repo)
    proc = dvc("exp", "run", "-S", "encode.backbone=timm:test_vit", cwd=repo, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert "error: `encode.backbone: timm:test_vit` needs weights" in out
    assert "hf download timm/test_vit.r160_in1k" in out
