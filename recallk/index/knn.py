"""k-NN recall of an index's answers against the exact neighbours, under the two published definitions.

Both read distances ``1 - cosine`` (ann-benchmarks' ``angular``), from the exact similarities: the exact
neighbours' (``true_scores``, the score stage's ``neighbors.csv``) and those of the items the index returned
(re-computed exactly, as ann-benchmarks' runner does).

* :func:`ann_benchmarks_recall` (key suffix ``ann_benchmarks``): a returned item among the first ``k`` counts
  when its distance is within the exact ``k``-th distance plus ``epsilon = 1e-3``
  (``ann_benchmarks/plotting/metrics.py``: ``knn_threshold``, ``get_recall_values``).
* :func:`big_ann_benchmarks_recall` (key suffix ``big_ann_benchmarks``): the exact ids, grouped into tie groups
  (consecutive distances within ``1e-6`` of their group's first), the first ``k`` groups kept; a returned id
  among the first ``k`` counts when it is in that set (``benchmark/plotting/metrics.py``:
  ``compute_recall_with_distance_ties``). Ties beyond the exact table's depth are not seen, as there.

Each returns one value per query, the count divided by ``k``; the tests hold the reference functions, ported.
"""

from __future__ import annotations

import numpy as np

#: ann-benchmarks' default tolerance of ``knn_threshold``.
ANN_EPSILON = 1e-3
#: big-ann-benchmarks' tie tolerance of ``compute_recall_with_distance_ties``.
TIE_TOLERANCE = 1e-6


def ann_benchmarks_recall(true_scores: np.ndarray, run_scores: np.ndarray, k: int,
                          epsilon: float = ANN_EPSILON) -> np.ndarray:
    """Per query, ``#{j < k : d_run[j] <= d_true[k-1] + epsilon} / k`` with ``d = 1 - cosine``.

    Parameters
    ----------
    true_scores : ndarray (n, >= k)
        The exact neighbours' cosines, best first.
    run_scores : ndarray (n, >= k)
        The exact cosines of the items the index returned, in its order (NaN: nothing returned there).
    k : int
        The ``count``.

    Returns
    -------
    ndarray (n,) float64. A query with fewer than ``k`` exact neighbours (NaN at ``k-1``) gets NaN.
    """
    threshold = (1.0 - true_scores[:, k - 1].astype(np.float64)) + epsilon
    distances = 1.0 - run_scores[:, :k].astype(np.float64)
    within = np.count_nonzero(distances <= threshold[:, None], axis=1)  # NaN compares False: not counted
    return np.where(np.isnan(threshold), np.nan, within / float(k))


def tie_groups(true_scores: np.ndarray) -> np.ndarray:
    """(n, depth) each exact neighbour's tie group, 0-based: a new group starts where the distance is
    ``TIE_TOLERANCE`` or more from the current group's first distance (big-ann-benchmarks' chaining)."""
    distances = 1.0 - true_scores.astype(np.float64)
    groups = np.zeros(distances.shape, dtype=np.int64)
    head = distances[:, 0].copy()
    for j in range(1, distances.shape[1]):  # depth steps (max(ks)), each over every query
        new = ~(np.abs(distances[:, j] - head) < TIE_TOLERANCE)
        head = np.where(new, distances[:, j], head)
        groups[:, j] = groups[:, j - 1] + new
    return groups


def big_ann_benchmarks_recall(true_ids: np.ndarray, true_scores: np.ndarray, run_ids: np.ndarray,
                              k: int) -> tuple[np.ndarray, int]:
    """Per query, ``|{exact ids in the first k tie groups} & {first k returned ids}| / k``, and the number of
    queries whose first ``k`` groups hold a tie.

    Parameters
    ----------
    true_ids : ndarray (n, depth) int
        The exact neighbours' gallery indices, best first (-1: none).
    true_scores : ndarray (n, depth)
        Their cosines (NaN where -1).
    run_ids : ndarray (n, >= k) int
        The index's returned gallery indices in its order (-1: none).
    k : int
        The ``count``.
    """
    groups = tie_groups(true_scores)
    kept = (groups < k) & (true_ids >= 0)
    n_groups = np.where(kept, groups + 1, 0).max(axis=1, initial=0)
    tied = np.count_nonzero(kept, axis=1) > n_groups  # some kept group holds more than one id
    run = run_ids[:, :k]
    n = true_ids.shape[0]
    found = np.zeros(n, dtype=np.int64)
    for j in range(run.shape[1]):  # k columns: is the j-th returned id among the query's kept exact ids?
        hit = (true_ids == run[:, j:j + 1]) & kept & (run[:, j:j + 1] >= 0)
        dup = (run[:, :j] == run[:, j:j + 1]).any(axis=1)  # a set: a repeated id counts once
        found += hit.any(axis=1) & ~dup
    return found / float(k), int(np.count_nonzero(tied))
