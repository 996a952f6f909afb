"""Which ranks a metric reads, and which pass of the engine computes them: :class:`Ranks` and :class:`Pass`.

A metric of the registry (:mod:`recallk.score.registry`) names the ranks it reads; the engine
(:func:`recallk.score.ranking.rank_positives`) takes the pass that computes them, chosen by one
explicit value instead of a mix of flags. No import but the standard library: the registry and the
settings read this module.
"""

from __future__ import annotations

import enum
import numbers
from dataclasses import dataclass


class Ranks(enum.IntEnum):
    """The ranks of a query's positives a metric reads, from the fewest to all of them (ordered: the pass
    that serves several metrics is the one of the largest)."""

    #: Each query's first positive only (recall@K, MRR): the fast pass.
    FIRST = 1
    #: The positives within each query's first ``max(R, depth)`` ranks (``R``: its positives; precision@K,
    #: r_precision, map@r): the top-L pass.
    TOP = 2
    #: Every positive's rank (full MAP): the complete ranking.
    EVERY = 3


def _positive_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class Pass:
    """One pass of the engine: which ranks it computes; build it with :meth:`first`, :meth:`top` or :meth:`every`.

    Attributes
    ----------
    ranks : Ranks
        ``FIRST``: each query's first positive; ``TOP``: its positives within its first ``max(R, depth)``
        ranks (and its first positive, however deep); ``EVERY``: every positive's rank.
    depth : int or None
        ``TOP`` only: the depth L (``max(ks)`` for the metrics at ``ks``).
    cap : int or None
        ``FIRST`` or ``TOP``: first ranks of ``cap`` or more may read ``cap``, so a query stops counting once
        ``cap`` items surely beat its best positive (serves recall@K for K <= ``cap``, not MRR); at most
        ``depth``. None: exact first ranks.

    Raises
    ------
    ValueError
        A ``depth`` or ``cap`` that is not a positive integer, one the pass does not take, or a ``cap``
        deeper than the ``depth``.
    """

    ranks: Ranks
    depth: int | None = None
    cap: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.ranks, Ranks):
            raise ValueError(f"`ranks` must be a Ranks member. Got {self.ranks!r} instead.")
        if self.ranks is Ranks.TOP and self.depth is None:
            raise ValueError("the top-L pass (Pass.top) needs a `depth`.")
        if self.ranks is not Ranks.TOP and self.depth is not None:
            raise ValueError(f"only the top-L pass (Pass.top) has a `depth`; this is {self.ranks.name}. "
                             f"Got depth={self.depth!r}.")
        if self.depth is not None and not _positive_int(self.depth):
            raise ValueError(f"`depth` must be a positive integer. Got {self.depth!r} instead.")
        if self.cap is not None:
            if self.ranks is Ranks.EVERY:
                raise ValueError("the complete ranking (Pass.every) is never capped: every rank is exact.")
            if not _positive_int(self.cap):
                raise ValueError(f"`cap` must be a positive integer. Got {self.cap!r} instead.")
            if self.depth is not None and self.cap > self.depth:
                raise ValueError(f"`cap` must be at most `depth` ({self.depth}). Got {self.cap!r} instead.")

    @classmethod
    def first(cls, cap: int | None = None) -> Pass:
        """Each query's first positive only (recall@K, MRR), first ranks capped at ``cap`` if given."""
        return cls(Ranks.FIRST, None, cap)

    @classmethod
    def top(cls, depth: int, cap: int | None = None) -> Pass:
        """The positives within each query's first ``max(R, depth)`` ranks, and its first positive's rank
        (capped at ``cap <= depth`` if given)."""
        return cls(Ranks.TOP, depth, cap)

    @classmethod
    def every(cls) -> Pass:
        """Every positive's rank: the complete ranking."""
        return cls(Ranks.EVERY)

    @property
    def first_only(self) -> bool:
        """Only the first positive's rank (no positive list)."""
        return self.ranks is Ranks.FIRST

    def __repr__(self) -> str:
        args = [] if self.depth is None else [repr(self.depth)]
        args += [] if self.cap is None else [f"cap={self.cap!r}"]
        return f"Pass.{self.ranks.name.lower()}({', '.join(args)})"
