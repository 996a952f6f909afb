"""The index stage's computation: every operating point of every kind, measured and paired with the exact run.

:func:`score_index` takes the unit rows of the queries, gallery and training rows, the exclusion rules as
codes, the exact run (:class:`Exact`: the score stage's per-query table and top neighbours, so the exact
ranking is read, never computed twice) and the settings; it returns one entry per operating point and each
point's per-query table. Per point: build seconds, index bytes, queries/s on every thread and on one, the k-NN
recall under both definitions (:mod:`recallk.index.knn`), each label metric from the index's own lists
(:mod:`recallk.index.lists`), its paired Δ against exact with the bootstrap interval, McNemar for recall@K
(:mod:`recallk.compare.stats`) and the non-inferiority verdict against ``index.margin``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from recallk.compare import stats
from recallk.errors import InputError
from recallk.index import kinds as kinds_mod
from recallk.index.knn import ann_benchmarks_recall, big_ann_benchmarks_recall
from recallk.index.lists import exclusion_bound, label_values, ranked_lists, short_lists
from recallk.progress import Progress
from recallk.score.ranking.scan import exact_pairs
from recallk.score.registry import metric_keys
from recallk.score.resample import percentile_interval
from recallk.score.similarity import float32_dot_error_bound
from recallk.settings.index import IndexSettings
from recallk.settings.score import ScoreSettings
from recallk.tables_contract import TASK_COLUMNS, per_query_column

log = logging.getLogger(__name__)

#: Metrics whose lists must reach every positive (``R``) / the whole gallery for exact values.
TO_R, TO_GALLERY = ("r_precision", "map@r"), ("map", "mrr")


@dataclass(frozen=True, eq=False)
class Problem:
    """The retrieval problem as the index sees it (rows in the exact run's order).

    Attributes
    ----------
    queries, gallery, train : ndarray
        Unit float32 rows (as the exact engine scores them); ``train`` may be empty.
    query_codes, gallery_codes : ndarray
        Label codes in one code space.
    own : ndarray
        Each query's own gallery row, or -1.
    exclude : sequence of (query codes, gallery codes)
        One pair per ``score.exclude_same`` column (-1: missing).
    """

    queries: np.ndarray
    gallery: np.ndarray
    train: np.ndarray
    query_codes: np.ndarray
    gallery_codes: np.ndarray
    own: np.ndarray
    exclude: Sequence[tuple[np.ndarray, np.ndarray]] = ()


@dataclass(frozen=True, eq=False)
class Exact:
    """The exact run: the score stage's per-query table (rows in query order) and each query's top neighbours
    as gallery rows and exact cosines (``(n, max(ks))``; -1 / NaN pad)."""

    table: pd.DataFrame
    neighbor_rows: np.ndarray
    neighbor_scores: np.ndarray


def needed_depth(metrics: Sequence[str], ks: Sequence[int], exact: Exact, n_gallery: int) -> int:
    """The default depth of the lists (``index.depth: null``): ``max(ks)``, or the largest ``R`` when
    r_precision or map@r is scored, at most the gallery. map and mrr read ranks beyond it (see
    :func:`truncated`)."""
    depth = max(ks)
    if any(m in TO_R for m in metrics):
        depth = max(depth, int(exact.table["num_positives"].max()))
    return max(1, min(depth, n_gallery))


def truncated(metrics: Sequence[str], depth: int, exact: Exact) -> list[str]:
    """The metrics whose index values lists of ``depth`` items cut short for some query: r_precision and map@r
    when a query has more than ``depth`` positives, map and mrr when a query may retrieve more than ``depth``
    items (a positive beyond the list counts as not retrieved, so even ``Flat`` differs from exact there)."""
    out = []
    for name in metrics:
        limit = exact.table["num_positives" if name in TO_R else "num_retrievable"].max()
        if name in TO_R + TO_GALLERY and limit > depth:
            out.append(name)
    return out


def check_kinds(settings: IndexSettings, dim: int) -> list[tuple[kinds_mod.Kind, list[dict[str, int]]]]:
    """Every kind of ``settings`` with its points, checked before any work (one InputError for the first fault)."""
    kinds = [kinds_mod.parse_kind(name, dim) for name in settings.kinds]
    sweep = {name: getattr(settings.sweep, name) for name in ("nprobe", "efSearch", "ef")}
    unused = kinds_mod.unused_sweep(kinds, sweep)
    if unused:
        raise InputError(unused)
    return [(kind, kinds_mod.points(kind, sweep)) for kind in kinds]


def rounded(values: np.ndarray) -> np.ndarray:
    """``values`` as the per-query CSV writes and reads them back (``%.10g``): Δ compares like with like."""
    return np.array([float(f"{v:.10g}") for v in values.tolist()], dtype=np.float64)


def paired(index_values: dict[str, np.ndarray], exact: Exact, score: ScoreSettings, margin: float,
           unjudged: Sequence[str] = ()) -> dict[str, Any]:
    """Each metric's mean, Δ against exact with its paired interval (``score.bootstrap``'s resamples, level, seed
    and unit), McNemar for recall@K, and the verdict: non-inferior when every interval's low end is above
    ``-margin``, the ``unjudged`` metrics (cut short by the depth, :func:`truncated`) left out."""
    boot = score.bootstrap
    table = exact.table
    labels = table["label"].astype(str).to_numpy()
    out: dict[str, Any] = {}
    deltas: dict[str, np.ndarray] = {}
    pairs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for key, values in index_values.items():
        exact_values = pd.to_numeric(table[per_query_column(key)], errors="coerce").to_numpy(dtype=np.float64)
        kept = ~np.isnan(exact_values)  # the queries with a positive: the same for every metric
        pairs[key] = exact_values[kept], rounded(values)[kept]
        deltas[key] = pairs[key][1] - pairs[key][0]
    # recallk compare's paired bootstrap (stats.bootstrap_deltas), once for every metric: the same resamples
    # serve every column, so the intervals are those stats.paired_bootstrap_ci gives metric by metric
    groups = labels[kept] if boot.unit == "label" else None
    means: dict[str, np.ndarray] = {}
    if boot.resamples and deltas:
        draws = stats.bootstrap_deltas(np.column_stack(list(deltas.values())), boot.resamples, boot.seed, groups)
        means = dict(zip(deltas, draws.T))
    verdict = True
    for key, (a, b) in pairs.items():
        mean = stats.fsum_mean(b)
        out[key] = mean
        out[f"delta_{key}"] = mean - stats.fsum_mean(a)
        low, high = percentile_interval(means[key], boot.confidence) if means else (out[f"delta_{key}"],) * 2
        out[f"delta_{key}_ci_low"], out[f"delta_{key}_ci_high"] = low, high
        if key not in unjudged:
            verdict &= low > -margin
        if key.startswith("recall@"):
            p, lost, gained = stats.mcnemar_exact(a > 0, b > 0)
            out[f"mcnemar_p_{key}"], out[f"lost_{key}"], out[f"gained_{key}"] = p, lost, gained
    out["non_inferior"] = bool(verdict)
    return out


def ordering_scores(problem: Problem, ids: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, str]:
    """The scores a point's lists are ordered by, and which: the exact cosines of the returned items when the
    index's own scores are all within float32 rounding of them (uncompressed vectors: Flat, IVF-Flat, HNSW,
    hnswlib), so that rounding noise never reorders what the exact engine orders (its total order: exact cosine,
    ties by gallery row); else (PQ, SQ, ... : approximate scores) the index's own."""
    line, col = np.nonzero(ids >= 0)
    exact = np.full(ids.shape, np.nan, dtype=np.float32)
    exact[line, col] = exact_pairs(problem.queries, problem.gallery, line, ids[line, col])
    tol = 2 * float32_dot_error_bound(problem.gallery.shape[1]) + 2.0**-22
    gap = np.abs(exact[line, col].astype(np.float64) - scores[line, col].astype(np.float64))
    if gap.size and float(gap.max()) <= tol:
        return exact, "exact cosine (the index's scores are exact up to float32 rounding)"
    return scores, "the index's own scores"


def knn_recalls(problem: Problem, exact: Exact, columns: np.ndarray, ks: Sequence[int]) -> dict[str, Any]:
    """k-NN recall@K of the lists ``columns`` under both definitions, at each K the exact table holds."""
    out: dict[str, Any] = {}
    top = min(columns.shape[1], exact.neighbor_rows.shape[1])
    run = columns[:, :top]
    line, col = np.nonzero(run >= 0)
    run_scores = np.full(run.shape, np.nan, dtype=np.float32)
    run_scores[line, col] = exact_pairs(problem.queries, problem.gallery, line, run[line, col])
    for k in (k for k in ks if k <= top):
        ann = ann_benchmarks_recall(exact.neighbor_scores, run_scores, k)
        big, tied = big_ann_benchmarks_recall(exact.neighbor_rows, exact.neighbor_scores, run, k)
        out[f"knn_recall@{k}_ann_benchmarks"] = stats.fsum_mean(ann[~np.isnan(ann)])
        out[f"knn_recall@{k}_big_ann_benchmarks"] = stats.fsum_mean(big)
        out[f"knn_tied_queries@{k}"] = tied
    return out


def per_query_table(exact: Exact, values: dict[str, np.ndarray]) -> pd.DataFrame:
    """A point's per-query table in the score stage's compact format (``recallk compare`` reads it)."""
    frame = exact.table[list(TASK_COLUMNS)].copy()
    for key, v in values.items():
        frame[per_query_column(key)] = v
    return frame


def point_name(kind: str, point: dict[str, int]) -> str:
    """``IVF64,Flat nprobe=8``: the kind and its swept value."""
    return " ".join([kind] + [f"{k}={v}" for k, v in point.items()])


def score_index(problem: Problem, exact: Exact, settings: IndexSettings,
                score: ScoreSettings) -> tuple[list[dict[str, Any]], list[pd.DataFrame]]:
    """Build, search and score every operating point of ``settings.kinds``.

    Returns
    -------
    (points, tables)
        One dict per point (see docs/index.md for every key) and its per-query table, in kind then sweep order.
    """
    n, m = problem.queries.shape[0], problem.gallery.shape[0]
    planned = check_kinds(settings, problem.gallery.shape[1])
    depth = min(settings.depth or needed_depth(score.metrics, score.ks, exact, m), m)
    cut = truncated(score.metrics, depth, exact)
    extra = int(exclusion_bound(problem.own, problem.exclude).max(initial=0))
    asked = min(depth + extra, m)
    threads = settings.threads or os.cpu_count() or 1
    one = min(settings.single_thread_queries, n)
    R, M = (exact.table[c].to_numpy(dtype=np.int64) for c in ("num_positives", "num_retrievable"))
    points: list[dict[str, Any]] = []
    tables: list[pd.DataFrame] = []
    with Progress(sum(len(p) for _, p in planned), "index points", "point", log) as bar:
        for kind, kind_points in planned:
            use_train = kind.needs_training and problem.train.shape[0] > 0
            trained_on = ((f"train split ({len(problem.train)} rows)" if use_train else
                           "gallery (no train split)") if kind.needs_training else "none (no training)")
            built = kinds_mod.build(kind, problem.gallery, problem.train if use_train else problem.gallery,
                                    settings.build_threads, settings.seed)
            log.info("%s built in %.2f s (%d bytes), trained on %s", kind.name, built.build_seconds,
                     built.memory_bytes, trained_on)
            for point in kind_points:
                ids, scores, seconds, ran = kinds_mod.search(built, problem.queries, asked, point, threads)
                one_seconds = kinds_mod.search(built, problem.queries[:one], asked, point, 1)[2]
                order_scores, order = ordering_scores(problem, ids, scores)
                columns, _ = ranked_lists(ids, order_scores, problem.own, problem.exclude, depth)
                values = label_values(columns, problem.query_codes, problem.gallery_codes, R, M, score.metrics,
                                      score.ks)
                entry: dict[str, Any] = {
                    "point": point_name(kind.name, point), "kind": kind.name, "library": kind.library,
                    "param": next(iter(point), None), "value": next(iter(point.values()), None),
                    "effective_value": next(iter(ran.values()), None),
                    "trained_on": trained_on, "build_seconds": built.build_seconds,
                    "memory_bytes": built.memory_bytes, "queries_per_second": n / max(seconds, 1e-12),
                    "queries_per_second_one_thread": one / max(one_seconds, 1e-12), "threads": threads,
                    "depth": depth, "searched_k": asked, "order": order, "short_lists": short_lists(columns, M),
                    "truncated_metrics": cut}
                entry.update(knn_recalls(problem, exact, columns, score.ks))
                entry.update(paired(values, exact, score, settings.margin, cut))
                points.append(entry)
                tables.append(per_query_table(exact, values))
                bar.update(1)
    return points, tables


def cheapest(points: Sequence[dict[str, Any]]) -> str | None:
    """The non-inferior point with the most queries/s (every thread), or None."""
    good = [p for p in points if p["non_inferior"]]
    return max(good, key=lambda p: p["queries_per_second"])["point"] if good else None


def summary_rows(points: Sequence[dict[str, Any]], metrics: Sequence[str], ks: Sequence[int]) -> pd.DataFrame:
    """One row per point for ``dvc plots``: kind, value, queries/s, k-NN recall@max(ks) and each label metric."""
    keys = metric_keys(metrics, ks)
    k = max(ks)
    columns = ["point", "kind", "param", "value", "queries_per_second", "queries_per_second_one_thread",
               "build_seconds", "memory_bytes", f"knn_recall@{k}_ann_benchmarks", f"knn_recall@{k}_big_ann_benchmarks"]
    columns += keys + [f"delta_{key}" for key in keys] + ["non_inferior"]
    return pd.DataFrame([{c: p.get(c) for c in columns} for p in points], columns=columns)
