"""Paired statistics and resampling, one low room that the score stage (intervals), the index stage (each
point against exact) and the compare commands all use: :mod:`~recallk.stats.resample` (bootstrap means and
intervals, the content order) and :mod:`~recallk.stats.inference` (paired bootstrap, sign-flip and McNemar
tests, Holm, power); :func:`mean`, the one mean of every reported value, and :func:`fixed`, its one printed
form."""

from __future__ import annotations

import math

import numpy as np

#: The most resamples or permutations any command or setting asks for (``--resamples``, ``--permutations``,
#: ``score.bootstrap.resamples``): memory and time grow with it, and 10,000 already gives bounds to about 0.002.
MAX_ASKED = 1_000_000


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



def fixed(x: float, digits: int = 4, signed: bool = False) -> str:
    """The one printed form of a reported value: ``digits`` decimals (with its sign, ``+`` included, when
    ``signed``), a value that rounds to zero printed as zero (``0.0000``, or ``+0.0000`` signed: never
    ``-0.0000``, which reads as a loss where there is none); NaN as ``nan``."""
    if x != x:
        return "nan"
    text = f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"
    if float(text) == 0.0:
        text = f"{0.0:+.{digits}f}" if signed else f"{0.0:.{digits}f}"
    return text
