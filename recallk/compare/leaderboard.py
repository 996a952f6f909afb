"""The statistics of ``recallk leaderboard`` and ``recallk track`` over a :class:`~recallk.compare.systems.Panel`.

Per metric: every system's mean with its bootstrap interval (the same resample indices for every
system and metric) and its between-run SD; the rank; Δ of each system against the reference (the
best system, or ``baseline``) with a paired bootstrap interval and a paired sign-flip p-value,
adjusted over the whole vs-reference family (every metric times every other system) by Holm or
Benjamini-Hochberg; and the all-pairs randomized Tukey HSD (:func:`recallk.compare.family.
randomized_tukey_hsd`, per metric; one permutation per query serves every metric) with its compact letter
display. ``track`` adds, for an ordered series, each point's paired Δ against the previous one and the
set of points indistinguishable from the best; there Δ against the best comes from the groups' family (the
pair's Tukey p and the Tukey HSD simultaneous interval), so a point shares a letter with the best, is listed
indistinguishable from it, has a vs-best adjusted p of at least ``alpha`` and a vs-best interval holding 0:
all four or none. A long run shows its progress (draws done, rate, time left:
:class:`recallk.progress.Progress`).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from recallk.compare import family
from recallk.compare.systems import Panel
from recallk.errors import InputError
from recallk.progress import Progress
from recallk.stats import inference as stats
from recallk.stats import mean
from recallk.stats.resample import percentile_interval, unit_sums

log = logging.getLogger(__name__)
#: Seconds before a terminal progress bar appears (none for a board that ends sooner).
BAR_DELAY = 2.0


@dataclass(frozen=True)
class BoardSettings:
    """How the leaderboard tests (the command's options).

    Attributes
    ----------
    baseline : str or None
        The system every other is compared with (None: the best on each metric).
    adjust : {"holm", "bh"}
        The adjustment of the vs-reference family.
    by : {"query", "label"}
        Resample and permute single queries, or every label's queries together (queries only).
    resamples, permutations, seed, confidence, alpha : as in ``recallk compare``; ``alpha`` draws
        the letters and the indistinguishable set.
    """

    baseline: str | None = None
    adjust: str = "holm"
    by: str = "query"
    resamples: int = 10_000
    permutations: int = 10_000
    seed: int = 0
    confidence: float = 0.95
    alpha: float = 0.05

    def __post_init__(self) -> None:
        if self.adjust not in family.ADJUSTMENTS:
            raise InputError(f"`adjust` must be one of {', '.join(family.ADJUSTMENTS)}. Got {self.adjust!r} instead.")
        if self.by not in ("query", "label"):
            raise InputError(f"`by` must be query or label. Got {self.by!r} instead.")
        stats.check_asked("--resamples", self.resamples)
        stats.check_asked("--permutations", self.permutations)
        for name in ("confidence", "alpha"):
            if not 0 < getattr(self, name) < 1:
                raise InputError(f"`{name}` must be strictly between 0 and 1. Got {getattr(self, name)!r} instead.")


def _groups(board: Panel, settings: BoardSettings) -> np.ndarray | None:
    if settings.by == "query":
        return None
    if board.labels is None:
        raise InputError("--by label needs the same queries in every run; these runs are paired by run.")
    return board.labels


def _tukey_units(values: np.ndarray, groups: np.ndarray | None) -> np.ndarray:
    """The Tukey units: the rows, or with ``groups`` each group's column sums (permuted together)."""
    if groups is None:
        return values
    return np.column_stack([unit_sums(values[:, s], groups)[0] for s in range(values.shape[1])])


def _order(values: np.ndarray) -> tuple[list[float], list[int]]:
    """The systems' means and their ranking (best first; ties in command-line order)."""
    means = [mean(values[:, s]) for s in range(values.shape[1])]
    return means, sorted(range(len(means)), key=lambda s: (-means[s], s))


def metric_board(board: Panel, metric: str, settings: BoardSettings, ref: int, tukey: dict[str, np.ndarray],
                 boots: np.ndarray, flips: dict[int, tuple[float, bool]], tukey_vs_ref: bool = False
                 ) -> dict[str, Any]:
    """One metric's leaderboard (see the module docstring) given its reference, its Tukey HSD, the
    bootstrap means of its systems (resamples, systems) and the sign-flip p of each other system.

    ``tukey_vs_ref`` (``track``): Δ against the reference from the family of the groups: its interval the Tukey
    HSD simultaneous interval (Δ ± the critical range, :func:`recallk.compare.family.tukey_half_width`) and its
    ``p_adjusted`` the pair's Tukey p, so that a system shares a letter with the reference exactly when that p is
    at least ``alpha`` and that interval holds 0."""
    values = board.values[metric]
    k = values.shape[1]
    means, order = _order(values)
    letters = family.compact_letters(order, tukey["p"] < settings.alpha)
    half_width = family.tukey_half_width(tukey, settings.alpha) if tukey_vs_ref else 0.0
    sds = board.run_sd(metric)
    rows = []
    for rank, s in enumerate(order, start=1):
        low, high = percentile_interval(boots[:, s], settings.confidence)
        row = {"system": board.names[s], "rank": rank, "mean": means[s], "ci_low": low, "ci_high": high,
               "run_sd": sds[s], "runs": len(board.run_means[metric][s]), "group": letters[s]}
        if s != ref:  # the paired interval from the same resamples: mean of the differences = difference of means
            delta = means[s] - means[ref]
            delta_low, delta_high = percentile_interval(boots[:, s] - boots[:, ref], settings.confidence)
            row.update(delta=delta, delta_low=delta_low, delta_high=delta_high, p=flips[s][0],
                       p_exact=flips[s][1], delta_run_sd=_paired_run_sd(board.run_means[metric], s, ref))
            if tukey_vs_ref:
                row.update(p_adjusted=float(tukey["p"][s, ref]),
                           **_tukey_interval(delta, half_width, bool(tukey["p"][s, ref] < settings.alpha)))
        rows.append(row)
    pairs = [{"a": board.names[i], "b": board.names[j], "diff": means[j] - means[i], "p_tukey": float(tukey["p"][i, j]),
              "significant": bool(tukey["p"][i, j] < settings.alpha)} for i, j in itertools.combinations(range(k), 2)]
    return {"reference": board.names[ref], "best": board.names[order[0]], "rows": rows, "pairs": pairs}


def _tukey_interval(delta: float, half_width: float, significant: bool) -> dict[str, float]:
    """``delta ± half_width``; where float rounding of Δ (float64 means; the test sums float32 values) puts
    ``|delta|`` on the other side of the critical range than the pair's p, the half-width is set to ``|delta|``
    (held 0: not significant) or just below it (significant), so the interval never contradicts the p."""
    if (abs(delta) > half_width) != significant:
        half_width = abs(delta) if not significant else float(np.nextafter(abs(delta), 0.0))
    return {"delta_low": delta - half_width, "delta_high": delta + half_width}


def _paired_run_sd(run_means: list[list[float]], s: int, ref: int) -> float | None:
    """The between-run SD of Δ: of the per-run differences of means, run r paired with run r (None unless
    both systems have the same number of runs, at least two)."""
    if len(run_means[s]) != len(run_means[ref]):
        return None
    return family.between_run_sd([a - b for a, b in zip(run_means[s], run_means[ref])])


def vs_reference(delta: np.ndarray, settings: BoardSettings, groups: np.ndarray | None,
                 tick: stats.Tick | None = None) -> dict[str, Any]:
    """Paired bootstrap interval and sign-flip p of ``delta`` (system minus reference, per unit), and the
    bootstrap means (``boot``, for an interval at another level)."""
    boot = stats.bootstrap_deltas(np.asarray(delta, dtype=np.float64), settings.resamples, settings.seed, groups,
                                  tick=tick)[:, 0]
    low, high = percentile_interval(boot, settings.confidence)
    p, exact = stats.sign_flip_pvalue(delta, settings.permutations, settings.seed, groups, tick)
    return {"delta_low": low, "delta_high": high, "p": p, "p_exact": exact, "boot": boot}


def leaderboard(board: Panel, settings: BoardSettings | None = None) -> dict[str, Any]:
    """Every metric's leaderboard and the family-adjusted vs-reference p-values.

    Returns
    -------
    dict
        ``systems`` (name, runs' origins), ``case``, ``units``, ``queries``, ``excluded``, ``by``,
        ``confidence``, ``alpha``, ``adjust``, ``permutations``, ``resamples``, ``baseline``;
        ``metrics``: per metric ``reference``, ``best``, ``rows`` (ranked: ``system``, ``rank``,
        ``mean``, ``ci_low``, ``ci_high``, ``run_sd``, ``runs``, ``group`` letters; and for every
        system but the reference ``delta``, ``delta_low``, ``delta_high``, ``delta_run_sd`` (the between-run SD
        of Δ, runs paired by position), ``p``, ``p_adjusted``) and
        ``pairs`` (every pair in command-line order: ``a``, ``b``, ``diff`` = b - a, ``p_tukey``,
        ``significant``; a pair with the reference also ``p_adjusted``).
    """
    settings = settings or BoardSettings()
    if settings.baseline is not None and settings.baseline not in board.names:
        raise InputError(f"--baseline names {settings.baseline!r}, which is not one of the systems: "
                         f"{', '.join(board.names)}.")
    with Progress(board_draws(settings), "leaderboard", "draws", log, delay=BAR_DELAY) as bar:
        return _leaderboard(board, settings, bar.update)


def board_draws(settings: BoardSettings) -> int:
    """The draws :func:`leaderboard` makes (its progress total): the Tukey permutations, the bootstrap
    resamples and the sign flips, each shared by every metric and system."""
    return 2 * settings.permutations + settings.resamples


def _leaderboard(board: Panel, settings: BoardSettings, tick: stats.Tick, tukey_vs_ref: bool = False
                 ) -> dict[str, Any]:
    reference = None if settings.baseline is None else board.names.index(settings.baseline)
    groups = _groups(board, settings)
    names, k = board.metrics, len(board.names)
    refs = [_order(board.values[m])[1][0] if reference is None else reference for m in names]
    others = [[s for s in range(k) if s != ref] for ref in refs]
    # every metric at once: the same permutations, resamples and sign patterns as one metric at a time
    tukeys = family.randomized_tukey_hsd_many(np.stack([_tukey_units(board.values[m], groups) for m in names],
                                                       axis=2), settings.permutations, settings.seed, tick)
    boots = stats.bootstrap_deltas(np.concatenate([board.values[m] for m in names], axis=1),
                                   settings.resamples, settings.seed, groups, tick=tick)
    deltas = np.concatenate([board.values[m][:, rest] - board.values[m][:, [ref]]
                             for m, ref, rest in zip(names, refs, others)], axis=1)
    p_values, exact = stats.sign_flip_pvalues(deltas, settings.permutations, settings.seed, groups, tick)
    flips = iter([(float(p), exact) for p in p_values])
    metrics = {m: metric_board(board, m, settings, refs[i], tukeys[i], boots[:, i * k:(i + 1) * k],
                               {s: next(flips) for s in others[i]}, tukey_vs_ref) for i, m in enumerate(names)}
    family_rows = [row for entry in metrics.values() for row in entry["rows"] if "p" in row]
    if not tukey_vs_ref:
        for row, adjusted in zip(family_rows, family.adjust([row["p"] for row in family_rows], settings.adjust)):
            row["p_adjusted"] = adjusted
    for entry in metrics.values():
        adjusted_of = {row["system"]: row["p_adjusted"] for row in entry["rows"] if "p" in row}
        for pair in entry["pairs"]:
            other = {pair["a"], pair["b"]} - {entry["reference"]}
            if len(other) == 1 and entry["reference"] in (pair["a"], pair["b"]):
                pair["p_adjusted"] = adjusted_of[other.pop()]
    return {"systems": [{"name": name, "runs": origins} for name, origins in zip(board.names, board.origins)],
            "case": board.case, "units": board.units, "queries": board.queries, "excluded": board.excluded,
            "by": settings.by, "confidence": settings.confidence, "alpha": settings.alpha, "adjust": settings.adjust,
            "permutations": settings.permutations, "resamples": settings.resamples, "baseline": settings.baseline,
            "vs_reference": "tukey" if tukey_vs_ref else settings.adjust, "metrics": metrics}


def track(board: Panel, settings: BoardSettings | None = None) -> dict[str, Any]:
    """:func:`leaderboard` against the best point plus, per metric in the given order, ``series``: each
    point's ``mean`` and interval, ``delta_prev`` with its paired p and interval, both adjusted over the steps
    by ``settings.adjust`` (the interval at ``level``: :func:`recallk.compare.family.adjusted_levels`), and
    ``indistinguishable`` (the points sharing a group letter with the best).

    Δ against the best is tested in the family of the letters (``vs_reference``: ``tukey``): its ``p_adjusted``
    is the pair's randomized Tukey HSD p and its interval the HSD simultaneous interval, so the groups, the
    indistinguishable set and the vs-best numbers never disagree."""
    settings = settings or BoardSettings()
    if settings.baseline is not None:
        raise InputError("track compares each point with the best and with the previous one; it takes no --baseline.")
    steps_draws = len(board.metrics) * (len(board.names) - 1) * (settings.resamples + settings.permutations)
    with Progress(board_draws(settings) + steps_draws, "track", "draws", log, delay=BAR_DELAY) as bar:
        return _track(board, settings, bar.update)


def _track(board: Panel, settings: BoardSettings, tick: stats.Tick) -> dict[str, Any]:
    result = _leaderboard(board, settings, tick, tukey_vs_ref=True)
    groups = _groups(board, settings)
    for metric, entry in result["metrics"].items():
        values = board.values[metric]
        by_name = {row["system"]: row for row in entry["rows"]}
        steps = [vs_reference(values[:, s] - values[:, s - 1], settings, groups, tick)
                 for s in range(1, len(board.names))]
        p_values = [step["p"] for step in steps]
        for step, adjusted, level in zip(steps, family.adjust(p_values, settings.adjust),
                                         family.adjusted_levels(p_values, settings.alpha, settings.adjust)):
            # the interval printed beside the adjusted p is adjusted as it is (the steps are one family)
            step.update(p_adjusted=adjusted, level=1.0 - level)
            step["delta_low"], step["delta_high"] = percentile_interval(step.pop("boot"), 1.0 - level)
        series = []
        for s, name in enumerate(board.names):
            row = by_name[name]
            point = {key: row.get(key) for key in ("system", "mean", "ci_low", "ci_high", "run_sd", "group")}
            point["vs_best"] = {key: row[key] for key in ("delta", "delta_low", "delta_high", "p", "p_adjusted")
                                if key in row}
            if s:
                step = steps[s - 1]
                point["delta_prev"] = {"delta": row["mean"] - by_name[board.names[s - 1]]["mean"],
                                       **{key: step[key] for key in ("delta_low", "delta_high", "level", "p",
                                                                     "p_adjusted")}}
            series.append(point)
        entry["series"] = series
        best_letters = set(by_name[entry["best"]]["group"])  # one family: the groups' (Tukey HSD)
        entry["indistinguishable"] = [p["system"] for p in series if set(p["group"]) & best_letters]
    return result
