"""Shared plumbing of the three stage scripts: arguments, atomic writes (:mod:`recallk.atomic`), the stage runner.

Nothing here knows about retrieval. The library raises
:class:`~recallk.errors.InputError` for problems the user must fix; :func:`run_stage`
prints those as one ``error:`` line and exits 2. Any other exception is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sqlite3
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from recallk.atomic import remove_outputs  # noqa: F401  (the stages' first step, here with the rest)
from recallk.data import contract
from recallk.errors import InputError, os_advice, sqlite_advice
from recallk.images import DEFAULT_BACKGROUND, background_problem

#: The files of the encode stage's folder output (``data/embeddings``, one DVC out), by role; score and index read
#: them from ``--embeddings DIR``. The two text files are there only when data/prepared/captions.csv has rows: the
#: captions' embeddings (float32, caption order) and their caption ids.
EMBEDDING_FILES = {"embeddings": "embeddings.npy", "ids": "ids.npy", "provenance": "provenance.json",
                   "text_embeddings": "text_embeddings.npy", "text_ids": "text_ids.npy"}
#: The files of the score stage's folder output (``data/scores``, one DVC out), by role; index reads two of them.
SCORE_FILES = {"per_query": "per_query.csv", "neighbors": "neighbors.csv", "embedding_copies": "embedding_copies.csv"}


def inside(folder: str | os.PathLike, name: str) -> str:
    """The path of file ``name`` in a folder output ``folder`` (``data/embeddings/ids.npy``)."""
    return str(Path(folder) / name)


def json_file(data: Any) -> Callable[[Path], None]:
    """A writer of ``data`` as indented UTF-8 JSON (a trailing newline) for :func:`recallk.atomic.write_all`."""
    return lambda tmp: tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8", newline="\n")


def read_input_csv(path: str | os.PathLike, required: Sequence[str] = (), **kwargs) -> pd.DataFrame:
    """Read a stage input CSV as text; a missing or unparseable file, or one without the
    ``required`` columns, is an InputError."""
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, **kwargs)
        missing = [c for c in required if c not in frame.columns]
        if missing:
            raise ValueError(f"no column {', '.join(missing)}")
        return frame
    except FileNotFoundError:
        raise InputError(f"{path} not found; run the earlier stages first (`dvc repro`).") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path} is not a readable CSV ({exc}); delete it and run `dvc repro`.") from None


def read_table(path: str | os.PathLike, schema, producer: str) -> pd.DataFrame:
    """Read a CSV written by the ``producer`` stage and check it against its contract ``schema``
    (the same pandera schema the stage checked when it wrote the file)."""
    frame = read_input_csv(path)
    try:
        contract.validate(frame, schema, source=str(path), csv_lines=True)
    except InputError as exc:
        raise InputError(f"{exc}\n{path} is damaged or from an older version: re-run {producer} "
                         f"(`dvc repro -f {producer}`).") from None
    return frame


def read_provenance(path: str | os.PathLike) -> dict | None:
    """An earlier stage's provenance.json, or None when it is absent (stages run by hand)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path} is not readable JSON ({exc}); re-run the stage that writes it "
                         "(`dvc repro -f`).") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a stage's provenance (a JSON object); re-run the stage that writes it "
                         "(`dvc repro -f`).")
    return data


def read_catalog(path: str | os.PathLike, data_root: str | None) -> pd.DataFrame:
    """The catalog CSV as text, checked by :func:`recallk.data.contract.catalog_schema`, and its image paths
    by the split stage's path rule (:func:`recallk.data.contract.check_catalog_paths`: inside ``data_root``,
    ``data_root`` in the split's provenance.json, :func:`data_root_of`). Every stage reads the catalog here, so
    a tampered catalog cannot make any of them open a file outside the data."""
    catalog = read_table(path, contract.catalog_schema(), "split")
    if contract.has_files(catalog):
        contract.check_catalog_paths(catalog, data_root, str(path))
    return catalog


def data_root_of(split_provenance: dict | None) -> str | None:
    """The data root the split stage recorded (its provenance.json), or None when that file is absent."""
    root = (split_provenance or {}).get("data_root")
    return root if isinstance(root, str) and root else None


def background_of(split_provenance: dict | None) -> str:
    """The colour the split stage composited transparency over (its provenance.json's ``background``, a copy of
    the ``split.background`` param, on which encode depends in dvc.yaml as on ``split.data_root``), so encode
    embeds and score draws each image as split hashed it; the default when that file is absent or predates it."""
    value = (split_provenance or {}).get("background", DEFAULT_BACKGROUND)
    problem = background_problem(value)
    if problem:
        raise InputError(f"the split stage's provenance.json: `background` {problem} Re-run the split stage "
                         "(`dvc repro -f split`).")
    return value


def read_captions(path: str | os.PathLike) -> pd.DataFrame:
    """The captions CSV as text (header only without captions), checked by
    :func:`recallk.data.contract.captions_schema`."""
    return read_table(path, contract.captions_schema(), "split")


def read_split(path: str | os.PathLike) -> pd.DataFrame:
    """The split CSV as text, checked by :func:`recallk.data.contract.split_schema`."""
    return read_table(path, contract.split_schema(), "split")


def parse_stage_args(argv: Sequence[str] | None, description: str, inputs: dict[str, str], outputs: dict[str, str],
                     flags: dict[str, str] | None = None) -> argparse.Namespace:
    """Parse a stage's ``--<name> PATH`` options plus ``--params``: the defaults are the stage's own ``INPUTS``
    and ``OUTPUTS`` tables, which dvc.yaml's deps and outs repeat (tests/test_dvc_yaml.py), so its ``cmd`` names
    no path; the options are for running a stage by hand on other files."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for name, default in inputs.items():
        parser.add_argument(f"--{name}", default=default, metavar="PATH", help="read")
    for name, default in outputs.items():
        parser.add_argument(f"--{name}", default=default, metavar="PATH", help="written")
    parser.add_argument("--params", default="params.yaml", metavar="PATH", help="the params file")
    for name, help_text in (flags or {}).items():
        parser.add_argument(f"--{name}", action="store_true", help=help_text)
    return parser.parse_args(argv)


def output_paths(args: argparse.Namespace, outputs: dict[str, str]) -> list[str]:
    """The paths ``args`` gives the ``outputs`` options (a stage's ``OUTPUTS``), in the table's order."""
    return [getattr(args, name.replace("-", "_")) for name in outputs]


def stage_name(main: Callable) -> str:
    """``the split stage`` for ``stages.split.main`` (its module's last part)."""
    module = getattr(main, "__module__", "") or ""
    spec = getattr(sys.modules.get(module), "__spec__", None)  # `python -m stages.split`: __main__, spec stages.split
    name = (spec.name if spec is not None else module).rsplit(".", 1)[-1]
    return f"the {name} stage" if name and name != "__main__" else "the stage"


#: The folders of this project's code (``recallk``, ``stages``): a warning attributed to a file in them is ours.
PROJECT_CODE = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), name) + os.sep
                     for name in ("recallk", "stages"))


def warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int, file=None,
                 line: str | None = None) -> None:
    """:func:`warnings.showwarning` of a stage run: one ``warning: <message>`` line on stderr, no source line.
    A warning of the library is attributed to the stage script that called it (``stacklevel``), whose code line
    says nothing to a user; one from another package (Pillow, torch) keeps its category and origin on the line."""
    text = str(message)
    if not os.path.abspath(filename).startswith(PROJECT_CODE):
        text += f" ({category.__name__} from {filename}:{lineno})"
    try:
        (file or sys.stderr).write(f"warning: {text}\n")
    except OSError:  # stderr closed: the warning is lost, as Python's own showwarning does
        pass


def run_stage(main: Callable[[Sequence[str] | None], None], argv: Sequence[str] | None = None) -> None:
    """Run a stage ``main``; turn an :class:`InputError` into one message and exit code 2, Ctrl-C into one
    message and exit code 130. Each Python warning raised meanwhile is one ``warning:`` line
    (:func:`warning_line`); the library's own callers still get real :mod:`warnings`."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    with warnings.catch_warnings():  # restores showwarning afterwards (a stage run in process by a test)
        warnings.showwarning = warning_line
        _run(main, argv)


def _run(main: Callable[[Sequence[str] | None], None], argv: Sequence[str] | None) -> None:
    """:func:`run_stage`'s exits."""
    try:
        main(argv)
    except KeyboardInterrupt:  # Ctrl-C (SIGINT): the writes are all or none, so nothing of this run is left
        sys.stderr.write(f"error: interrupted (Ctrl-C) before {stage_name(main)} finished; none of its outputs "
                         "was written (they are all or none, and the old ones were removed first, so DVC runs "
                         "the stage again): re-run it (`dvc repro`).\n")
        sys.exit(130)  # as a shell reports a process ended by SIGINT
    except InputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(2)
    except OSError as exc:  # disk full, file-size limit, permissions: nothing half-written stays behind
        where = f" {exc.filename}" if exc.filename else ""
        sys.stderr.write(f"error: could not read or write{where}: {exc.strerror or exc} (errno {exc.errno}). "
                         f"To fix: {os_advice(exc)}, then re-run; no partial output was kept.\n")
        sys.exit(2)
    except sqlite3.Error as exc:  # the embedding cache could not be written (disk full, file-size limit)
        sys.stderr.write(f"error: the embedding cache could not be updated ({exc}); its last committed batch "
                         f"is intact. To fix: {sqlite_advice(exc)}, then re-run.\n")
        sys.exit(2)
