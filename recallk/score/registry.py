"""The metric registry: one pure function per metric and one table, :data:`TABLE`.

Each row (:class:`Metric`) names a metric, its function and the ranks it reads (:class:`~recallk.score.passes.Ranks`);
the metric names (:data:`METRICS`, the rule of ``metrics=`` / ``score.metrics``), the first-rank-only
set (:data:`FIRST_ONLY`), the engine pass that serves a set of metrics (:func:`serving_pass`) and the
dispatch of :func:`recallk.score.metrics.per_query` all come from the table, read when called. A new metric
is one function and one row.

Every function takes a :class:`Span` (the ranks of a run of queries) and returns one value per query of it
(float64, or bool for a hit; queries without positives are set to NaN by the caller). A per-K metric
(``per_k``) is called once per K, ``compute(span, k)``, and reported as ``name@K``; its value at K reads
only ranks below K, so a first rank capped at ``max(ks)`` serves it. A first-rank metric that is not per-K
(MRR) reads the exact first rank, so no pass serving it is capped.

Notation (the formulas of :mod:`recallk.score.metrics`): for a query, :math:`M` items it may retrieve,
:math:`R` positives among them, :math:`r_1 < \\dots < r_R` their 1-based ranks.

No import but numpy and the errors: the settings read this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from recallk.checks import as_list, checker
from recallk.errors import did_you_mean, quote
from recallk.score.passes import Pass, Ranks


class Span:
    """The ranks a metric reads for a run of ``n`` queries.

    Parameters
    ----------
    first : ndarray
        (n,) each query's 0-based first-positive rank, -1 without positives.
    n_positives, n_retrievable : ndarray
        (n,) :math:`R` and :math:`M` per query.
    listed : ndarray, optional
        (n,) positives listed per query (:math:`R`, or fewer within a depth); None for a first-positive
        ranking, whose spans serve only ``Ranks.FIRST`` metrics.
    ranks : ndarray, optional
        The listed positives' 0-based ranks, query after query, ascending within each (``listed`` of each).
    """

    def __init__(self, first: np.ndarray, n_positives: np.ndarray, n_retrievable: np.ndarray,
                 listed: np.ndarray | None = None, ranks: np.ndarray | None = None) -> None:
        self.first, self.n_positives, self.n_retrievable = first, n_positives, n_retrievable
        self.listed, self._ranks = listed, ranks

    @property
    def n(self) -> int:
        return self.first.size

    @cached_property
    def rank(self) -> np.ndarray:
        """Each listed positive's 1-based rank :math:`r_j` (float64)."""
        return self._ranks + 1.0

    @cached_property
    def owner(self) -> np.ndarray:
        """The query (0..n-1) of each listed positive."""
        return np.repeat(np.arange(self.n), self.listed)

    @cached_property
    def position(self) -> np.ndarray:
        """Each listed positive's 1-based place :math:`j` among its query's positives (float64)."""
        listed = self.listed
        return np.arange(self._ranks.size) - np.repeat(np.cumsum(listed) - listed, listed) + 1.0

    @cached_property
    def positives_each(self) -> np.ndarray:
        """:math:`R` of the query of each listed positive."""
        return np.repeat(self.n_positives, self.listed)

    @cached_property
    def safe_positives(self) -> np.ndarray:
        """(n,) :math:`\\max(R, 1)`, the divisor of the per-positive means."""
        return np.maximum(self.n_positives, 1)

    def per_query(self, weights: np.ndarray) -> np.ndarray:
        """(n,) the sum of ``weights`` (one per listed positive) over each query's positives."""
        return np.bincount(self.owner, weights=weights, minlength=self.n)


# ------------------------------------------------------------------------------------------ the metrics


def recall(span: Span, k: int) -> np.ndarray:
    """recall@K (hit rate): :math:`\\mathbb{1}[r_1 \\le K]`."""
    return span.first < k


def precision(span: Span, k: int) -> np.ndarray:
    """precision@K: :math:`|\\{j : r_j \\le K\\}| / \\min(K, M)`."""
    return span.per_query((span.rank <= k).astype(np.float64)) / np.maximum(np.minimum(k, span.n_retrievable), 1)


def r_precision(span: Span) -> np.ndarray:
    """R-precision: :math:`|\\{j : r_j \\le R\\}| / R`."""
    return span.per_query((span.rank <= span.positives_each).astype(np.float64)) / span.safe_positives


def map_at_r(span: Span) -> np.ndarray:
    """MAP@R (Musgrave et al. 2020): :math:`\\frac{1}{R} \\sum_{j : r_j \\le R} j / r_j`."""
    return span.per_query(np.where(span.rank <= span.positives_each, span.position / span.rank, 0.0)) \
        / span.safe_positives


def average_precision(span: Span) -> np.ndarray:
    """Average precision over the full ranking: :math:`\\frac{1}{R} \\sum_{j=1}^{R} j / r_j`."""
    return span.per_query(span.position / span.rank) / span.safe_positives


def reciprocal_rank(span: Span) -> np.ndarray:
    """Reciprocal rank: :math:`1 / r_1`."""
    return 1.0 / (np.maximum(span.first, 0.0) + 1.0)


@dataclass(frozen=True)
class Metric:
    """One row of :data:`TABLE`.

    Attributes
    ----------
    name : str
        The name of ``metrics=`` / ``score.metrics``.
    compute : callable
        ``compute(span, k)`` for a per-K metric, else ``compute(span)``: one value per query (:class:`Span`).
    ranks : Ranks
        The ranks it reads: the first positive's, those within the top ``max(R, max(ks))``, or every one.
    per_k : bool
        One key per K (``name@K``); its value at K reads only ranks below K.
    """

    name: str
    compute: Callable[..., np.ndarray]
    ranks: Ranks
    per_k: bool = False

    def keys(self, ks: Iterable[int]) -> list[str]:
        """Its keys at ``ks``, in report order."""
        return [f"{self.name}@{k}" for k in ks] if self.per_k else [self.name]

    @property
    def exact_first(self) -> bool:
        """Reads the exact first rank at any depth (a first-rank metric that is not per-K: MRR)."""
        return self.ranks is Ranks.FIRST and not self.per_k


#: Every metric, in report order.
TABLE: tuple[Metric, ...] = (
    Metric("recall", recall, Ranks.FIRST, per_k=True),
    Metric("precision", precision, Ranks.TOP, per_k=True),
    Metric("r_precision", r_precision, Ranks.TOP),
    Metric("map@r", map_at_r, Ranks.TOP),
    Metric("map", average_precision, Ranks.EVERY),
    Metric("mrr", reciprocal_rank, Ranks.FIRST),
)


def names() -> tuple[str, ...]:
    """The names of :data:`TABLE` as it is now, in report order."""
    return tuple(m.name for m in TABLE)


def rows(metrics: Iterable[str], table: Sequence[Metric] | None = None) -> list[Metric]:
    """The rows of ``metrics`` (names already checked, :func:`check_metrics`), in the order given, from ``table``
    (default: :data:`TABLE` as it is now)."""
    by_name = {m.name: m for m in (TABLE if table is None else table)}
    return [by_name[name] for name in metrics]


#: Metric names of ``metrics=`` / ``score.metrics`` (the table at import; the rules read the table).
METRICS = names()
#: Metrics that read only each query's first positive (a cheaper ranking pass).
FIRST_ONLY = frozenset(m.name for m in TABLE if m.ranks is Ranks.FIRST)


def metric_keys(metrics: Sequence[str], ks: Sequence[int]) -> list[str]:
    """Flat keys in report order: ``name@K`` per K for a per-K metric (recall, precision), the others once."""
    return _keys_of(rows(metrics), ks)


def _keys_of(needed: Sequence[Metric], ks: Sequence[int]) -> list[str]:
    return [key for m in needed for key in m.keys(ks)]


def serving_pass(metrics: Sequence[str], depth: int, capped: bool = False) -> Pass:
    """The cheapest engine pass that serves ``metrics`` at Ks up to ``depth`` (``max(ks)``).

    ``capped``: first ranks of ``depth`` or more may read ``depth`` (the Python API, which reports the
    metrics alone), unless a metric reads the exact first rank (MRR) or every rank (full MAP). The score
    stage's tables read first ranks beyond ``max(ks)`` (the recall curve), so it ranks uncapped.
    """
    return _pass_of(rows(metrics), depth, capped)


def _pass_of(needed: Sequence[Metric], depth: int, capped: bool) -> Pass:
    ranks = max((m.ranks for m in needed), default=Ranks.FIRST)
    cap = depth if capped and not any(m.exact_first for m in needed) else None
    if ranks is Ranks.FIRST:
        return Pass.first(cap)
    if ranks is Ranks.TOP:
        return Pass.top(depth, cap)
    return Pass.every()


def keys_and_pass(metrics: tuple[str, ...], ks: tuple[int, ...]) -> tuple[list[str], Pass]:
    """:func:`metric_keys` and the capped :func:`serving_pass` (the Python API's) of checked settings: ``metrics``
    and ``ks`` as :class:`~recallk.score.settings.ScoreSettings` holds them (tuples of names and of ints).

    Memoized (``functools.lru_cache``, :func:`_keys_and_pass`): both are pure functions of :data:`TABLE` and the two
    tuples, and a :class:`~recallk.score.passes.Pass` is immutable, so a training loop's call derives them once,
    not per batch. The table is part of the key, by identity (a patched table has entries of its own)."""
    keys, ranks = _keys_and_pass(_Same(TABLE), metrics, ks)
    return list(keys), ranks


class _Same:
    """A key that is its object by identity (hashing a table of rows would cost more than the derivation); it holds
    the object, so the id in a cache key cannot name another one while the entry lives."""

    __slots__ = ("of",)

    def __init__(self, of: Any) -> None:
        self.of = of

    def __hash__(self) -> int:
        return id(self.of)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.of is self.of


@lru_cache(maxsize=256)
def _keys_and_pass(table: _Same, metrics: tuple[str, ...], ks: tuple[int, ...]) -> tuple[tuple[str, ...], Pass]:
    """:func:`keys_and_pass` of the table ``table.of``, computed (the cache's one function)."""
    needed = rows(metrics, table.of)
    return tuple(_keys_of(needed, ks)), _pass_of(needed, max(ks), capped=True)


# ------------------------------------------------------------------------------------------ the rule


def metrics_problem(v: Any) -> str | None:
    """A non-empty list of distinct names of :data:`TABLE`."""
    known = names()
    if not isinstance(v, list) or not v or not all(isinstance(m, str) for m in v) or len(set(v)) != len(v):
        return f"must be distinct names from {', '.join(known)}. Got {quote(v)} instead."
    bad = [m for m in v if m not in known]
    if bad:
        return (f"must be distinct names from {', '.join(known)}. Got {quote(v)} instead."
                f"{did_you_mean(bad[0], known)}")
    return None


def _all_if_none(metrics: Any) -> Any:
    return list(names()) if metrics is None else as_list(metrics)


#: ``metrics``: :func:`metrics_problem`, the rule of ``score.metrics``; ``None`` means all of them.
check_metrics = checker("metrics", metrics_problem, prepare=_all_if_none)
