"""Simulated comparisons of known truth: are ``recallk compare``'s tests and intervals calibrated?

The generator draws ``reps`` independent comparisons at once (one column each) of ``labels x
per_label`` queries. Per query, A and B share a query difficulty ``z`` (so they are correlated query
by query, as two systems on one query set are) and each adds its own noise:

``a = z + e_a``, ``b = z + e_b + shift`` (``e ~ N(0, 1)``, ``z ~ N(0, 1) + u_label``),

and, ``clustered``, each system also gets a per-label effect ``w ~ N(0, tau**2)`` (one system is better
on some labels, worse on others), so the differences of one label's queries are correlated: the
query-level analysis is then optimistic, and the label or two-level one is the valid one. Under the
null (``shift = 0``) A and B are exchangeable, so ``delta = b - a`` is symmetric about 0; an alternative
moves every difference by ``shift`` (the true Δ).

Used by ``bench/compare_calibration.py`` (the full run) and by a short test.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import numpy as np

from recallk.stats import inference as stats

#: The resampling units checked, and the scenario where each is the valid analysis.
VALID_UNDER = {"query": False, "label": True, "two-level": True}


@dataclass(frozen=True)
class Design:
    """One simulated setting: ``labels x per_label`` queries, label spread ``tau`` of the differences
    (clustered scenario), and the resamples/permutations each comparison draws."""

    labels: int = 100
    per_label: int = 6
    tau: float = 0.5
    resamples: int = 1000
    permutations: int = 1000
    alpha: float = 0.05
    confidence: float = 0.95


def generate(rng: np.random.Generator, reps: int, design: Design, *, clustered: bool,
             shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """``reps`` comparisons: the per-query differences (n, reps) and the labels (n,)."""
    n = design.labels * design.per_label
    groups = np.repeat(np.arange(design.labels), design.per_label)
    z = rng.normal(size=(n, reps)) + rng.normal(size=(design.labels, reps))[groups]
    a = z + rng.normal(size=(n, reps))
    b = z + rng.normal(size=(n, reps)) + shift
    if clustered:
        a += design.tau * rng.normal(size=(design.labels, reps))[groups]
        b += design.tau * rng.normal(size=(design.labels, reps))[groups]
    return b - a, groups


def analyse(delta: np.ndarray, groups: np.ndarray, by: str, design: Design, seed: int) -> dict[str, np.ndarray]:
    """Per column: the sign-flip p, the bootstrap interval and standard error, as ``compare`` computes them
    under ``by`` (query, label or two-level)."""
    grouping = None if by == "query" else groups
    boot = stats.bootstrap_deltas(delta, design.resamples, seed, grouping, by == "two-level")
    tail = (1 - design.confidence) / 2
    low, high = np.quantile(boot, [tail, 1 - tail], axis=0)
    p, _ = stats.sign_flip_pvalues(delta, design.permutations, seed + 1, grouping)
    return {"p": p, "low": low, "high": high, "se": boot.std(axis=0, ddof=1)}


def batches(total: int, size: int) -> list[int]:
    """``total`` split into batches of at most ``size`` (each batch: one call with its own seed)."""
    return [min(size, total - start) for start in range(0, total, size)]


def null_rates(nulls: int, design: Design, seed: int = 0, batch: int = 500) -> dict[str, dict[str, float]]:
    """Per scenario (independent / clustered differences) and unit: the Type I error of the sign-flip test
    at ``alpha`` and the bootstrap interval's coverage of the true Δ (0), over ``nulls`` comparisons."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, float]] = {}
    for clustered in (False, True):
        hits = {by: [0, 0] for by in VALID_UNDER}
        for i, size in enumerate(batches(nulls, batch)):
            delta, groups = generate(rng, size, design, clustered=clustered)
            for by in VALID_UNDER:
                r = analyse(delta, groups, by, design, seed + 10 * i)
                hits[by][0] += int(np.count_nonzero(r["p"] <= design.alpha))
                hits[by][1] += int(np.count_nonzero((r["low"] <= 0) & (0 <= r["high"])))
        scenario = "clustered" if clustered else "independent"
        for by, (rejected, covered) in hits.items():
            out[f"{scenario}/{by}"] = {"type1": rejected / nulls, "coverage": covered / nulls,
                                       "valid": (not clustered) or VALID_UNDER[by]}
    return out


def power_curve(reps: int, design: Design, multiples: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 2.8, 3.5),
                by: str = "query", seed: int = 1, batch: int = 500) -> list[dict[str, float]]:
    """Simulated power of the sign-flip test against the predicted power (:func:`stats.power_at` with each
    comparison's own bootstrap standard error, averaged), at true Δ = multiple x the true standard error
    of the mean difference, and at Δ = the mean predicted minimum detectable Δ (80% power): rows of
    ``delta``, ``simulated``, ``predicted``. ``by``: the unit (its valid scenario is used)."""
    clustered = VALID_UNDER[by]
    n = design.labels * design.per_label
    # var(delta) = 2 (independent), + 2 tau**2 shared by a label's queries (clustered)
    true_se = np.sqrt((2 + (2 * design.tau**2 * design.per_label if clustered else 0)) / n)
    rng = np.random.default_rng(seed)
    null_delta, groups = generate(rng, reps, design, clustered=clustered)
    units = design.labels if by != "query" else n
    mde = float(np.mean([stats.detectable(se, design.alpha, units=units) for se in
                         analyse(null_delta, groups, by, design, seed)["se"]]))
    rows = []
    for shift in [m * true_se for m in multiples] + [mde]:
        simulated, predicted = 0, 0.0
        for i, size in enumerate(batches(reps, batch)):
            delta, groups = generate(rng, size, design, clustered=clustered, shift=shift)
            r = analyse(delta, groups, by, design, seed + 10 * i)
            simulated += int(np.count_nonzero(r["p"] <= design.alpha))
            predicted += float(sum(stats.power_at(shift, se, design.alpha, units) for se in r["se"]))
        rows.append({"delta": float(shift), "simulated": simulated / reps, "predicted": predicted / reps,
                     "at_mde": shift == mde})
    return rows


def tukey_family_error(nulls: int, systems: int = 4, queries: int = 200, permutations: int = 1000,
                       alpha: float = 0.05, seed: int = 2) -> float | None:
    """The family-wise error of the leaderboard's randomized Tukey HSD (``recallk.compare.family``) over
    ``nulls`` null comparisons of exchangeable systems (any pair with p <= alpha is an error); None when
    that module is not in this tree (the hook for it)."""
    if importlib.util.find_spec("recallk.compare.family") is None:
        return None
    family = importlib.import_module("recallk.compare.family")
    rng = np.random.default_rng(seed)
    errors = 0
    for i in range(nulls):
        z = rng.normal(size=(queries, 1))
        values = z + rng.normal(size=(queries, systems))
        p = family.randomized_tukey_hsd(values, permutations, seed + i)["p"]
        errors += bool((p[np.triu_indices(systems, 1)] <= alpha).any())
    return errors / nulls
