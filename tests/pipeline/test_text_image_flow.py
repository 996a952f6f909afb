"""Text <-> image retrieval end to end (issue 41) under real ``dvc repro`` in a temporary git repo: a tiny OpenCLIP
model made offline (a local-dir folder: open_clip_config.json and its weights) embeds the digits and their
captions, the score stage writes both directions nested in the declared metrics file (equal to
:func:`recallk.crossmodal_metrics` on the stored embeddings, bit for bit), ``dvc metrics show`` lists
``text_to_image.recall@1``, and ``recallk compare --direction`` pairs two committed runs by images."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from extras import extra
from helpers import commit, copy_pipeline, dvc, git_init, repro, run_module, set_params
from recallk.score.crossmodal import crossmodal_metrics

pytestmark = pytest.mark.pipeline

#: A CLIP small enough to build in milliseconds: 16-d embeddings of 32 px images, open_clip's own tokenizer.
TINY_CFG = {"embed_dim": 16,
            "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
            "text_cfg": {"context_length": 8, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 1}}


def write_model(folder: Path, seed: int) -> None:
    """The tiny config's model with seeded random weights, as a local-dir folder (no registered config needed)."""
    open_clip, torch = extra("open_clip", "open-clip"), extra("torch", "torch")
    from torch_helpers import save_state_dict

    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "recallk-e2e-clip.json"
    config.write_text(json.dumps(TINY_CFG))
    open_clip.add_model_config(config)
    config.unlink()
    torch.manual_seed(seed)
    model, _, _ = open_clip.create_model_and_transforms("recallk-e2e-clip", pretrained=None)
    save_state_dict(model.state_dict(), folder / "open_clip_model.safetensors")
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CFG, "preprocess_cfg": {}}))


def write_captions(repo: Path) -> None:
    """Two captions per image: its label spelled out, and its file name."""
    images = sorted(p.relative_to(repo / "data/digits").as_posix() for p in (repo / "data/digits").rglob("*.png"))
    rows = [f"{rel},a handwritten {rel.split('/')[0]}\n{rel},scan {rel.split('/')[-1]}" for rel in images]
    (repo / "data/digits/captions.csv").write_text("image_id,caption\n" + "\n".join(rows) + "\n", encoding="utf-8")


def peer_metrics(repo: Path) -> dict:
    """:func:`crossmodal_metrics` on the stored embeddings of the eval images and their captions."""
    split = pd.read_csv(repo / "data/prepared/split.csv", dtype=str)
    captions = pd.read_csv(repo / "data/prepared/captions.csv", dtype=str, keep_default_na=False)
    folder = repo / "data/embeddings"
    images, ids = np.load(folder / "embeddings.npy"), np.load(folder / "ids.npy").tolist()
    texts, text_ids = np.load(folder / "text_embeddings.npy"), np.load(folder / "text_ids.npy").tolist()
    eval_ids = split.loc[split["query"].eq("True"), "image_id"].tolist()
    captions = captions[captions["image_id"].isin(eval_ids)]
    return crossmodal_metrics(images[[ids.index(i) for i in eval_ids]],
                              texts[[text_ids.index(c) for c in captions["caption_id"]]],
                              [eval_ids.index(i) for i in captions["image_id"]], ks=[1, 5, 10])


def test_text_image_pipeline_scores_both_directions_and_compares(tmp_path):
    repo = copy_pipeline(tmp_path / "repo", per_label=2)
    write_model(repo / "models/clip", seed=0)
    write_captions(repo)
    set_params(repo, {"split.protocol": "text_image", "split.captions": "captions.csv",
                      "encode.backbone": "open_clip:ViT-B-32", "encode.open_clip.weights": "models/clip",
                      "score.bootstrap.resamples": 100})
    git_init(repo)
    ran, _, out = repro(repo)
    assert {"split", "encode", "score"} <= ran, out
    recall = json.loads((repo / "metrics/recall.json").read_text(encoding="utf-8"))
    want = peer_metrics(repo)
    for direction in ("text_to_image", "image_to_text"):
        assert recall[direction] == {k: v for k, v in want[direction].items() if k.startswith("recall@")}
    intervals = json.loads((repo / "metrics/intervals.json").read_text(encoding="utf-8"))
    assert intervals["interval_unit"] == "image" and intervals["image_to_text"]["map"] == want["image_to_text"]["map"]
    shown = json.loads(dvc("metrics", "show", "--json", cwd=repo).stdout)
    flat = json.dumps(shown)
    assert '"text_to_image"' in flat and '"recall@1"' in flat
    commit(repo, "run one")

    write_model(repo / "models/clip", seed=1)  # another model: encode and score re-run
    ran, _, out = repro(repo)
    assert {"encode", "score"} <= ran and "split" not in ran, out
    commit(repo, "run two")
    out_json = tmp_path / "cmp.json"
    proc = run_module("recallk.compare", "HEAD~1", "HEAD", "--direction", "text_to_image", "--json", str(out_json),
                      "--resamples", "200", "--permutations", "200", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out_json.read_text(encoding="utf-8"))
    assert result["by"] == "label" and result["queries"] == len(pd.read_csv(repo / "data/prepared/captions.csv")
                                                                  .query("split != 'train'"))
    assert result["metrics"]["recall@1"]["mean_b"] == pytest.approx(peer_metrics(repo)["text_to_image"]["recall@1"])
    refused = run_module("recallk.compare", "HEAD~1", "HEAD", cwd=repo)
    assert refused.returncode == 2 and "--direction" in refused.stderr
