"""The ``score`` section: :class:`ScoreSettings`, its sub-sections and the rules only this section has
(the interval level, the embedding copy cosine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recallk.checks import (
    DEFAULT_MEMORY_MB,
    backend_problem,
    choice,
    columns_problem,
    integer,
    is_int,
    ks_problem,
    positive_number_problem,
)
from recallk.errors import quote
from recallk.score.registry import METRICS, metrics_problem
from recallk.settings.base import ray_address, setting
from recallk.stats import MAX_ASKED


def confidence_problem(v: Any) -> str | None:
    """An interval level: a float strictly between 0 and 1."""
    if not isinstance(v, float) or not 0.0 < v < 1.0:
        return f"must be a number strictly between 0 and 1, such as 0.95. Got {quote(v)} instead."
    return None


def cosine_problem(v: Any) -> str | None:
    """A cosine above 0 and at most 1, or None (off)."""
    if v is None:
        return None
    if not (is_int(v) or isinstance(v, float)) or not 0.0 < v <= 1.0:
        return f"must be a cosine above 0 and at most 1, such as 0.95, or null (off). Got {quote(v)} instead."
    return None


def joint_columns_problem(v: Any) -> str | None:
    """``exclude_same_all``: [] or at least two distinct column names, not ``image_id``."""
    problem = columns_problem(v)
    if problem:
        return problem
    if len(v) == 1:
        return (f"needs at least two columns that exclude together (one column alone belongs in "
                f"score.exclude_same). Got {quote(v)} instead.")
    if "image_id" in v:
        return f"must not name image_id (a query's own image is always excluded). Got {quote(v)} instead."
    return None


def junk_column_problem(v: Any) -> str | None:
    """``junk``: null, or one catalog column name other than label and image_id."""
    if v is None:
        return None
    if not isinstance(v, str) or not v or v in ("label", "image_id"):
        return f"must be a catalog column of true/false flags (e.g. junk), or null. Got {quote(v)} instead."
    return None


@dataclass(frozen=True)
class RaySettings:
    """``score.ray``: where the ranking's tile jobs run with ``score.engine: ray``."""

    address: str | None = ray_address("cluster address, as for `encode.ray.address`; `null`: `RAY_ADDRESS`, else "
                                      "a local cluster")
    num_cpus: int = setting(1, integer(1, 1024), "CPUs, and engine threads, per task")


@dataclass(frozen=True)
class BootstrapSettings:
    """``score.bootstrap``: the intervals (resampled by query or by label; 0 resamples: off)."""

    resamples: int = setting(1000, integer(0, MAX_ASKED),
                             "bootstrap resamples of the queries for the intervals; `0` turns them off")
    confidence: float = setting(0.95, confidence_problem,
                                "interval level (percentile bootstrap), strictly between 0 and 1")
    seed: int = setting(0, integer(0), "seed of the resampling (`numpy.random.default_rng`)")
    unit: str = setting("query", choice("query", "label"),
                        "what is resampled: `query`, or `label` (every label's queries together: honest when a "
                        "label's queries are correlated, as under `leave_one_out`)")


@dataclass(frozen=True)
class FailureSettings:
    """``score.failures``: the failure contact sheet (the worst queries and their top ``k``)."""

    queries: int = setting(8, integer(0, 1000),
                           "queries in the failure gallery `plots/failures.png`; `0` turns it off (a 1×1 placeholder)")
    k: int = setting(5, integer(0, 100), "retrieved items shown per query")


@dataclass(frozen=True)
class EmbeddingCopySettings:
    """``score.embedding_copies``: the embedding copy check (None: off)."""

    min_cosine: float | None = setting(None, cosine_problem,
                                       "the embedding check: queries with another image at this cosine or above "
                                       "among their top max(ks) items are flagged, and every metric is also reported "
                                       "without them; `null` turns it off; 0.999 flags near-exact copies only "
                                       "(looser values flag clean positives: [Leakage checks](leakage.md))")


@dataclass(frozen=True)
class ScoreSettings:
    """The ``score`` section: what is measured (``ks``, ``metrics``, ``exclude_same``, ``whiten``) and how
    (memory bound, backend, engine), the intervals, the failure sheet and the near-copy check."""

    ks: tuple[int, ...] = setting([1, 5, 10], ks_problem,
                                  "the K of `recall@K` and `precision@K`: distinct positive integers")
    metrics: tuple[str, ...] = setting(list(METRICS), metrics_problem,
                                       "which of `recall`, `precision`, `r_precision`, `map@r`, `map`, `mrr`; "
                                       "`recall` and `mrr` alone take a cheaper pass")
    max_memory_mb: float = setting(DEFAULT_MEMORY_MB, positive_number_problem,
                                   "bound on the engine's extra memory at any N×M (what it covers: "
                                   "[docs/internals/engine.md](internals/engine.md#max_memory_mb))")
    backend: str = setting("numpy", backend_problem,
                           "`numpy` (the exact engine, on the CPU) or `torch` (the candidate product on "
                           "`score.device`, the `torch` extra; for GPUs): identical metrics")
    device: str = setting("auto", choice("auto", "cpu", "cuda"),
                          "`backend: torch` only: where it multiplies; `auto`: the tensors' device, else `cuda` when "
                          "torch sees one, else `cpu` ([GPUs](internals/gpu.md#the-torch-scoring-backend))")
    matmul: str = setting("float32", choice("float32", "tf32", "bfloat16"),
                          "`backend: torch` only: the candidate product's format; `tf32`/`bfloat16` are faster on "
                          "GPUs with a wider certified window; the metrics stay exact either way")
    shards: int = setting(1, integer(1, 4096),
                          "`backend: torch` only: the gallery cut by rows into this many shards, searched apart "
                          "(one per GPU when there are several) and merged per query; identical metrics")
    engine: str = setting("local", choice("local", "ray"),
                          "`local`: this machine's cores; `ray`: the exact engine's tile jobs on Ray tasks, "
                          "byte-identical to `local` ([docs/internals/scale.md](internals/scale.md))")
    ray: RaySettings = setting(RaySettings)
    exclude_same: tuple[str, ...] = setting([], columns_problem,
                                            "catalog columns (e.g. `[camera]`): an item sharing the query's value is "
                                            "neither retrieved nor a positive; empty values never match")
    exclude_same_all: tuple[str, ...] = setting([], joint_columns_problem,
                                                "catalog columns (`label` allowed) that exclude together: an item "
                                                "sharing the query's value in every one of them is neither "
                                                "retrieved nor a positive (re-ID junk: `[label, camera]`); a "
                                                "missing value never matches; `[]`: off ([Datasets](datasets.md))")
    junk: str | None = setting(None, junk_column_problem,
                               "catalog column of true/false flags: a true gallery item is junk for every query, "
                               "never retrieved nor a positive, so it changes no metric (Market-1501's `-1` files); "
                               "not under `leave_one_out`; `null`: off ([Datasets](datasets.md))")
    whiten: str = setting("none", choice("none", "pca"),
                          "`pca`: PCA whitening fitted on the train split only (at least 2 images), applied to "
                          "queries and gallery")
    bootstrap: BootstrapSettings = setting(BootstrapSettings)
    failures: FailureSettings = setting(FailureSettings)
    embedding_copies: EmbeddingCopySettings = setting(EmbeddingCopySettings)

    #: Keys of earlier releases: an old params file gets one "renamed to" error naming the new key.
    RENAMED = {"near_duplicates": "embedding_copies"}

    def problem(self) -> str | None:
        """The torch backend's own params (``shards``, ``matmul``, ``device: cuda``) with another backend, or
        ``device: cuda`` / ``matmul: tf32`` with ``engine: ray`` (whose tasks search the shards on CPU torch):
        they would be ignored, so the run would not be what was asked."""
        if self.backend != "torch":
            ignored = {"shards": self.shards != 1, "matmul": self.matmul != "float32", "device": self.device == "cuda"}
            why = ("with `backend: {backend}`, but only `backend: torch` reads {it} (the numpy engine bounds its "
                   "memory with `max_memory_mb` and spreads over machines with `engine: ray`); set `backend: torch` "
                   "or remove {it}.")
        elif self.engine == "ray":
            ignored = {"device": self.device == "cuda", "matmul": self.matmul == "tf32"}
            why = ("with `engine: ray`, but the Ray tasks search the torch backend's shards on CPU torch, so the GPU "
                   "would not run the candidate product; set `engine: local` to rank on the GPU (its shards then go "
                   "to the machine's GPUs), or remove {it}.")
        else:
            return None
        asked = [f"`{name}: {getattr(self, name)}`" for name, set_ in ignored.items() if set_]
        if not asked:
            return None
        return f"sets {' and '.join(asked)} " + why.format(backend=self.backend, it="them" if len(asked) > 1 else "it")

    @property
    def depth(self) -> int:
        """The deepest K asked for, ``max(ks)``: named once here."""
        return max(self.ks)
