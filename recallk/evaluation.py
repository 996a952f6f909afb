"""Encode images and score them like the pipeline, for training loops: :func:`evaluate`."""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image

from recallk import images
from recallk.checks import as_array
from recallk.score.metrics import recall_at_k, score_settings


def encode_all(items: Sequence[Any], encoder_fn: Callable[[list[Image.Image]], Any], batch: int = 32) -> np.ndarray:
    """Encode images (paths or PIL images) in batches with ``encoder_fn(list[PIL.Image]) -> (n, d)``."""
    out = []
    for start in range(0, len(items), batch):
        chunk = [x if isinstance(x, Image.Image) else images.load(x) for x in items[start:start + batch]]
        out.append(np.asarray(as_array(encoder_fn(chunk)), dtype=np.float32))  # a torch tensor is detached
    return np.concatenate(out) if out else np.empty((0, 0), dtype=np.float32)


def evaluate(query_images: Sequence[Any], gallery_images: Sequence[Any], query_labels: Sequence[Any],
             gallery_labels: Sequence[Any], *, encoder_fn: Callable[[list[Image.Image]], Any],
             ks: Sequence[int] | None = None) -> dict[str, float]:
    """Encode both sets with ``encoder_fn`` and return :func:`recall_at_k`.

    The signature shape of :func:`~recallk.score.metrics.recall_at_k`: the data positional in the same order
    (query items, gallery items, query labels, gallery labels), the rest keyword-only.

    Parameters
    ----------
    query_images, gallery_images : sequence of str, os.PathLike or PIL.Image.Image
        File paths are decoded like the pipeline (EXIF orientation applied, transparency composited over
        white, the ``split.background`` default, RGB).
    query_labels : sequence of length len(query_images)
    gallery_labels : sequence of length len(gallery_images)
    encoder_fn : callable
        ``encoder_fn(list[PIL.Image.Image]) -> array of shape (batch, d)``, called on batches of 32.
    ks : sequence of positive int, optional
        Default: the ``score.ks`` default (1, 5, 10); checked before anything is encoded.

    Returns
    -------
    dict
        ``{"recall@K": float}`` for each K (see :func:`recall_at_k` for the formula and tie rule).

    Notes
    -----
    An item present in both lists is the same image, and that query never retrieves it
    (self-match exclusion): a path by its absolute path, a PIL image by object identity
    (the same object in both lists; two equal-looking copies are two images).
    ``encoder_fn`` may return a torch tensor, requiring grad or not (it is detached).
    When every query lacks a positive the result is NaN with a ``RuntimeWarning``.
    """
    ks = score_settings(ks=ks).ks  # checked first: a bad K never waits for the encoding
    q_emb = encode_all(query_images, encoder_fn)
    g_emb = encode_all(gallery_images, encoder_fn)

    def ids(items: Sequence[Any]) -> list[str]:
        return [f"<PIL image {id(x)}>" if isinstance(x, Image.Image) else os.path.abspath(x) for x in items]

    return recall_at_k(q_emb, g_emb, np.asarray(query_labels), np.asarray(gallery_labels),
                       query_ids=ids(query_images), gallery_ids=ids(gallery_images), ks=ks)
