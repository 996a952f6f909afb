"""Compare two systems query by query: the paired analysis behind ``recallk compare``.

Inputs are two per-query tables (the score stage's ``metrics/per_query.csv``): one row
per query with ``image_id``, ``label``, ``num_positives``, ``num_retrievable`` and one
column per metric (``hit@K``, ``precision@K``, ``r_precision``, ``ap@r``, ``ap``, ``rr``;
empty for a query without positives). Paired means the same queries, retrieving from the
same gallery under the same rules, so the per-query differences ``delta = B - A`` carry
the comparison.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from recallk.errors import InputError
from recallk.progress import Progress
from recallk.stats import inference as stats
from recallk.stats import mean
from recallk.tables_contract import DIRECTIONS, TASK_COLUMNS, headline_key

log = logging.getLogger(__name__)
#: The resampling units: single queries, whole labels, or labels then queries within labels.
UNITS = ("query", "label", "two-level")

#: Columns that define the retrieval task of a query (TASK_COLUMNS but its id): they must agree between A and B.
QUERY_TASK = tuple(c for c in TASK_COLUMNS if c != "image_id")


@dataclass(frozen=True)
class CompareSettings:
    """How :func:`compare` compares, given once (``recallk compare``'s options).

    Attributes
    ----------
    by : {"query", "label", "two-level"}
        The resampling unit of the bootstrap and of the sign flips: single queries, or every
        label's queries together (clustered; use it under leave-one-out), or ``two-level``: the
        bootstrap draws labels, then queries within each drawn label (from variance-matched values,
        :func:`recallk.stats.inference.two_level_values`, so the within-label spread counts once), and the
        sign flips flip whole labels (a second level of flips would only re-draw each query's sign: the
        query-level test).
    intersect : bool
        Compare the common queries when the query sets differ (else an InputError).
    resamples, permutations : int
        Bootstrap resamples (the same resample indices for every metric) and random sign-flip
        patterns (every pattern is enumerated when there are at most that many), each capped so that
        units x draws stays within ``max_draws`` (:func:`recallk.stats.inference.capped`; the result
        reports the numbers drawn).
    confidence : float
        Level of the bootstrap interval of the mean difference.
    seed : int
        Seed of both the bootstrap and the sign flips.
    max_draws : int
        The most unit draws of the bootstrap, and of the sign flips.
    alpha, power : float
        Level and power of the minimum detectable difference (per metric, unadjusted).
    delta : float, optional
        A difference to detect: the result says about how many queries detect it at ``power``.
    """

    by: str = "query"
    intersect: bool = False
    resamples: int = 10_000
    permutations: int = 10_000
    confidence: float = 0.95
    seed: int = 0
    max_draws: int = stats.MAX_DRAWS
    alpha: float = 0.05
    power: float = 0.8
    delta: float | None = None

    def __post_init__(self) -> None:
        if self.by not in UNITS:
            raise InputError(f"`by` must be one of {', '.join(UNITS)}. Got {self.by!r} instead.")
        stats.check_asked("--resamples", self.resamples)
        stats.check_asked("--permutations", self.permutations)


def default_unit(by: str | None, direction: str | None) -> str:
    """``--by`` as given; by default ``label`` for text -> image (the captions of one image share their target: the
    image, their ``label``, is the resampling unit) and ``query`` otherwise."""
    return by or ("label" if direction == DIRECTIONS[0] else "query")


def metric_columns(frame: pd.DataFrame) -> list[str]:
    """The per-query metric columns of a table, in its order."""
    return [c for c in frame.columns if headline_key(c)]


def align(a: pd.DataFrame, b: pd.DataFrame, *, intersect: bool = False, names: tuple[str, str] = ("A", "B")
          ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, int]]:
    """The two tables on the same queries, in image_id order; ``dropped`` counts the queries of each
    side left out (with ``intersect``). Raises InputError when the query sets or tasks differ."""
    for frame, name in ((a, names[0]), (b, names[1])):
        missing = [c for c in TASK_COLUMNS if c not in frame.columns]
        if missing:
            raise InputError(f"{name}: the per-query table lacks column(s) {', '.join(missing)}; "
                             "re-run the score stage of this version to write metrics/per_query.csv.")
        if frame["image_id"].duplicated().any():
            raise InputError(f"{name}: the per-query table repeats image_id "
                             f"{frame.loc[frame['image_id'].duplicated(), 'image_id'].iloc[0]!r}.")
    ids_a, ids_b = set(a["image_id"]), set(b["image_id"])
    only_a, only_b = sorted(ids_a - ids_b), sorted(ids_b - ids_a)
    common = sorted(ids_a & ids_b)
    if (only_a or only_b) and not intersect or not common:  # (different and not --intersect) or nothing shared
        advice = (f"Pass --intersect to compare the {len(common)} common queries." if common else
                  "They have no query in common, so --intersect cannot help: score both on the same split.")
        raise InputError(f"{names[0]} and {names[1]} scored different queries ({len(only_a)} only in {names[0]}, "
                         f"e.g. {only_a[:3]}; {len(only_b)} only in {names[1]}, e.g. {only_b[:3]}): a paired "
                         f"comparison needs the same split. {advice}")
    a = a.set_index("image_id").loc[common]
    b = b.set_index("image_id").loc[common]
    for column in QUERY_TASK:
        differ = a[column].astype(str) != b[column].astype(str)
        if differ.any():
            first = differ[differ].index[0]
            raise InputError(f"{names[0]} and {names[1]} differ in `{column}` for {int(differ.sum())} queries "
                             f"(e.g. {first!r}: {a.at[first, column]} vs {b.at[first, column]}): the gallery, the "
                             "protocol or score.exclude_same differ, so the queries are not the same task.")
    return a, b, {names[0]: len(only_a), names[1]: len(only_b)}


def compare(a: pd.DataFrame, b: pd.DataFrame, settings: CompareSettings | None = None, *,
            names: tuple[str, str] = ("A", "B")) -> dict[str, Any]:
    """The paired comparison of B against A on every metric both tables hold.

    Parameters
    ----------
    a, b : DataFrame
        Per-query tables (see the module docstring).
    settings : CompareSettings, optional
        The resampling unit, intersect, resamples, permutations, confidence, seed, the draws' cap and
        the power analysis (default: ``CompareSettings()``).
    names : (str, str)
        What the messages and the result call A and B.

    Returns
    -------
    dict
        ``queries`` (compared), ``dropped`` (per side), ``by``, and ``metrics``: one entry per
        headline metric with ``mean_a``, ``mean_b``, ``delta`` (B - A), ``ci_low``/``ci_high``
        (paired bootstrap), ``p`` (two-sided paired sign-flip randomization) with ``p_exact``,
        ``p_holm`` (Holm over the metrics), ``ci_holm_low``/``ci_holm_high`` (the interval at the metric's
        level in Holm's procedure, ``ci_holm_level``: :func:`~recallk.stats.inference.holm_levels`; the
        verdicts use it), ``p_mcnemar`` with ``discordant`` [A only hits, B only hits] for recall@K, ``dz``
        (Cohen's d_z), ``wins``/``ties``/``losses``, ``se`` (the bootstrap standard error of Δ), ``mde`` (the minimum
        detectable |Δ| at ``power``, :func:`recallk.stats.inference.detectable`) and, with ``delta``,
        ``queries_needed``; ``draws``: the resamples and sign patterns drawn (after the cap) and asked;
        ``power``: alpha, power, delta; ``flips``: per K the queries whose hit changed; ``per_label``: per
        label and metric.
    """
    settings = settings or CompareSettings()
    by = settings.by
    a, b, dropped = align(a, b, intersect=settings.intersect, names=names)
    columns = [c for c in metric_columns(a.reset_index()) if c in b.columns]
    if not columns:
        raise InputError(f"{names[0]} and {names[1]} share no per-query metric column; re-run the score stage of "
                         "both versions (this version writes every metric per query).")
    values_a = a[columns].apply(pd.to_numeric, errors="coerce")
    values_b = b[columns].apply(pd.to_numeric, errors="coerce")
    included = values_a.notna().all(axis=1) & values_b.notna().all(axis=1)  # queries with positives
    labels = a.loc[included, "label"].astype(str).to_numpy()
    groups = None if by == "query" else labels
    if not included.any():
        raise InputError("no compared query has a positive: every metric is undefined.")
    va, vb = values_a.loc[included].to_numpy(np.float64), values_b.loc[included].to_numpy(np.float64)
    deltas = vb - va
    draws = _draws(settings, deltas.shape[0], groups)
    with Progress(draws["resamples"] + draws["permutations"], "compare", "draws", log, delay=2.0) as bar:
        boot = stats.bootstrap_deltas(deltas, draws["resamples"], settings.seed, groups, by == "two-level",
                                      bar.update)
        p_values, exact = stats.sign_flip_pvalues(deltas, draws["permutations"], settings.seed, groups, bar.update)
    results: dict[str, dict[str, Any]] = {}
    for j, column in enumerate(columns):
        delta = deltas[:, j]
        low, high = stats.percentile_interval(boot[:, j], settings.confidence)
        se = float(boot[:, j].std(ddof=1)) if boot.shape[0] > 1 else 0.0
        wins, ties, losses = stats.win_tie_loss(delta)
        mean_a, mean_b = mean(va[:, j]), mean(vb[:, j])
        entry = {"column": column, "mean_a": mean_a, "mean_b": mean_b, "delta": mean_b - mean_a, "ci_low": low,
                 "ci_high": high, "p": float(p_values[j]), "p_exact": exact, "dz": stats.cohens_dz(delta),
                 "wins": wins, "ties": ties, "losses": losses, "se": se,
                 "mde": stats.detectable(se, settings.alpha, settings.power, draws["units"])}
        if settings.delta is not None:
            entry["queries_needed"] = stats.queries_needed(delta.size, se, settings.delta, settings.alpha,
                                                           settings.power)
        if column.startswith("hit@"):
            p_mc, only_a, only_b = stats.mcnemar_exact(va[:, j] > 0, vb[:, j] > 0)
            entry.update(p_mcnemar=p_mc, discordant=[only_a, only_b])
        results[headline_key(column)] = entry
    p_values = [e["p"] for e in results.values()]
    for j, (entry, adjusted, level) in enumerate(zip(results.values(), stats.holm(p_values),
                                                     stats.holm_levels(p_values, settings.alpha))):
        low, high = stats.percentile_interval(boot[:, j], 1.0 - level)
        entry.update(p_holm=adjusted, ci_holm_low=low, ci_holm_high=high, ci_holm_level=1.0 - level)
    return {"names": list(names), "queries": int(included.sum()), "excluded": int((~included).sum()),
            "dropped": dropped, "by": by, "confidence": settings.confidence, "draws": draws,
            "power": {"alpha": settings.alpha, "power": settings.power, "delta": settings.delta},
            "metrics": results,
            "flips": _flips(a[included], values_a[included], values_b[included]),
            "per_label": _per_label(labels, values_a[included], values_b[included])}


def _draws(settings: CompareSettings, queries: int, groups: np.ndarray | None) -> dict[str, Any]:
    """The resamples and sign patterns to draw (capped by ``max_draws``), the units they draw, and what was
    asked: the result's ``draws``."""
    labels = 0 if groups is None else int(np.unique(groups).size)
    boot_units = queries if settings.by in ("query", "two-level") else labels
    flip_units = queries if settings.by == "query" else labels
    out = {"units": flip_units, "unit": "label" if settings.by != "query" else "query",
           "resamples": stats.capped(settings.resamples, boot_units, settings.max_draws),
           "permutations": stats.capped(settings.permutations, flip_units, settings.max_draws),
           "resamples_asked": settings.resamples, "permutations_asked": settings.permutations,
           "max_draws": settings.max_draws}
    for kind in ("resamples", "permutations"):
        if out[kind] < out[f"{kind}_asked"]:
            log.warning("%s capped at %d of %d asked: %d units x %d would exceed %d draws (raise --max-draws)",
                        kind, out[kind], out[f"{kind}_asked"], boot_units if kind == "resamples" else flip_units,
                        out[f"{kind}_asked"], settings.max_draws)
    return out


def _flips(a: pd.DataFrame, values_a: pd.DataFrame, values_b: pd.DataFrame) -> dict[str, dict[str, list]]:
    """Per recall@K: the queries that went hit -> miss (``lost``) and miss -> hit (``gained``), with labels."""
    out: dict[str, dict[str, list]] = {}
    ids, labels = a.index.astype(str).to_numpy(), a["label"].astype(str).to_numpy()
    for column in (c for c in values_a.columns if c.startswith("hit@")):
        hit_a, hit_b = values_a[column].to_numpy() > 0, values_b[column].to_numpy() > 0
        out[headline_key(column)] = {
            kind: [{"image_id": i, "label": label} for i, label in zip(ids[mask].tolist(), labels[mask].tolist())]
            for kind, mask in (("lost", hit_a & ~hit_b), ("gained", ~hit_a & hit_b))}
    return out


def _per_label(labels: np.ndarray, values_a: pd.DataFrame, values_b: pd.DataFrame) -> list[dict[str, Any]]:
    """Per label: its number of queries and, per metric, the mean of A, of B and the difference."""
    names, inverse = np.unique(labels.astype(str), return_inverse=True)
    order = np.argsort(inverse.ravel(), kind="stable")
    bounds = np.cumsum(np.bincount(inverse.ravel(), minlength=names.size))[:-1]
    parts = {column: (np.split(values_a[column].to_numpy(np.float64)[order], bounds),
                      np.split(values_b[column].to_numpy(np.float64)[order], bounds)) for column in values_a.columns}
    rows = []
    for i, label in enumerate(names.tolist()):
        row: dict[str, Any] = {"label": label, "queries": int(parts[values_a.columns[0]][0][i].size)}
        for column, (side_a, side_b) in parts.items():
            mean_a, mean_b = mean(side_a[i]), mean(side_b[i])
            row[headline_key(column)] = {"mean_a": mean_a, "mean_b": mean_b, "delta": mean_b - mean_a}
        rows.append(row)
    return rows
