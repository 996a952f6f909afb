"""Where ``recallk compare`` finds a per-query table: a file, a folder, a git revision or a DVC experiment.

A revision or an experiment is read from git: the score stage keeps the compact per-query
table ``metrics/per_query.csv`` in git (``cache: false``, like the metrics), so this works in
a fresh clone with no DVC cache, e.g. in CI against the base branch.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
from pathlib import Path

import pandas as pd

from recallk.errors import InputError, quote
from recallk.tables_contract import DIRECTION_COLUMN, DIRECTIONS, check_per_query, metric_columns, restore_formulas

#: The compact per-query table, committed with the metrics.
TABLE = "metrics/per_query.csv"
#: The full per-query table (a DVC-cached output): read through ``dvc.api`` for older revisions.
FULL_TABLE = "data/scores/per_query.csv"
#: Where a folder of outputs may hold it.
CANDIDATES = ("per_query.csv", TABLE)


#: Where DVC keeps the queued experiments that failed: a git stash, one reflog entry per experiment, its subject
#: ``commit: dvc-exp:<rev>:<baseline rev>:<name>`` (dvc/repo/experiments/stash.py, ExpStash.MESSAGE_RE).
FAILED_STASH = "refs/exps/celery/failed"
_FAILED_RE = re.compile(r"(?:commit: )?dvc-exp:[0-9a-f]+:[0-9a-f]+:(?P<name>[^~^:\\?\[\]*]*)")


def _git(*args: str, cwd: Path, binary: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=not binary)


def resolve_revision(spec: str, repo: Path) -> str | None:
    """The commit of a git revision (branch, tag, hash, ``HEAD~1``) or of a DVC experiment name
    (its ref under ``refs/exps``); None when ``spec`` is neither."""
    proc = _git("rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}", cwd=repo)
    if proc.returncode == 0:
        return proc.stdout.strip()
    refs = _git("for-each-ref", "--format=%(refname) %(objectname)", "refs/exps", cwd=repo)
    matches = [line.split()[1] for line in refs.stdout.splitlines()
               if _experiment_name(line.split()[0]) == spec]
    if len(matches) > 1:
        raise InputError(f"{len(matches)} DVC experiments are named {spec!r}; name one by its commit instead "
                         "(`dvc exp show --sha`).")
    return matches[0] if matches else None


def _experiment_name(ref: str) -> str | None:
    """The name of an experiment's ref, ``refs/exps/<xx>/<baseline>/<name>``; None for DVC's other refs under
    refs/exps (the queue's stashes, refs/exps/celery/failed among them)."""
    parts = ref.split("/")
    return parts[4] if len(parts) == 5 and len(parts[2]) == 2 else None


def failed_experiments(repo: Path) -> set[str]:
    """The names of the queued DVC experiments that failed (``Failed`` in ``dvc queue status``), as DVC's
    failed stash lists them (``dvc queue remove --failed`` empties it)."""
    proc = _git("log", "-g", "--format=%gs", FAILED_STASH, "--", cwd=repo)
    return {m["name"] for m in map(_FAILED_RE.match, proc.stdout.splitlines()) if m and m["name"]}


#: Byte-order marks of the encodings a per-query CSV is not in (UTF-32 first: its LE mark starts with UTF-16's).
FOREIGN_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32 little-endian"), (b"\x00\x00\xfe\xff", "UTF-32 big-endian"),
                (b"\xff\xfe", "UTF-16 little-endian"), (b"\xfe\xff", "UTF-16 big-endian"))


def decode(data: bytes | str, source: str) -> str:
    """``data`` as text: UTF-8 (one BOM at the start dropped), no other byte-order mark, no NUL byte; else an
    InputError naming ``source`` and, for a byte-order mark, which one and where."""
    if isinstance(data, str):
        return data
    for mark, encoding in FOREIGN_BOMS:
        if data.startswith(mark):
            raise InputError(f"{source} is not UTF-8 text: it starts with the {encoding} byte-order mark "
                             f"({mark.hex(' ').upper()}), so it was saved as {encoding.split()[0]}. Save it as UTF-8 "
                             f"(e.g. `iconv -f {encoding.split()[0]} -t UTF-8`), or name the per-query CSV the score "
                             "stage wrote.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{source} is not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r}); it is "
                         "binary or another encoding. Name the per-query CSV the score stage wrote.") from None
    if "\ufeff" in text:
        at = text.index("\ufeff")
        line = text.count("\n", 0, at) + 1
        column = at - (text.rfind("\n", 0, at) + 1) + 1
        where = "right after the one it starts with" if at == 0 else f"at line {line}, character {column}"
        raise InputError(f"{source} holds a byte-order mark (U+FEFF, bytes EF BB BF) {where}, where none belongs (a "
                         "file may start with one, nowhere else): files joined together (each with its mark) or a mark "
                         "pasted into a cell. Remove it (or re-run the score stage that wrote it).")
    if "\x00" in text:
        raise InputError(f"{source} holds a NUL byte at character {text.index(chr(0))}: it is binary (or UTF-16) "
                         "data, not the UTF-8 per-query CSV the score stage wrote.")
    return text


def record_lines(text: str) -> list[int]:
    """The first CSV line (1-based) of each data record of ``text`` (a quoted cell may span lines)."""
    reader = csv.reader(io.StringIO(text))
    starts, line = [], 1
    next(reader, None)
    line = reader.line_num + 1
    for _ in reader:
        starts.append(line)
        line = reader.line_num + 1
    return starts


def read_table(data: bytes | str, source: str, direction: str | None = None) -> pd.DataFrame:
    """Parse a per-query CSV (every cell as text, empty cells missing), checked against its contract
    (:func:`recallk.tables_contract.check_per_query`): one InputError naming ``source``, each bad column, its
    CSV lines and queries. Text that is not UTF-8, holds a NUL byte, or does not end with a newline (the
    writer ends every line with one: the file was cut short) is refused too. A text <-> image run's table (a
    ``direction`` column) gives the queries of ``direction`` (:func:`one_direction`)."""
    text = decode(data, source)
    if text and not text.endswith("\n"):
        last = text.rsplit("\n", 1)[-1]
        raise InputError(f"{source} is cut short: its last line ({quote(last)}, line {text.count(chr(10)) + 1}) "
                         "does not end with a newline, as every line the score stage writes does. Re-run the score "
                         "stage that wrote it (`dvc repro score`).")
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
        lines = record_lines(text)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, csv.Error) as exc:
        raise InputError(f"{source} is not a readable per-query CSV ({exc}).") from None
    frame = restore_formulas(frame).replace("", pd.NA)  # the score stage quotes formula-like text
    lines = lines if len(lines) == len(frame) else None
    if direction is not None or DIRECTION_COLUMN in frame.columns:
        frame, lines = one_direction(frame, lines, source, direction)
    check_per_query(frame, source if direction is None else f"{source} ({direction})", lines)
    return frame


def one_direction(frame: pd.DataFrame, lines: list[int] | None, source: str,
                  direction: str | None) -> tuple[pd.DataFrame, list[int] | None]:
    """The rows of a text <-> image run's per-query table (:data:`~recallk.tables_contract.DIRECTION_COLUMN`) of
    ``direction``, without that column and without the metric columns no row of it holds (``ap`` of text ->
    image), and their CSV lines; an InputError when ``direction`` is None (the two directions are different
    queries and cannot be pooled) or the table has no such column."""
    if DIRECTION_COLUMN not in frame.columns:
        raise InputError(f"{source} is an image retrieval run's per-query table (no `{DIRECTION_COLUMN}` column), but "
                         f"--direction {direction} names a text <-> image direction; drop --direction.")
    if direction is None:
        raise InputError(f"{source} is a text <-> image run (split.protocol: text_image): its per-query table holds "
                         "two directions, different queries. Name one with --direction "
                         f"{' or --direction '.join(DIRECTIONS)}.")
    keep = (frame[DIRECTION_COLUMN] == direction).to_numpy()
    if not keep.any():
        raise InputError(f"{source} holds no {direction} query (its `{DIRECTION_COLUMN}` column has "
                         f"{', '.join(map(str, frame[DIRECTION_COLUMN].dropna().unique()[:3]))}); re-run the score "
                         "stage that wrote it.")
    rows = frame[keep].drop(columns=DIRECTION_COLUMN)
    rows = rows[[c for c in rows.columns if not (metric_columns(rows[[c]]) and rows[c].isna().all())]]
    return rows.reset_index(drop=True), None if lines is None else [n for n, k in zip(lines, keep) if k]


def evaluated(spec: str, repo: str | Path = ".") -> dict[str, str]:
    """What the score stage says it evaluated (``metrics/evaluated.json``) beside ``spec``'s per-query
    table: in a folder, or at a revision; empty when there is none (a CSV file, an older revision).
    A damaged file (not UTF-8, not JSON, not one object) is an InputError naming it."""
    path = Path(spec)
    candidates = _beside(path)
    if not (path.is_file() or path.is_dir()):
        commit = resolve_revision(spec, Path(repo))
        shown = _git("show", f"{commit}:metrics/evaluated.json", cwd=Path(repo), binary=True) if commit else None
        if shown is None or shown.returncode != 0:
            return {}
        return parse_evaluated(shown.stdout, f"{spec}:metrics/evaluated.json")
    for candidate in candidates:
        if candidate.is_file():
            return parse_evaluated(candidate.read_bytes(), str(candidate))
    return {}


def parse_evaluated(data: bytes, source: str) -> dict[str, str]:
    """An ``evaluated.json``'s object, its values as text (the report prints them); an InputError naming
    ``source`` when it is not UTF-8 JSON holding one object."""
    try:
        facts = json.loads(decode(data, source))
    except ValueError as exc:  # json.JSONDecodeError, or a number too deep to parse
        raise InputError(f"{source} is not readable JSON ({exc}); re-run the score stage that writes it "
                         "(`dvc repro score`), or compare the per-query CSV files by name.") from None
    except RecursionError:
        raise InputError(f"{source} nests too deeply to be the score stage's evaluated.json; re-run the score "
                         "stage that writes it (`dvc repro score`).") from None
    if not isinstance(facts, dict):
        raise InputError(f"{source} holds a JSON {type(facts).__name__}, not the object the score stage writes; "
                         "re-run the score stage (`dvc repro score`).")
    return {str(k): v if isinstance(v, (str, int, float, bool)) or v is None else json.dumps(v)
            for k, v in facts.items()}


def input_files(spec: str) -> list[Path]:
    """The files on disk that :func:`load` and :func:`evaluated` read for ``spec``: a CSV file and the
    ``evaluated.json`` beside it, a folder's per-query tables and ``evaluated.json`` files; none for a git
    revision or an experiment (read from git). An output naming one of them is refused
    (:func:`recallk.compare.outputs.check_targets`)."""
    path = Path(spec)
    tables = [path] if path.is_file() else [path / name for name in CANDIDATES] if path.is_dir() else []
    return [candidate for candidate in tables + _beside(path) if candidate.is_file()]


def _beside(path: Path) -> list[Path]:
    """Where an ``evaluated.json`` may lie for a per-query CSV file or a folder of outputs (none otherwise)."""
    if path.is_file():
        return [path.parent / "evaluated.json"]
    if path.is_dir():
        return [path / "evaluated.json", path / "metrics" / "evaluated.json"]
    return []


def load(spec: str, repo: str | Path = ".", direction: str | None = None) -> tuple[pd.DataFrame, str]:
    """The per-query table named by ``spec`` and a description of where it came from.

    ``spec`` is tried as a file, a folder (``per_query.csv`` or ``metrics/per_query.csv`` in it),
    then a git revision or DVC experiment name in ``repo`` (``metrics/per_query.csv`` at that commit).
    ``direction``: the queries of that direction of a text <-> image run (:func:`one_direction`).
    """
    path = Path(spec)
    if path.is_file():
        return read_table(path.read_bytes(), str(path), direction), str(path)
    if path.is_dir():
        for name in CANDIDATES:
            if (path / name).is_file():
                return read_table((path / name).read_bytes(), str(path / name), direction), str(path / name)
        raise InputError(f"folder {spec!r} holds no per-query table ({' or '.join(CANDIDATES)}); run the score "
                         "stage there, or name the CSV file.")
    repo = Path(repo)
    commit = resolve_revision(spec, repo)
    if commit is None and spec in failed_experiments(repo):
        raise InputError(f"{spec!r} is a queued DVC experiment that failed (`dvc exp run --run-all` exits 0 all the "
                         f"same): see why with `dvc queue logs {spec}`, then queue it again.")
    if commit is None:
        raise InputError(f"{spec!r} is not a file, a folder, a git revision or a DVC experiment of {repo.resolve()}; "
                         "list experiments with `dvc exp list`.")
    shown = _git("show", f"{commit}:{TABLE}", cwd=repo, binary=True)
    if shown.returncode == 0:
        return read_table(shown.stdout, f"{spec}:{TABLE}", direction), f"{spec} ({commit[:7]}):{TABLE}"
    full = read_table(_from_dvc_cache(spec, commit, repo), f"{spec}:{FULL_TABLE}", direction)
    return full, f"{spec} ({commit[:7]}):{FULL_TABLE}"


def _from_dvc_cache(spec: str, commit: str, repo: Path) -> bytes:
    """The full per-query table of a revision that kept no compact one in git, through ``dvc.api``
    (it needs that revision's outputs in the DVC cache or a remote)."""
    import dvc.api

    try:
        return dvc.api.read(FULL_TABLE, repo=str(repo), rev=commit, mode="rb")
    except Exception as exc:  # dvc raises many types here (missing cache, no remote, no such path)
        raise InputError(f"revision {spec!r} ({commit[:7]}) has no {TABLE} in git, and its {FULL_TABLE} is not in "
                         f"the DVC cache ({type(exc).__name__}); fetch it with `dvc pull` (or `dvc exp pull` for an "
                         f"experiment), or check the revision out, run `dvc repro` and commit {TABLE}.") from None
