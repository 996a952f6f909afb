"""Text towers: captions embedded by the same weights as the images, with the model's own tokenizer, for text <->
image retrieval. A tiny OpenCLIP config (open_clip's built-in tokenizer) and a tiny transformers CLIPModel with a
CLIPTokenizer, both made offline with random weights and loaded through the production path."""

from __future__ import annotations

import json

import numpy as np
import pytest

from extras import extra
from recallk.encode.registry import get_backbone

CAPTIONS = ["a red car on a street", "two dogs", "a bowl of fruit and a very long caption about it"]


@pytest.fixture(scope="module")
def open_clip_tiny(tmp_path_factory):
    """(model name, weights file, open_clip model, its tokenizer): a registered 16-d config whose text tower
    takes open_clip's own tokenizer (49,408 tokens, 8 positions)."""
    open_clip = extra("open_clip", "open-clip")
    torch = extra("torch", "torch")
    from torch_helpers import save_state_dict

    name = "recallk-tiny-text-clip"
    folder = tmp_path_factory.mktemp("open_clip_text")
    cfg = {"embed_dim": 16,
           "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
           "text_cfg": {"context_length": 8, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 1}}
    (folder / f"{name}.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(folder / f"{name}.json")
    torch.manual_seed(0)
    model, _, _ = open_clip.create_model_and_transforms(name, pretrained=None)
    weights = save_state_dict(model.state_dict(), folder / "w.safetensors")
    return name, weights, model.eval(), open_clip.get_tokenizer(name)


def test_open_clip_captions_are_its_own_encode_text(open_clip_tiny):
    torch = extra("torch", "torch")
    from torch_helpers import ATOL

    name, weights, model, tokenizer = open_clip_tiny
    backbone = get_backbone(f"open_clip:{name}", {"weights": str(weights), "tag": None})
    got = backbone.encode_text(CAPTIONS)
    with torch.inference_mode():
        want = model.encode_text(tokenizer(CAPTIONS)).numpy()
    assert got.shape == (3, 16) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    assert backbone.encode_text([CAPTIONS[2]])[0].tobytes() == got[2].tobytes()  # independent of the batch
    assert backbone.encode_text([]).shape == (0, 16)
    assert backbone.text_fingerprint not in (None, backbone.fingerprint)


def test_open_clip_text_fingerprint_follows_the_weights(open_clip_tiny, tmp_path):
    torch = extra("torch", "torch")
    from torch_helpers import save_state_dict

    name, weights, model, _ = open_clip_tiny
    first = get_backbone(f"open_clip:{name}", {"weights": str(weights), "tag": None})
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["token_embedding.weight"] += torch.ones_like(state["token_embedding.weight"])
    other = get_backbone(f"open_clip:{name}", {"weights": str(save_state_dict(state, tmp_path / "b.pt")), "tag": None})
    assert other.text_fingerprint != first.text_fingerprint
    assert not np.allclose(other.encode_text(CAPTIONS), first.encode_text(CAPTIONS))


@pytest.fixture(scope="module")
def hf_clip(tmp_path_factory):
    """A tiny CLIPModel, its image processor and a CLIPTokenizer over a 30-token vocabulary, saved together."""
    transformers = extra("transformers", "hf")
    torch = extra("torch", "torch")
    folder = tmp_path_factory.mktemp("hf_clip") / "clip"
    folder.mkdir()
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, **{c: 2 + i for i, c in enumerate(letters)},
             **{f"{c}</w>": 28 + i for i, c in enumerate(letters)}}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = transformers.CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    tokenizer.save_pretrained(folder)
    config = transformers.CLIPConfig(
        text_config={"vocab_size": len(vocab), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "max_position_embeddings": 32, "bos_token_id": 0,
                     "eos_token_id": 1, "pad_token_id": 1},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 32, "patch_size": 16},
        projection_dim=8)
    torch.manual_seed(0)
    model = transformers.CLIPModel(config).eval()
    model.save_pretrained(folder)
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(
        folder)
    return folder, model, transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)


def test_hf_clip_captions_are_get_text_features(hf_clip):
    torch = extra("torch", "torch")
    from torch_helpers import ATOL, photos

    folder, model, tokenizer = hf_clip
    backbone = get_backbone(f"hf:{folder}", {"dir": str(folder), "pooling": "pooler"})
    got = backbone.encode_text(CAPTIONS)
    with torch.inference_mode():  # one caption at a time, as the CPU path runs them (no padding), cut at the
        # text tower's 32 positions (the long caption has 40 tokens)
        want = np.concatenate([model.get_text_features(**tokenizer([c], truncation=True, max_length=32,
                                                                   return_tensors="pt")).pooler_output.numpy()
                               for c in CAPTIONS])
    assert got.shape == (3, 8) and backbone.dim == 8
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    # the image side is get_image_features' projection: the same 8-d space
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(folder, local_files_only=True)
    with torch.inference_mode():
        images = model.get_image_features(**processor(images=photos(2), return_tensors="pt")).pooler_output.numpy()
    np.testing.assert_allclose(backbone.encode(photos(2)), images, atol=ATOL, rtol=0)
    assert backbone.text_fingerprint not in (None, backbone.fingerprint)


def test_hf_clip_with_another_pooling_embeds_no_captions(hf_clip):
    # cls / mean read the vision tower's hidden states, not the shared space: no text tower is offered
    folder, _, _ = hf_clip
    backbone = get_backbone(f"hf:{folder}", {"dir": str(folder), "pooling": "cls"})
    assert backbone.encode_text is None and backbone.text_fingerprint is None


def test_image_only_backbones_have_no_text_tower():
    backbone = get_backbone("pixels", {"resolution": 4})
    assert backbone.encode_text is None and backbone.text_fingerprint is None
