"""Captions are a tracked input (split.captions, split.protocol: text_image), under real ``dvc repro`` in a temporary
git repo: the captions file lies inside the data root (a dep of split through ``${split.data_root}``), and the
split's captions table is a dep of encode, so editing a caption re-runs split and encode, and re-embeds that
caption while every image vector stays as it was."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers import caption_encoders, commit, copy_pipeline, git_init, repro, set_params

pytestmark = pytest.mark.pipeline

ENCODERS = caption_encoders("e")


def write_captions(repo: Path, last: str) -> None:
    """One caption per image of the digits subset (the label spelled out), the last one ``last``."""
    images = sorted(p.relative_to(repo / "data/digits").as_posix() for p in (repo / "data/digits").rglob("*.png"))
    rows = [f"{rel},a handwritten {rel.split('/')[0]}" for rel in images[:-1]] + [f'{images[-1]},"{last}"']
    (repo / "data/digits/captions.csv").write_text("image_id,caption\n" + "\n".join(rows) + "\n", encoding="utf-8")


def test_editing_a_caption_reruns_split_and_encode(tmp_path):
    repo = copy_pipeline(tmp_path / "repo", per_label=2)
    (repo / "encoders.py").write_text(ENCODERS)
    write_captions(repo, "a nine")
    set_params(repo, {"split.protocol": "text_image", "split.captions": "captions.csv",
                      "encode.backbone": "callable:encoders:image", "encode.callable.module_file": "encoders.py",
                      "encode.callable.text_function": "text"})
    git_init(repo)
    ran, _, out = repro(repo, "encode")
    assert ran == {"split", "encode"}, out
    images = (repo / "data/embeddings/embeddings.npy").read_bytes()
    texts = np.load(repo / "data/embeddings/text_embeddings.npy")
    commit(repo, "repro")
    ran, skipped, out = repro(repo, "encode")
    assert not ran and skipped == {"split", "encode"}, out

    write_captions(repo, "the digit nine, written by hand")  # one caption edited in place: nothing else changes
    ran, skipped, out = repro(repo, "encode")
    assert ran == {"split", "encode"}, out
    assert (repo / "data/embeddings/embeddings.npy").read_bytes() == images
    new = np.load(repo / "data/embeddings/text_embeddings.npy")
    np.testing.assert_array_equal(new[:-1], texts[:-1])
    assert new[-1, 0] == len("the digit nine, written by hand") != texts[-1, 0]
    assert "data/prepared/captions.csv" in (repo / "dvc.lock").read_text()
