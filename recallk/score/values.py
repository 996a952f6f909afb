"""From a :class:`~recallk.score.ranking.Ranking` to metric values: per query, their means and the counts.

The metrics are the rows of the registry (:mod:`recallk.score.registry`), computed on
:class:`~recallk.score.registry.Span` s of queries; each reported value is the mean over the
included queries (:func:`recallk.stats.mean`: summed with ``math.fsum``, so the order of the queries never
changes a bit). Formulas: :mod:`recallk.score.metrics`.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import numpy as np

from recallk.errors import InputError
from recallk.score.passes import Ranks
from recallk.score.ranking import Ranking, consecutive_runs
from recallk.score.registry import Metric, Span, metric_keys, rows
from recallk.score.retrieval_data import user_stacklevel
from recallk.score.settings import ScoreSettings
from recallk.stats import mean

#: Positives whose per-positive temporaries (about 40 B each) :func:`per_query` holds at a time.
SPAN_PAIRS = 2**20


def check_serves(ranking: Ranking, metrics: Sequence[Metric], depth: int) -> None:
    """Raise ValueError unless ``ranking`` holds the ranks ``metrics`` read at Ks up to ``depth``."""
    needs_all = [m.name for m in metrics if m.ranks is not Ranks.FIRST]
    if needs_all and not ranking.complete:
        raise ValueError(f"metrics {needs_all} need the complete ranking; rank with Pass.top(depth) or "
                         "Pass.every().")
    every = any(m.ranks is Ranks.EVERY for m in metrics)
    top_k = any(m.ranks is Ranks.TOP and m.per_k for m in metrics)  # precision@K: the top K ranks
    if ranking.depth is not None and (every or top_k and np.any(
            (ranking.depth < np.minimum(depth, ranking.n_retrievable))[ranking.n_positives > 0])):
        raise ValueError("this ranking holds only the top of each query's ranking (the top-L pass, `depth`): it "
                         "serves recall, precision@K for K up to its depth, r_precision, map@r and mrr, not map; "
                         "rank with Pass.every() or a larger depth.")
    if ranking.cap is not None and ((needs_all and ranking.depth is None) or any(m.exact_first for m in metrics)
                                    or depth > ranking.cap):
        raise ValueError(f"this ranking's first ranks are capped at {ranking.cap}: it serves recall@K for "
                         f"K <= {ranking.cap} only; rank without a cap.")


def per_query(ranking: Ranking, settings: ScoreSettings) -> dict[str, np.ndarray]:
    """Per-query values of each metric key of ``settings`` (its ``metrics`` at its ``ks``; NaN for excluded
    queries).

    Returns a dict of float64 arrays of shape (n_queries,), keyed like :func:`metric_keys`.
    Runs of queries with about :data:`SPAN_PAIRS` positives between them are computed at a time,
    so the per-positive temporaries stay bounded however many positives a label has.
    """
    metrics, ks = rows(settings.metrics), settings.ks
    check_serves(ranking, metrics, settings.depth)
    keys = metric_keys(settings.metrics, ks)
    first = ranking.first_rank  # 0-based (int64); computed over every query once
    if ranking.ranks.size <= SPAN_PAIRS:  # one span: every query at once
        values = _span_values(ranking, first, 0, first.size, ks, metrics)
        return {key: values[key] for key in keys}
    spans = [_span_values(ranking, first[a:b], a, b, ks, metrics)
             for a, b in consecutive_runs(np.diff(ranking.offsets), SPAN_PAIRS)]
    return {key: np.concatenate([s[key] for s in spans]) for key in keys}


def _span_values(ranking: Ranking, first: np.ndarray, a: int, b: int, ks: Sequence[int],
                 metrics: Sequence[Metric]) -> dict[str, np.ndarray]:
    """:func:`per_query` for queries ``a:b``, whose 0-based first ranks are ``first``."""
    R = ranking.n_positives[a:b]
    included = R > 0
    listed = ranked = None
    if ranking.complete:  # the rest needs every positive's rank (or, with a depth, those within it)
        listed, ranked = np.diff(ranking.offsets[a:b + 1]), ranking.ranks[ranking.offsets[a]:ranking.offsets[b]]
    span = Span(first, R, ranking.n_retrievable[a:b], listed, ranked)
    out: dict[str, np.ndarray] = {}
    for metric in metrics:
        if metric.per_k:
            for k, key in zip(ks, metric.keys(ks)):
                out[key] = np.where(included, metric.compute(span, k), np.nan)
        else:
            out[metric.name] = np.where(included, metric.compute(span), np.nan)
    return out


def tie_sensitivity(ranking: Ranking, ks: Sequence[int]) -> dict[str, int]:
    """Queries whose hit at K flips when exact ties are broken the other way (larger gallery index first)."""
    first, other = ranking.first_rank, ranking.first_rank_opposite  # both -1 for a query without positives
    differ = first != other  # a hit can flip only where they differ
    if not differ.any():
        return {f"tie_sensitive@{k}": 0 for k in ks}
    first, other = first[differ], other[differ]
    return {f"tie_sensitive@{k}": int(np.count_nonzero((first < k) != (other < k))) for k in ks}


def capped_ks(ks: Sequence[int], n_retrievable: np.ndarray) -> list[int]:
    """The Ks at or above the largest number of items any query may retrieve: at such a K every query's
    whole gallery is within its top K (recall@K is 1.0 for every query with a positive), so the value
    measures nothing. The score stage writes them to metrics/counts.json (``capped_ks``) and the report
    block marks their lines."""
    most = int(n_retrievable.max()) if n_retrievable.size else 0
    return [int(k) for k in ks if k >= most] if n_retrievable.size else []


def warn_if_k_beyond_gallery(ks: Sequence[int], n_retrievable: np.ndarray) -> None:
    """One warning naming every K larger than what any query may retrieve: at such a K recall is 1 for every
    query with a positive and precision@K divides by K items that do not exist, so the number says nothing."""
    most = int(np.maximum.reduce(n_retrievable)) if n_retrievable.size else 0
    beyond = [k for k in ks if k > most]
    if beyond and n_retrievable.size:
        warnings.warn(f"K = {', '.join(map(str, beyond))} is larger than every query's gallery (at most {most} "
                      f"retrievable items): recall@K is 1.0 for every query with a positive there; use K up to "
                      f"{most} (`ks` / `score.ks`).", UserWarning, stacklevel=user_stacklevel())


def summarize(ranking: Ranking, settings: ScoreSettings, all_excluded: str = "raise",
              means_only: bool = False) -> tuple[dict[str, Any], dict | None]:
    """Headline means, counts and tie sensitivity of ``settings``' metrics at its ``ks``, plus the per-query
    arrays they came from.

    When every query is excluded (none has a positive it may retrieve) the metrics are undefined:
    ``all_excluded="raise"`` (the score stage) raises an InputError; ``"nan"`` (the Python API, where a
    training loop must not die on one odd batch) gives NaN for every metric with a ``RuntimeWarning``.
    ``means_only`` (what :func:`~recallk.score.metrics.retrieval_metrics` returns): the means and counts
    alone, without tie sensitivity; for recall@K alone no per-query arrays either (None is returned for
    them): each mean is the number of first ranks below K, counted from the first ranks sorted, the same number.
    """
    ks = settings.ks
    n_in = int(np.count_nonzero(ranking.n_positives))  # queries with a positive (the counts are never negative)
    warn_if_k_beyond_gallery(ks, ranking.n_retrievable)
    first = _first_ranks_if_cheap(ranking, settings, n_in) if means_only else None
    per = per_query(ranking, settings) if first is None else None
    if n_in == 0:
        why = (f"every one of the {ranking.n_positives.size} queries is excluded: none has a gallery "
               "item of its label that it may retrieve, so the metrics are undefined")
        if all_excluded == "raise":
            raise InputError(f"{why}. Put same-label images in the gallery.")
        warnings.warn(f"{why}; returning NaN. Put same-label items in the gallery.", RuntimeWarning,
                      stacklevel=user_stacklevel())
    out: dict[str, Any]
    if first is not None:  # the included queries' first ranks, sorted: those below K are the hits at K
        hits = np.sort(first).searchsorted(ks)
        out = {f"recall@{k}": (h / n_in if n_in else math.nan) for k, h in zip(ks, hits)}
    else:  # a recall value is 0 or 1: its fsum is the number of hits, so mean() is hits / n_in exactly
        out = {key: (np.count_nonzero(v == 1.0) / n_in if n_in else math.nan)
               if key.startswith("recall@") else mean(v) for key, v in per.items()}
    out.update(num_queries=n_in, num_excluded_queries=int(ranking.n_positives.size - n_in))
    if not means_only:
        out.update(tie_sensitivity(ranking, ks))
    return out, per


def _first_ranks_if_cheap(ranking: Ranking, settings: ScoreSettings, n_in: int) -> np.ndarray | None:
    """For recall@K alone (whose values :func:`per_query` would accept), the first ranks of the ``n_in``
    included queries, in query order; None otherwise. A first-positive ranking holds exactly those (one entry
    per query with positives); else they are read from :attr:`Ranking.first_rank`."""
    if list(settings.metrics) != ["recall"] or (ranking.cap is not None and settings.depth > ranking.cap):
        return None
    if not ranking.complete and ranking.ranks.size == n_in:
        return ranking.ranks
    return ranking.first_rank[ranking.n_positives > 0]
