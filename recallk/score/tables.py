"""The tables behind the headline means: bootstrap intervals, per-class and per-query
tables, and the recall@K curve. Plain functions over numpy arrays and pandas frames.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from recallk.score.metrics import mean
from recallk.score.ranking import Ranking
from recallk.score.resample import bootstrap_means, percentile_interval


def bootstrap_ci(values: dict[str, np.ndarray], resamples: int, confidence: float, seed: int,
                 unit: str = "query", labels: Sequence[str] | None = None) -> dict[str, float]:
    """Percentile bootstrap intervals of each metric's mean.

    ``values`` maps a metric key to per-query values (NaN = excluded query, dropped first).
    ``unit``: ``query`` resamples queries with replacement; ``label`` resamples labels (each
    with all its queries, which ``labels`` gives), the honest choice when a label's queries are
    correlated (leave-one-out). Every metric uses the same resamples
    (:func:`recallk.score.resample.bootstrap_means`). Returns ``{key}_ci_low`` and ``{key}_ci_high``.
    """
    if resamples <= 0 or not values:
        return {}
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


#: Per-query column of a headline metric whose per-query name differs (recall@K -> hit@K, see :func:`per_query_column`).
_PER_QUERY_NAMES = {"map@r": "ap@r", "map": "ap", "mrr": "rr"}
#: Columns identifying each query and its task, first in both per-query tables.
TASK_COLUMNS = ("image_id", "label", "num_positives", "num_retrievable")


def per_query_column(key: str) -> str:
    """The per-query column of headline metric ``key``: ``recall@K`` -> ``hit@K``, ``map@r`` -> ``ap@r``,
    ``map`` -> ``ap``, ``mrr`` -> ``rr``; ``precision@K`` and ``r_precision`` keep their names."""
    if key.startswith("recall@"):
        return "hit@" + key.split("@", 1)[1]
    return _PER_QUERY_NAMES.get(key, key)


def headline_key(column: str) -> str | None:
    """The inverse of :func:`per_query_column`; None for a column that is not a per-query metric."""
    name, _, k = column.partition("@")
    if name in ("hit", "precision") and k.isdigit():
        return f"{'recall' if name == 'hit' else 'precision'}@{k}"
    inverse = {v: k for k, v in _PER_QUERY_NAMES.items()}
    return inverse.get(column, "r_precision" if column == "r_precision" else None)


def per_query(image_ids: Sequence[str], labels: Sequence[str], ranking: Ranking,
              values: dict[str, np.ndarray]) -> pd.DataFrame:
    """One row per query, sorted by image_id: its task (label, positives, retrievable items), its first
    positive's 1-based rank under both tie rules, and its value of every scored metric
    (:func:`per_query_column` names them: ``hit@K``, ``precision@K``, ``r_precision``, ``ap@r``, ``ap``, ``rr``).

    Excluded queries (no positive) have empty ranks and metric values.
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
    return frame.sort_values("image_id", kind="stable").reset_index(drop=True)


def compact_per_query(frame: pd.DataFrame) -> pd.DataFrame:
    """The per-query table kept in git beside the metrics (``metrics/per_query.csv``): each query's task
    and metric values, what ``recallk compare`` needs, without the rank columns."""
    return frame[[c for c in frame.columns if c in TASK_COLUMNS or headline_key(c)]]


def recall_curve(ranking: Ranking, k_max: int) -> pd.DataFrame:
    """recall@k for k = 1 .. min(k_max, largest number of retrievable items), over included queries."""
    first = ranking.first_rank[ranking.n_positives > 0]
    top = int(min(k_max, ranking.n_retrievable.max(initial=1)))
    hits = np.cumsum(np.bincount(first[first < top], minlength=top))
    return pd.DataFrame({"k": np.arange(1, top + 1), "recall": hits / max(first.size, 1)})
