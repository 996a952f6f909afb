"""Recall@K Runner's library: exact, memory-bounded retrieval metrics and the pipeline's parts.

The public API::

    from recallk import recall_at_k, retrieval_metrics, retrieval_summary, evaluate, Scorer
    from recallk import Evaluator   # a training loop's evaluator, every epoch (recallk.training)

Attributes are imported lazily (PEP 562), so importing a submodule such as
``recallk.score.metrics`` runs only this file and that submodule's own imports:
each DVC stage's import closure stays its own.

Layout: :mod:`recallk.data` (catalog, contracts, splitting), :mod:`recallk.encode`
(backbones, cache, batches), :mod:`recallk.score` (similarity, the ranking engine,
metrics, tables), :mod:`recallk.training` (the evaluator of a training loop), :mod:`recallk.checks` (every
input rule) and :mod:`recallk.errors`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use (below)
    from recallk.errors import InputError
    from recallk.evaluation import encode_all, evaluate
    from recallk.report.block import format_report
    from recallk.score.metrics import (
        METRICS,
        Scorer,
        first_positive_ranks,
        recall_at_k,
        retrieval_metrics,
        retrieval_summary,
    )
    from recallk.score.passes import Pass
    from recallk.score.ranking import Ranking, rank_positives
    from recallk.training import EpochResult, Evaluator

#: Public name -> the module that defines it.
_API = {
    "recall_at_k": "recallk.score.metrics",
    "retrieval_metrics": "recallk.score.metrics",
    "retrieval_summary": "recallk.score.metrics",
    "first_positive_ranks": "recallk.score.metrics",
    "METRICS": "recallk.score.registry",
    "Scorer": "recallk.score.metrics",
    "evaluate": "recallk.evaluation",
    "encode_all": "recallk.evaluation",
    "format_report": "recallk.report.block",
    "rank_positives": "recallk.score.ranking",
    "Ranking": "recallk.score.ranking",
    "Pass": "recallk.score.passes",
    "InputError": "recallk.errors",
    "Evaluator": "recallk.training",
    "EpochResult": "recallk.training",
}

__all__ = ["EpochResult", "Evaluator", "InputError", "METRICS", "Pass", "Ranking", "Scorer", "encode_all",
           "evaluate", "first_positive_ranks", "format_report", "rank_positives", "recall_at_k",
           "retrieval_metrics", "retrieval_summary"]  # sorted(_API): tests/test_api.py


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'recallk' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
