"""The tables behind the headline means: bootstrap intervals, per-class and per-query
tables, and the recall@K curve. Plain functions over numpy arrays and pandas frames.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from recallk.score.ranking import Ranking
from recallk.stats import mean
from recallk.stats.resample import bootstrap_means, percentile_interval
from recallk.tables_contract import TASK_COLUMNS, check_per_query, headline_key, per_query_column


def bootstrap_ci(values: dict[str, np.ndarray], resamples: int, confidence: float, seed: int,
                 unit: str = "query", labels: Sequence[str] | None = None,
                 order: np.ndarray | None = None) -> dict[str, float]:
    """Percentile bootstrap intervals of each metric's mean.

    ``values`` maps a metric key to per-query values (NaN = excluded query, dropped first).
    ``unit``: ``query`` resamples queries with replacement; ``label`` resamples labels (each
    with all its queries, which ``labels`` gives), the honest choice when a label's queries are
    correlated (leave-one-out). Every metric uses the same resamples
    (:func:`recallk.stats.resample.bootstrap_means`). Returns ``{key}_ci_low`` and ``{key}_ci_high``.

    ``order`` (a permutation of the queries, :func:`recallk.stats.resample.content_order`) is the order
    the resamples draw from; with it, labels (``unit: label``) are numbered by their first query in that
    order too, so renaming files or labels never moves the bounds.
    """
    if resamples <= 0 or not values:
        return {}
    if order is not None:
        values = {key: np.asarray(v)[order] for key, v in values.items()}
        if labels is not None:
            codes = pd.factorize(pd.Series(np.asarray(labels, dtype=str)[order]))[0]
            labels = np.char.zfill(codes.astype(str), 12)
    kept_rows = ~np.isnan(next(iter(values.values())))
    kept = {key: v[kept_rows] for key, v in values.items()}
    groups = np.asarray(labels, dtype=str)[kept_rows] if unit == "label" else None
    out: dict[str, float] = {}
    for key, means in bootstrap_means(kept, resamples, seed, groups).items():
        out[f"{key}_ci_low"], out[f"{key}_ci_high"] = percentile_interval(means, confidence)
    return out


def per_class(values: dict[str, np.ndarray], labels: Sequence[str]) -> tuple[pd.DataFrame, dict[str, float]]:
    """Per-label means of each metric (included queries only) and their unweighted mean over labels.

    Returns the table (``label, num_queries`` then one column per key, sorted by
    label) and ``{key}_class_mean`` for each key.
    """
    frame = pd.DataFrame({key: v for key, v in values.items()})
    frame.insert(0, "label", np.asarray(labels, dtype=str))
    first = next(iter(values))
    frame = frame[~frame[first].isna()]
    table = frame.groupby("label", sort=True).agg(
        num_queries=(first, "size"), **{key: (key, lambda s: mean(s.to_numpy())) for key in values})
    means = {f"{key}_class_mean": mean(table[key].to_numpy()) for key in values}
    return table.reset_index(), means


def per_query(image_ids: Sequence[str], labels: Sequence[str], ranking: Ranking,
              values: dict[str, np.ndarray], neighbors: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per query, sorted by image_id: its task (label, positives, retrievable items), its first
    positive's 1-based rank under both tie rules, its value of every scored metric
    (:func:`per_query_column` names them: ``hit@K``, ``precision@K``, ``r_precision``, ``ap@r``, ``ap``, ``rr``)
    and, with ``neighbors`` (:func:`neighbors`), what it retrieved first (``top1_id``, ``top1_label``).

    Excluded queries (no positive) have empty ranks and metric values. The table is checked against its
    contract, :class:`recallk.tables_contract.PerQueryTable`, which ``recallk compare`` reads it back with.
    """
    first = ranking.first_rank
    frame = pd.DataFrame({
        "image_id": np.asarray(image_ids, dtype=str),
        "label": np.asarray(labels, dtype=str),
        "num_positives": ranking.n_positives,
        "num_retrievable": ranking.n_retrievable,
        "first_positive_rank": pd.array(np.where(first >= 0, first + 1, 0), dtype="Int64"),
        "first_positive_rank_other_tie_rule": pd.array(np.where(first >= 0, ranking.first_rank_opposite + 1, 0),
                                                       dtype="Int64"),
    })
    none = first < 0
    frame.loc[none, ["first_positive_rank", "first_positive_rank_other_tie_rule"]] = pd.NA
    for key, column in values.items():
        frame[per_query_column(key)] = column
    if neighbors is not None:
        first_item = neighbors[neighbors["rank"] == 1].set_index("image_id")
        frame["top1_id"] = frame["image_id"].map(first_item["gallery_id"])
        frame["top1_label"] = frame["image_id"].map(first_item["gallery_label"])
    frame = frame.sort_values("image_id", kind="stable").reset_index(drop=True)
    check_per_query(frame, "the per-query table")
    return frame


#: big-ann-benchmarks' tie tolerance on distances ``1 - cosine`` (``compute_recall_with_distance_ties``): how close
#: to the ``max(ks)``-th an item must be for ``neighbors.csv`` to run past it (:func:`tie_end`).
TIE_TOLERANCE = 1e-6


def tie_end(distances: np.ndarray, k: int) -> np.ndarray:
    """(n,) where each query's tie at its ``k``-th item ends: ``k``, then one more for each next distance within
    :data:`TIE_TOLERANCE` of the ``k``-th (anchored there, not chained), up to the first that is not (NaN is
    not): big-ann-benchmarks' rule, by which ``neighbors.csv`` runs past ``max(ks)``."""
    distances = np.asarray(distances, dtype=np.float64)
    close = np.abs(distances[:, k:] - distances[:, k - 1:k]) < TIE_TOLERANCE  # NaN compares False
    return k + np.cumprod(close, axis=1).sum(axis=1, dtype=np.int64)


def neighbors(query_ids: Sequence[str], query_labels: Sequence[str], gallery_ids: Sequence[str],
              gallery_labels: Sequence[str], cols: np.ndarray, scores: np.ndarray) -> pd.DataFrame:
    """What each query retrieved (:func:`recallk.score.ranking.neighbors.top_k`), one row per (query, rank):
    ``image_id, label, rank`` (1-based), ``gallery_id, gallery_label, score`` (the exact cosine) and
    ``is_positive``; sorted by image_id then rank."""
    used = cols >= 0
    q_rows, ranks = np.nonzero(used)
    g_rows = cols[used]
    q_ids, q_lab = np.asarray(query_ids, dtype=str), np.asarray(query_labels, dtype=str)
    g_ids, g_lab = np.asarray(gallery_ids, dtype=str), np.asarray(gallery_labels, dtype=str)
    frame = pd.DataFrame({"image_id": q_ids[q_rows], "label": q_lab[q_rows], "rank": ranks + 1,
                          "gallery_id": g_ids[g_rows],
                          "gallery_label": g_lab[g_rows], "score": scores[used].astype(np.float64),
                          "is_positive": g_lab[g_rows] == q_lab[q_rows]})
    return frame.sort_values(["image_id", "rank"], kind="stable").reset_index(drop=True)


def confusions(neighbors: pd.DataFrame) -> pd.DataFrame:
    """For each query label, the labels its queries retrieve first: ``label, retrieved_label, queries``
    and ``share`` (of that label's queries with a retrieved item), most frequent first, ties by label."""
    first = neighbors[neighbors["rank"] == 1]
    counts = first.groupby(["label", "gallery_label"]).size().rename("queries").reset_index()
    counts["share"] = counts["queries"] / counts.groupby("label")["queries"].transform("sum")
    counts = counts.rename(columns={"gallery_label": "retrieved_label"})
    counts["order"] = -counts["queries"]
    counts = counts.sort_values(["label", "order", "retrieved_label"], kind="stable").drop(columns="order")
    return counts.reset_index(drop=True)


def compact_per_query(frame: pd.DataFrame, values: dict[str, np.ndarray] | None = None) -> pd.DataFrame:
    """The per-query table kept in git beside the metrics (``metrics/per_query.csv``): each query's task
    and metric values, what ``recallk compare`` needs, without the rank and neighbour columns. With ``values``
    (metric key -> per-query values, in ``frame``'s row order), those values replace ``frame``'s metric columns:
    an index point's table, on the exact run's task columns."""
    if values is not None:
        frame = frame[list(TASK_COLUMNS)].copy()
        for key, v in values.items():
            frame[per_query_column(key)] = v
    return frame[[c for c in frame.columns if c in TASK_COLUMNS or headline_key(c)]]


def recall_curve(ranking: Ranking, k_max: int) -> pd.DataFrame:
    """recall@k for k = 1 .. min(k_max, largest number of retrievable items), over included queries."""
    first = ranking.first_rank[ranking.n_positives > 0]
    top = int(min(k_max, ranking.n_retrievable.max(initial=1)))
    hits = np.cumsum(np.bincount(first[first < top], minlength=top))
    return pd.DataFrame({"k": np.arange(1, top + 1), "recall": hits / max(first.size, 1)})


def curve_band(ranking: Ranking, curve: pd.DataFrame, resamples: int, confidence: float, seed: int,
               unit: str = "query", labels: Sequence[str] | None = None,
               order: np.ndarray | None = None) -> pd.DataFrame:
    """The recall@K curve with a bootstrap interval per k (``k, recall, ci_low, ci_high``), the same
    resamples as :func:`bootstrap_ci`; without resamples the band is the curve itself."""
    first = ranking.first_rank.astype(np.float64)
    first[ranking.n_positives == 0] = np.nan
    values = {int(k): np.where(np.isnan(first), np.nan, (first < k).astype(np.float64)) for k in curve["k"]}
    ci = bootstrap_ci(values, resamples, confidence, seed, unit, labels, order)
    band = curve.copy()
    band["ci_low"] = [ci.get(f"{k}_ci_low", r) for k, r in zip(curve["k"], curve["recall"])]
    band["ci_high"] = [ci.get(f"{k}_ci_high", r) for k, r in zip(curve["k"], curve["recall"])]
    return band
