"""k-NN recall of an index's answers against the exact neighbours, under the two published definitions.

Both read distances ``1 - cosine`` (ann-benchmarks' ``angular``), from the exact similarities: the exact
neighbours' (``true_scores``, the score stage's ``neighbors.csv``) and those of the items the index returned
(re-computed exactly, as ann-benchmarks' runner does).

* :func:`ann_benchmarks_recall` (key suffix ``ann_benchmarks``): a returned item among the first ``k`` counts
  when its distance is within the exact ``k``-th distance plus ``epsilon = 1e-3``
  (``ann_benchmarks/plotting/metrics.py``: ``knn_threshold``, ``get_recall_values``).
* :func:`big_ann_benchmarks_recall` (key suffix ``big_ann_benchmarks``): the first ``k`` exact ids, and past
  position ``k`` every further exact id whose distance is within ``1e-6`` of the ``k``-th distance (stopping at
  the first that is not); a returned id among the first ``k`` counts when it is in that set
  (``benchmark/plotting/metrics.py``: ``compute_recall_with_distance_ties`` as merged, PR #74). The exact table
  (the score stage's ``neighbors.csv``) runs past ``max(ks)`` while a distance is tied there, as big-ann's
  ground truth runs deeper than ``k``.

Each returns one value per query, the count divided by ``k``; the tests hold the reference functions, ported.
"""

from __future__ import annotations

import numpy as np

from recallk.score.tables import tie_end

#: ann-benchmarks' default tolerance of ``knn_threshold``.
ANN_EPSILON = 1e-3


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


def big_ann_benchmarks_recall(true_ids: np.ndarray, true_distances: np.ndarray, run_ids: np.ndarray,
                              k: int) -> tuple[np.ndarray, int]:
    """Per query, ``|{exact ids to the tie end} & {first k returned ids}| / k``, and the
    number of queries whose tie runs past position ``k``.

    Parameters
    ----------
    true_ids : ndarray (n, depth >= k) int
        The exact neighbours' gallery indices, best first (-1: none); past position ``k`` they count up to
        :func:`recallk.score.tables.tie_end` (each next one within ``1e-6`` of the ``k``-th distance).
    true_distances : ndarray (n, depth)
        Their distances, ascending (here ``1 - cosine``, in float64; NaN where -1), as big-ann's
        ``true_dists``: the tie test reads them as given.
    run_ids : ndarray (n, >= k) int
        The index's returned gallery indices in its order (-1: none).
    k : int
        The ``count``.

    Returns
    -------
    (ndarray (n,) float64, int)
    """
    end = tie_end(true_distances, k)
    kept = (np.arange(true_ids.shape[1]) < end[:, None]) & (true_ids >= 0)
    run = run_ids[:, :k]
    found = np.zeros(true_ids.shape[0], dtype=np.int64)
    for j in range(run.shape[1]):  # k columns: is the j-th returned id among the query's kept exact ids?
        hit = (true_ids == run[:, j:j + 1]) & kept & (run[:, j:j + 1] >= 0)
        dup = (run[:, :j] == run[:, j:j + 1]).any(axis=1)  # a set: a repeated id counts once
        found += hit.any(axis=1) & ~dup
    return found / float(k), int(np.count_nonzero(end > k))
