"""Where ``recallk compare`` finds a per-query table: a file, a folder, a git revision or a DVC experiment.

A revision or an experiment is read from git: the score stage keeps the compact per-query
table ``metrics/per_query.csv`` in git (``cache: false``, like the metrics), so this works in
a fresh clone with no DVC cache, e.g. in CI against the base branch.
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pandas as pd

from recallk.errors import InputError
from recallk.tables_contract import check_per_query, restore_formulas

#: The compact per-query table, committed with the metrics.
TABLE = "metrics/per_query.csv"
#: The full per-query table (a DVC-cached output): read through ``dvc.api`` for older revisions.
FULL_TABLE = "data/scores/per_query.csv"
#: Where a folder of outputs may hold it.
CANDIDATES = ("per_query.csv", TABLE)


def _git(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def resolve_revision(spec: str, repo: Path) -> str | None:
    """The commit of a git revision (branch, tag, hash, ``HEAD~1``) or of a DVC experiment name
    (its ref under ``refs/exps``); None when ``spec`` is neither."""
    proc = _git("rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}", cwd=repo)
    if proc.returncode == 0:
        return proc.stdout.strip()
    refs = _git("for-each-ref", "--format=%(refname) %(objectname)", "refs/exps", cwd=repo)
    matches = [line.split()[1] for line in refs.stdout.splitlines()
               if line.split()[0].rsplit("/", 1)[-1] == spec]
    if len(matches) > 1:
        raise InputError(f"{len(matches)} DVC experiments are named {spec!r}; name one by its commit instead "
                         "(`dvc exp show --sha`).")
    return matches[0] if matches else None


def read_table(text: str, source: str) -> pd.DataFrame:
    """Parse a per-query CSV (every cell as text, empty cells missing), checked against its contract
    (:func:`recallk.tables_contract.check_per_query`: one InputError naming ``source`` and each bad column)."""
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"{source} is not a readable per-query CSV ({exc}).") from None
    frame = restore_formulas(frame).replace("", pd.NA)  # the score stage quotes formula-like text
    check_per_query(frame, source)
    return frame


def evaluated(spec: str, repo: str | Path = ".") -> dict[str, str]:
    """What the score stage says it evaluated (``metrics/evaluated.json``) beside ``spec``'s per-query
    table: in a folder, or at a revision; empty when there is none (a CSV file, an older revision)."""
    path = Path(spec)
    if path.is_file():
        candidates = [path.parent / "evaluated.json"]
    elif path.is_dir():
        candidates = [path / "evaluated.json", path / "metrics" / "evaluated.json"]
    else:
        commit = resolve_revision(spec, Path(repo))
        shown = _git("show", f"{commit}:metrics/evaluated.json", cwd=Path(repo)) if commit else None
        return json.loads(shown.stdout) if shown is not None and shown.returncode == 0 else {}
    for candidate in candidates:
        if candidate.is_file():
            return json.loads(candidate.read_text(encoding="utf-8"))
    return {}


def load(spec: str, repo: str | Path = ".") -> tuple[pd.DataFrame, str]:
    """The per-query table named by ``spec`` and a description of where it came from.

    ``spec`` is tried as a file, a folder (``per_query.csv`` or ``metrics/per_query.csv`` in it),
    then a git revision or DVC experiment name in ``repo`` (``metrics/per_query.csv`` at that commit).
    """
    path = Path(spec)
    if path.is_file():
        return read_table(path.read_text(encoding="utf-8"), str(path)), str(path)
    if path.is_dir():
        for name in CANDIDATES:
            if (path / name).is_file():
                return read_table((path / name).read_text(encoding="utf-8"), str(path / name)), str(path / name)
        raise InputError(f"folder {spec!r} holds no per-query table ({' or '.join(CANDIDATES)}); run the score "
                         "stage there, or name the CSV file.")
    repo = Path(repo)
    commit = resolve_revision(spec, repo)
    if commit is None:
        raise InputError(f"{spec!r} is not a file, a folder, a git revision or a DVC experiment of {repo.resolve()}; "
                         "list experiments with `dvc exp list`.")
    shown = _git("show", f"{commit}:{TABLE}", cwd=repo)
    if shown.returncode == 0:
        return read_table(shown.stdout, f"{spec}:{TABLE}"), f"{spec} ({commit[:7]}):{TABLE}"
    full = read_table(_from_dvc_cache(spec, commit, repo), f"{spec}:{FULL_TABLE}")
    return full, f"{spec} ({commit[:7]}):{FULL_TABLE}"


def _from_dvc_cache(spec: str, commit: str, repo: Path) -> str:
    """The full per-query table of a revision that kept no compact one in git, through ``dvc.api``
    (it needs that revision's outputs in the DVC cache or a remote)."""
    import dvc.api

    try:
        return dvc.api.read(FULL_TABLE, repo=str(repo), rev=commit, encoding="utf-8")
    except Exception as exc:  # dvc raises many types here (missing cache, no remote, no such path)
        raise InputError(f"revision {spec!r} ({commit[:7]}) has no {TABLE} in git, and its {FULL_TABLE} is not in "
                         f"the DVC cache ({type(exc).__name__}); fetch it with `dvc pull` (or `dvc exp pull` for an "
                         f"experiment), or check the revision out, run `dvc repro` and commit {TABLE}.") from None
