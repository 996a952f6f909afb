"""The encode stage's torch params end to end: clean errors (exit 2, one message, no outputs) and a CPU run."""

from __future__ import annotations

import json

import pytest

from extras import extra
from helpers import ENCODE_OUTPUTS, assert_no_outputs, run_fails, run_ok, set_params

extra("torch", "torch")  # without it, this file is skipped
import torch
import torchvision

pytestmark = pytest.mark.stage  # every test here runs stage scripts as subprocesses

TORCHVISION = {"encode.backbone": "torchvision:squeezenet1_1", "encode.torchvision.weights": "sq.pth",
               "encode.torchvision.preset": "SqueezeNet1_1_Weights.IMAGENET1K_V1"}


@pytest.mark.parametrize("changes, fragments", [
    # cuda asked for where torch sees none
    ({"encode.device": "cuda"}, ["`encode.device: cuda` but torch", "sees no CUDA device"]),
    ({"encode.device": "cpu", "encode.dtype": "float16"}, ["`encode.dtype: float16` needs a GPU"]),
    ({"encode.hf.dir": "models/nowhere", "encode.backbone": "hf:models/nowhere"},
     ["`encode.backbone: hf:models/nowhere`: directory 'models/nowhere' not found"]),
    ({"encode.backbone": "hf:models/dino"},  # the directory not given as encode.hf.dir too
     ["needs `encode.hf.dir: models/dino` too"]),
    ({"encode.torchvision.resize": 0}, ["`encode.torchvision.resize` must be an integer between 1 and 8192 or null"]),
    ({"encode.torchvision.mean": [0.5, 0.5]}, ["`encode.torchvision.mean` must be a list of 3 numbers"]),
])
def test_bad_torch_params_are_one_clear_error(split_project, changes, fragments, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the stage's torch sees no GPU, on any machine
    torch.save(torchvision.models.get_model("squeezenet1_1", weights=None).state_dict(), split_project / "sq.pth")
    set_params(split_project, {**TORCHVISION, **changes})
    run_fails(split_project, "encode", *fragments)
    assert_no_outputs(split_project, ENCODE_OUTPUTS)


def test_torchvision_on_cpu_records_the_backbone(split_project):
    torch.manual_seed(0)
    torch.save(torchvision.models.get_model("squeezenet1_1", weights=None).state_dict(), split_project / "sq.pth")
    set_params(split_project, {**TORCHVISION, "encode.device": "cpu"})
    run_ok(split_project, "encode", cli=True)  # torch in a process of its own
    provenance = json.loads((split_project / "data/embeddings/provenance.json").read_text())
    assert provenance["backbone"] == "torchvision:squeezenet1_1" and provenance["embedding_dim"] == 512
