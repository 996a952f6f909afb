"""Retrieval metrics from exact ranks: ``retrieval_metrics``, ``recall_at_k`` and friends, and :class:`Scorer`.

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

Each reported value is the mean over the included queries (:func:`recallk.stats.mean`:
summed with ``math.fsum``, so the order of the queries never changes a bit). Each metric is one function
and one row of the registry (:mod:`recallk.score.registry`).

The public functions share one signature shape (scikit-learn's): the four data arrays positional,
everything else keyword-only, with the same names in the same order everywhere: ``query_ids``,
``gallery_ids``, ``exclude`` (which items a query may retrieve), then ``ks``, ``metrics`` (what is
measured), then ``max_memory_mb``, ``backend`` (how). Each builds a :class:`Scorer`, whose settings are
checked once; a training loop keeps one and calls it on every batch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Sequence

import numpy as np

from recallk.checks import as_list
from recallk.errors import InputError
from recallk.score.passes import Pass
from recallk.score.ranking import Ranking, rank_data
from recallk.score.registry import METRICS, keys_and_pass, metric_keys, serving_pass
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import ScoreSettings
from recallk.score.values import per_query, summarize
from recallk.settings.base import as_params, checked, from_mapping, with_values

__all__ = ["METRICS", "Scorer", "first_positive_ranks", "metric_keys", "per_query", "rank", "recall_at_k",
           "retrieval_metrics", "retrieval_summary", "summarize"]

#: Metric names accepted by ``metrics=`` / ``score.metrics``; recall and precision expand to one key per K.


def rank(data: RetrievalData, settings: ScoreSettings, ranks: Pass | None = None,
         tensors: tuple | None = None) -> Ranking:
    """Rank ``data`` with the backend (``numpy`` or ``torch``) and engine of ``settings``, which the caller
    checked (the score stage's params schema, :class:`Scorer`: both through :func:`recallk.settings.base.checked`).

    ``tensors``: ``backend="torch"`` only, the caller's (query, gallery) tensors as they are (on a GPU, say),
    ``data`` then holding stand-ins of their shape (:func:`~recallk.score.ranking.torch_api.torch_data`).

    ``ranks``: the pass (:class:`~recallk.score.passes.Pass`); None: the cheapest uncapped pass that serves
    ``settings.metrics`` at its ``ks`` (:func:`~recallk.score.registry.serving_pass`), what the score stage
    needs (its tables read first ranks beyond ``max(ks)``). ``settings.engine == "ray"``: the numpy engine's
    tiles run on Ray tasks (:mod:`recallk.score.ranking.ray_tiles`, ``settings.ray``), with the same result.
    """
    ranks = serving_pass(settings.metrics, settings.depth) if ranks is None else ranks
    if settings.backend == "torch":
        from recallk.score.ranking.torch_api import rank_torch

        return rank_torch(data, settings, ranks, tensors)
    count_tiles = None
    if settings.engine == "ray":
        from recallk.score.ranking.ray_tiles import RayTiles

        count_tiles = RayTiles(address=settings.ray.address, num_cpus=settings.ray.num_cpus)
    return rank_data(data, ranks, settings.max_memory_mb, count_tiles)


def score_settings(settings: ScoreSettings | None = None, **given: Any) -> ScoreSettings:
    """``settings`` (default ``ScoreSettings()``) with each argument of ``given`` that is not None in place of the
    field of its name, checked by the params check's own route (:func:`recallk.settings.base.checked`: every
    field's rule, then the rules across fields, :meth:`ScoreSettings.problem`); an
    :class:`~recallk.errors.InputError` names each problem like the argument (``"`ks` must be positive integers.
    Got [0, 5] instead."``). Iterables (a tuple, an array, a generator) are taken as lists.

    Without ``settings`` only the given arguments are checked (:func:`~recallk.settings.base.with_values`: the
    defaults meet every rule), with the same result and sentences: a training loop's call pays for its few
    arguments, not for the whole section's check (0.1 ms, as long as plain numpy's whole evaluation of a batch)."""
    given = {name: as_list(value) if name in ("ks", "metrics") else value
             for name, value in given.items() if value is not None}
    errors: list[str] = []
    if settings is None:
        out = with_values(_DEFAULTS, given, errors)
        if errors:
            raise InputError(" ".join(errors))
        return out if all(type(k) is int for k in out.ks) else replace(out, ks=tuple(int(k) for k in out.ks))
    values = as_params(settings)
    defaults = as_params(_DEFAULTS)
    values.update({name: defaults[name] for name in ("ks", "metrics") if values[name] is None})  # None: the default
    values.update(given)
    values = checked(ScoreSettings, values, "", errors)
    if errors:
        raise InputError(" ".join(errors))
    values["ks"] = [int(k) for k in values["ks"]]
    return from_mapping(ScoreSettings, values)


#: The ``score`` section's defaults, which meet every rule.
_DEFAULTS = ScoreSettings()


class Scorer:
    """Retrieval metrics with the settings given once, for training loops (the shape of
    pytorch-metric-learning's ``AccuracyCalculator``)::

        scorer = Scorer(ks=(1, 5), metrics=["recall", "map@r"])  # checked here, once
        for epoch in range(epochs):
            ...
            print(scorer(query_emb, gallery_emb, query_labels, gallery_labels))

    Parameters
    ----------
    settings : ScoreSettings, optional
        What to measure and how (``ks``, ``metrics``, ``max_memory_mb``, ``backend``, ``engine``, ``ray``;
        the rest of the ``score`` section plays no part here); default ``ScoreSettings()``.
    ks, metrics, max_memory_mb, backend, device : optional
        Override the field of ``settings`` of that name (as for :func:`retrieval_metrics`); None keeps the
        settings' value. The whole is checked once, by the params check's route (:func:`score_settings`).

    Raises
    ------
    InputError
        A setting that breaks its rule, named like the argument (``"`ks` must be positive integers. Got
        [0, 5] instead."``).

    Attributes
    ----------
    settings : ScoreSettings
        The checked settings (``ks`` and ``metrics`` as tuples).
    keys : list of str
        The keys of the dict a call returns, in report order.
    ranks : Pass
        The engine pass every call takes: the cheapest that serves the metrics (first ranks capped at
        ``max(ks)`` when no metric reads them exactly).
    """

    def __init__(self, settings: ScoreSettings | None = None, *, ks: Iterable[int] | None = None,
                 metrics: Iterable[str] | None = None, max_memory_mb: float | None = None,
                 backend: str | None = None, device: str | None = None) -> None:
        self.settings = score_settings(settings, ks=ks, metrics=metrics, max_memory_mb=max_memory_mb,
                                       backend=backend, device=device)
        self.keys, self.ranks = keys_and_pass(self.settings.metrics, self.settings.ks)

    def __repr__(self) -> str:
        return f"Scorer({self.settings!r})"

    def rank(self, query_emb: Any, gallery_emb: Any, query_labels: Sequence[Any], gallery_labels: Sequence[Any], *,
             query_ids: Sequence[Any] | None = None, gallery_ids: Sequence[Any] | None = None,
             exclude: Sequence[tuple[Any, Any]] = (), ranks: Pass | None = None) -> tuple[RetrievalData, Ranking]:
        """The checked data (:class:`RetrievalData`) and its ranking by :attr:`ranks`, or by
        ``ranks`` when given (``backend="torch"``: tensors on a GPU are ranked there, with no copy to the host,
        :func:`~recallk.score.ranking.torch_api.torch_data`)."""
        tensors = None
        if self.settings.backend == "torch":
            from recallk.score.ranking.torch_api import torch_data

            data, tensors = torch_data(query_emb, gallery_emb, query_labels, gallery_labels, query_ids=query_ids,
                                       gallery_ids=gallery_ids, exclude=exclude)
        else:
            data = RetrievalData(query_emb, gallery_emb, query_labels, gallery_labels, query_ids=query_ids,
                                 gallery_ids=gallery_ids, exclude=exclude)
        return data, rank(data, self.settings, self.ranks if ranks is None else ranks, tensors)

    def __call__(self, query_emb: Any, gallery_emb: Any, query_labels: Sequence[Any],
                 gallery_labels: Sequence[Any], *, query_ids: Sequence[Any] | None = None,
                 gallery_ids: Sequence[Any] | None = None, exclude: Sequence[tuple[Any, Any]] = ()) -> dict[str, float]:
        """The metrics of one query set against one gallery: :func:`retrieval_metrics` (see it for the
        arguments and the result) with these settings."""
        _, ranking = self.rank(query_emb, gallery_emb, query_labels, gallery_labels, query_ids=query_ids,
                               gallery_ids=gallery_ids, exclude=exclude)
        summary, _ = summarize(ranking, self.settings, all_excluded="nan", means_only=True)
        return {key: summary[key] for key in self.keys}

    def summary(self, query_emb: Any, gallery_emb: Any, query_labels: Sequence[Any], gallery_labels: Sequence[Any],
                *, query_ids: Sequence[Any] | None = None, gallery_ids: Sequence[Any] | None = None,
                exclude: Sequence[tuple[Any, Any]] = ()) -> dict[str, Any]:
        """:func:`retrieval_summary` with these settings: the metrics plus the counts the report needs."""
        data, ranking = self.rank(query_emb, gallery_emb, query_labels, gallery_labels, query_ids=query_ids,
                                  gallery_ids=gallery_ids, exclude=exclude)
        summary, _ = summarize(ranking, self.settings, all_excluded="nan")
        summary.update(num_gallery=int(data.n_gallery), embedding_dim=int(data.gallery_emb.shape[1]))
        return summary


def retrieval_metrics(query_emb: np.ndarray, gallery_emb: np.ndarray, query_labels: Sequence[Any],
                      gallery_labels: Sequence[Any], *, query_ids: Sequence[Any] | None = None,
                      gallery_ids: Sequence[Any] | None = None, exclude: Sequence[tuple[Any, Any]] = (),
                      ks: Iterable[int] | None = None, metrics: Iterable[str] | None = None,
                      max_memory_mb: float | None = None, backend: str | None = None,
                      device: str | None = None) -> dict[str, float]:
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
    query_ids, gallery_ids : sequences, optional
        Both or neither. A gallery item with the query's own id is never retrieved nor a
        positive. Compared as strings, like the labels.
    exclude : sequence of (query values, gallery values), optional
        A gallery item that shares the query's value in any pair is not retrievable
        (e.g. the same camera); missing values (None, NaN, "") never match. A pair of 2-D
        arrays excludes on every column at once (re-ID: person and camera);
        :func:`recallk.score.exclusion.junk_pair` hides items from every query.
    ks : iterable of positive int, optional
        Default: ``ScoreSettings().ks`` (1, 5, 10). Every argument below left None takes the default of the
        ``score`` param of its name (:class:`~recallk.score.settings.ScoreSettings`, docs/params.md).
    metrics : iterable of str, optional
        Names from :data:`METRICS`; default all of them.
    max_memory_mb : float, optional
        Bound on scratch memory (default 512); queries and gallery are scored in blocks under it.
    backend : {"numpy", "torch"}, optional
        Default ``numpy``; ``torch`` multiplies on ``device`` (torch tensors taken as they are, on a GPU too)
        and gives identical results.
    device : {"auto", "cpu", "cuda"}, optional
        ``backend="torch"`` only (``score.device``): ``auto`` (the default) ranks where the tensors are, else
        on CUDA when torch sees a GPU, else on the CPU.

    Returns
    -------
    dict
        For each name, in the order given: ``recall@K`` and ``precision@K`` per K,
        else the name itself (``r_precision``, ``map@r``, ``map``, ``mrr``); each
        the mean over queries with at least one positive. Formulas: module docstring.

    See Also
    --------
    Scorer : the same, with the settings given once (training loops).

    Notes
    -----
    Ties: equal similarities rank by gallery index, smaller first (see
    ``tie_sensitive@K`` in :func:`retrieval_summary` for how much that matters).
    K above :math:`M_q`: recall counts any positive, precision divides by :math:`M_q`.
    """
    scorer = Scorer(ks=ks, metrics=metrics, max_memory_mb=max_memory_mb, backend=backend, device=device)
    return scorer(query_emb, gallery_emb, query_labels, gallery_labels, query_ids=query_ids,
                  gallery_ids=gallery_ids, exclude=exclude)



def retrieval_summary(query_emb: np.ndarray, gallery_emb: np.ndarray, query_labels: Sequence[Any],
                      gallery_labels: Sequence[Any], *, query_ids: Sequence[Any] | None = None,
                      gallery_ids: Sequence[Any] | None = None, exclude: Sequence[tuple[Any, Any]] = (),
                      ks: Iterable[int] | None = None, metrics: Iterable[str] | None = ("recall",),
                      max_memory_mb: float | None = None, backend: str | None = None,
                      device: str | None = None) -> dict[str, Any]:
    """:func:`retrieval_metrics` plus the counts the report needs (``metrics`` default: recall alone).

    Adds ``num_queries`` (queries in the means), ``num_excluded_queries``,
    ``num_gallery``, ``embedding_dim`` and ``tie_sensitive@K`` (queries whose
    hit at K flips when exact ties are broken the other way).
    """
    scorer = Scorer(ks=ks, metrics=metrics, max_memory_mb=max_memory_mb, backend=backend, device=device)
    return scorer.summary(query_emb, gallery_emb, query_labels, gallery_labels, query_ids=query_ids,
                          gallery_ids=gallery_ids, exclude=exclude)


def recall_at_k(query_emb: np.ndarray, gallery_emb: np.ndarray, query_labels: Sequence[Any],
                gallery_labels: Sequence[Any], *, query_ids: Sequence[Any] | None = None,
                gallery_ids: Sequence[Any] | None = None, exclude: Sequence[tuple[Any, Any]] = (),
                ks: Iterable[int] | None = None, max_memory_mb: float | None = None,
                backend: str | None = None, device: str | None = None) -> dict[str, float]:
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
    query_ids, gallery_ids : sequences, optional
        Both or neither: ids (compared as strings) that identify the same image in both sets
        (self-match exclusion).
    exclude, ks, max_memory_mb, backend, device
        As for :func:`retrieval_metrics` (``backend="torch"``: torch tensors are taken as they are, on their
        device).

    Returns
    -------
    dict
        ``{"recall@K": float}`` for each K, in the order of ``ks``.

    Notes
    -----
    Ties: equal similarities rank by gallery index (earlier first). A query never
    retrieves its own image, even when ``K >= n_gallery``.
    """
    return retrieval_metrics(query_emb, gallery_emb, query_labels, gallery_labels, query_ids=query_ids,
                             gallery_ids=gallery_ids, exclude=exclude, ks=ks, metrics=["recall"],
                             max_memory_mb=max_memory_mb, backend=backend, device=device)


def first_positive_ranks(query_emb: np.ndarray, gallery_emb: np.ndarray, query_labels: Sequence[Any],
                         gallery_labels: Sequence[Any], *, query_ids: Sequence[Any] | None = None,
                         gallery_ids: Sequence[Any] | None = None, exclude: Sequence[tuple[Any, Any]] = (),
                         max_memory_mb: float | None = None, backend: str | None = None,
                         device: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Where each query's first positive ranks, and how many positives it has.

    Parameters
    ----------
    query_emb, gallery_emb, query_labels, gallery_labels, query_ids, gallery_ids, exclude
        As for :func:`retrieval_metrics`.
    max_memory_mb, backend, device
        As for :func:`retrieval_metrics` (``backend="torch"``: torch tensors are taken as they are, on their
        device; the arrays come back on the host).

    Returns
    -------
    (first_rank, n_positives) : two int64 arrays of shape (n_queries,)
        ``first_rank[i]``: the 0-based rank of query i's most similar positive (a gallery item of its
        label that it may retrieve) among the items it may retrieve, so ``first_rank[i] < K`` is a hit
        at K; ties rank by gallery index, smaller first; -1 when the query has no positive.
        ``n_positives[i]``: its number of positives (its own image, by ``query_ids``/``gallery_ids``,
        never counts); 0 exactly where ``first_rank`` is -1.
    """
    scorer = Scorer(metrics=("recall",), max_memory_mb=max_memory_mb, backend=backend, device=device)
    _, ranking = scorer.rank(query_emb, gallery_emb, query_labels, gallery_labels, query_ids=query_ids,
                             gallery_ids=gallery_ids, exclude=exclude, ranks=Pass.first())  # exact first ranks: no cap
    return ranking.first_rank, ranking.n_positives
