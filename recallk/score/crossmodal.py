"""Text <-> image retrieval: captions as queries, images as queries, one exact engine.

A cross-modal set is ``n_images`` image embeddings, ``n_texts`` caption embeddings and, for each caption, the
image it describes (``caption_images``: one image position per caption; an image has one or more captions, as in
Flickr30k's and MSCOCO's five). Both directions are ordinary labelled retrieval for the engine of
:mod:`recallk.score.ranking`, with the image as the label:

* ``text_to_image``: each caption is a query; its one positive is its image.
* ``image_to_text``: each image is a query; its positives are its captions, and it hits at K when any of them
  is in its top K (the CLIP papers' recall@K; CLIP_benchmark's "text retrieval" computes the same hit rate).

So the tie rule is the engine's (equal similarities rank by gallery index, smaller first) and the scratch memory
stays under ``max_memory_mb`` at any size, where CLIP_benchmark's ``recall_at_k`` builds a one-hot
``(n_texts, k, n_images)`` tensor per batch and takes ``torch.topk`` with no defined tie order.

Per direction, for a query with 1-based first-positive rank :math:`r_1`:

* ``recall@K`` = :math:`\\mathbb{1}[r_1 \\le K]`; ``mrr`` = :math:`1 / r_1`;
* ``mean_rank`` = the mean of :math:`r_1`; ``median_rank`` = the median of :math:`r_1` rounded down
  (open_clip's ``get_clip_metrics``: ``floor(median(0-based rank)) + 1``);
* ``map`` (``image_to_text`` only: a caption has one positive, so there it would equal ``mrr``): average
  precision over all of the image's captions, as :mod:`recallk.score.metrics` defines it.

Intervals respect the design: the captions of one image share their target, so ``text_to_image`` resamples
images (each with all its captions), not captions; ``image_to_text`` resamples images, its queries.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np

from recallk.errors import InputError
from recallk.score.metrics import Scorer
from recallk.score.values import per_query
from recallk.stats import mean
from recallk.stats.resample import bootstrap_means, percentile_interval

__all__ = ["DIRECTIONS", "CrossModalRuns", "crossmodal_metrics", "crossmodal_per_query", "crossmodal_intervals"]

#: The two directions, in report order: caption queries first (the protocols' "image retrieval").
DIRECTIONS = ("text_to_image", "image_to_text")

#: What a direction reports beyond ``recall@K`` and ``mrr``.
RANK_KEYS = ("mean_rank", "median_rank")


def caption_positions(caption_images: Sequence[Any], n_images: int, n_texts: int) -> np.ndarray:
    """``caption_images`` checked: one integer image position in ``[0, n_images)`` per caption."""
    values = np.asarray(caption_images)
    if values.ndim != 1 or values.size != n_texts:
        raise InputError(f"`caption_images` must give one image position per caption: {n_texts} captions. "
                         f"Got shape {values.shape} instead.")
    if values.size and not np.issubdtype(values.dtype, np.integer):
        raise InputError("`caption_images` must be integer positions into the image embeddings (0 .. "
                         f"{n_images - 1}). Got dtype {values.dtype} instead.")
    outside = np.flatnonzero((values < 0) | (values >= n_images))
    if outside.size:
        raise InputError(f"`caption_images` must lie in [0, {n_images}) (one row per image embedding). Got "
                         f"{values[outside[0]]} at caption {outside[0]} ({outside.size} captions outside).")
    return values.astype(np.int64)


class CrossModalRuns:
    """The per-query values of both directions of one cross-modal set (what :func:`crossmodal_per_query`
    returns).

    Attributes
    ----------
    values : dict
        ``{direction: {key: float64 array}}``: per query of that direction (``text_to_image``: one row per
        caption, in caption order; ``image_to_text``: one per image), each metric key of the settings plus
        ``rank`` (the 1-based first-positive rank); NaN for a query without positives (an image with no
        caption).
    tie_sensitive : dict
        ``{direction: bool array}``: queries whose first-positive rank changes when exact ties are broken the
        other way (larger gallery index first); only these can differ from a tool with another tie order.
    clusters : dict
        ``{direction: int64 array}``: the image each query belongs to (the resampling unit).
    """

    def __init__(self, values: dict[str, dict[str, np.ndarray]], tie_sensitive: dict[str, np.ndarray],
                 clusters: dict[str, np.ndarray]) -> None:
        self.values, self.tie_sensitive, self.clusters = values, tie_sensitive, clusters

    def summary(self) -> dict[str, dict[str, float]]:
        """``{direction: {key: mean}}`` with ``mean_rank``, ``median_rank`` and ``num_queries``."""
        out: dict[str, dict[str, float]] = {}
        for direction, values in self.values.items():
            rank = values["rank"]
            kept = rank[~np.isnan(rank)]
            row = {key: mean(v) for key, v in values.items() if key != "rank"}
            row["mean_rank"] = mean(rank)
            row["median_rank"] = float(math.floor(np.median(kept))) if kept.size else math.nan
            row["num_queries"] = int(kept.size)
            out[direction] = row
        return out


def crossmodal_per_query(image_emb: Any, text_emb: Any, caption_images: Sequence[Any], *,
                         ks: Iterable[int] | None = None, max_memory_mb: float | None = None,
                         backend: str | None = None, device: str | None = None) -> CrossModalRuns:
    """Per-query values of text -> image and image -> text retrieval (see the module docstring).

    Parameters
    ----------
    image_emb : array-like of shape (n_images, d)
    text_emb : array-like of shape (n_texts, d)
        The two towers' embeddings in one space (any scale: rows are L2-normalised, as for
        :func:`recallk.retrieval_metrics`).
    caption_images : sequence of int of length n_texts
        Each caption's image, as a row of ``image_emb``.
    ks, max_memory_mb, backend, device
        As for :func:`recallk.retrieval_metrics`.

    Returns
    -------
    CrossModalRuns
    """
    n_images, n_texts = len(image_emb), len(text_emb)
    images = np.arange(n_images)
    captions = caption_positions(caption_images, n_images, n_texts)
    runs = {"text_to_image": (text_emb, image_emb, captions, images, ("recall", "mrr")),
            "image_to_text": (image_emb, text_emb, images, captions, ("recall", "mrr", "map"))}
    values, ties, clusters = {}, {}, {}
    for direction, (queries, gallery, query_labels, gallery_labels, metrics) in runs.items():
        scorer = Scorer(ks=ks, metrics=metrics, max_memory_mb=max_memory_mb, backend=backend, device=device)
        _, ranking = scorer.rank(queries, gallery, query_labels, gallery_labels)
        row = per_query(ranking, scorer.settings)
        first = ranking.first_rank
        row["rank"] = np.where(first >= 0, first + 1.0, np.nan)
        values[direction], clusters[direction] = row, query_labels
        ties[direction] = first != ranking.first_rank_opposite
    return CrossModalRuns(values, ties, clusters)


def crossmodal_metrics(image_emb: Any, text_emb: Any, caption_images: Sequence[Any], *,
                       ks: Iterable[int] | None = None, max_memory_mb: float | None = None,
                       backend: str | None = None, device: str | None = None) -> dict[str, dict[str, float]]:
    """Recall@K, MRR, mean and median rank of both directions (and MAP for image -> text).

    Parameters
    ----------
    image_emb, text_emb, caption_images, ks, max_memory_mb, backend, device
        As for :func:`crossmodal_per_query`.

    Returns
    -------
    dict
        ``{"text_to_image": {...}, "image_to_text": {...}}``, each ``recall@K`` per K, ``mrr`` (and ``map``),
        ``mean_rank``, ``median_rank`` and ``num_queries`` (captions, or images with a caption). Formulas and
        the tie rule: the module docstring.

    Examples
    --------
    >>> import numpy as np
    >>> images = np.eye(3)
    >>> texts = np.array([[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0, 0, 1.0]])
    >>> got = crossmodal_metrics(images, texts, [0, 0, 1, 2], ks=[1])
    >>> got["text_to_image"]["recall@1"], got["image_to_text"]["num_queries"]
    (1.0, 3)
    """
    return crossmodal_per_query(image_emb, text_emb, caption_images, ks=ks, max_memory_mb=max_memory_mb,
                                backend=backend, device=device).summary()


def crossmodal_intervals(runs: CrossModalRuns, resamples: int, seed: int,
                         confidence: float = 0.95) -> dict[str, dict[str, tuple[float, float]]]:
    """Percentile bootstrap intervals of each direction's means, resampling images (clusters).

    The captions of an image share one target, so a ``text_to_image`` resample draws images with replacement
    and takes all the captions of each (:func:`recallk.stats.resample.bootstrap_means` with ``groups``): caption
    resampling would treat five correlated queries as five independent ones and give intervals too narrow.
    ``median_rank`` gets no interval (the bootstrap of a median of integers is coarse and not reported).

    Returns ``{direction: {key: (low, high)}}`` for every mean key, ``mean_rank`` included.
    """
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for direction, values in runs.values.items():
        kept = ~np.isnan(values["rank"])
        arrays = {key: v[kept] for key, v in values.items()}
        means = bootstrap_means(arrays, resamples, seed, groups=runs.clusters[direction][kept])
        out[direction] = {("mean_rank" if key == "rank" else key): percentile_interval(m, confidence)
                          for key, m in means.items()}
    return out
