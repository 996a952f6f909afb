"""The ``score`` section: :class:`ScoreSettings` and its sub-sections."""

from __future__ import annotations

from dataclasses import dataclass

from recallk.score.registry import METRIC_NAMES
from recallk.settings.base import setting


@dataclass(frozen=True)
class RaySettings:
    """``score.ray``: where the ranking's tile jobs run with ``score.engine: ray``."""

    address: str | None = setting(None)
    num_cpus: int = setting(1)


@dataclass(frozen=True)
class BootstrapSettings:
    """``score.bootstrap``: the intervals (resampled by query or by label; 0 resamples: off)."""

    resamples: int = setting(1000)
    confidence: float = setting(0.95)
    seed: int = setting(0)
    unit: str = setting("query")


@dataclass(frozen=True)
class FailureSettings:
    """``score.failures``: the failure contact sheet (the worst queries and their top ``k``)."""

    queries: int = setting(8)
    k: int = setting(5)


@dataclass(frozen=True)
class EmbeddingCopySettings:
    """``score.near_duplicates``: the embedding near-copy check (None: off)."""

    min_cosine: float | None = setting(None)


@dataclass(frozen=True)
class ScoreSettings:
    """The ``score`` section: what is measured (``ks``, ``metrics``, ``exclude_same``, ``whiten``) and how
    (memory bound, backend, engine), the intervals, the failure sheet and the near-copy check."""

    ks: tuple[int, ...] = setting([1, 5, 10])
    metrics: tuple[str, ...] = setting(list(METRIC_NAMES))
    max_memory_mb: float = setting(512)
    backend: str = setting("numpy")
    engine: str = setting("local")
    ray: RaySettings = setting(RaySettings)
    exclude_same: tuple[str, ...] = setting([])
    whiten: str = setting("none")
    bootstrap: BootstrapSettings = setting(BootstrapSettings)
    failures: FailureSettings = setting(FailureSettings)
    near_duplicates: EmbeddingCopySettings = setting(EmbeddingCopySettings)

    @property
    def depth(self) -> int:
        """The deepest K asked for, ``max(ks)``: named once here."""
        return max(self.ks)
