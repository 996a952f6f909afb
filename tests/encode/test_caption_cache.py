"""Captions through the embedding cache get the images' rules (one piece of code, recallk.encode.batches): an
unusable hit is dropped with the images' warning and embedded again, a forged hit fails the verification sample
with the images' advice, a user text function's error is a message."""

from __future__ import annotations

import numpy as np
import pytest
from test_poisoned_cache import BAD_VECTORS, poison

from recallk.encode.base import Backbone
from recallk.encode.cache import EmbeddingCache
from recallk.encode.captions import caption_sha256, encode_texts
from recallk.errors import InputError

TEXTS = ["a dog", "a red car", "a dog", "a train", "two cats", "a boat"]
IDS = [f"i{n}.png#0" for n in range(len(TEXTS))]
DIM = 3


def text_tower(captions):
    return np.array([[len(c), c.count("a") + 1, c.count(" ") + 2] for c in captions], dtype=np.float32)


def backbone(text=text_tower) -> Backbone:
    return Backbone(name="fake", dim=DIM, encode=lambda images: None, fingerprint="img", user_code=True,
                    encode_text=text, text_fingerprint="txt")


def embed(db, verify_cache: int = 0, model: Backbone | None = None) -> tuple[np.ndarray, int, int]:
    with EmbeddingCache(db, "txt") as cache:
        return encode_texts(TEXTS, IDS, model or backbone(), cache, dim=DIM, batch_size=2, verify_cache=verify_cache)


@pytest.mark.parametrize("kind", BAD_VECTORS)
def test_unusable_caption_hits_are_dropped_with_a_warning_and_embedded_again(tmp_path, kind, caplog):
    db = tmp_path / "c.sqlite"
    fresh, n_enc, n_hit = embed(db)
    assert (n_enc, n_hit) == (5, 0) and fresh.tobytes() == text_tower(TEXTS).tobytes()
    poison(db, "txt", {caption_sha256(text): BAD_VECTORS[kind](DIM) for text in ("a dog", "a boat")})
    out, n_enc, n_hit = embed(db)
    assert out.tobytes() == fresh.tobytes() and (n_enc, n_hit) == (2, 3)
    assert "dropped 2 unusable cached caption embedding(s)" in caplog.text
    assert embed(db)[1:] == (0, 5)  # healed: the entries were replaced


def test_the_verification_sample_catches_a_forged_caption_row(tmp_path):
    db = tmp_path / "c.sqlite"
    fresh, _, _ = embed(db)
    poison(db, "txt", {caption_sha256("a train"): fresh[1]})  # another caption's vector, a valid digest
    assert embed(db, verify_cache=0)[0][3].tobytes() == fresh[1].tobytes()  # the documented limit: off
    with pytest.raises(InputError, match=r"served 1 of 5 sampled caption vectors unlike a fresh encoding \(e\.g\. "
                                         r"caption 'a train'.*a text tower whose output is not deterministic.*"
                                         r"keep the cache folder writable only by you"):
        embed(db, verify_cache=5)


def test_a_text_function_error_and_unusable_fresh_vectors_are_messages(tmp_path):
    def broken(captions):
        raise ValueError("no tokenizer")

    def zero_for_cats(captions):
        return np.array([np.zeros(DIM) if "cat" in c else np.ones(DIM) for c in captions], dtype=np.float32)

    with pytest.raises(InputError, match=r"the text function of backbone 'fake' \(encode.callable.text_function\) "
                                         r"raised ValueError: no tokenizer on 2 caption\(s\); fix it"):
        embed(tmp_path / "c.sqlite", model=backbone(broken))
    with pytest.raises(InputError, match=r"backbone 'fake' gave NaN, inf or all-zero embeddings for 1 caption\(s\): "
                                         r"'i4.png#0'; check those captions or the backbone"):
        embed(tmp_path / "c.sqlite", model=backbone(zero_for_cats))
