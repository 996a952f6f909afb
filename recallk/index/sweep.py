"""The index stage's computation: every operating point of every kind, measured and paired with the exact run.

:func:`score_index` takes the unit rows of the queries, gallery and training rows, the exclusion rules as
codes, the exact run (:class:`Exact`: the score stage's per-query table and top neighbours, so the exact
ranking is read, never computed twice) and the settings; it returns one entry per operating point and each
point's per-query table. Per point: build seconds, index bytes, queries/s on every thread and on one, the k-NN
recall under both definitions (:mod:`recallk.index.knn`), each label metric from the index's own lists
(:mod:`recallk.index.lists`), its paired Δ against exact with the bootstrap interval, McNemar for recall@K
(:mod:`recallk.stats.inference`) and the non-inferiority verdict against ``index.margin``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
import pandas as pd

from recallk.errors import InputError
from recallk.index import kinds as kinds_mod
from recallk.index.knn import ann_benchmarks_recall, big_ann_benchmarks_recall
from recallk.index.lists import exclusion_bound, label_values, ranked_lists, short_lists, undetermined
from recallk.index.settings import IndexSettings, index_settings
from recallk.progress import Progress
from recallk.score.ranking.scan import exact_pairs
from recallk.score.registry import metric_keys
from recallk.score.settings import ScoreSettings
from recallk.score.similarity import float32_dot_error_bound
from recallk.score.tables import compact_per_query
from recallk.stats import inference as stats
from recallk.stats import mean
from recallk.stats.resample import percentile_interval
from recallk.tables_contract import per_query_column

log = logging.getLogger(__name__)

#: Metrics whose lists must reach every positive (``R``) for exact values.
TO_R = ("r_precision", "map@r")


@dataclass(frozen=True, eq=False)
class IndexProblem:
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
    r_precision or map@r is scored, at most the gallery. A metric that reads deeper for some query (map, mrr)
    is reported for a point only where its lists give it exactly (:func:`recallk.index.lists.undetermined`)."""
    depth = max(ks)
    if any(m in TO_R for m in metrics):
        depth = max(depth, int(exact.table["num_positives"].max()))
    return max(1, min(depth, n_gallery))


def check_kinds(settings: IndexSettings, dim: int) -> list[tuple[kinds_mod.Kind, list[dict[str, int]]]]:
    """Every kind of ``settings`` with its points, checked before any work (one InputError for the first fault)."""
    kinds = [kinds_mod.parse_kind(name, dim) for name in settings.kinds]
    sweep = {name: getattr(settings.sweep, name) for name in ("nprobe", "efSearch", "ef")}
    unused = kinds_mod.unused_sweep(kinds, sweep)
    if unused:
        raise InputError(unused)
    return [(kind, kinds_mod.points(kind, sweep)) for kind in kinds]


def exact_columns(exact: Exact, keys: Sequence[str]) -> dict[str, np.ndarray]:
    """Each metric's exact per-query values (float64, NaN for a query without a positive), read once."""
    return {key: pd.to_numeric(exact.table[per_query_column(key)], errors="coerce").to_numpy(dtype=np.float64)
            for key in keys}


def paired(index_values: dict[str, np.ndarray], exact: Exact, score: ScoreSettings, margin: float,
           exact_values: dict[str, np.ndarray] | None = None, counts_cache: dict | None = None) -> dict[str, Any]:
    """Each metric's mean, Δ against exact with its paired interval (``score.bootstrap``'s resamples, level, seed
    and unit), McNemar for recall@K, and the verdict: non-inferior when every interval's low end is above
    ``-margin`` (and some metric is reported: ``index_values`` holds only those the lists give exactly).
    ``exact_values`` (:func:`exact_columns`) and ``counts_cache`` (the bootstrap's counts,
    :func:`recallk.stats.inference.bootstrap_deltas`) serve every point of a sweep."""
    boot = score.bootstrap
    table = exact.table
    labels = table["label"].astype(str).to_numpy()
    exact_values = exact_values if exact_values is not None else exact_columns(exact, list(index_values))
    out: dict[str, Any] = {}
    deltas: dict[str, np.ndarray] = {}
    pairs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for key, values in index_values.items():
        kept = ~np.isnan(exact_values[key])  # the queries with a positive: the same for every metric
        pairs[key] = exact_values[key][kept], np.asarray(values, dtype=np.float64)[kept]  # full values both
        deltas[key] = pairs[key][1] - pairs[key][0]
    # recallk compare's paired bootstrap (stats.bootstrap_deltas), once for every metric: the same resamples
    # serve every column, so the intervals are those stats.paired_bootstrap_ci gives metric by metric
    groups = labels[kept] if boot.unit == "label" and pairs else None
    means: dict[str, np.ndarray] = {}
    if boot.resamples and deltas:
        draws = stats.bootstrap_deltas(np.column_stack(list(deltas.values())), boot.resamples, boot.seed, groups,
                                       counts_cache=counts_cache)
        means = dict(zip(deltas, draws.T))
    verdict = True
    for key, (a, b) in pairs.items():
        value = mean(b)
        out[key] = value
        out[f"delta_{key}"] = value - mean(a)
        low, high = percentile_interval(means[key], boot.confidence) if means else (out[f"delta_{key}"],) * 2
        out[f"delta_{key}_ci_low"], out[f"delta_{key}_ci_high"] = low, high
        verdict &= low > -margin
        if key.startswith("recall@"):
            p, lost, gained = stats.mcnemar_exact(a > 0, b > 0)
            out[f"mcnemar_p_{key}"], out[f"lost_{key}"], out[f"gained_{key}"] = p, lost, gained
    out["non_inferior"] = bool(verdict) and bool(pairs)  # a point with no metric reported is not judged good
    return out


def returned_cosines(problem: IndexProblem, ids: np.ndarray) -> np.ndarray:
    """(n, k) float32 the exact cosine of each returned gallery row (the exact engine's, ``exact_pairs``), NaN
    where the index returned none (-1): computed once per point, for its order and its k-NN recall."""
    line, col = np.nonzero(ids >= 0)
    exact = np.full(ids.shape, np.nan, dtype=np.float32)
    exact[line, col] = exact_pairs(problem.queries, problem.gallery, line, ids[line, col])
    return exact


def order_tolerance(problem: IndexProblem) -> float:
    """How far an uncompressed index's float32 score may lie from the exact cosine: twice the float32 product's
    bound, and the exact value's own rounding."""
    return 2 * float32_dot_error_bound(problem.gallery.shape[1]) + 2.0**-22


def ordering_scores(problem: IndexProblem, ids: np.ndarray, scores: np.ndarray,
                    exact: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """The scores a point's lists are ordered by, and which: the exact cosines of the returned items
    (``exact``, :func:`returned_cosines`) when the index's own scores are all within float32 rounding of them
    (uncompressed vectors: Flat, IVF-Flat, HNSW, hnswlib), so that rounding noise never reorders what the exact
    engine orders (its total order: exact cosine, ties by gallery row); else (PQ, SQ, ... : approximate scores)
    the index's own."""
    exact = returned_cosines(problem, ids) if exact is None else exact
    valid = ids >= 0
    tol = order_tolerance(problem)
    gap = np.abs(np.subtract(exact, scores, dtype=np.float64))
    if valid.any() and float(gap.max(where=valid, initial=0.0)) <= tol:
        return exact, "exact cosine (the index's scores are exact up to float32 rounding)"
    return scores, "the index's own scores"


def knn_recalls(problem: IndexProblem, exact: Exact, columns: np.ndarray, ks: Sequence[int],
                column_cosines: np.ndarray | None = None) -> dict[str, Any]:
    """k-NN recall@K of the lists ``columns`` under both definitions, at each K the exact table holds
    (``column_cosines``: the exact cosines of ``columns``, NaN at -1, when the caller has them)."""
    out: dict[str, Any] = {}
    top = min(columns.shape[1], exact.neighbor_rows.shape[1])
    run = columns[:, :top]
    if column_cosines is None:
        column_cosines = returned_cosines(problem, run)
    run_scores = column_cosines[:, :top]
    true_distances = 1.0 - exact.neighbor_scores.astype(np.float64)  # the whole table: ties run past max(ks)
    for k in (k for k in ks if k <= top):
        ann = ann_benchmarks_recall(exact.neighbor_scores, run_scores, k)
        big, tied = big_ann_benchmarks_recall(exact.neighbor_rows, true_distances, run, k)
        out[f"knn_recall@{k}_ann_benchmarks"] = mean(ann[~np.isnan(ann)])
        out[f"knn_recall@{k}_big_ann_benchmarks"] = mean(big)
        out[f"knn_tied_queries@{k}"] = tied
    return out


def point_name(kind: str, point: dict[str, int]) -> str:
    """``IVF64,Flat nprobe=8``: the kind and its swept value."""
    return " ".join([kind] + [f"{k}={v}" for k, v in point.items()])


@dataclass(frozen=True, eq=False)
class Shared:
    """What every point of a sweep scores against, computed once: the margin, the exact per-query values
    (:func:`exact_columns`), the bootstrap's counts (filled by the first point) and each query's R and M."""

    margin: float
    exact_values: dict[str, np.ndarray]
    counts: dict
    n_positives: np.ndarray
    n_retrievable: np.ndarray


def score_answers(problem: IndexProblem, exact: Exact, answer: Answer, score: ScoreSettings,
                  shared: Shared) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """What a point reports that follows from its ``answer`` (not its timings): the order, the short lists, the
    k-NN recall, each metric its lists give exactly (:func:`recallk.index.lists.undetermined`; the others are
    named in ``unreported_metrics``) paired with exact; and those metrics' per-query values."""
    lists = answer.lists
    columns = lists.columns
    values = label_values(columns, problem.query_codes, problem.gallery_codes, shared.n_positives,
                          shared.n_retrievable, score.metrics, score.ks)
    unreported = undetermined(columns, problem.query_codes, problem.gallery_codes, shared.n_positives,
                              shared.n_retrievable, answer.exhausted, score.metrics, score.ks)
    values = {key: v for key, v in values.items() if key not in unreported}
    result: dict[str, Any] = {"order": lists.order, "short_lists": short_lists(columns, shared.n_retrievable),
                              "tie_extended_queries": answer.extended, "unreported_metrics": unreported}
    result.update(knn_recalls(problem, exact, columns, score.ks, lists.column_cosines))
    result.update(paired(values, exact, score, shared.margin, shared.exact_values, shared.counts))
    return result, values


@dataclass(frozen=True, eq=False)
class Lists:
    """A point's ranked lists (:func:`ranked_lists`, ``(n, depth)``): gallery rows and their exact cosines, the
    order they follow (:func:`ordering_scores`) and, per list, its ``depth``-th item's score in that order (NaN
    for a short list)."""

    columns: np.ndarray
    column_cosines: np.ndarray
    order: str
    cut: np.ndarray


def lists_of(problem: IndexProblem, ids: np.ndarray, scores: np.ndarray, depth: int) -> Lists:
    """The ranked lists of the answers ``ids``, ``scores``; the exact cosines of the answers are computed once and
    serve the order, the cut and the k-NN recall."""
    cosines = returned_cosines(problem, ids)
    order_scores, order = ordering_scores(problem, ids, scores, cosines)
    columns, column_cosines = ranked_lists(ids, order_scores, problem.own, problem.exclude, depth, cosines)
    listed = column_cosines if order_scores is cosines else ranked_lists(ids, order_scores, problem.own,
                                                                          problem.exclude, depth)[1]
    return Lists(columns, column_cosines, order, listed[:, depth - 1].astype(np.float64))


def relisted(problem: IndexProblem, lists: Lists, sub: np.ndarray, ids: np.ndarray, scores: np.ndarray,
             depth: int) -> Lists:
    """``lists`` with the rows ``sub`` ranked again from their new answers (``ids``, ``scores``: every row): only
    those rows' cosines are computed, unless their answers change the order the point's lists follow (then all)."""
    part = replace(problem, queries=problem.queries[sub], query_codes=problem.query_codes[sub], own=problem.own[sub],
                   exclude=[(qc[sub], gc) for qc, gc in problem.exclude])
    new = lists_of(part, ids[sub], scores[sub], depth)
    if new.order != lists.order:
        return lists_of(problem, ids, scores, depth)
    columns, column_cosines, cut = lists.columns.copy(), lists.column_cosines.copy(), lists.cut.copy()
    columns[sub], column_cosines[sub], cut[sub] = new.columns, new.column_cosines, new.cut
    return Lists(columns, column_cosines, lists.order, cut)


@dataclass(frozen=True, eq=False)
class Answer:
    """A point's answers: gallery rows and the index's scores (``(n, width)``; -1 / NaN pad), their lists, the
    seconds the searches took, the point as it ran, which queries the index had no more items for
    (``exhausted``) and how many were asked again, deeper, past a tie at the cut (``extended``)."""

    ids: np.ndarray
    scores: np.ndarray
    lists: Lists
    seconds: float
    ran: dict[str, int]
    exhausted: np.ndarray
    extended: int


def open_cuts(problem: IndexProblem, ids: np.ndarray, scores: np.ndarray, lists: Lists,
              width: np.ndarray) -> np.ndarray:
    """(n,) the queries whose answer may end inside a tie at the cut: the index returned all ``width`` items asked,
    and its last score is not strictly below the ``depth``-th list item's (``lists.cut``, in the order the lists
    follow; exact cosines compared with the float32 tolerance that order allows), so an item it did not return
    may tie with, or outrank, one the list holds."""
    returned = np.count_nonzero(ids >= 0, axis=1)
    last = np.min(np.where(ids >= 0, scores, np.inf), axis=1, initial=np.inf).astype(np.float64)
    tol = order_tolerance(problem) if lists.order.startswith("exact") else 0.0
    return (returned >= width) & ~np.isnan(lists.cut) & (last >= lists.cut - tol)


def search_past_cut(built: kinds_mod.Built, problem: IndexProblem, asked: int, point: dict[str, int], threads: int,
                    depth: int) -> Answer:
    """Search every query for ``asked`` items, then ask the queries whose answer ends inside a tie at the cut
    (:func:`open_cuts`) again for twice as many, until the last returned score is strictly below the cut or the
    gallery is asked: so an exact index (``Flat``) lists the tie group as the exact engine does (exact cosine,
    ties by gallery row) and every Δ is 0."""
    m = problem.gallery.shape[0]
    ids, scores, seconds, ran = kinds_mod.search(built, problem.queries, asked, point, threads)
    width = np.full(len(ids), ids.shape[1])
    extended = np.zeros(len(ids), dtype=bool)
    lists = lists_of(problem, ids, scores, depth)
    todo = open_cuts(problem, ids, scores, lists, width)
    while todo.any() and ids.shape[1] < m:
        k = min(2 * ids.shape[1], m)
        sub = np.flatnonzero(todo)
        more_ids, more_scores, more_seconds, _ = kinds_mod.search(built, problem.queries[sub], k, point, threads)
        ids = np.pad(ids, ((0, 0), (0, k - ids.shape[1])), constant_values=-1)
        scores = np.pad(scores, ((0, 0), (0, k - scores.shape[1])), constant_values=np.nan)
        ids[sub], scores[sub], width[sub] = more_ids, more_scores, k
        seconds += more_seconds
        extended[sub] = True
        lists = relisted(problem, lists, sub, ids, scores, depth)
        todo = open_cuts(problem, ids, scores, lists, width)
    exhausted = np.count_nonzero(ids >= 0, axis=1) < width
    return Answer(ids, scores, lists, seconds, ran, exhausted, int(np.count_nonzero(extended)))


def warn_below_k(kind: str, points: Sequence[dict[str, Any]], asked: int) -> None:
    """One warning per kind whose swept ``efSearch`` / ``ef`` values ran at the ``asked`` items instead (FAISS
    HNSW and hnswlib search with ``max(value, k)``: such points repeat one another), naming the param."""
    below = [p for p in points if p["param"] in ("efSearch", "ef") and p["effective_value"] != p["value"]]
    if below:
        log.warning("`index.sweep.%s`: %s searches with at least the %d items each query asks for (the depth plus "
                    "the excluded items), so %s %s ran at %d, the same search; sweep values above %d to see a "
                    "difference", below[0]["param"], kind, asked, below[0]["param"],
                    ", ".join(str(p["value"]) for p in below), below[0]["effective_value"], asked)


def score_index(problem: IndexProblem, exact: Exact, settings: IndexSettings,
                score: ScoreSettings) -> tuple[list[dict[str, Any]], list[pd.DataFrame]]:
    """Build, search and score every operating point of ``settings.kinds``.

    ``settings`` is checked first, by the params check's rules (:func:`~recallk.index.settings.index_settings`: one
    InputError naming every param out of bounds), so a settings object made in Python meets them too.

    Returns
    -------
    (points, tables)
        One dict per point (see docs/index.md for every key) and its per-query table, in kind then sweep order.
    """
    settings = index_settings(settings)
    n, m = problem.queries.shape[0], problem.gallery.shape[0]
    planned = check_kinds(settings, problem.gallery.shape[1])
    depth = min(settings.depth or needed_depth(score.metrics, score.ks, exact, m), m)
    extra = int(exclusion_bound(problem.own, problem.exclude).max(initial=0))
    asked = min(depth + extra + 1, m)  # one past the cut: a tie there shows (search_past_cut)
    threads = settings.threads or os.cpu_count() or 1
    one = min(settings.single_thread_queries, n)
    shared = Shared(settings.margin, exact_columns(exact, metric_keys(score.metrics, score.ks)), {},
                    *(exact.table[c].to_numpy(dtype=np.int64) for c in ("num_positives", "num_retrievable")))
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
            answers: dict[tuple, tuple[Answer, dict[str, Any], dict[str, np.ndarray]]] = {}
            for point in kind_points:
                answer = search_past_cut(built, problem, asked, point, threads, depth)
                ran, seconds = answer.ran, answer.seconds
                one_seconds = kinds_mod.search(built, problem.queries[:one], asked, point, 1)[2]
                same = answers.get(tuple(sorted(ran.items())))
                if (same is not None and np.array_equal(same[0].ids, answer.ids)
                        and np.array_equal(same[0].scores, answer.scores, True)):
                    result, values = same[1], same[2]  # the point ran as an earlier one: the same answers
                else:
                    result, values = score_answers(problem, exact, answer, score, shared)
                    answers[tuple(sorted(ran.items()))] = answer, result, values
                entry: dict[str, Any] = {
                    "point": point_name(kind.name, point), "kind": kind.name, "library": kind.library,
                    "param": next(iter(point), None), "value": next(iter(point.values()), None),
                    "effective_value": next(iter(ran.values()), None),
                    "trained_on": trained_on, "build_seconds": built.build_seconds,
                    "memory_bytes": built.memory_bytes, "queries_per_second": n / max(seconds, 1e-12),
                    "queries_per_second_one_thread": one / max(one_seconds, 1e-12), "threads": threads,
                    "depth": depth, "searched_k": asked, **result}
                points.append(entry)
                tables.append(compact_per_query(exact.table, values))  # the score stage's compact format
                bar.update(1)
            warn_below_k(kind.name, points[len(points) - len(kind_points):], asked)
    return points, tables


#: The keys of a point that are measurements (they differ run to run), kept apart from its results.
TIMING_KEYS = ("build_seconds", "queries_per_second", "queries_per_second_one_thread", "threads")


def split_timings(points: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Each point's results (every key but :data:`TIMING_KEYS`: the same for the same inputs, byte for byte)
    and, by point name, its timings."""
    results = [{k: v for k, v in p.items() if k not in TIMING_KEYS} for p in points]
    return results, {p["point"]: {k: p[k] for k in TIMING_KEYS} for p in points}


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
