"""The tables behind the headline means: bootstrap intervals, per-class and per-query
tables, and the recall@K curve. Plain functions over numpy arrays and pandas frames.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from recallk.score.metrics import mean
from recallk.score.ranking import Ranking

#: Resampled query indices drawn at a time (bounds the bootstrap's scratch to ~32 MB).
_BOOTSTRAP_CELLS = 4_000_000


def bootstrap_ci(values: dict[str, np.ndarray], resamples: int, confidence: float, seed: int) -> dict[str, float]:
    """Percentile bootstrap intervals of each metric's mean, resampling queries with replacement.

    ``values`` maps a metric key to per-query values (NaN = excluded query, dropped
    first). Every metric uses the same resamples (``numpy.random.default_rng(seed)``).
    Returns ``{key}_ci_low`` and ``{key}_ci_high`` for each key.
    """
    out: dict[str, float] = {}
    if resamples <= 0 or not values:
        return out
    kept = {key: v[~np.isnan(v)] for key, v in values.items()}
    n = len(next(iter(kept.values())))
    rng = np.random.default_rng(seed)
    means = {key: np.empty(resamples) for key in kept}
    step = max(1, _BOOTSTRAP_CELLS // max(n, 1))
    for start in range(0, resamples, step):
        idx = rng.integers(0, n, size=(min(step, resamples - start), n))
        for key, v in kept.items():
            sample = v[idx]  # each resample's mean, kept within its range like the headline's (metrics.mean)
            np.clip(sample.mean(axis=1), sample.min(axis=1), sample.max(axis=1),
                    out=means[key][start:start + idx.shape[0]])
    tail = (1.0 - confidence) / 2.0
    for key, m in means.items():
        low, high = np.quantile(m, [tail, 1.0 - tail])
        out[f"{key}_ci_low"], out[f"{key}_ci_high"] = float(low), float(high)
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
              values: dict[str, np.ndarray]) -> pd.DataFrame:
    """One row per query: first positive's 1-based rank, positives, retrievable items, AP and AP@R.

    Excluded queries (no positive) have empty ranks and metrics. ``ap`` and
    ``ap@r`` are filled when ``map`` / ``map@r`` are among the scored metrics.
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
    for key, column in (("map", "ap"), ("map@r", "ap@r")):
        if key in values:
            frame[column] = values[key]
    return frame.sort_values("image_id", kind="stable").reset_index(drop=True)


def recall_curve(ranking: Ranking, k_max: int) -> pd.DataFrame:
    """recall@k for k = 1 .. min(k_max, largest number of retrievable items), over included queries."""
    first = ranking.first_rank[ranking.n_positives > 0]
    top = int(min(k_max, ranking.n_retrievable.max(initial=1)))
    hits = np.cumsum(np.bincount(first[first < top], minlength=top))
    return pd.DataFrame({"k": np.arange(1, top + 1), "recall": hits / max(first.size, 1)})
