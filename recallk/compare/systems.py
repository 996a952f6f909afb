"""Many systems, each given as one run or several, on a common footing: the input of leaderboard and track.

A system on the command line is ``[NAME=]SPEC[+SPEC...]``: one or several runs (split seeds, folds,
training seeds), each SPEC a per-query CSV, a folder of score outputs, a git revision or a DVC
experiment name (:func:`recallk.compare.sources.load`). :func:`panel` turns the systems into one
matrix per metric, rows the units the statistics resample and permute, columns the systems:

- **single run**: every system is one run on the same queries; units are the queries.
- **same queries**: some system has several runs and every run scored the same queries: each
  query's value is averaged over a system's runs, then tested; units are the queries.
- **different queries**: every system has the same number ``m >= 2`` of runs and the runs differ
  in their queries (other split seeds): run ``r`` of every system is paired with run ``r`` of the
  others (they must share queries), each run reduced to its mean; units are the ``m`` runs.

The between-run standard deviation of every system's per-run means is kept beside the matrix.
"""

from __future__ import annotations

import fnmatch
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from recallk.compare import family, paired, sources
from recallk.errors import InputError
from recallk.tables_contract import headline_key

CASES = ("single run", "same queries", "different queries")


@dataclass(frozen=True)
class SystemSpec:
    """A system as named on the command line and the specs of its runs."""

    name: str
    runs: tuple[str, ...]


def parse_system(arg: str) -> SystemSpec:
    """``[NAME=]SPEC[+SPEC...]``; an argument that is an existing path is one spec, whatever it holds."""
    if Path(arg).exists():
        return SystemSpec(arg, (arg,))
    name, rest = arg.split("=", 1) if "=" in arg else ("", arg)
    runs = tuple(part for part in rest.split("+") if part)
    if not runs or not name and "=" in arg:
        raise InputError(f"system {arg!r} names no run; write NAME=SPEC or SPEC1+SPEC2.")
    return SystemSpec(name or arg, runs)


def experiment_names(repo: str | Path, pattern: str = "*") -> list[str]:
    """The DVC experiments of ``repo`` (refs ``refs/exps/<xx>/<baseline>/<name>``) whose name matches
    the shell pattern ``pattern``, sorted by name."""
    proc = subprocess.run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], cwd=repo,
                          capture_output=True, text=True)
    names = set()
    for ref in proc.stdout.splitlines():
        parts = ref.split("/")
        if len(parts) == 5 and len(parts[2]) == 2 and fnmatch.fnmatchcase(parts[4], pattern):
            names.add(parts[4])
    return sorted(names)


def failed_experiment_names(repo: str | Path, pattern: str = "*") -> list[str]:
    """The queued DVC experiments of ``repo`` that failed (``Failed`` in ``dvc queue status``; ``dvc exp run
    --run-all`` exits 0 all the same) whose name matches the shell pattern ``pattern`` and that have no
    experiment of that name (none succeeded since), sorted by name. ``dvc queue remove --failed`` forgets them."""
    found = sources.failed_experiments(Path(repo))
    return sorted({n for n in found if fnmatch.fnmatchcase(n, pattern)} - set(experiment_names(repo, pattern)))


@dataclass
class Panel:
    """Systems on common units: ``values[metric]`` is (units, systems), ``run_means[metric][s]`` the
    per-run means of system s, ``labels`` the units' labels (queries only), ``frames`` the aligned
    per-query values of each system (same-queries cases; for per-label tables and curves)."""

    names: list[str]
    origins: list[list[str]]
    case: str
    units: str
    metrics: list[str]
    values: dict[str, np.ndarray]
    run_means: dict[str, list[list[float]]]
    labels: np.ndarray | None
    queries: int
    excluded: int
    frames: list[pd.DataFrame] = field(default_factory=list)

    def run_sd(self, metric: str) -> list[float | None]:
        return [family.between_run_sd(runs) for runs in self.run_means[metric]]


def load_systems(specs: Sequence[SystemSpec], repo: str | Path = ".", direction: str | None = None
                 ) -> list[tuple[str, list[pd.DataFrame], list[str]]]:
    """Every run's per-query table and origin, system by system (of text <-> image runs, the queries of
    ``direction``)."""
    loaded = []
    for spec in specs:
        tables = [sources.load(run, repo, direction) for run in spec.runs]
        loaded.append((spec.name, [t for t, _ in tables], [o for _, o in tables]))
    names = [name for name, _, _ in loaded]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InputError(f"system {twice[0]!r} is named twice; name them apart with NAME=SPEC.")
    return loaded


def _common_metrics(tables: Sequence[pd.DataFrame]) -> list[str]:
    columns = [c for c in paired.metric_columns(tables[0]) if all(c in t.columns for t in tables)]
    if not columns:
        raise InputError("the systems share no per-query metric column; re-run the score stage of each "
                         "(this version writes every metric per query).")
    return columns


def _aligned(tables: Sequence[pd.DataFrame], names: Sequence[str], intersect: bool) -> list[pd.DataFrame]:
    """Every table on the queries of the first (or on the queries all share, with ``intersect``)."""
    if intersect:
        common = set.intersection(*(set(t["image_id"]) for t in tables))
        tables = [t[t["image_id"].isin(common)] for t in tables]
    return [tables[0].set_index("image_id").sort_index()] + [
        paired.align(tables[0], t, names=(names[0], name))[1] for t, name in zip(tables[1:], names[1:])]


def _numeric(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    return frame[list(columns)].apply(pd.to_numeric, errors="coerce")


def panel(loaded: Sequence[tuple[str, list[pd.DataFrame], list[str]]], *, intersect: bool = False) -> Panel:
    """The systems' runs as one matrix per metric (see the module docstring for the three cases).

    Raises InputError when the runs fit none of the cases (say, different queries but unequal numbers
    of runs), naming the systems and what to pass.
    """
    names = [name for name, _, _ in loaded]
    if len(names) < 2:
        raise InputError(f"a leaderboard needs at least two systems; got {len(names)}.")
    runs = [tables for _, tables, _ in loaded]
    flat = [t for tables in runs for t in tables]
    flat_names = [f"{name} run {r + 1}" if len(tables) > 1 else name
                  for name, tables in zip(names, runs) for r in range(len(tables))]
    columns = _common_metrics(flat)
    metrics = [headline_key(c) for c in columns]
    origins = [list(o) for _, _, o in loaded]
    same = all(set(t["image_id"]) == set(flat[0]["image_id"]) for t in flat)
    counts = {len(tables) for tables in runs}
    if not same and len(counts) == 1 and min(counts) >= 2:
        return _per_run(names, origins, runs, columns, metrics, intersect)
    shared = set.intersection(*(set(t["image_id"]) for t in flat))
    if not same and (not intersect or not shared):
        pairing = ("" if intersect else " Runs on other splits are paired by position only when every system has "
                   "the same number m >= 2 of runs (" + ("one run each" if counts == {1} else
                                                        f"runs per system here: {sorted(counts)}") + ").")
        raise InputError(differing_queries(flat, flat_names) + pairing + " " + (
            f"Pass --intersect to keep the {len(shared)} queries every run shares." if shared else
            "No query is shared by every run, so --intersect cannot help: leave out the runs of another split or "
            "data set, or score them on the same one."))
    aligned = _aligned(flat, flat_names, intersect)
    values = [_numeric(frame, columns) for frame in aligned]
    included = np.logical_and.reduce([v.notna().all(axis=1).to_numpy() for v in values])
    if not included.any():
        raise InputError("no query has a positive in every run: every metric is undefined.")
    matrices: dict[str, np.ndarray] = {}
    run_means: dict[str, list[list[float]]] = {}
    frames, start = [], 0
    for tables in runs:
        block = values[start:start + len(tables)]
        frames.append(sum(v[included] for v in block) / len(block))
        start += len(tables)
    for column, metric in zip(columns, metrics):
        matrices[metric] = np.column_stack([frame[column].to_numpy(dtype=np.float64) for frame in frames])
        start, run_means[metric] = 0, []
        for tables in runs:
            run_means[metric].append([float(v.loc[included, column].mean()) for v in values[start:start + len(tables)]])
            start += len(tables)
    case = "single run" if max(counts) == 1 else "same queries"
    labels = aligned[0].loc[included, "label"].astype(str).to_numpy()
    for frame in frames:
        frame.columns = metrics
        frame.insert(0, "label", labels)
    return Panel(names, origins, case, "queries", metrics, matrices, run_means, labels, int(included.sum()),
                 int((~included).sum()), frames)


#: Query ids quoted per differing run in an error.
SHOWN_IDS = 3


def differing_queries(tables: Sequence[pd.DataFrame], names: Sequence[str]) -> str:
    """Which runs scored other queries than the rest: the query set most runs share is the reference (the first
    such on a tie); every other run is named with its count, how many of its queries the reference lacks and how
    many of the reference's it lacks, a few ids of each."""
    sets = [frozenset(t["image_id"].astype(str)) for t in tables]
    tally: dict[frozenset, int] = {}
    for ids in sets:
        tally[ids] = tally.get(ids, 0) + 1
    reference = max(tally, key=lambda ids: (tally[ids], -sets.index(ids)))
    holders = [name for name, ids in zip(names, sets) if ids == reference]
    shown = holders[:3] + ([f"{len(holders) - 3} more"] if len(holders) > 3 else [])
    who = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]
    parts = []
    for name, ids in zip(names, sets):
        if ids != reference:
            extra, missing = sorted(ids - reference), sorted(reference - ids)
            said = [f"{len(q)} {what} (e.g. {', '.join(q[:SHOWN_IDS])})"
                    for q, what in ((extra, "not in those"), (missing, "of those missing")) if q]
            parts.append(f"{name} scored {len(ids)}: {'; '.join(said)}")
    return (f"the runs scored different queries: {who} scored {len(reference)}; " + "; ".join(parts) + ".")


def _per_run(names: list[str], origins: list[list[str]], runs: list[list[pd.DataFrame]], columns: list[str],
             metrics: list[str], intersect: bool) -> Panel:
    """Different queries per run: run r of every system on run r's queries, each reduced to its mean."""
    m = len(runs[0])
    per_run: dict[str, np.ndarray] = {metric: np.empty((m, len(names))) for metric in metrics}
    queries = excluded = 0
    for r in range(m):
        aligned = _aligned([tables[r] for tables in runs], [f"{name} run {r + 1}" for name in names], intersect)
        values = [_numeric(frame, columns) for frame in aligned]
        included = np.logical_and.reduce([v.notna().all(axis=1).to_numpy() for v in values])
        if not included.any():
            raise InputError(f"run {r + 1}: no query has a positive in every system.")
        queries, excluded = queries + int(included.sum()), excluded + int((~included).sum())
        for column, metric in zip(columns, metrics):
            per_run[metric][r] = [float(v.loc[included, column].mean()) for v in values]
    run_means = {metric: [per_run[metric][:, s].tolist() for s in range(len(names))] for metric in metrics}
    return Panel(names, origins, "different queries", "runs", metrics, per_run, run_means, None, queries, excluded)
