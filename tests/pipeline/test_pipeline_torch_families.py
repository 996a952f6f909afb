"""torchvision:<model> and hf:<dir> under real DVC: `dvc exp run -S`, and a changed weights file re-encodes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from extras import extra
from helpers import EMBEDDINGS, commit, copy_pipeline, dvc, git_init, repro, set_params

extra("torch", "torch")  # without it, this file is skipped
import torch
import torchvision

pytestmark = pytest.mark.pipeline

ENCODED_RE = re.compile(r"encoded (\d+) images, served (\d+) from the cache")
PREPROCESS = {"encode.torchvision.resize": 40, "encode.torchvision.crop": 32,
              "encode.torchvision.mean": [0.5, 0.5, 0.5], "encode.torchvision.std": [0.25, 0.25, 0.25]}


def encoded(out: str) -> tuple[int, int]:
    found = ENCODED_RE.findall(out)
    assert len(found) == 1, out
    return int(found[0][0]), int(found[0][1])


def save_squeezenet(path: Path, seed: int) -> None:
    torch.manual_seed(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(torchvision.models.get_model("squeezenet1_1", weights=None).state_dict(), path)


def provenance(repo: Path) -> dict:
    return json.loads((repo / "data/embeddings/provenance.json").read_text())


def test_torchvision_exp_run_and_changed_weights_reencode(tmp_path: Path) -> None:
    repo = copy_pipeline(tmp_path / "repo", per_label=3)  # 30 digits
    save_squeezenet(repo / "models" / "squeezenet.pth", seed=0)
    set_params(repo, PREPROCESS)
    git_init(repo)
    proc = dvc("exp", "run", "-S", "encode.backbone=torchvision:squeezenet1_1",
               "-S", "encode.torchvision.weights=models/squeezenet.pth", cwd=repo)
    assert encoded(proc.stdout + proc.stderr) == (30, 0)
    first = provenance(repo)
    assert first["backbone"] == "torchvision:squeezenet1_1" and first["embedding_dim"] == 512
    embeddings = (repo / EMBEDDINGS).read_bytes()
    commit(repo, "squeezenet")
    ran, _, out = repro(repo)
    assert "encode" not in ran  # unchanged: nothing re-runs
    save_squeezenet(repo / "models" / "squeezenet.pth", seed=1)  # the weights replaced in place
    ran, _, out = repro(repo)
    assert {"encode", "score"} <= ran and encoded(out) == (30, 0)  # a DVC dep, and a new cache key
    assert provenance(repo)["fingerprint"] != first["fingerprint"]
    assert (repo / EMBEDDINGS).read_bytes() != embeddings


def test_hf_dir_is_tracked(tmp_path: Path) -> None:
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    repo = copy_pipeline(tmp_path / "repo", per_label=3)
    folder = repo / "models" / "dino"
    torch.manual_seed(0)
    Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             image_size=32, patch_size=8)).save_pretrained(folder)
    processor = BitImageProcessor(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32})
    processor.save_pretrained(folder)
    set_params(repo, {"encode.backbone": "hf:models/dino", "encode.hf.dir": "models/dino", "encode.device": "cpu"})
    git_init(repo)
    ran, _, out = repro(repo)
    assert "encode" in ran and encoded(out) == (30, 0)
    assert provenance(repo)["embedding_dim"] == 32
    commit(repo, "dino")
    BitImageProcessor(size={"shortest_edge": 36}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    ran, _, out = repro(repo)  # only the processor config changed: encode re-runs with a new key
    assert "encode" in ran and encoded(out) == (30, 0)
