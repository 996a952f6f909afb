"""The score stage's computation under ``split.protocol: text_image``: text <-> image retrieval of the eval images
and their captions, both directions in one exact engine (:mod:`recallk.score.crossmodal`).

:func:`score_text_image` takes the eval images and their captions, already read, checked and aligned
(:class:`TextImageSets`; the stage reads the files), and the ``score`` settings; it returns the three metrics
files' contents (recall@K's means per direction, the counts, the other means with every interval) and the
per-query table, one row per query of either direction (``direction`` column). Intervals resample images: the
captions of one image share their target, so they are one cluster (:func:`~recallk.score.crossmodal.
crossmodal_intervals`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from recallk.errors import InputError
from recallk.score import embedding_copies
from recallk.score.crossmodal import DIRECTIONS, CrossModalRuns, crossmodal_intervals, crossmodal_per_query
from recallk.score.ranking.neighbors import top_k
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import FailureSettings, ScoreSettings
from recallk.score.similarity import cosine_block, l2_normalize
from recallk.score.values import capped_ks
from recallk.tables_contract import check_per_query, per_query_column

#: What the intervals resample, as the metrics files and the report say it.
INTERVAL_UNIT = "image"
#: The line the report block and the page print under the directions.
INTERVAL_NOTE = ("intervals resample images (an image with all its captions: the captions of one image share their "
                 "target, so they are one cluster, not independent queries)")
#: Score params that mean nothing between captions and images: refused when set (their default is off).
UNUSED = {"exclude_same": [], "exclude_same_all": [], "junk": None, "whiten": "none", "engine": "local",
          "matmul": "float32"}


@dataclass(frozen=True, eq=False)
class TextImageSets:
    """The eval images and their captions: what :func:`score_text_image` scores.

    Attributes
    ----------
    image_ids : ndarray
        The eval images (every one an image -> text query and a text -> image gallery item), in split order.
    image_emb : ndarray
        (n_images, d), their embeddings, finite.
    caption_ids, captions : ndarray
        The eval images' captions (``<image_id>#<n>``) and their text, in captions.csv order.
    caption_images : ndarray
        Each caption's image, as a position in ``image_ids``.
    text_emb : ndarray
        (n_captions, d), the captions' embeddings, finite.
    """

    image_ids: np.ndarray
    image_emb: np.ndarray
    caption_ids: np.ndarray
    captions: np.ndarray
    caption_images: np.ndarray
    text_emb: np.ndarray


def check_settings(settings: ScoreSettings) -> None:
    """Refuse the ``score`` params that have no meaning between captions and images (:data:`UNUSED`), and
    ``embedding_copies`` (its cosine threshold compares images with images)."""
    for key, off in UNUSED.items():
        value = getattr(settings, key)
        if (list(value) if isinstance(value, tuple) else value) != off:
            raise InputError(f"`score.{key}` is {value!r}, which text <-> image retrieval (split.protocol: "
                             f"text_image) does not use; set `score.{key}: {'null' if off is None else off}`.")
    if settings.embedding_copies.min_cosine is not None:
        raise InputError("`score.embedding_copies.min_cosine` is set, but under split.protocol: text_image no query "
                         "is an image of the gallery; set it to null.")


def score_text_image(sets: TextImageSets, settings: ScoreSettings) -> tuple[dict[str, Any], pd.DataFrame]:
    """Score both directions of ``sets``; return the metrics files' contents and the per-query table.

    Returns
    -------
    (files, per_query)
        ``files``: ``{"recall": {direction: {recall@K: mean}}, "counts": {direction: {num_queries,
        num_excluded_queries, num_gallery, tie_sensitive, capped_ks}, embedding_dim}, "intervals":
        {"interval_unit": "image", direction: {mrr, [map,] mean_rank, median_rank, <key>_ci_low, <key>_ci_high}}}``
        (directions in :data:`~recallk.score.crossmodal.DIRECTIONS` order; no interval keys without resamples).
        ``per_query``: :func:`per_query_table`.
    """
    check_settings(settings)
    if sets.image_emb.shape[1] != sets.text_emb.shape[1]:
        raise InputError(f"the image embeddings have {sets.image_emb.shape[1]} dimensions and the caption embeddings "
                         f"{sets.text_emb.shape[1]}: the two towers must embed into one space; re-run encode with a "
                         "backbone that has both (`dvc repro -f encode`).")
    runs = crossmodal_per_query(sets.image_emb, sets.text_emb, sets.caption_images, ks=settings.ks,
                                max_memory_mb=settings.max_memory_mb, backend=settings.backend,
                                device=settings.device)
    summary = runs.summary()
    boot = settings.bootstrap
    ci = crossmodal_intervals(runs, boot.resamples, boot.seed, boot.confidence) if boot.resamples else {}
    sizes = {"text_to_image": (len(sets.caption_ids), len(sets.image_ids)),
             "image_to_text": (len(sets.image_ids), len(sets.caption_ids))}
    recall, counts, intervals = {}, {}, {"interval_unit": INTERVAL_UNIT}
    for direction in DIRECTIONS:
        means = summary[direction]
        recall[direction] = {k: v for k, v in means.items() if k.startswith("recall@")}
        n_queries, n_gallery = sizes[direction]
        counts[direction] = {"num_queries": means["num_queries"],
                             "num_excluded_queries": n_queries - means["num_queries"], "num_gallery": n_gallery,
                             "tie_sensitive": int(runs.tie_sensitive[direction].sum()),
                             "capped_ks": capped_ks(settings.ks, np.full(n_queries, n_gallery))}
        detail = {k: v for k, v in means.items() if k not in recall[direction] and k != "num_queries"}
        for key, (low, high) in ci.get(direction, {}).items():
            detail[f"{key}_ci_low"], detail[f"{key}_ci_high"] = low, high
        intervals[direction] = detail
    counts["embedding_dim"] = int(sets.image_emb.shape[1])
    return {"recall": recall, "counts": counts, "intervals": intervals}, per_query_table(sets, runs)


def per_query_table(sets: TextImageSets, runs: CrossModalRuns) -> pd.DataFrame:
    """One row per query of both directions, text -> image first, each direction by query id: ``direction``,
    ``image_id`` (the query: a caption id, or an image id), ``label`` (the image it belongs to, the resampling
    cluster: a caption's image, an image itself), ``num_positives`` (1, or the image's captions),
    ``num_retrievable`` (the other side's size), ``first_positive_rank`` (empty for an image without a caption),
    ``tie_sensitive`` (that rank moves under the opposite tie rule), each metric's per-query value (``hit@K``,
    ``rr``; ``ap`` for image -> text) and ``caption`` (a text query's caption, empty for an image). Each
    direction is checked against the per-query contract (:func:`~recallk.tables_contract.check_per_query`)."""
    images = np.asarray(sets.image_ids, dtype=str)
    n_captions = np.bincount(sets.caption_images, minlength=len(images))
    rows = {"text_to_image": (np.asarray(sets.caption_ids, dtype=str), images[sets.caption_images],
                              np.ones(len(sets.caption_ids), dtype=np.int64), len(images),
                              np.asarray(sets.captions, dtype=object)),
            "image_to_text": (images, images, n_captions, len(sets.caption_ids), np.full(len(images), None))}
    frames = []
    for direction in DIRECTIONS:
        ids, labels, positives, retrievable, text = rows[direction]
        values = runs.values[direction]
        frame = pd.DataFrame({"direction": direction, "image_id": ids, "label": labels,
                              "num_positives": positives, "num_retrievable": retrievable,
                              "first_positive_rank": pd.array(np.nan_to_num(values["rank"]).astype(np.int64),
                                                              dtype="Int64"),
                              "tie_sensitive": runs.tie_sensitive[direction]})
        frame.loc[np.isnan(values["rank"]), "first_positive_rank"] = pd.NA
        for key, column in values.items():
            if key != "rank":
                frame[per_query_column(key)] = column
        frame["caption"] = text
        frame = frame.sort_values("image_id", kind="stable").reset_index(drop=True)
        check_per_query(frame.drop(columns="direction"), f"the {direction} per-query table")
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def report_tables(per_query: pd.DataFrame, ks: tuple[int, ...]) -> dict[str, pd.DataFrame]:
    """The score stage's tables of a text <-> image run, by the stage's name: ``per_query`` and its ``compact``
    copy, the ``curve`` (:func:`curve`), and the image retrieval tables, header only (``per_class``,
    ``confusions``, ``neighbors``, ``embedding_copies``: labels and image neighbours are not scored here)."""
    def empty(*columns: str) -> pd.DataFrame:
        return pd.DataFrame({c: [] for c in columns})

    return {"per_query": per_query, "compact": compact_table(per_query), "curve": curve(per_query, ks),
            "per_class": empty("label", "num_queries"),
            "confusions": empty("label", "retrieved_label", "queries", "share"),
            "neighbors": empty("image_id", "label", "rank", "gallery_id", "gallery_label", "score", "is_positive"),
            "embedding_copies": embedding_copies.empty_pairs()}


def compact_table(per_query: pd.DataFrame) -> pd.DataFrame:
    """The per-query table kept in git (``metrics/per_query.csv``): without the rank, tie and caption columns,
    what ``recallk compare --direction`` reads."""
    return per_query.drop(columns=["first_positive_rank", "tie_sensitive", "caption"])


def curve(per_query: pd.DataFrame, ks: tuple[int, ...], k_min: int = 20) -> pd.DataFrame:
    """recall@k of both directions for k = 1 .. max(ks, ``k_min``), or up to the larger gallery when that is smaller:
    ``k, recall`` (text -> image, the column ``dvc plots`` draws) and ``recall_image_to_text``."""
    top = int(min(max(*ks, k_min), per_query["num_retrievable"].max()))
    k = np.arange(1, top + 1)
    out = {"k": k}
    for direction, column in zip(DIRECTIONS, ("recall", "recall_image_to_text")):
        rank = per_query.loc[per_query["direction"].eq(direction), "first_positive_rank"].dropna().to_numpy(np.int64)
        out[column] = (rank[:, None] <= k[None, :]).sum(axis=0) / max(rank.size, 1)
    return pd.DataFrame(out)


def failure_rows(sets: TextImageSets, per_query: pd.DataFrame, failures: FailureSettings,
                 max_memory_mb: float | None = None) -> list[dict]:
    """The rows of the text <-> image failure gallery (:func:`recallk.report.failure_sheet.draw` with its
    ``TEXT_IMAGE_LEGEND``): per direction the ``failures.queries`` queries with the deepest first positive (ties by
    id), each with its top ``failures.k`` items and its first positive; a caption's id stands for its text, and an
    item's label is its image (a caption's image, an image itself), so a hit is a positive."""
    images, captions = np.asarray(sets.image_ids, dtype=str), np.asarray(sets.caption_ids, dtype=str)
    caption_labels = images[sets.caption_images]
    sides = {"text_to_image": (sets.text_emb, captions, caption_labels, sets.image_emb, images, images),
             "image_to_text": (sets.image_emb, images, images, sets.text_emb, captions, caption_labels)}
    rows = []
    for direction, (q_emb, q_ids, q_labels, g_emb, g_ids, g_labels) in sides.items():
        worst = per_query[per_query["direction"].eq(direction) & per_query["first_positive_rank"].notna()]
        worst = worst.assign(_rank=-worst["first_positive_rank"].astype(np.int64)).sort_values(
            ["_rank", "image_id"], kind="stable").head(failures.queries)
        if worst.empty or not failures.k:
            continue
        at = pd.Series(np.arange(len(q_ids)), index=q_ids)[worst["image_id"]].to_numpy()
        data = RetrievalData(q_emb[at], g_emb, q_labels[at], g_labels)
        cols, scores = top_k(data, failures.k, max_memory_mb)
        sims = cosine_block(l2_normalize(q_emb[at]), l2_normalize(g_emb).T)
        for n, (i, rank) in enumerate(zip(at, worst["first_positive_rank"].astype(int))):
            positives = np.flatnonzero(g_labels == q_labels[i])
            best = positives[np.lexsort((positives, -sims[n, positives]))[0]]  # the ranking's rule: ties by index
            rows.append({"query": (q_ids[i], q_labels[i]),
                         "retrieved": [(g_ids[c], g_labels[c], float(s), g_labels[c] == q_labels[i])
                                       for c, s in zip(cols[n], scores[n]) if c >= 0],
                         "first": (g_ids[best], int(rank), float(sims[n, best]))})
    return rows
