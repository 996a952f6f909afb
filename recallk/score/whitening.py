"""PCA whitening of embeddings, fitted on the train split only (``score.whiten: pca``)."""

from __future__ import annotations

import numpy as np

from recallk.errors import InputError
from recallk.score.similarity import l2_normalize


def pca_whitening(train: np.ndarray, *sets: np.ndarray) -> list[np.ndarray]:
    """Fit PCA whitening on ``train`` only and apply it to each of ``sets``.

    Rows are L2-normalised first; the fit centres them on the train mean and
    scales each principal axis to unit variance (scikit-learn ``PCA(whiten=True)``,
    full SVD, so deterministic). Axes with no train variance are dropped. The
    eval embeddings never enter the fit.

    Parameters
    ----------
    train : array of shape (n_train, d), n_train >= 2
    *sets : arrays of shape (n, d)

    Returns
    -------
    list of float32 arrays of shape (n, d') with d' <= min(n_train - 1, d)
    """
    from sklearn.decomposition import PCA

    unit = l2_normalize(train).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):  # no variance at all: reported below, not warned
        pca = PCA(whiten=True, svd_solver="full").fit(unit)
    var = pca.explained_variance_
    keep = int(np.count_nonzero(var > var.max(initial=0.0) * 1e-10)) if var.size else 0
    if keep == 0:
        raise InputError("the train embeddings have no variance (all identical); whitening is undefined.")
    pca = PCA(n_components=keep, whiten=True, svd_solver="full").fit(unit)
    return [pca.transform(l2_normalize(x).astype(np.float64)).astype(np.float32) for x in sets]
