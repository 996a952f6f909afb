"""The score stage's computation: the metric suite of a split's queries against its gallery.

:func:`score_split` takes arrays and tables already read and checked (the stage
reads the files), so it can be called on any embeddings and split, and returns
the flat metrics and the tables (per-class, recall curve, per-query).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
from PIL import Image

from recallk.checks import check_exclude_columns, is_missing
from recallk.errors import InputError
from recallk.report import failure_sheet
from recallk.score import embedding_copies
from recallk.report import tables
from recallk.score.metrics import metric_keys, rank, summarize, top_depth
from recallk.score.ranking.neighbors import top_k
from recallk.score.resample import content_order
from recallk.score.similarity import cosine_block, l2_normalize
from recallk.score.whitening import pca_whitening

log = logging.getLogger(__name__)

#: The recall curve runs to K = max(ks, CURVE_K).
CURVE_K = 20


def score_split(emb: np.ndarray, row: pd.Series, catalog: pd.DataFrame, *, queries: np.ndarray, gallery: np.ndarray,
                train: np.ndarray, same_set: bool, ks: Sequence[int], metrics: Sequence[str], max_memory_mb: float,
                backend: str, exclude_same: Sequence[str], whiten: str, bootstrap: dict[str, Any],
                failures: dict[str, int] | None = None, load: Callable[[str], Image.Image] | None = None,
                near_duplicates: dict[str, Any] | None = None, engine: str = "local",
                ray: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Score ``queries`` against ``gallery``; return the flat metrics and the tables.

    Parameters
    ----------
    emb : (n_images, d) array
        One row per image, finite (checked by the caller, which names the file).
    row : Series
        The row of ``emb`` of each image_id (its index).
    catalog : DataFrame indexed by image_id
        ``label`` and any ``exclude_same`` columns.
    queries, gallery, train : arrays of image_id
        ``train`` is only used by ``whiten: pca`` (the fit never sees the eval images).
    same_set : bool
        The queries are the gallery, row for row (leave-one-out), from the split protocol.
    ks, metrics, max_memory_mb, backend, exclude_same, whiten, bootstrap, failures, near_duplicates
        The ``score`` params (see the README). ``near_duplicates.min_cosine`` (None: off) flags the
        queries with another image at that cosine or above among their top max(ks) items (on the
        embeddings as stored, before any whitening) and adds every metric over the other queries
        (:mod:`recallk.score.embedding_copies`).
    engine, ray
        ``score.engine``: ``ray`` ranks on Ray tasks (``score.ray``: ``address``, ``num_cpus``), with the
        same result as ``local``; the neighbour tables and the bootstrap stay on this machine.
    load : callable, optional
        ``load(image_id) -> PIL image``; with ``failures.queries > 0`` the failure gallery is drawn.

    Returns
    -------
    (metrics, tables)
        ``metrics``: each metric key's mean, ``<key>_class_mean``, ``<key>_ci_low`` /
        ``<key>_ci_high``, the counts and ``tie_sensitive@K``. ``tables``: ``per_class``,
        ``curve``, ``per_query``, ``neighbors`` (each query's top max(ks) items), ``confusions`` and
        ``near_duplicates`` (the flagged pairs; empty when the check is off) frames.
    """
    check_exclude_columns(exclude_same, list(catalog.columns), name="score.exclude_same")
    q_emb, g_emb = emb[row[queries].to_numpy()], emb[row[gallery].to_numpy()]
    q_raw, g_raw = q_emb, g_emb
    if whiten == "pca":
        if train.size < 2:
            raise InputError(f"`score.whiten: pca` fits on the train split, which has {train.size} image(s); "
                             "give it at least 2 (split.fractions.train) or set `score.whiten: none`.")
        try:
            q_emb, g_emb = pca_whitening(emb[row[train].to_numpy()], q_emb, g_emb)
        except InputError as exc:
            raise InputError(f"`score.whiten: pca`: {exc} Set `score.whiten: none`.") from None
        log.info("whitening fitted on %d train images (%d dims kept)", train.size, q_emb.shape[1])
    labels = catalog["label"]
    q_labels, g_labels = labels[queries].to_numpy(), labels[gallery].to_numpy()
    exclude = [(catalog.loc[queries, c].to_numpy(), catalog.loc[gallery, c].to_numpy()) for c in exclude_same]
    ranking = rank(q_emb, g_emb, q_labels, g_labels, queries, gallery, metrics, exclude, max_memory_mb, backend,
                   same_set=same_set, engine=engine, ray=ray, depth=top_depth(metrics, ks))
    if exclude_same and not ranking.n_positives.any():
        raise InputError(f"every query is excluded: with `score.exclude_same: {list(exclude_same)}` no query keeps "
                         "a same-label gallery item it may retrieve. Remove those columns from score.exclude_same.")
    summary, values = summarize(ranking, ks, metrics)
    keys = metric_keys(metrics, ks)
    table, class_means = tables.per_class({k: values[k] for k in keys}, q_labels)
    out: dict[str, Any] = {k: summary[k] for k in keys}
    out.update(class_means)
    content = (catalog.loc[queries, "sha256"].fillna("").astype(str).to_numpy() if "sha256" in catalog
               else np.full(len(queries), ""))
    order = content_order(content, queries)  # resample by content, so renaming files never moves a bound
    out.update(tables.bootstrap_ci({k: values[k] for k in keys}, **bootstrap, labels=q_labels, order=order))
    out.update({k: v for k, v in summary.items() if k not in out})
    out.update(num_gallery=int(g_emb.shape[0]), embedding_dim=int(g_emb.shape[1]))
    failures = failures or {"queries": 0, "k": 0}
    cols, scores = top_k(q_emb, g_emb, max(max(ks), failures["k"]), queries, gallery, exclude, max_memory_mb)
    neighbors = tables.neighbors(queries, q_labels, gallery, g_labels, cols, scores)
    min_cosine = (near_duplicates or {}).get("min_cosine")
    copies = embedding_copies.empty_pairs()
    if min_cosine is not None:
        if whiten != "none":  # the backbone's own cosines: a threshold means the same whatever the scoring
            cols_raw, scores_raw = top_k(q_raw, g_raw, max(ks), queries, gallery, exclude, max_memory_mb)
        else:
            cols_raw, scores_raw = cols[:, :max(ks)], scores[:, :max(ks)]
        copies = embedding_copies.flagged_pairs(cols_raw, scores_raw, queries, q_labels, gallery, g_labels,
                                                min_cosine)
        flagged = np.isin(queries, copies["image_id"].unique())
        out["num_near_duplicate_queries"] = int(flagged.sum())
        out.update(embedding_copies.without(values, flagged, keys))
        log.info("score.near_duplicates.min_cosine %g: %d of %d queries have another image at that cosine or above "
                 "among their top %d", min_cosine, int(flagged.sum()), len(queries), max(ks))
    curve = tables.recall_curve(ranking, max(max(ks), CURVE_K))
    frames = {"per_class": table, "curve": curve,
              "curve_band": tables.curve_band(ranking, curve, **bootstrap, labels=q_labels, order=order),
              "per_query": tables.per_query(queries, q_labels, ranking, values, neighbors),
              "neighbors": neighbors[neighbors["rank"] <= max(ks)].reset_index(drop=True),
              "confusions": tables.confusions(neighbors), "near_duplicates": copies}
    if failures["queries"] and load is not None:
        frames["failures"] = _failure_sheet(frames["per_query"], neighbors, failures, q_emb, g_emb, queries,
                                            gallery, g_labels, exclude, load)
    return out, frames


def _failure_sheet(per_query: pd.DataFrame, neighbors: pd.DataFrame, failures: dict[str, int], q_emb: np.ndarray,
                   g_emb: np.ndarray, queries: np.ndarray, gallery: np.ndarray, g_labels: np.ndarray,
                   exclude: list, load: Callable[[str], Image.Image]) -> Image.Image:
    """The failure gallery (:mod:`recallk.report.failure_sheet`) of the ``failures["queries"]`` worst queries."""
    row_of = {qid: i for i, qid in enumerate(queries)}
    g_unit, g_labels = l2_normalize(g_emb), np.asarray(g_labels, dtype=str)
    rows = []
    for _, query in failure_sheet.worst_queries(per_query, failures["queries"]).iterrows():
        qid, i = query["image_id"], row_of[query["image_id"]]
        mine = neighbors[neighbors["image_id"] == qid].head(failures["k"])
        # the first positive, by the ranking's rule: exact cosine, ties by gallery index
        sims = cosine_block(l2_normalize(q_emb[i:i + 1]), g_unit.T)[0]
        allowed = (gallery != qid) & (g_labels == str(query["label"]))
        for q_values, g_values in exclude:
            value = q_values[i]
            if not is_missing(value):
                allowed &= np.asarray(g_values, dtype=object) != value
        positives = np.flatnonzero(allowed)
        best = positives[np.lexsort((positives, -sims[positives]))[0]]
        rows.append({"query": (qid, query["label"]),
                     "retrieved": list(zip(mine["gallery_id"], mine["gallery_label"], mine["score"],
                                           mine["is_positive"])),
                     "first": (gallery[best], int(query["first_positive_rank"]), float(sims[best]))})
    return failure_sheet.draw(rows, load)
