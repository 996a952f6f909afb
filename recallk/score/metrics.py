"""Retrieval metrics from exact ranks: ``retrieval_metrics``, ``recall_at_k`` and friends.

Every metric shares the conventions of :mod:`recallk.score.ranking`: cosine similarity
(:func:`recallk.score.similarity.cosine_block`), ranking by descending similarity with
ties broken by gallery index (smaller first), the query's own image (same id)
and excluded items never retrieved, and queries with no positive left out of
every mean and counted in ``num_excluded_queries``.

Notation, for a query q: :math:`M_q` gallery items it may retrieve, :math:`R_q`
positives among them (same label), :math:`r_1 < r_2 < \\dots < r_{R_q}` their
1-based ranks, :math:`\\mathrm{rel}_q(i) = 1` when the item at rank i is a positive.

* ``recall@K`` = :math:`\\mathbb{1}[r_1 \\le K]` (hit rate, the seed's definition).
* ``precision@K`` = :math:`|\\{j : r_j \\le K\\}| / \\min(K, M_q)`.
* ``r_precision`` = :math:`|\\{j : r_j \\le R_q\\}| / R_q`.
* ``map@r`` = :math:`\\frac{1}{R_q} \\sum_{j : r_j \\le R_q} j / r_j` (MAP@R, Musgrave et al. 2020).
* ``map`` = :math:`\\frac{1}{R_q} \\sum_{j=1}^{R_q} j / r_j` (average precision over the full ranking).
* ``mrr`` = :math:`1 / r_1`.

Each reported value is the mean over the included queries (:func:`mean`: summed with
``math.fsum``, so the order of the queries never changes a bit).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable, Sequence

import numpy as np

from recallk.checks import (FIRST_ONLY, METRIC_NAMES, as_array, check_backend, check_exclude_pairs, check_inputs, check_ks,
                            check_memory, check_metrics, same_values)
from recallk.errors import InputError
from recallk.score.ranking import Ranking, consecutive_runs, rank_positives

#: Metric names accepted by ``metrics=`` / ``score.metrics``; recall and precision expand to one key per K.
METRICS = METRIC_NAMES
#: Positives whose per-positive temporaries (about 40 B each) :func:`per_query` holds at a time.
_SPAN_PAIRS = 2**20


def metric_keys(metrics: Sequence[str], ks: Sequence[int]) -> list[str]:
    """Flat keys in report order: ``recall@K`` and ``precision@K`` per K, the others once."""
    keys: list[str] = []
    for name in metrics:
        keys += [f"{name}@{k}" for k in ks] if name in ("recall", "precision") else [name]
    return keys


def per_query(ranking: Ranking, ks: Sequence[int], metrics: Sequence[str]) -> dict[str, np.ndarray]:
    """Per-query values of each metric key (NaN for excluded queries), plus ``ap``-style helpers.

    Returns a dict of float64 arrays of shape (n_queries,), keyed like :func:`metric_keys`.
    Runs of queries with about ``_SPAN_PAIRS`` positives between them are computed at a time,
    so the per-positive temporaries stay bounded however many positives a label has.
    """
    needs_all = [m for m in metrics if m not in FIRST_ONLY]
    if needs_all and not ranking.complete:
        raise ValueError(f"metrics {needs_all} need the complete ranking; rank with complete=True.")
    if ranking.depth is not None and ("map" in metrics or "precision" in metrics and ks and np.any(
            (ranking.depth < np.minimum(max(ks), ranking.n_retrievable))[ranking.n_positives > 0])):
        raise ValueError("this ranking holds only the top of each query's ranking (the top-L pass, `depth`): it "
                         "serves recall, precision@K for K up to its depth, r_precision, map@r and mrr, not map; "
                         "rank with depth=None or a larger depth.")
    if ranking.cap is not None and ((needs_all and ranking.depth is None) or "mrr" in metrics or max(ks, default=0) > ranking.cap):
        raise ValueError(f"this ranking's first ranks are capped at {ranking.cap}: it serves recall@K for "
                         f"K <= {ranking.cap} only; rank with cap=None.")
    first = ranking.first_rank  # 0-based (int64); computed over every query once
    if ranking.ranks.size <= _SPAN_PAIRS:  # one span: every query at once
        values = _span_values(ranking, first, 0, first.size, ks, metrics)
        return {key: values[key] for key in metric_keys(metrics, ks)}
    spans = [_span_values(ranking, first[a:b], a, b, ks, metrics)
             for a, b in consecutive_runs(np.diff(ranking.offsets), _SPAN_PAIRS)]
    return {key: np.concatenate([s[key] for s in spans]) for key in metric_keys(metrics, ks)}


def _span_values(ranking: Ranking, first: np.ndarray, a: int, b: int, ks: Sequence[int],
                 metrics: Sequence[str]) -> dict[str, np.ndarray]:
    """:func:`per_query` for queries ``a:b``, whose 0-based first ranks are ``first``."""
    n = b - a
    R = ranking.n_positives[a:b]
    included = R > 0
    n_retrievable = ranking.n_retrievable[a:b]
    out: dict[str, np.ndarray] = {}

    def nan_out(values: np.ndarray) -> np.ndarray:
        return np.where(included, values, np.nan)

    if ranking.complete:  # the rest needs every positive's rank (or, with a depth, those within it)
        listed = np.diff(ranking.offsets[a:b + 1])  # R, or fewer within a depth
        r = ranking.ranks[ranking.offsets[a]:ranking.offsets[b]] + 1.0  # 1-based rank
        owner = np.repeat(np.arange(n), listed)
        j = np.arange(r.size) - np.repeat(np.cumsum(listed) - listed, listed) + 1.0
        R_each = np.repeat(R, listed)
        safe_R = np.maximum(R, 1)

    def per(weights: np.ndarray) -> np.ndarray:
        return np.bincount(owner, weights=weights, minlength=n)

    for name in metrics:
        if name == "recall":
            for k in ks:
                out[f"recall@{k}"] = nan_out(first < k)
        elif name == "precision":
            for k in ks:
                out[f"precision@{k}"] = nan_out(per((r <= k).astype(np.float64))
                                                / np.maximum(np.minimum(k, n_retrievable), 1))
        elif name == "r_precision":
            out["r_precision"] = nan_out(per((r <= R_each).astype(np.float64)) / safe_R)
        elif name == "map@r":
            out["map@r"] = nan_out(per(np.where(r <= R_each, j / r, 0.0)) / safe_R)
        elif name == "map":
            out["map"] = nan_out(per(j / r) / safe_R)
        elif name == "mrr":
            out["mrr"] = nan_out(1.0 / (np.maximum(first, 0.0) + 1.0))
    return out


def mean(values: np.ndarray) -> float:
    """Mean of the non-NaN entries (NaN marks excluded queries): the correctly rounded sum
    (``math.fsum``, so the order never changes a bit) divided once, then kept within the
    entries' range, so a metric equal for every query reports exactly that value."""
    kept = values[values == values]  # NaN is the one value unequal to itself
    if not kept.size:
        return math.nan
    return float(min(max(math.fsum(kept.tolist()) / kept.size, kept.min()), kept.max()))


def tie_sensitivity(ranking: Ranking, ks: Sequence[int]) -> dict[str, int]:
    """Queries whose hit at K flips when exact ties are broken the other way (larger gallery index first)."""
    first, other = ranking.first_rank, ranking.first_rank_opposite  # both -1 for a query without positives
    differ = first != other  # a hit can flip only where they differ
    if not differ.any():
        return {f"tie_sensitive@{k}": 0 for k in ks}
    first, other = first[differ], other[differ]
    return {f"tie_sensitive@{k}": int(np.count_nonzero((first < k) != (other < k))) for k in ks}


def rank(query_emb, gallery_emb, query_labels, gallery_labels, query_ids=None, gallery_ids=None,
         metrics: Sequence[str] = METRICS, exclude: Sequence[tuple[Any, Any]] = (), max_memory_mb: float = 512,
         backend: str = "numpy", cap: int | None = None, same_set: bool | None = None, engine: str = "local",
         ray: dict[str, Any] | None = None, depth: int | None = None) -> Ranking:
    """Validate the inputs once and rank with the chosen backend (``numpy`` or ``faiss``).

    ``cap`` (no mrr, no map): first ranks of ``cap`` or more may read ``cap``, so the numpy
    engine stops counting a query once it surely misses every K <= ``cap`` (recall alone), or (with
    ``depth``) needs no exact first rank for a query whose positives all lie beyond its first L.
    ``same_set``: the queries *are* the gallery, row for row (leave-one-out), as the caller
    knows it (the score stage from the split protocol); ``None`` detects it from the arrays.
    ``engine="ray"``: the numpy engine's tiles run on Ray tasks (:mod:`recallk.score.ranking.ray_tiles`,
    ``ray``: ``address``, ``num_cpus``), with the same result.
    ``depth`` (:func:`top_depth`): the metrics read only each query's first max(R, depth) ranks, so the numpy
    engine takes its top-L pass (the complete ranking without it, or with ``backend="faiss"``).
    """
    q, g = check_inputs(query_emb, gallery_emb, query_labels, gallery_labels, query_ids, gallery_ids)
    if same_set is None and query_ids is None and (q is g or same_values(q, g)):
        warnings.warn("`query_emb` and `gallery_emb` hold the same rows and no ids were passed, so every query "
                      "retrieves itself (recall@1 is 1.0); pass `query_ids` and `gallery_ids` (e.g. "
                      "np.arange(n) for both) to exclude each query's own row.", UserWarning, stacklevel=3)
    max_memory_mb, backend = check_memory(max_memory_mb), check_backend(backend)
    pairs = check_exclude_pairs(exclude, q.shape[0], g.shape[0])
    complete = any(m not in FIRST_ONLY for m in metrics)
    count_tiles = None
    if engine == "ray":
        if backend == "faiss":
            raise InputError("`score.engine: ray` runs the numpy engine's tiles on Ray; set `score.backend: numpy` "
                             "(faiss is a single-machine cross-check) or `score.engine: local`.")
        from recallk.score.ranking.ray_tiles import RayTiles

        count_tiles = RayTiles(**(ray or {}))
    if backend == "faiss":
        from recallk.score.ranking.faiss_backend import rank_positives_faiss

        return rank_positives_faiss(q, g, query_labels, gallery_labels, query_ids, gallery_ids, pairs,
                                    max_memory_mb=max_memory_mb)
    return rank_positives(q, g, query_labels, gallery_labels, query_ids, gallery_ids, pairs,
                          max_memory_mb=max_memory_mb, complete=complete,
                          cap=cap if not complete or depth is not None else None,
                          same_set=same_set, count_tiles=count_tiles, depth=depth if complete else None)


def _recall_cap(names: Sequence[str], ks: Sequence[int]) -> int | None:
    """Without mrr and map, first ranks beyond the largest K change nothing: the engine may stop counting
    there (recall alone) or skip exact first ranks beyond each query's first L (the top-L pass)."""
    return None if {"mrr", "map"} & set(names) else max(ks)


def top_depth(names: Sequence[str], ks: Sequence[int]) -> int | None:
    """The depth of the top-L pass that serves ``names`` at ``ks``: max(ks), unless full ``map`` needs every
    positive's rank (None)."""
    return None if "map" in names else max(ks, default=1)


def summarize(ranking: Ranking, ks: Sequence[int], metrics: Sequence[str],
              all_excluded: str = "raise", means_only: bool = False) -> tuple[dict[str, Any], dict | None]:
    """Headline means, counts and tie sensitivity, plus the per-query arrays they came from.

    When every query is excluded (none has a positive it may retrieve) the metrics are undefined:
    ``all_excluded="raise"`` (the score stage) raises an InputError; ``"nan"`` (the Python API, where a
    training loop must not die on one odd batch) gives NaN for every metric with a ``RuntimeWarning``.
    ``means_only`` (what :func:`retrieval_metrics` returns): the means and counts alone, without tie
    sensitivity; for recall@K alone no per-query arrays either (None is returned for them): each mean is the
    number of first ranks below K, counted from the first ranks sorted, the same number.
    """
    n_in = int(np.count_nonzero(ranking.n_positives))  # queries with a positive (the counts are never negative)
    first = _first_ranks_if_cheap(ranking, ks, metrics, n_in) if means_only else None
    per = per_query(ranking, ks, metrics) if first is None else None
    if n_in == 0:
        why = (f"every one of the {ranking.n_positives.size} queries is excluded: none has a gallery "
               "item of its label that it may retrieve, so the metrics are undefined")
        if all_excluded == "raise":
            raise InputError(f"{why}. Put same-label images in the gallery.")
        warnings.warn(f"{why}; returning NaN. Put same-label items in the gallery.", RuntimeWarning, stacklevel=3)
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


def _first_ranks_if_cheap(ranking: Ranking, ks: Sequence[int], metrics: Sequence[str], n_in: int) -> np.ndarray | None:
    """For recall@K alone (whose values :func:`per_query` would accept), the first ranks of the ``n_in``
    included queries, in query order; None otherwise. A first-positive ranking holds exactly those (one entry
    per query with positives); else they are read from :attr:`Ranking.first_rank`."""
    if list(metrics) != ["recall"] or (ranking.cap is not None and max(ks) > ranking.cap):
        return None
    if not ranking.complete and ranking.ranks.size == n_in:
        return ranking.ranks
    return ranking.first_rank[ranking.n_positives > 0]


def retrieval_metrics(query_emb: np.ndarray, gallery_emb: np.ndarray, query_labels: Sequence[Any],
                      gallery_labels: Sequence[Any], ks: Iterable[int] = (1, 5, 10),
                      query_ids: Sequence[Any] | None = None, gallery_ids: Sequence[Any] | None = None,
                      metrics: Iterable[str] | None = None, *, exclude: Sequence[tuple[Any, Any]] = (),
                      max_memory_mb: float = 512, backend: str = "numpy") -> dict[str, float]:
    """The metric suite of exact cosine retrieval, as a flat dict.

    Parameters
    ----------
    query_emb : array-like of shape (n_queries, d)
    gallery_emb : array-like of shape (n_gallery, d)
        Any scale (rows are L2-normalised; a zero row has similarity 0 to
        everything). NaN or inf raises ValueError naming the rows.
    query_labels : sequence of length n_queries
    gallery_labels : sequence of length n_gallery
        Compared as strings, so ``1`` and ``"1"`` are the same label.
    ks : iterable of positive int, default (1, 5, 10)
    query_ids, gallery_ids : sequences, optional
        Both or neither. A gallery item with the query's own id is never retrieved nor a
        positive. Compared as strings, like the labels.
    metrics : iterable of str, optional
        Names from :data:`METRICS`; default all of them.
    exclude : sequence of (query values, gallery values), optional
        A gallery item that shares the query's value in any pair is not retrievable
        (e.g. the same camera); missing values (None, NaN, "") never match.
    max_memory_mb : float, default 512
        Bound on scratch memory; queries and gallery are scored in blocks under it.
    backend : {"numpy", "faiss"}, default "numpy"
        ``faiss`` ranks with ``faiss.IndexFlatIP`` and gives identical results.

    Returns
    -------
    dict
        For each name, in the order given: ``recall@K`` and ``precision@K`` per K,
        else the name itself (``r_precision``, ``map@r``, ``map``, ``mrr``); each
        the mean over queries with at least one positive. Formulas: module docstring.

    Notes
    -----
    Ties: equal similarities rank by gallery index, smaller first (see
    ``tie_sensitive@K`` in :func:`retrieval_summary` for how much that matters).
    K above :math:`M_q`: recall counts any positive, precision divides by :math:`M_q`.
    """
    ks, names = check_ks(ks), check_metrics(metrics)
    ranking = rank(query_emb, gallery_emb, query_labels, gallery_labels, query_ids, gallery_ids, names, exclude,
                   max_memory_mb, backend, cap=_recall_cap(names, ks), depth=top_depth(names, ks))
    summary, _ = summarize(ranking, ks, names, all_excluded="nan", means_only=True)
    return {key: summary[key] for key in metric_keys(names, ks)}


def retrieval_summary(query_emb: np.ndarray, gallery_emb: np.ndarray, query_labels: Sequence[Any],
                      gallery_labels: Sequence[Any], ks: Iterable[int] = (1, 5, 10),
                      query_ids: Sequence[Any] | None = None, gallery_ids: Sequence[Any] | None = None,
                      max_memory_mb: float = 512, metrics: Iterable[str] | None = ("recall",),
                      exclude: Sequence[tuple[Any, Any]] = (), backend: str = "numpy") -> dict[str, Any]:
    """:func:`retrieval_metrics` plus the counts the report needs.

    Adds ``num_queries`` (queries in the means), ``num_excluded_queries``,
    ``num_gallery``, ``embedding_dim`` and ``tie_sensitive@K`` (queries whose
    hit at K flips when exact ties are broken the other way).
    """
    ks, names = check_ks(ks), check_metrics(metrics)
    ranking = rank(query_emb, gallery_emb, query_labels, gallery_labels, query_ids, gallery_ids, names, exclude,
                   max_memory_mb, backend, cap=_recall_cap(names, ks), depth=top_depth(names, ks))
    summary, _ = summarize(ranking, ks, names, all_excluded="nan")
    g = as_array(gallery_emb)
    summary.update(num_gallery=int(g.shape[0]), embedding_dim=int(g.shape[1]))
    return summary


def recall_at_k(query_emb: np.ndarray, gallery_emb: np.ndarray, query_labels: Sequence[Any],
                gallery_labels: Sequence[Any], ks: Iterable[int] = (1, 5, 10),
                query_ids: Sequence[Any] | None = None, gallery_ids: Sequence[Any] | None = None,
                ) -> dict[str, float]:
    """Recall@K (hit rate) of cosine retrieval.

    .. math::

        \\mathrm{recall@}K = \\frac{1}{|Q'|} \\sum_{q \\in Q'}
            \\mathbb{1}[\\exists\\, g \\in \\mathrm{top}_K(q) : y_g = y_q]

    where :math:`Q'` is the set of queries that have at least one gallery item of
    their label other than themselves, and :math:`\\mathrm{top}_K(q)` holds the
    :math:`\\min(K, M_q)` most similar gallery items the query may retrieve
    (:math:`M_q` is the gallery size, minus one when the query's own image is in it).

    Parameters
    ----------
    query_emb : array-like of shape (n_queries, d)
    gallery_emb : array-like of shape (n_gallery, d)
    query_labels, gallery_labels : sequences of labels (compared as strings)
    ks : iterable of positive int, default (1, 5, 10)
    query_ids, gallery_ids : sequences, optional
        Both or neither: ids (compared as strings) that identify the same image in both sets
        (self-match exclusion).

    Returns
    -------
    dict
        ``{"recall@K": float}`` for each K, in the order of ``ks``.

    Notes
    -----
    Ties: equal similarities rank by gallery index (earlier first). A query never
    retrieves its own image, even when ``K >= n_gallery``.
    """
    return retrieval_metrics(query_emb, gallery_emb, query_labels, gallery_labels, ks, query_ids, gallery_ids,
                             metrics=["recall"])


def first_positive_ranks(query_emb: np.ndarray, gallery_emb: np.ndarray, query_labels: Sequence[Any],
                         gallery_labels: Sequence[Any], query_ids: Sequence[Any] | None = None,
                         gallery_ids: Sequence[Any] | None = None, max_memory_mb: float = 512,
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Where each query's first positive ranks, and how many positives it has.

    Returns
    -------
    (first_rank, n_positives) : two int64 arrays of shape (n_queries,)
        ``first_rank[i]``: the 0-based rank of query i's most similar positive (a gallery item of its
        label that it may retrieve) among the items it may retrieve, so ``first_rank[i] < K`` is a hit
        at K; ties rank by gallery index, smaller first; -1 when the query has no positive.
        ``n_positives[i]``: its number of positives (its own image, by ``query_ids``/``gallery_ids``,
        never counts); 0 exactly where ``first_rank`` is -1.
    """
    ranking = rank(query_emb, gallery_emb, query_labels, gallery_labels, query_ids, gallery_ids, ["recall"],
                   max_memory_mb=max_memory_mb)
    return ranking.first_rank, ranking.n_positives
