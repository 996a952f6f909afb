"""Retrieval metrics inside a training loop: :class:`~recallk.training.evaluator.Evaluator` (built once from the
``score`` settings and the validation set, called with each epoch's embeddings), what one call says
(:class:`~recallk.training.decisions.EpochResult`) and where it goes for DVC (:mod:`recallk.training.live`,
:mod:`recallk.training.layout`). The core imports none of the extras; the Lightning and transformers adapters
build on it. docs/training.md.

Attributes are imported lazily (PEP 562, as :mod:`recallk`'s), so ``recallk track`` reading a log folder
(:mod:`recallk.training.layout`) imports no scoring code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recallk.training.decisions import DecisionSettings, EpochResult
    from recallk.training.evaluator import Evaluator
    from recallk.training.live import LiveFiles

#: Public name -> the module that defines it.
_API = {"DecisionSettings": "recallk.training.decisions", "EpochResult": "recallk.training.decisions",
        "Evaluator": "recallk.training.evaluator", "LiveFiles": "recallk.training.live"}

__all__ = ["DecisionSettings", "EpochResult", "Evaluator", "LiveFiles"]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'recallk.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
