"""From an index's answers to ranked lists under the exact engine's rules, and every label metric from them.

An index answers each query with up to ``k`` gallery rows and its own scores. :func:`ranked_lists` drops what
the exact engine never retrieves (the query's own image, an item sharing an ``exclude`` value, the ``-1`` an
index pads with), orders the rest by the index's score, ties by gallery row (smaller first, the exact engine's
tie rule), and keeps the first ``depth``. :func:`label_values` computes the metrics of
:mod:`recallk.score.registry` from those lists with the registry's own functions: a positive the list does not
hold counts as not retrieved (recall@K a miss, its precision term 0, its AP term 0, and a query whose list holds
no positive has reciprocal rank 0), so with lists as deep as the ranking (``depth`` = the gallery) the values
are the exact engine's whenever the lists are.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from recallk.score.passes import Ranks
from recallk.score.registry import Span, rows

#: The first rank of a query whose list holds no positive: beyond every K.
NOT_LISTED = np.iinfo(np.int64).max // 4


def exclusion_bound(own: np.ndarray, codes: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """(n,) an upper bound on the gallery rows each query may not retrieve: its own image (``own >= 0``) plus,
    per exclusion pair of codes (query codes, gallery codes; -1 missing), the gallery rows sharing its value."""
    bound = (own >= 0).astype(np.int64)
    for qc, gc in codes:
        sizes = np.bincount(gc[gc >= 0], minlength=int(max(qc.max(initial=-1), gc.max(initial=-1))) + 1)
        bound += np.where(qc >= 0, sizes[np.maximum(qc, 0)], 0)
    return bound


def list_order(ids: np.ndarray, scores: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """(n, k) each row's answer columns by (-score, gallery row), the dropped (``~keep``) last.

    float32 scores (every index's) sort as one uint64 key per item, the score's order-preserving bits above
    the row: one sort instead of two, the same order (-0.0 counts as 0.0, as it compares). Other scores, or a
    NaN score kept, sort by ``np.lexsort`` of the two keys.
    """
    if scores.dtype == np.float32 and ids.size and int(ids.max()) < 2**32 and not np.isnan(scores[keep]).any():
        bits = (scores + np.float32(0.0)).view(np.uint32)  # + 0.0: -0.0 -> 0.0
        rising = bits ^ np.where(bits >> 31, np.uint32(0xFFFFFFFF), np.uint32(0x80000000))  # ascending with s
        key = ((~rising).astype(np.uint64) << np.uint64(32)) | np.maximum(ids, 0).astype(np.uint64)
        key[~keep] = np.iinfo(np.uint64).max
        return np.argsort(key, axis=-1)
    by_score = np.where(keep, -scores.astype(np.float64), np.inf)  # what is dropped sorts last
    return np.lexsort((np.where(keep, ids, np.iinfo(np.int64).max), by_score), axis=-1)


def ranked_lists(ids: np.ndarray, scores: np.ndarray, own: np.ndarray,
                 codes: Sequence[tuple[np.ndarray, np.ndarray]], depth: int,
                 values: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each query's ranked list from an index's answer.

    Parameters
    ----------
    ids : ndarray (n, k) int
        The gallery rows the index returned (-1: none).
    scores : ndarray (n, k)
        The index's similarity for each (larger is better).
    own : ndarray (n,) int
        The query's own gallery row, or -1.
    codes : sequence of (query codes (n,), gallery codes (m,))
        One pair per exclusion column (-1: missing, never matches).
    depth : int
        How many items a list keeps.
    values : ndarray (n, k), optional
        What the second array returns, in the lists' order (default: ``scores``); the index stage passes the
        exact cosines of the answers.

    Returns
    -------
    (columns, values)
        int64 ``(n, depth)`` gallery rows by (-score, row), -1 where the list came up short; their ``values``
        as float32 (NaN there).
    """
    keep = (ids >= 0) & (ids != own[:, None])
    safe = np.maximum(ids, 0)
    for qc, gc in codes:
        keep &= ~((qc[:, None] >= 0) & (gc[safe] == qc[:, None]))
    order = list_order(ids, scores, keep)[:, :depth]
    kept = np.take_along_axis(keep, order, axis=1)
    out = np.where(kept, np.take_along_axis(ids, order, axis=1), -1).astype(np.int64, copy=False)
    values = scores if values is None else values
    out_scores = np.where(kept, np.take_along_axis(values, order, axis=1), np.nan).astype(np.float32)
    if out.shape[1] < depth:  # the index was asked for fewer than depth items (a small gallery)
        pad = depth - out.shape[1]
        out = np.pad(out, ((0, 0), (0, pad)), constant_values=-1)
        out_scores = np.pad(out_scores, ((0, 0), (0, pad)), constant_values=np.nan)
    return out, out_scores


def short_lists(columns: np.ndarray, n_retrievable: np.ndarray) -> int:
    """Queries whose list holds fewer than ``min(depth, M)`` items (``M``: the items the query may retrieve)."""
    listed = np.count_nonzero(columns >= 0, axis=1)
    return int(np.count_nonzero(listed < np.minimum(columns.shape[1], n_retrievable)))


def label_values(columns: np.ndarray, query_codes: np.ndarray, gallery_codes: np.ndarray,
                 n_positives: np.ndarray, n_retrievable: np.ndarray, metrics: Sequence[str],
                 ks: Sequence[int]) -> dict[str, np.ndarray]:
    """Per-query values of ``metrics`` at ``ks`` (keys of :func:`recallk.score.registry.metric_keys`) from the
    ranked lists ``columns`` (:func:`ranked_lists`).

    Parameters
    ----------
    columns : ndarray (n, depth) int
        Each query's list (-1 pads).
    query_codes, gallery_codes : ndarray
        Label codes (one code space): a listed item of the query's code is a positive.
    n_positives, n_retrievable : ndarray (n,)
        :math:`R` and :math:`M` of each query under the exact engine's rules (the score stage's per-query
        table): the divisors; NaN for a query with :math:`R = 0`.

    Formulas: :mod:`recallk.score.registry` with :math:`r_j` the 1-based places of the listed positives; a
    positive not listed adds nothing, and a query with none listed has reciprocal rank 0.
    """
    hit = (columns >= 0) & (gallery_codes[np.maximum(columns, 0)] == query_codes[:, None])
    line, place = np.nonzero(hit)  # row-major: each query's positives in place order
    listed = np.bincount(line, minlength=columns.shape[0])
    first = np.full(columns.shape[0], NOT_LISTED, dtype=np.int64)
    first[line[::-1]] = place[::-1]  # the last write per query is its smallest place
    R = np.asarray(n_positives, dtype=np.int64)
    span = Span(np.where(R > 0, first, -1), R, np.asarray(n_retrievable, dtype=np.int64), listed,
                place.astype(np.int64))
    included = R > 0
    out: dict[str, np.ndarray] = {}
    for metric in rows(metrics):
        if metric.per_k:
            for k, key in zip(ks, metric.keys(ks)):
                out[key] = np.where(included, metric.compute(span, k), np.nan)
        else:
            value = metric.compute(span)
            if metric.name == "mrr":
                value = np.where(listed > 0, value, 0.0)
            out[metric.name] = np.where(included, value, np.nan)
    return out


def undetermined(columns: np.ndarray, query_codes: np.ndarray, gallery_codes: np.ndarray, n_positives: np.ndarray,
                 n_retrievable: np.ndarray, exhausted: np.ndarray, metrics: Sequence[str],
                 ks: Sequence[int]) -> list[str]:
    """The metric keys the lists ``columns`` cannot give exactly for some query with a positive: each is what a
    deeper list of the same index could change, so it is not reported (issue 39).

    A query's list is complete when it holds every item the query may retrieve (``n_retrievable``) or the index
    had nothing more to return (``exhausted``: fewer answers than asked). Otherwise, with ``d`` the depth and
    ``R`` the positives, by the ranks a metric reads (:class:`recallk.score.registry.Ranks`): the first positive's
    (recall@K: ``K <= d`` or a listed positive; mrr: a listed positive), the top K or R (precision@K: ``K <= d``;
    r_precision, map@r: ``R <= d``), every positive's (map: every positive listed).

    Parameters
    ----------
    columns : ndarray (n, d) int
        Each query's list (:func:`ranked_lists`; -1 pads).
    query_codes, gallery_codes : ndarray
        Label codes (one code space).
    n_positives, n_retrievable : ndarray (n,)
        ``R`` and ``M`` of each query under the exact engine's rules.
    exhausted : ndarray (n,) bool
        The index returned fewer items than asked for the query.
    metrics, ks : sequence
        As :func:`label_values`.

    Returns
    -------
    list of str
        Keys of :func:`recallk.score.registry.metric_keys`, in its order.
    """
    depth = columns.shape[1]
    hit = (columns >= 0) & (gallery_codes[np.maximum(columns, 0)] == query_codes[:, None])
    listed_positives = np.count_nonzero(hit, axis=1)
    R = np.asarray(n_positives, dtype=np.int64)
    complete = exhausted | (np.count_nonzero(columns >= 0, axis=1) >= np.asarray(n_retrievable))
    open_ = (R > 0) & ~complete
    out = []
    for metric in rows(metrics):
        for k, key in zip(ks, metric.keys(ks)) if metric.per_k else [(None, metric.name)]:
            beyond = (k if k is not None else R) > depth  # the top ranks it reads: K, or R
            if metric.ranks is Ranks.FIRST:  # the first positive: known once one is listed
                missing = (beyond if k is not None else True) & (listed_positives == 0)
            elif metric.ranks is Ranks.TOP:
                missing = beyond
            else:  # every positive's rank
                missing = listed_positives < R
            if np.any(open_ & missing):
                out.append(key)
    return out
