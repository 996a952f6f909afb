"""Bootstrap resampling shared by the score stage's intervals and ``recallk compare``.

One seeded stream of resample indices (``numpy.random.default_rng(seed)``) serves
every metric, drawn in chunks so the scratch stays bounded at any number of queries.
Resampling is by query, or by cluster (``groups``: every query of a label together).
"""

from __future__ import annotations

import numpy as np

#: Resampled indices drawn at a time (bounds the scratch to ~32 MB per metric).
CELLS = 4_000_000


def unit_sums(values: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per cluster: the sum of its values and its number of queries; and each query's cluster."""
    _, inverse = np.unique(np.asarray(groups).astype(str), return_inverse=True)
    return np.bincount(inverse, weights=values), np.bincount(inverse).astype(np.float64), inverse


def content_order(content: np.ndarray, image_ids: np.ndarray) -> np.ndarray:
    """The order resamples draw queries in: by file content (sha256), then image_id (embeddings-only
    catalogs have no content, so their order is the ids'). Catalog order follows file names, so without
    this, renaming files would move every bootstrap bound; with it, only the content decides."""
    return np.lexsort((np.asarray(image_ids, dtype=str), np.asarray(content, dtype=str)))


def bootstrap_means(values: dict[str, np.ndarray], resamples: int, seed: int,
                    groups: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The mean of each of ``resamples`` bootstrap resamples of every array in ``values``.

    Parameters
    ----------
    values : dict of 1-D float arrays of one length n (no NaN)
    resamples, seed : int
        The same resample indices serve every key.
    groups : array of length n, optional
        Resample clusters (e.g. labels) instead of queries: a resample draws ``n_clusters``
        clusters with replacement and its mean is the sum of their values over the number
        of their queries.

    Returns
    -------
    dict of arrays of shape (resamples,)
        Each mean kept within the range of the values it came from (so a constant metric's
        resamples are that constant exactly).
    """
    arrays = {key: np.asarray(v, dtype=np.float64) for key, v in values.items()}
    n = len(next(iter(arrays.values())))
    if groups is None:
        units, sizes, sums = n, None, arrays
    else:
        parts = {key: unit_sums(v, groups) for key, v in arrays.items()}
        sums = {key: p[0] for key, p in parts.items()}
        sizes = next(iter(parts.values()))[1]
        units = sizes.size
    rng = np.random.default_rng(seed)
    means = {key: np.empty(resamples) for key in arrays}
    step = max(1, CELLS // max(units, 1))
    for start in range(0, resamples, step):
        idx = rng.integers(0, units, size=(min(step, resamples - start), units))
        out = slice(start, start + idx.shape[0])
        for key, v in arrays.items():
            if sizes is None:  # by query: each resample's mean within that resample's range
                sample = v[idx]
                np.clip(sample.mean(axis=1), sample.min(axis=1), sample.max(axis=1), out=means[key][out])
            else:
                np.clip(sums[key][idx].sum(axis=1) / sizes[idx].sum(axis=1), v.min(), v.max(), out=means[key][out])
    return means


def percentile_interval(means: np.ndarray, confidence: float) -> tuple[float, float]:
    """The percentile bootstrap interval of level ``confidence`` from resample means."""
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)
