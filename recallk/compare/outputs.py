"""The files ``recallk compare`` writes (``--json``, ``--md``): all or nothing, even under SIGKILL.

Both are written by :func:`recallk.atomic.write_all` (a temp file beside each, fsynced, renamed into place
together, after the old files are removed; the folders made when missing), so a killed run never leaves half
a JSON file or a new JSON beside an old markdown, and the next run removes its temp files.
The JSON is strict: a value that is not a finite number is written as ``null``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

from recallk.atomic import write_all
from recallk.errors import InputError


def strict(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by None (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same path once symlinks and ``..`` are resolved, or (both
    existing) the same inode (a hard link)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_targets(targets: Sequence[tuple[str, str | None]], inputs: Sequence[tuple[str, Path]] = ()) -> None:
    """The one rule for every command's output files (``recallk compare``'s ``--json``/``--md``, ``leaderboard``'s
    and ``track``'s ``--json``/``--md``/``--png``, ``report``'s ``--out``), checked before anything is read or
    written: each output is a file, not a folder; no two options name one file; no option names an input
    (a per-query table or the ``evaluated.json`` beside it). Paths are compared after resolving symlinks and
    ``..``, and existing files by inode (hard links too). ``targets``: (option, path or None); ``inputs``:
    (the system or side it belongs to, an input file)."""
    named = [(option, Path(path)) for option, path in targets if path]
    for option, path in named:
        if path.is_dir():
            raise InputError(f"{option} names {str(path)!r}, which is a folder; it takes a file name (e.g. "
                             f"{str(path / 'out')!r}).")
    for (first, a), (second, b) in itertools.combinations(named, 2):
        if _same_file(a, b):
            link = "" if str(a) == str(b) else f" ({str(a)!r} and {str(b)!r} resolve to {str(a.resolve())!r})"
            raise InputError(f"{first} and {second} both name the file {str(a)!r}{link}: one would overwrite the "
                             "other. Give each output its own file.")
    for option, path in named:
        for owner, source in inputs:
            if _same_file(path, source):
                raise InputError(f"{option} names {str(path)!r}, which is an input ({str(source)!r}, read for "
                                 f"{owner}): writing there would overwrite it. Give the output another file name.")


def write(json_path: str | None, md_path: str | None, result: dict[str, Any], markdown: str) -> None:
    """Write ``result`` as indented JSON to ``json_path`` and ``markdown`` to ``md_path`` (each optional), both
    or neither (:func:`check_targets` says whether they may be written, before this is called)."""
    paths = [p for p in (json_path, md_path) if p]
    writers = []
    if json_path:
        text = json.dumps(strict(result), indent=2, allow_nan=False) + "\n"
        writers.append((json_path, lambda tmp: tmp.write_text(text, encoding="utf-8", newline="\n")))
    if md_path:
        writers.append((md_path, lambda tmp: tmp.write_text(markdown, encoding="utf-8", newline="\n")))
    for path in paths:  # an old pair never stays half-replaced: a killed run leaves both missing or new
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    write_all(writers)
