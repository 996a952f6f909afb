"""Paired statistics and resampling, one low room that the score stage (intervals), the index stage (each
point against exact) and the compare commands all use: :mod:`~recallk.stats.resample` (bootstrap means and
intervals, the content order) and :mod:`~recallk.stats.inference` (paired bootstrap, sign-flip and McNemar
tests, Holm, power)."""

from __future__ import annotations

import math

import numpy as np


def mean(values: np.ndarray) -> float:
    """The one mean of every reported value (the score stage's metrics, the index stage's exact block and points,
    ``recallk compare`` and the leaderboard): the mean of the non-NaN entries (NaN marks excluded queries), the
    correctly rounded sum (``math.fsum``, so the order of the queries never changes a bit) divided once, then kept
    within the entries' range, so a metric equal for every query reports exactly that value; NaN when none is left.
    """
    values = np.asarray(values, dtype=np.float64)
    kept = values[values == values]  # NaN is the one value unequal to itself
    if not kept.size:
        return math.nan
    return float(min(max(math.fsum(kept.tolist()) / kept.size, kept.min()), kept.max()))

