"""The encode stage with captions (split.captions, split.protocol: text_image), run in process: a tiny OpenCLIP
model made offline embeds the captions with its text tower (through the embedding cache), as does a tiny
transformers CLIPModel saved to a folder (``hf:<dir>``, ``pooling: pooler``), ``precomputed`` reads
them from ``encode.precomputed.text``, a ``callable:`` embeds them with ``encode.callable.text_function``, and a
backbone without a text tower is refused before any image is encoded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_text_towers import hf_clip, open_clip_tiny  # noqa: F401  (the tiny models, module-scoped fixtures)

from helpers import assert_no_outputs, caption_encoders, run_fails, run_ok, set_params, tiny_project
from recallk.encode.base import NO_FILE
from recallk.encode.registry import get_backbone

pytestmark = pytest.mark.stage

EMB = "data/embeddings"
CAPTIONS = ['c/0.png,"a dog, running"', "c/1.png,a red car", "c/0.png,a dog", "a/0.png,a train image",
            "d/2.png,a red car"]


def captioned(tmp_path: Path, **params) -> Path:
    """The tiny project (labels a..d, 3 images each) with five captions, under text_image."""
    proj = tiny_project(tmp_path)
    (proj / "data/digits/caps.csv").write_text("image_id,caption\n" + "\n".join(CAPTIONS) + "\n")
    set_params(proj, {"split.protocol": "text_image", "split.captions": "caps.csv", **params})
    return proj


def outputs(proj: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    folder = proj / EMB
    return (np.load(folder / "text_embeddings.npy"), np.load(folder / "text_ids.npy"),
            json.loads((folder / "provenance.json").read_text()))


CAPTION_IDS = ["c/0.png#0", "c/1.png#0", "c/0.png#1", "a/0.png#0", "d/2.png#0"]
TEXTS = ["a dog, running", "a red car", "a dog", "a train image", "a red car"]


def test_open_clip_embeds_the_captions_in_caption_order_once_each(tmp_path, request):
    # test_text_towers' tiny OpenCLIP model: a 16-d config with a text tower, random weights, made offline
    name, weights, _, _ = request.getfixturevalue("open_clip_tiny")
    proj = captioned(tmp_path, **{"encode.backbone": f"open_clip:{name}", "encode.open_clip.weights": str(weights),
                                  "encode.device": "cpu"})
    run_ok(proj, "split", "encode")
    texts, ids, provenance = outputs(proj)
    backbone = get_backbone(f"open_clip:{name}", {"weights": str(weights), "tag": None})
    assert ids.tolist() == CAPTION_IDS and texts.dtype == np.float32 and texts.shape == (5, 16)
    np.testing.assert_array_equal(texts, backbone.encode_text(TEXTS))  # one caption at a time: batch-free bytes
    assert texts[1].tobytes() == texts[4].tobytes()  # one text, one vector
    assert provenance["text_fingerprint"] == backbone.text_fingerprint and provenance["num_captions"] == 5
    assert np.load(proj / EMB / "embeddings.npy").shape == (12, 16)

    # again: every caption from the cache (keyed by the text fingerprint and the caption's sha256), same bytes
    first = (proj / EMB / "text_embeddings.npy").read_bytes()
    proc = run_ok(proj, "encode")
    assert "encoded 0 distinct captions, served 4 from the cache" in proc.stderr, proc.stderr
    assert "verified 4 cached caption embedding(s) against a fresh encoding: 0 mismatch(es)" in proc.stderr
    assert (proj / EMB / "text_embeddings.npy").read_bytes() == first


def test_a_transformers_clip_saved_to_a_folder_embeds_images_and_captions(tmp_path, request):
    # test_text_towers' tiny CLIPModel with its CLIPTokenizer and image processor, saved with save_pretrained
    folder, _, _ = request.getfixturevalue("hf_clip")
    proj = captioned(tmp_path, **{"encode.backbone": f"hf:{folder}", "encode.hf.dir": str(folder),
                                  "encode.hf.pooling": "pooler", "encode.device": "cpu"})
    run_ok(proj, "split", "encode")
    texts, ids, provenance = outputs(proj)
    backbone = get_backbone(f"hf:{folder}", {"dir": str(folder), "pooling": "pooler"})
    assert ids.tolist() == CAPTION_IDS and texts.shape == (5, 8)
    np.testing.assert_array_equal(texts, backbone.encode_text(TEXTS))
    assert provenance["text_fingerprint"] == backbone.text_fingerprint
    assert np.load(proj / EMB / "embeddings.npy").shape == (12, 8)  # the images in the same 8-d space


def test_without_captions_no_text_file_is_written(tmp_path):
    proj = tiny_project(tmp_path)
    run_ok(proj, "split", "encode")
    assert sorted(p.name for p in (proj / EMB).iterdir()) == ["embeddings.npy", "ids.npy", "provenance.json"]
    assert "text_fingerprint" not in json.loads((proj / EMB / "provenance.json").read_text())


def test_a_backbone_without_a_text_tower_is_refused_before_encoding(tmp_path):
    proj = captioned(tmp_path)  # pixels: images only
    run_ok(proj, "split")
    proc = run_fails(proj, "encode", "data/prepared/captions.csv has captions", "`encode.backbone: pixels` embeds "
                     "images only", "`open_clip:<model>`", "`hf:<dir>` of a CLIP-style model with `encode.hf.pooling: "
                     "pooler`", "`encode.callable.text_function`", "`encode.precomputed.text`")
    assert "encoded" not in proc.stderr  # refused before any image is encoded
    assert_no_outputs(proj, [EMB])


def test_every_tracked_path_param_of_encode_is_a_dep_in_dvc_yaml():
    from helpers import ROOT
    from recallk.encode.settings import EncodeSettings, tracked_path_problem
    from recallk.settings.base import fields

    deps = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]["encode"]["deps"]
    tracked = [name for name, f in fields(EncodeSettings) if f.metadata.get("rule") is tracked_path_problem]
    assert "precomputed.text" in tracked
    assert [name for name in tracked if f"${{encode.{name}}}" not in deps] == []


ENCODERS = caption_encoders("a", extra="""

def wrong(captions):
    return np.ones((len(captions), 5), dtype=np.float32)
""")


def test_a_callable_embeds_captions_with_its_text_function(tmp_path):
    proj = captioned(tmp_path, **{"encode.backbone": "callable:encoders:image", "encode.callable.module_file":
                                  "encoders.py", "encode.callable.text_function": "text"})
    (proj / "encoders.py").write_text(ENCODERS)
    run_ok(proj, "split", "encode")
    texts, ids, provenance = outputs(proj)
    assert ids.tolist() == CAPTION_IDS
    np.testing.assert_array_equal(texts[:, 0], [len(t) for t in TEXTS])
    assert provenance["text_fingerprint"] not in (None, provenance["fingerprint"])

    set_params(proj, {"encode.callable.text_function": "wrong"})
    run_fails(proj, "encode", "embedded 4 caption(s) as shape (4, 5); expected (4, 3)", "image embeddings' "
              "dimension 3")
    set_params(proj, {"encode.callable.text_function": "missing"})
    run_fails(proj, "encode", "`encode.callable.text_function` is 'missing', but module 'encoders' has no such "
              "function")
    assert_no_outputs(proj, [EMB])


def precomputed_project(tmp_path: Path, dim: int = 4) -> tuple[Path, Path]:
    """The captioned tiny project with ``precomputed`` image embeddings and a caption .npz of dimension ``dim``
    whose rows are in reverse caption order."""
    proj = captioned(tmp_path)
    run_ok(proj, "split")
    catalog_ids = [line.split(",")[0] for line in (proj / "data/prepared/catalog.csv").read_text().splitlines()[1:]]
    rng = np.random.default_rng(0)
    np.savez(proj / "images.npz", ids=np.array(catalog_ids), embeddings=rng.normal(size=(12, 4)))
    np.savez(proj / "texts.npz", ids=np.array(CAPTION_IDS[::-1]), embeddings=np.arange(5 * dim).reshape(5, dim) + 1.0)
    set_params(proj, {"encode.backbone": "precomputed", "encode.precomputed.path": "images.npz",
                      "encode.precomputed.text": "texts.npz"})
    return proj, proj / "texts.npz"


def test_precomputed_caption_embeddings_are_read_by_caption_id(tmp_path):
    proj, _ = precomputed_project(tmp_path)
    run_ok(proj, "encode")
    texts, ids, provenance = outputs(proj)
    assert ids.tolist() == CAPTION_IDS
    np.testing.assert_array_equal(texts, (np.arange(20).reshape(5, 4) + 1.0)[::-1])
    assert provenance["text_fingerprint"].startswith("texts.npz sha256 ")


def test_precomputed_caption_embeddings_are_checked(tmp_path):
    proj, npz = precomputed_project(tmp_path, dim=3)
    run_fails(proj, "encode", "'texts.npz' (encode.precomputed.text): caption embeddings of dimension 3, but the "
              "image embeddings have 4")
    np.savez(npz, ids=np.array(CAPTION_IDS[:3]), embeddings=np.ones((3, 4)))
    run_fails(proj, "encode", "texts.npz: 2 caption(s) have no embedding, e.g. a/0.png#0, d/2.png#0; compute "
              "embeddings for every caption_id of data/prepared/captions.csv")
    np.savez(npz, ids=np.array(CAPTION_IDS), embeddings=np.vstack([np.ones((4, 4)), np.zeros((1, 4))]))
    run_fails(proj, "encode", "NaN, inf or all-zero embeddings for 1 caption(s): d/2.png#0")
    np.save(proj / "texts.npy", np.ones((5, 4)))
    set_params(proj, {"encode.precomputed.text": "texts.npy"})
    run_fails(proj, "encode", "`encode.precomputed.text` 'texts.npy' is not an .npz archive")
    set_params(proj, {"encode.precomputed.text": NO_FILE})
    run_fails(proj, "encode", "set `encode.precomputed.text` to an .npz with arrays ids (the caption ids")
    assert_no_outputs(proj, [EMB])
