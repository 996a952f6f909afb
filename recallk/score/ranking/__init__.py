"""The exact ranking engine: where each query's positives rank among what it may retrieve.

``rank_data`` (numpy, blocked under ``max_memory_mb``; ``rank_positives`` is its public wrapper
over arrays) returns the :class:`Ranking` of a :class:`~recallk.score.retrieval_data.RetrievalData`; the torch backend
(:mod:`~recallk.score.ranking.torch_api`) returns the same one. How the engine works: ``docs/internals/engine.md``.
"""

from recallk.score.ranking.budget import Budget
from recallk.score.ranking.engine import Ranking, rank_data, rank_positives
from recallk.score.ranking.problem import Problem
from recallk.score.ranking.schedule import consecutive_runs

__all__ = ["Budget", "Problem", "Ranking", "consecutive_runs", "rank_data", "rank_positives"]
