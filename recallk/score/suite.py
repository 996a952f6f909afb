"""The score stage's computation: the metric suite of a split's queries against its gallery.

:func:`score_split` takes the split's sets (:class:`SplitSets`: image_ids by role and their
embeddings) and the catalog, already read and checked (the stage reads the files), and the ``score``
settings, so it can be called on any embeddings and split; it returns the flat metrics and the tables
(per-class, recall curve, per-query, ...).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from recallk.checks import check_exclude_columns, is_missing
from recallk.errors import InputError
from recallk.score import embedding_copies, tables
from recallk.score.exclusion import exclusion_pairs
from recallk.score.metrics import rank
from recallk.score.ranking.neighbors import top_k
from recallk.score.registry import metric_keys
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import FailureSettings, ScoreSettings
from recallk.score.similarity import cosine_block, l2_normalize
from recallk.score.values import capped_ks, summarize
from recallk.score.whitening import pca_whitening
from recallk.stats.resample import content_order

log = logging.getLogger(__name__)

#: The recall curve runs to K = max(ks, CURVE_K).
CURVE_K = 20


@dataclass(frozen=True, eq=False)
class SplitSets:
    """A split's images by role, and their embeddings: what :func:`score_split` scores.

    Attributes
    ----------
    emb : ndarray
        (n_images, d), one row per image, finite (checked by the caller, which names the file).
    row : Series
        The row of ``emb`` of each image_id (its index).
    queries, gallery, train : ndarray
        image_ids, in split order. ``train`` is only read by ``whiten: pca`` (the fit never sees the eval
        images).
    same_set : bool
        The queries are the gallery, row for row (leave-one-out), from the split protocol.
    """

    emb: np.ndarray
    row: pd.Series
    queries: np.ndarray
    gallery: np.ndarray
    train: np.ndarray
    same_set: bool

    def embeddings(self, image_ids: np.ndarray) -> np.ndarray:
        """The rows of ``emb`` of ``image_ids``, in their order."""
        return self.emb[self.row[image_ids].to_numpy()]


def score_split(sets: SplitSets, catalog: pd.DataFrame,
                settings: ScoreSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    """Score ``sets.queries`` against ``sets.gallery``; return the flat metrics and the tables.

    Parameters
    ----------
    sets : SplitSets
        The image_ids by role and their embeddings.
    catalog : DataFrame indexed by image_id
        ``label`` and any ``exclude_same`` columns.
    settings : ScoreSettings
        The ``score`` params (docs/params.md), checked. ``embedding_copies.min_cosine`` (None: off) flags
        the queries with another image at that cosine or above among their top ``max(ks)`` items (on the
        embeddings as stored, before any whitening) and adds every metric over the other queries
        (:mod:`recallk.score.embedding_copies`). ``engine: ray`` ranks on Ray tasks (``ray``), with the
        same result as ``local``; the neighbour tables and the bootstrap stay on this machine.

    Returns
    -------
    (metrics, tables)
        ``metrics``: each metric key's mean, ``<key>_class_mean``, ``<key>_ci_low`` /
        ``<key>_ci_high``, the counts, ``tie_sensitive@K`` and ``capped_ks`` (the Ks at or above every query's
        gallery: :func:`~recallk.score.values.capped_ks`). ``tables``: ``per_class``,
        ``curve``, ``per_query``, ``neighbors`` (each query's top max(ks) items), ``confusions`` and
        ``embedding_copies`` (the flagged pairs; empty when the check is off) frames, and ``failures``: the
        rows of the failure gallery (:func:`failure_rows`; empty when ``failures.queries`` is 0), which the
        stage draws (:func:`recallk.report.failure_sheet.draw`).
    """
    check_exclude_columns(settings.exclude_same, list(catalog.columns), name="score.exclude_same")
    queries, gallery, depth, bootstrap = sets.queries, sets.gallery, settings.depth, asdict(settings.bootstrap)
    q_raw, g_raw = sets.embeddings(queries), sets.embeddings(gallery)
    q_emb, g_emb = _whitened(sets, settings.whiten, q_raw, g_raw)
    labels = catalog["label"]
    q_labels, g_labels = labels[queries].to_numpy(), labels[gallery].to_numpy()
    exclude = exclusion_pairs(catalog, queries, gallery, settings, sets.same_set)
    data = RetrievalData(q_emb, g_emb, q_labels, g_labels, query_ids=queries, gallery_ids=gallery, exclude=exclude,
                         same_set=sets.same_set)
    ranking = rank(data, settings)
    if settings.exclude_same and not ranking.n_positives.any():
        raise InputError(f"every query is excluded: with `score.exclude_same: {list(settings.exclude_same)}` no "
                         "query keeps a same-label gallery item it may retrieve. Remove those columns from "
                         "score.exclude_same.")
    if (settings.exclude_same_all or settings.junk) and not ranking.n_positives.any():
        raise InputError(f"every query is excluded: with `score.exclude_same_all: {list(settings.exclude_same_all)}`"
                         f" and `score.junk: {settings.junk}` no query keeps a same-label gallery item it may "
                         "retrieve (each one's matches are all junk). Check the catalog's columns, or turn the "
                         "rules off ([] and null).")
    summary, values = summarize(ranking, settings)
    keys = metric_keys(settings.metrics, settings.ks)
    table, class_means = tables.per_class({k: values[k] for k in keys}, q_labels)
    out: dict[str, Any] = {k: summary[k] for k in keys}
    out.update(class_means)
    content = (catalog.loc[queries, "sha256"].fillna("").astype(str).to_numpy() if "sha256" in catalog
               else np.full(len(queries), ""))
    order = content_order(content, queries)  # resample by content, so renaming files never moves a bound
    out.update(tables.bootstrap_ci({k: values[k] for k in keys}, **bootstrap, labels=q_labels, order=order))
    out.update({k: v for k, v in summary.items() if k not in out})
    out.update(num_gallery=int(g_emb.shape[0]), embedding_dim=int(g_emb.shape[1]),
               capped_ks=capped_ks(settings.ks, ranking.n_retrievable))
    failures = settings.failures
    cols, scores = tied_top_k(data, depth, max(depth, failures.k), settings.max_memory_mb)
    neighbors = tables.neighbors(queries, q_labels, gallery, g_labels, cols, scores)
    min_cosine = settings.embedding_copies.min_cosine
    copies = embedding_copies.empty_pairs()
    if min_cosine is not None:
        if settings.whiten != "none":  # the backbone's own cosines: a threshold means the same whatever the scoring
            cols_raw, scores_raw = top_k(replace(data, query_emb=q_raw, gallery_emb=g_raw), depth,
                                         settings.max_memory_mb)
        else:
            cols_raw, scores_raw = cols[:, :depth], scores[:, :depth]
        copies = embedding_copies.flagged_pairs(cols_raw, scores_raw, data, min_cosine)
        flagged = np.isin(queries, copies["image_id"].unique())
        out["num_embedding_copy_queries"] = int(flagged.sum())
        out.update(embedding_copies.without(values, flagged, keys))
        log.info("score.embedding_copies.min_cosine %g: %d of %d queries have another image at that cosine or above "
                 "among their top %d", min_cosine, int(flagged.sum()), len(queries), depth)
    curve = tables.recall_curve(ranking, max(depth, CURVE_K))
    frames = {"per_class": table, "curve": curve,
              "curve_band": tables.curve_band(ranking, curve, **bootstrap, labels=q_labels, order=order),
              "per_query": tables.per_query(queries, q_labels, ranking, values, neighbors),
              "neighbors": tables.neighbors(queries, q_labels, gallery, g_labels, past_ties(cols, scores, depth),
                                            scores),
              "confusions": tables.confusions(neighbors), "embedding_copies": copies}
    frames["failures"] = failure_rows(data, frames["per_query"], neighbors, failures) if failures.queries else []
    return out, frames


def tied_top_k(data: RetrievalData, depth: int, width: int,
               max_memory_mb: float | None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~recallk.score.ranking.neighbors.top_k` at least ``width`` deep and one past ``depth``, deeper (doubled)
    while a query's tie at its ``depth``-th item (:func:`recallk.score.tables.tie_end`) reaches the last column."""
    m = data.gallery_emb.shape[0]
    width = min(max(width, depth + 1), m)
    while True:
        cols, scores = top_k(data, width, max_memory_mb)
        if width >= m or not (tables.tie_end(1.0 - scores.astype(np.float64), depth) >= width).any():
            return cols, scores
        width = min(2 * width, m)


def past_ties(cols: np.ndarray, scores: np.ndarray, depth: int) -> np.ndarray:
    """``cols`` (:func:`tied_top_k`) as ``neighbors.csv`` keeps them (-1 elsewhere): the first ``depth``, every
    item past it within 1e-6 of the ``depth``-th distance (a tie at the cut, as big-ann-benchmarks' ground truth
    runs past K) and the first that is not, so a reader sees where the tie ends."""
    depth = min(depth, cols.shape[1])
    end = tables.tie_end(1.0 - scores.astype(np.float64), depth) + 1
    return np.where(np.arange(cols.shape[1]) < end[:, None], cols, -1)


def _whitened(sets: SplitSets, whiten: str, q_emb: np.ndarray, g_emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The query and gallery embeddings as scored: as stored, or (``whiten: pca``) whitened by a PCA fitted
    on the train split."""
    if whiten != "pca":
        return q_emb, g_emb
    train = sets.train
    if train.size < 2:
        raise InputError(f"`score.whiten: pca` fits on the train split, which has {train.size} image(s); "
                         "give it at least 2 (split.fractions.train) or set `score.whiten: none`.")
    try:
        q_emb, g_emb = pca_whitening(sets.embeddings(train), q_emb, g_emb)
    except InputError as exc:
        raise InputError(f"`score.whiten: pca`: {exc} Set `score.whiten: none`.") from None
    log.info("whitening fitted on %d train images (%d dims kept)", train.size, q_emb.shape[1])
    return q_emb, g_emb


def worst_queries(per_query: pd.DataFrame, n: int) -> pd.DataFrame:
    """The ``n`` worst queries with a positive: lowest ``ap@r`` (when scored), then the largest
    first-positive rank, ties by image_id."""
    rows = per_query[per_query["first_positive_rank"].notna()].copy()
    rows["_ap"] = rows["ap@r"] if "ap@r" in rows else 0.0
    rows["_rank"] = -rows["first_positive_rank"].astype(np.int64)
    rows = rows.sort_values(["_ap", "_rank", "image_id"], kind="stable")
    return rows.head(n).drop(columns=["_ap", "_rank"])


def failure_rows(data: RetrievalData, per_query: pd.DataFrame, neighbors: pd.DataFrame,
                 failures: FailureSettings) -> list[dict]:
    """The rows of the failure gallery (:mod:`recallk.report.failure_sheet` draws them): the ``failures.queries``
    worst queries of ``data`` (as scored: whitened or not), each with its top ``failures.k`` items and its first
    positive (``{"query": (id, label), "retrieved": [(id, label, score, is_positive)], "first": (id, rank,
    score)}``)."""
    queries, gallery = data.query_ids, data.gallery_ids
    row_of = {qid: i for i, qid in enumerate(queries)}
    g_unit, g_labels = l2_normalize(data.gallery_emb), np.asarray(data.gallery_labels, dtype=str)
    rows = []
    for _, query in worst_queries(per_query, failures.queries).iterrows():
        qid, i = query["image_id"], row_of[query["image_id"]]
        mine = neighbors[neighbors["image_id"] == qid].head(failures.k)
        # the first positive, by the ranking's rule: exact cosine, ties by gallery index
        sims = cosine_block(l2_normalize(data.query_emb[i:i + 1]), g_unit.T)[0]
        allowed = (gallery != qid) & (g_labels == str(query["label"]))
        for q_values, g_values in data.exclude:
            value = q_values[i]
            if not is_missing(value):
                allowed &= np.asarray(g_values, dtype=object) != value
        positives = np.flatnonzero(allowed)
        best = positives[np.lexsort((positives, -sims[positives]))[0]]
        rows.append({"query": (qid, query["label"]),
                     "retrieved": list(zip(mine["gallery_id"], mine["gallery_label"], mine["score"],
                                           mine["is_positive"])),
                     "first": (gallery[best], int(query["first_positive_rank"]), float(sims[best]))})
    return rows
