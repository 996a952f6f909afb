"""The Lightning adapter (the ``lightning`` extra): :class:`RetrievalCallback` scores an
:class:`~recallk.training.Evaluator` at the end of every validation epoch.

The module's ``validation_step`` returns each batch's embeddings with their row numbers in the validation set,
``{"embeddings": (b, d) tensor, "index": (b,) tensor}`` (:func:`with_index` adds the row number to any dataset).
Rows ``0 .. n_queries - 1`` are the queries and the gallery follows (``n_queries .. n_queries + n_gallery - 1``);
leave-one-out: the one set. Under DDP every rank's rows are gathered with their numbers, the sampler's repeats
dropped and every row checked to arrive once (else one InputError on every rank:
:mod:`recallk.training.distributed`), scored on rank 0, and the result broadcast: every rank gets the same
metrics in ``trainer.callback_metrics`` (for ``ModelCheckpoint(monitor="map@r")``), and the same stop.

Values reach the trainer's loggers with ``step = trainer.current_epoch``, not the global step that ``self.log``
in an epoch-end hook uses (Lightning #17671); a ``dvclive.lightning.DVCLiveLogger`` is written through its
``Live`` with its step set to the epoch (its own ``log_metrics`` counts steps and turns step 0 into the next
step, dvclive #477), unless the evaluator already logs to that folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from recallk.errors import InputError, MissingExtraError, quote
from recallk.training import distributed
from recallk.training.evaluator import EpochResult, Evaluator
from recallk.training.live import LiveLogger

try:
    import lightning.pytorch as pl
    import torch
except ImportError as exc:
    raise MissingExtraError("recallk.training.lightning", "lightning", "lightning", exc) from None

__all__ = ["RetrievalCallback", "with_index"]

#: What to check when rows are missing, ending the gather's message.
HINT = ("Make `validation_step` return {'embeddings': ..., 'index': ...} for every sample of every batch (the "
        "index: the sample's row in the validation set, `with_index(dataset)`), and validate on every batch "
        "(no `limit_val_batches`, no sampler that drops samples).")


class _WithIndex(torch.utils.data.Dataset):
    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, row: int) -> tuple[int, Any]:
        return row, self.dataset[row]


def with_index(dataset: Any) -> torch.utils.data.Dataset:
    """``dataset`` whose item ``i`` is ``(i, dataset[i])``: the row number ``validation_step`` returns as ``index``."""
    return _WithIndex(dataset)


def _is_dvclive_logger(logger: Any) -> bool:
    return type(logger).__module__.split(".")[0] == "dvclive"


class RetrievalCallback(pl.Callback):
    """Score ``evaluator`` at the end of every validation epoch (the sanity check skipped).

    Parameters
    ----------
    evaluator : Evaluator
        Built on every rank alike (the same validation set); only rank 0's is called.
    embeddings_key, index_key : str
        The keys of ``validation_step``'s returned dict.
    stop : bool
        Set ``trainer.should_stop`` when the result says ``should_stop`` (the evaluator's ``patience``).
    log_to_loggers : bool
        Log each metric and its interval bounds to the trainer's loggers at ``step = epoch``.

    Attributes
    ----------
    result : EpochResult or None
        The last epoch's (its per-query table on rank 0 only).
    results : list of EpochResult
        Every epoch's, without tables.
    """

    def __init__(self, evaluator: Evaluator, *, embeddings_key: str = "embeddings", index_key: str = "index",
                 stop: bool = True, log_to_loggers: bool = True) -> None:
        self.evaluator = distributed.checked_evaluator(evaluator)
        self.keys = (embeddings_key, index_key)
        self.stop = stop
        self.log_to_loggers = log_to_loggers
        self.result: EpochResult | None = None
        self.results: list[EpochResult] = []
        self._reset()

    def _reset(self) -> None:
        self._emb: list[Any] = []
        self._idx: list[Any] = []
        self._problem: str | None = None

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if trainer.sanity_checking or self._problem is not None:
            return
        emb_key, idx_key = self.keys
        if not isinstance(outputs, Mapping) or emb_key not in outputs or idx_key not in outputs:
            got = f"a dict with keys {sorted(map(str, outputs))}" if isinstance(outputs, Mapping) else \
                quote(type(outputs).__name__)
            # not raised here: the other ranks would wait for this one at the gather; every rank raises it there
            self._problem = (f"validation_step must return a dict with {emb_key!r} and {idx_key!r}; it returned {got} "
                             f"(batch {batch_idx})")
            return
        self._emb.append(outputs[emb_key])  # checked at the epoch end, where every rank learns of a problem
        self._idx.append(outputs[idx_key])

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        epoch = trainer.current_epoch
        if self.results and epoch <= self.results[-1].epoch:  # every rank knows it: raised on every rank
            raise InputError(f"RetrievalCallback scores once per epoch, and epoch {epoch} is already scored: validate "
                             "once per epoch (`val_check_interval=1.0`).")
        if self._problem is not None:
            emb, idx, problem = None, None, self._problem
        else:
            emb, idx, problem = distributed.local_rows(self._emb, self._idx)
        rows = distributed.gather_rows(emb, idx, problem, distributed.total_rows(self.evaluator), HINT)
        self._reset()
        result = distributed.on_rank_zero(lambda: distributed.score_rows(self.evaluator, epoch, rows),
                                          strip=distributed.without_table)
        self.result = result
        self.results.append(distributed.without_table(result))
        for key, value in result.metrics.items():  # the same on every rank: no sync needed
            pl_module.log(key, value, logger=False, sync_dist=False)
        if self.log_to_loggers and trainer.is_global_zero:
            self._to_loggers(trainer, result)
        if self.stop and result.should_stop:
            trainer.should_stop = True

    def _to_loggers(self, trainer: pl.Trainer, result: EpochResult) -> None:
        values = distributed.logged_values(result)
        for logger in trainer.loggers:
            if _is_dvclive_logger(logger):
                live = logger.experiment
                if self.evaluator.log_dir is None or not os.path.samefile(live.dir, self.evaluator.log_dir):
                    LiveLogger(live).log(result.epoch, values, {"best_epoch": result.best_epoch})
            else:
                logger.log_metrics(values, step=result.epoch)
