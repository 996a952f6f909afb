"""The evaluator of a training loop: :class:`Evaluator`, built once from the ``score`` settings and the validation
set, called with each epoch's embeddings; what one call says, :class:`~recallk.training.decisions.EpochResult`,
and the decisions' settings live in :mod:`recallk.training.decisions`.

Each call is the score stage's computation on the epoch's embeddings (the same ranking pass, means, per-query
values and bootstrap intervals, drawn in the same order: :func:`recallk.score.suite.score_split`'s parts), so
its numbers equal ``python -m stages.score`` on those embeddings bit for bit. The decisions read the per-query
values of the monitored metric: an epoch is the new best only when the paired bootstrap interval of its Δ
against the best so far (the same queries) lies above zero (:func:`recallk.stats.inference.paired_bootstrap_ci`),
and ``should_stop`` says when ``patience`` evaluations passed without progress.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import os
from dataclasses import asdict, replace
from typing import Any, Iterable, Sequence

import numpy as np

from recallk.checks import check_exclude_pairs
from recallk.errors import InputError, quote
from recallk.score import tables
from recallk.score.metrics import Scorer
from recallk.score.registry import serving_pass
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import ScoreSettings
from recallk.score.values import summarize
from recallk.stats.inference import paired_bootstrap_ci
from recallk.stats.resample import content_order
from recallk.training import layout, live
from recallk.training.decisions import DecisionSettings, EpochResult, decision_settings

__all__ = ["DecisionSettings", "EpochResult", "Evaluator"]

def _is_tensor(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _rows_of(x: Any, name: str) -> int:
    shape = getattr(x, "shape", None)
    if shape is None:
        x = np.asarray(x)
        shape = x.shape
    if len(shape) != 2:
        raise InputError(f"`{name}` must be a 2-D array (one row per item). Got shape {tuple(shape)} instead.")
    return int(shape[0])


def _bad_rows(x: Any) -> np.ndarray:
    """The rows of ``x`` (a numpy array or a torch tensor, on its device) holding NaN or inf."""
    if _is_tensor(x):
        return (~x.detach().isfinite().all(dim=1)).nonzero().flatten().cpu().numpy()
    values = np.asarray(x)
    if values.dtype.kind not in "fc":  # integers are finite; other types are refused by the engine's own check
        return np.empty(0, dtype=np.int64)
    return np.flatnonzero(~np.isfinite(values).all(axis=1))


def _take(x: Any, rows: np.ndarray) -> Any:
    """Rows ``rows`` of ``x``, a numpy array or a torch tensor (indexed where it lives)."""
    if _is_tensor(x):
        import torch

        return x[torch.as_tensor(rows, device=x.device)]
    return np.asarray(x)[rows]


class Evaluator:
    """Retrieval metrics of a validation set after every epoch, with the decisions a fine-tune needs and the
    numbers logged where DVC users look.

    Parameters
    ----------
    query_labels : sequence of length n_queries
    gallery_labels : sequence of length n_gallery, optional
        None: leave-one-out, the queries are the gallery (each retrieves the others).
    query_ids, gallery_ids : sequences, optional
        Both or neither, as for :func:`recallk.retrieval_metrics`; they name the queries in the per-query tables
        and order the bootstrap's draws (the score stage's order for a catalog without files). Leave-one-out: the
        ids of the one set (``query_ids``; default ``0 .. n-1``, so no query retrieves itself).
    exclude : sequence of (query values, gallery values), optional
        As for :func:`recallk.retrieval_metrics` (``score.exclude_same``); leave-one-out: both sides the one set's.
    settings : ScoreSettings, optional
        What is measured and how (``ks``, ``metrics``, ``bootstrap``, ``max_memory_mb``, ``backend``, ``device``,
        ``engine``); ``bootstrap.resamples`` must be positive (the decisions read intervals).
    ks, metrics, max_memory_mb, backend, device : optional
        Override the field of ``settings`` of that name (as :class:`recallk.Scorer`).
    monitor : str, optional
        The metric key the best epoch and the stop read; default ``map@r`` when measured, else the first key.
    patience : int, optional
        Evaluations without progress after which ``should_stop`` is True; None (default): never.
    stop_rule : {"significant", "plain"}
        ``significant``: progress is a new best epoch (Δ's paired interval above zero), so the loop stops after
        ``patience`` evaluations without a significant improvement; ``plain``: progress is a mean above the
        reference by more than ``min_delta``, and the reference is the mean of the last progress (Lightning's and
        Keras' EarlyStopping: rises smaller than ``min_delta`` add up until they count).
    min_delta : float
        ``plain`` only.
    subsample : int, optional
        Score a fixed subsample of this many queries, drawn once with ``seed``, the same every epoch (so epochs
        stay paired); the gallery stays whole. Its intervals are wider: :attr:`subsample_widening`.
    seed : int
    log : dvclive.Live, str, os.PathLike or None
        Where each epoch's values go (:mod:`recallk.training.live`): a ``dvclive.Live`` (its step set to the
        epoch), or a folder (DVCLive's files: through ``dvclive.Live`` when installed, else written here);
        each epoch's per-query table goes to ``per_query/`` inside it. None: nothing written.

    Raises
    ------
    InputError
        A bad setting or argument, named like it; labels, ids or exclusions that do not fit together.

    Attributes
    ----------
    settings : ScoreSettings
    decisions : DecisionSettings
    keys : list of str
        The metric keys of every result, in report order.
    monitor : str
    n_queries, n_gallery : int
        The rows each call's ``query_emb`` and ``gallery_emb`` must have (leave-one-out: ``n_gallery`` is
        ``n_queries``). ``query_emb`` may instead hold only the subsample's rows, :attr:`query_rows`, in order.
    query_rows : ndarray
        The query rows scored: the subsample's, sorted, or every row.
    subsample_widening : float
        About how much wider the intervals are than on every query: √(n_queries / subsample) (1.0 without one).
    history : list of EpochResult
        Every result so far, without its table.
    """

    def __init__(self, query_labels: Sequence[Any], gallery_labels: Sequence[Any] | None = None, *,
                 query_ids: Sequence[Any] | None = None, gallery_ids: Sequence[Any] | None = None,
                 exclude: Sequence[tuple[Any, Any]] = (), settings: ScoreSettings | None = None,
                 ks: Iterable[int] | None = None, metrics: Iterable[str] | None = None,
                 max_memory_mb: float | None = None, backend: str | None = None, device: str | None = None,
                 monitor: str | None = None, patience: int | None = None, stop_rule: str = "significant",
                 min_delta: float = 0.0, subsample: int | None = None, seed: int = 0, log: Any = None) -> None:
        self._scorer = Scorer(settings, ks=ks, metrics=metrics, max_memory_mb=max_memory_mb, backend=backend,
                              device=device)
        self.settings = self._scorer.settings
        self.keys = list(self._scorer.keys)
        self.decisions = decision_settings(monitor=monitor, patience=patience, stop_rule=stop_rule,
                                           min_delta=min_delta, subsample=subsample, seed=seed)
        self.monitor = self._monitor(self.decisions.monitor)
        if self.settings.bootstrap.resamples <= 0:
            raise InputError("`settings.bootstrap.resamples` is 0, but the evaluator reports intervals and declares "
                             "a best epoch only when a paired interval excludes zero; give it resamples (1000, the "
                             "default) or score with recallk.Scorer.")
        self._pass = serving_pass(self.settings.metrics, self.settings.depth)  # the score stage's: tables need it
        self._set_data(query_labels, gallery_labels, query_ids, gallery_ids, exclude)
        self._sink = live.open_log(log)
        self.log_dir = self._sink.dir if self._sink is not None else None
        if self.log_dir is not None:
            live.clear_tables(self.log_dir)
            self._write_evaluated()
        self.history: list[EpochResult] = []
        self._best: tuple[int, dict[str, float], np.ndarray] | None = None  # epoch, means, monitored values
        self._reference = -math.inf  # stop_rule plain: the monitored mean at the last progress
        self._since_progress = 0

    def __repr__(self) -> str:
        protocol = "leave-one-out" if self.leave_one_out else f"{self.n_gallery} gallery items"
        queries = (f"{self.query_rows.size} of {self.n_queries} queries" if self.query_rows.size != self.n_queries
                   else f"{self.n_queries} queries")
        return (f"Evaluator({queries}, {protocol}, monitor={self.monitor!r}, patience={self.decisions.patience}, "
                f"stop_rule={self.decisions.stop_rule!r}, log={self.log_dir!r})")

    # ------------------------------------------------------------------------------------------ construction

    def _monitor(self, monitor: str | None) -> str:
        if monitor is None:
            return "map@r" if "map@r" in self.keys else self.keys[0]
        if monitor not in self.keys:
            raise InputError(f"`monitor` must be one of the evaluator's metrics: {', '.join(self.keys)}. Got "
                             f"{quote(monitor)} instead; add it to `metrics` (and its K to `ks`), or monitor another.")
        return monitor

    def _set_data(self, query_labels: Sequence[Any], gallery_labels: Sequence[Any] | None,
                  query_ids: Sequence[Any] | None, gallery_ids: Sequence[Any] | None,
                  exclude: Sequence[tuple[Any, Any]]) -> None:
        """Check the validation set once (stand-in embeddings: labels, ids, exclusions) and keep what each call
        scores: the subsample's query side and the whole gallery side."""
        self.leave_one_out = gallery_labels is None
        n = len(query_labels)
        if self.leave_one_out:
            if gallery_ids is not None:
                raise InputError("leave-one-out (no `gallery_labels`) takes the one set's ids as `query_ids`; "
                                 "leave `gallery_ids` out.")
            gallery_labels = query_labels
            query_ids = np.arange(n) if query_ids is None else query_ids
            gallery_ids = query_ids
        m = len(gallery_labels)
        pairs = list(check_exclude_pairs(exclude, n, m))
        RetrievalData(np.ones((n, 1)), np.ones((m, 1)), query_labels, gallery_labels, query_ids=query_ids,
                      gallery_ids=gallery_ids, exclude=pairs, same_set=False)  # checks; raises an InputError
        self.n_queries, self.n_gallery = n, m
        size = self.decisions.subsample
        if size is not None and size > n:
            raise InputError(f"`subsample` must be at most the {n} queries. Got {size} instead; leave it None to "
                             "score every query.")
        rows = (np.sort(np.random.default_rng(self.decisions.seed).choice(n, size, replace=False))
                if size is not None and size < n else np.arange(n))
        self.query_rows = rows
        self.subsample_widening = math.sqrt(n / rows.size)
        q_ids = None if query_ids is None else np.asarray(query_ids, dtype=object)[rows]
        self._query = (np.asarray(query_labels, dtype=object)[rows], q_ids)
        self._gallery = (gallery_labels, gallery_ids)
        self._exclude = [(np.asarray(q, dtype=object)[rows], g) for q, g in pairs]
        names = (np.asarray(q_ids, dtype=str) if q_ids is not None else rows.astype(str))
        self._names = names  # the per-query tables' image_id
        self._order = content_order(np.full(rows.size, ""), names)  # the score stage's order without file content
        self._labels_text = np.asarray(self._query[0], dtype=str)

    def _write_evaluated(self) -> None:
        """``per_query/evaluated.json``: what was evaluated, as ``recallk compare`` prints it beside a table."""
        decisions = self.decisions
        facts = {"evaluator": "recallk.training.Evaluator",
                 "protocol": "leave_one_out" if self.leave_one_out else "query_gallery",
                 "num_queries": int(self.query_rows.size), "num_queries_given": self.n_queries,
                 "num_gallery": self.n_gallery, "subsample": decisions.subsample, "subsample_seed": decisions.seed,
                 "subsample_widening": self.subsample_widening,
                 "ks": list(self.settings.ks), "metrics": list(self.settings.metrics),
                 "exclude_pairs": len(self._exclude), "bootstrap": asdict(self.settings.bootstrap),
                 "monitor": self.monitor, "patience": decisions.patience, "stop_rule": decisions.stop_rule,
                 "min_delta": decisions.min_delta,
                 "queries_digest": hashlib.sha256("\n".join(f"{i}\t{label}" for i, label in zip(
                     self._names, self._labels_text)).encode()).hexdigest()[:12]}  # which queries, which labels
        self.evaluated_id = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:12]
        facts["id"] = self.evaluated_id
        path = os.path.join(self.log_dir, layout.TABLES, layout.EVALUATED)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(facts, handle, indent=2, default=str)
            handle.write("\n")

    # ------------------------------------------------------------------------------------------ each epoch

    @property
    def best_epoch(self) -> int | None:
        """The best epoch so far (None before the first call)."""
        return None if self._best is None else self._best[0]

    @property
    def should_stop(self) -> bool:
        """Whether ``patience`` evaluations passed without progress under the stop rule."""
        patience = self.decisions.patience
        return patience is not None and self._since_progress >= patience

    def _epoch(self, epoch: Any) -> int:
        try:
            value = operator.index(epoch)
        except TypeError:
            value = None
        if value is None or isinstance(epoch, bool) or value < 0:
            raise InputError(f"`epoch` must be a non-negative integer (the step DVC plots). Got {quote(epoch)} "
                             "instead.")
        last = self.history[-1].epoch if self.history else None
        if last is not None and value <= last:
            raise InputError(f"`epoch` must increase from call to call (the step of every logged value): the last "
                             f"was {last}. Got {value} instead; build a new Evaluator for a new run.")
        return value

    def _embeddings(self, epoch: int, query_emb: Any, gallery_emb: Any) -> tuple[Any, Any]:
        """The epoch's query rows (the subsample's) and gallery, counts and values checked."""
        if self.leave_one_out and gallery_emb is not None:
            raise InputError("this evaluator is leave-one-out (built without `gallery_labels`): pass one set of "
                             "embeddings, `evaluator(epoch, emb)`, not `gallery_emb`.")
        if not self.leave_one_out and gallery_emb is None:
            raise InputError(f"pass `gallery_emb` ({self.n_gallery} rows): this evaluator has a gallery "
                             "(built with `gallery_labels`); leave-one-out is built without them.")
        n_q = _rows_of(query_emb, "query_emb")
        if self.leave_one_out:
            if n_q != self.n_queries:
                raise InputError(f"`query_emb` must have one row per item of the validation set, {self.n_queries}. "
                                 f"Got {n_q} rows instead (epoch {epoch}); embed every item, in the order of "
                                 "`query_labels`.")
            gallery_emb = query_emb
        else:
            if n_q not in (self.n_queries, self.query_rows.size):
                subsample = (f", or the subsample's {self.query_rows.size} (`evaluator.query_rows`)"
                             if self.query_rows.size != self.n_queries else "")
                raise InputError(f"`query_emb` must have one row per query, {self.n_queries}{subsample}. Got {n_q} "
                                 f"rows instead (epoch {epoch}); embed the queries in the order of `query_labels`.")
            n_g = _rows_of(gallery_emb, "gallery_emb")
            if n_g != self.n_gallery:
                raise InputError(f"`gallery_emb` must have one row per gallery item, {self.n_gallery}. Got {n_g} "
                                 f"rows instead (epoch {epoch}); embed the gallery in the order of `gallery_labels`.")
        for name, emb in (("query_emb", query_emb), ("gallery_emb", gallery_emb)):
            bad = _bad_rows(emb)
            if bad.size:
                raise InputError(f"`{name}` has NaN or inf in {bad.size} row(s) at epoch {epoch}, first rows "
                                 f"{bad[:10].tolist()}: the model's embeddings diverged; lower the learning rate or "
                                 "check the loss for NaN.")
            if self.leave_one_out:
                break
        if n_q == self.n_queries and self.query_rows.size != self.n_queries:
            query_emb = _take(query_emb, self.query_rows)
        return query_emb, gallery_emb

    def __call__(self, epoch: int, query_emb: Any, gallery_emb: Any = None) -> EpochResult:
        """Score one epoch's embeddings; decide; log.

        Parameters
        ----------
        epoch : int
            Non-negative, above the previous call's: the step of every logged value.
        query_emb : array-like or torch tensor of shape (n_queries, d)
            Or only the subsample's rows (:attr:`query_rows`, in order). Leave-one-out: the one set.
        gallery_emb : array-like or torch tensor of shape (n_gallery, d), optional
            None under leave-one-out only.

        Returns
        -------
        EpochResult
        """
        epoch = self._epoch(epoch)
        q, g = self._embeddings(epoch, query_emb, gallery_emb)
        (q_labels, q_ids), (g_labels, g_ids) = self._query, self._gallery
        data, ranking = self._scorer.rank(q, g, q_labels, g_labels, query_ids=q_ids, gallery_ids=g_ids,
                                          exclude=self._exclude, ranks=self._pass)
        summary, values = summarize(ranking, self.settings)
        means = {key: float(summary[key]) for key in self.keys}  # the same float (recall@K comes as numpy's)
        bootstrap = asdict(self.settings.bootstrap)
        ci = tables.bootstrap_ci({k: values[k] for k in self.keys}, **bootstrap, labels=self._labels_text,
                                 order=self._order)
        intervals = {k: (ci[f"{k}_ci_low"], ci[f"{k}_ci_high"]) for k in self.keys}
        delta, is_best = self._decide(epoch, means, values[self.monitor])
        table = tables.compact_per_query(tables.per_query(self._names, self._labels_text, ranking, values))
        result = EpochResult(epoch=epoch, metrics=means, intervals=intervals, monitor=self.monitor, delta=delta,
                             is_best=is_best, best_epoch=self._best[0], best_metrics=self._best[1],
                             epochs_without_progress=self._since_progress, should_stop=self.should_stop,
                             num_queries=summary["num_queries"], num_excluded_queries=summary["num_excluded_queries"],
                             num_gallery=int(data.n_gallery), table=table)
        if self._sink is not None:
            result = self._log(result)
        self.history.append(replace(result, table=None))
        return result

    def _decide(self, epoch: int, means: dict[str, float],
                monitored: np.ndarray) -> tuple[tuple[float, float, float] | None, bool]:
        """Δ of the monitored metric against the best so far with its paired interval; the new best and the
        progress count. Queries without a positive (NaN) are the same every epoch and left out."""
        value = means[self.monitor]
        delta = None
        if self._best is None:
            is_best = True
        else:
            kept = ~np.isnan(monitored[self._order])
            diff = (monitored[self._order] - self._best[2][self._order])[kept]
            boot = self.settings.bootstrap
            groups = self._labels_text[self._order][kept] if boot.unit == "label" else None
            low, high = paired_bootstrap_ci(diff, boot.resamples, boot.seed, boot.confidence, groups)
            delta = (float(value - self._best[1][self.monitor]), float(low), float(high))
            is_best = low > 0
        if is_best:
            self._best = (epoch, means, monitored)
        if self.decisions.stop_rule == "significant":
            progress = is_best
        else:  # as Lightning's EarlyStopping: the reference moves only on progress
            progress = value - self.decisions.min_delta > self._reference
            self._reference = value if progress else self._reference
        self._since_progress = 0 if progress else self._since_progress + 1
        return delta, is_best

    def _log(self, result: EpochResult) -> EpochResult:
        """The epoch's table to ``per_query/``, its values to the sink (each mean and ``<key>_ci_low``/``_ci_high``
        at step = epoch; ``best_epoch`` in the summary only)."""
        from recallk.atomic import write_all
        from recallk.tables_contract import csv_file

        path = os.path.join(self.log_dir, layout.TABLES, layout.table_name(result.epoch))
        write_all([(path, csv_file(result.table, self.evaluated_id, exact=True))])
        values: dict[str, float] = {}
        for key in self.keys:
            low, high = result.intervals[key]
            values.update({key: result.metrics[key], f"{key}_ci_low": low, f"{key}_ci_high": high})
        self._sink.log(result.epoch, values, {"best_epoch": result.best_epoch})
        return replace(result, table_path=path)
