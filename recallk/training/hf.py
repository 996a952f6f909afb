"""The transformers adapter (the ``hf-trainer`` extra): :class:`RetrievalTrainerCallback` scores an
:class:`~recallk.training.Evaluator` at every evaluation of a ``transformers.Trainer``.

It is two hooks of one object: ``compute_metrics`` (hand it to the Trainer) receives the evaluation set's
embeddings, which the Trainer has already gathered from every process in the dataset's order with the padding
dropped (``accelerator.gather_for_metrics``); it checks their count, scores them on rank 0 and broadcasts the result
(:mod:`recallk.training.distributed`), and returns the means and interval bounds, which the Trainer logs as
``eval_<key>`` and ``metric_for_best_model`` may name; ``on_evaluate`` then stops the training when the evaluator's
``patience`` says so.

The model's forward returns ``(loss, embeddings)`` (or an output whose first field after the loss is the embeddings)
for the evaluation set: rows ``0 .. n_queries - 1`` the queries, then the gallery (leave-one-out: the one set), not
shuffled. The step is the epoch as the Trainer counts it (``state.epoch``: 1 after the first epoch; 0 for an
evaluation before training) with ``eval_strategy="epoch"``, else the global step.
"""

from __future__ import annotations

import logging
from typing import Any

from recallk.errors import InputError, MissingExtraError
from recallk.training import distributed
from recallk.training.evaluator import EpochResult, Evaluator

try:
    from transformers import TrainerCallback
except ImportError as exc:
    raise MissingExtraError("recallk.training.hf", "hf-trainer", "transformers", exc) from None

__all__ = ["RetrievalTrainerCallback"]

log = logging.getLogger(__name__)


class RetrievalTrainerCallback(TrainerCallback):
    """Score ``evaluator`` at every evaluation of a ``transformers.Trainer``::

        callback = RetrievalTrainerCallback(evaluator)
        trainer = Trainer(model, args, train_dataset=train, eval_dataset=val,
                          compute_metrics=callback.compute_metrics, callbacks=[callback])

    Parameters
    ----------
    evaluator : Evaluator
        Built in every process alike; only rank 0's is called.
    stop : bool
        Set ``control.should_training_stop`` when the result says ``should_stop`` (the evaluator's ``patience``).

    Attributes
    ----------
    result : EpochResult or None
        The last evaluation's (its per-query table on rank 0 only).
    results : list of EpochResult
        Every evaluation's, without tables.
    """

    def __init__(self, evaluator: Evaluator, *, stop: bool = True) -> None:
        self.evaluator = distributed.checked_evaluator(evaluator)
        self.stop = stop
        self.result: EpochResult | None = None
        self.results: list[EpochResult] = []
        self._state: Any = None
        self._args: Any = None
        self._fresh = False

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._args, self._state = args, state

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._args, self._state = args, state  # the Trainer makes a new state for each train()

    def _step(self) -> int:
        state, args = self._state, self._args
        if state is None:
            return 0
        strategy = getattr(args, "eval_strategy", "epoch")
        if getattr(strategy, "value", strategy) == "epoch":  # an IntervalStrategy, or its text
            return int(round(state.epoch or 0))
        return int(state.global_step)

    def compute_metrics(self, eval_pred: Any) -> dict[str, float]:
        """The ``compute_metrics`` of the Trainer: score the gathered embeddings; the means and interval bounds."""
        emb = eval_pred.predictions
        if isinstance(emb, (tuple, list)):
            emb = emb[0]
        rows = getattr(emb, "shape", (len(emb),))[0]
        total = distributed.total_rows(self.evaluator)
        if rows != total:  # every process holds the same gathered rows: raised in each
            raise InputError(f"The evaluation gave {rows} embeddings, but the evaluator's validation set has "
                             f"{total} rows: evaluate on that set (eval_dataset), every row once, in its "
                             "order (the queries, then the gallery).")
        step = self._step()
        if self.results and step <= self.results[-1].epoch:
            log.warning("recallk: step %d is already scored; this evaluation is not scored again (the evaluator "
                        "logs one row per epoch).", step)
            return {}
        result = distributed.on_rank_zero(lambda: distributed.score_rows(self.evaluator, step, emb),
                                          strip=distributed.without_table)
        self.result, self._fresh = result, True
        self.results.append(distributed.without_table(result))
        return {**distributed.logged_values(result), "best_epoch": result.best_epoch}

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._fresh and self.stop and self.result.should_stop:
            control.should_training_stop = True
        self._fresh = False
