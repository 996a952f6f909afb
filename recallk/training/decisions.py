"""What a training loop decides with and gets back from :class:`~recallk.training.evaluator.Evaluator`: the
decision settings (:class:`DecisionSettings`: the monitored metric, patience, the stop rule, the subsample; checked
once by the params route, :func:`decision_settings`) and one epoch's result (:class:`EpochResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from recallk.checks import choice, integer
from recallk.errors import InputError, quote
from recallk.settings.base import checked, from_mapping, setting

__all__ = ["DecisionSettings", "EpochResult", "STOP_RULES", "decision_settings"]

#: The stop rules: ``significant`` (no new best, which needs Δ's interval above zero) or ``plain`` (the monitored
#: mean not above the mean of the last progress by more than ``min_delta``: Lightning's and Keras' EarlyStopping,
#: whose reference moves only on progress, so rises smaller than ``min_delta`` add up).
STOP_RULES = ("significant", "plain")


def _monitor_problem(v: Any) -> str | None:
    if v is not None and (not isinstance(v, str) or not v):
        return f"must be a metric key such as 'map@r' or 'recall@1', or None (the default). Got {quote(v)} instead."
    return None


def _patience_problem(v: Any) -> str | None:
    return None if v is None else integer(1)(v)


def _min_delta_problem(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0 <= v < 1:
        return f"must be a number from 0 up to (not including) 1, such as 0.001. Got {quote(v)} instead."
    return None


def _subsample_problem(v: Any) -> str | None:
    return None if v is None else integer(1)(v)


@dataclass(frozen=True)
class DecisionSettings:
    """What the evaluator decides and what it scores, besides the ``score`` settings: the arguments of
    :class:`Evaluator` of these names (checked once, named like the arguments)."""

    monitor: str | None = setting(None, _monitor_problem,
                                  "the metric key the best epoch and the stop read; None: `map@r` when measured, "
                                  "else the first key")
    patience: int | None = setting(None, _patience_problem,
                                   "evaluations without progress before `should_stop`; None: never")
    stop_rule: str = setting("significant", choice(*STOP_RULES),
                             "`significant`: progress is a new best (Δ's interval above zero); `plain`: the mean "
                             "above its highest by more than `min_delta`")
    min_delta: float = setting(0.0, _min_delta_problem, "`stop_rule: plain` only: the smallest rise that counts")
    subsample: int | None = setting(None, _subsample_problem,
                                    "a fixed, seeded subsample of this many queries, the same every epoch; None: all")
    seed: int = setting(0, integer(0), "the subsample's seed (`numpy.random.default_rng`)")


@dataclass(frozen=True, eq=False)
class EpochResult:
    """What one call of :class:`Evaluator` says about one epoch.

    Attributes
    ----------
    epoch : int
    metrics : dict of str to float
        Each metric's mean over the included queries, keyed and ordered like :attr:`Evaluator.keys`: the score
        stage's means (recall@K in ``metrics/recall.json``, the others in ``metrics/intervals.json``).
    intervals : dict of str to (float, float)
        Each mean's bootstrap interval (``settings.bootstrap``), as ``metrics/intervals.json``.
    monitor : str
        The metric the decisions read.
    delta : (float, float, float) or None
        ``(Δ, low, high)``: the monitored mean minus the best epoch's before this one, and the paired bootstrap
        interval of Δ (the same queries, the same resamples); None at the first epoch.
    is_best : bool
        The first epoch, or ``low > 0``: the best epoch changes only on a difference the queries can tell.
    best_epoch : int
    best_metrics : dict of str to float
        The best epoch so far (this one when ``is_best``) and its means.
    epochs_without_progress : int
        Evaluations since the last progress under the stop rule (0: this one made progress).
    should_stop : bool
        ``patience`` is set and ``epochs_without_progress`` reached it.
    num_queries, num_excluded_queries, num_gallery : int
        The queries in the means (the subsample's, with one), those without a positive, the gallery items.
    table : DataFrame
        The per-query table, the columns of ``metrics/per_query.csv`` (what ``recallk compare`` and ``track`` read).
    table_path : str or None
        Where it was written (``<log folder>/per_query/epoch_NNNN.csv``); None without a log.
    """

    epoch: int
    metrics: dict[str, float]
    intervals: dict[str, tuple[float, float]]
    monitor: str
    delta: tuple[float, float, float] | None
    is_best: bool
    best_epoch: int
    best_metrics: dict[str, float]
    epochs_without_progress: int
    should_stop: bool
    num_queries: int
    num_excluded_queries: int
    num_gallery: int
    table: pd.DataFrame | None = field(default=None, repr=False)
    table_path: str | None = None


def decision_settings(**given: Any) -> DecisionSettings:
    """:class:`DecisionSettings` from the arguments that are not None (a None ``monitor``/``patience``/``subsample``
    keeps its default, None), checked by the params route: one InputError naming every bad argument."""
    errors: list[str] = []
    values = checked(DecisionSettings, {k: v for k, v in given.items() if v is not None}, "", errors)
    if errors:
        raise InputError(" ".join(errors))
    return from_mapping(DecisionSettings, values)
