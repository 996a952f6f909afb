"""The files ``recallk compare`` writes (``--json``, ``--md``): all or nothing, even under SIGKILL.

Both are written by :func:`recallk.atomic.write_all` (a temp file beside each, fsynced, renamed into place
together, after the old files are removed; the folders made when missing), so a killed run never leaves half
a JSON file or a new JSON beside an old markdown, and the next run removes its temp files.
The JSON is strict: a value that is not a finite number is written as ``null``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any

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


def write(json_path: str | None, md_path: str | None, result: dict[str, Any], markdown: str) -> None:
    """Write ``result`` as indented JSON to ``json_path`` and ``markdown`` to ``md_path`` (each optional), both
    or neither; a path that is a folder, or the same file twice, is an InputError."""
    paths = [p for p in (json_path, md_path) if p]
    if len(paths) == 2 and Path(paths[0]).resolve() == Path(paths[1]).resolve():
        raise InputError(f"--json and --md name the same file {paths[0]!r}; give each its own.")
    for path in paths:
        if Path(path).is_dir():
            raise InputError(f"{path!r} is a folder; --json and --md take a file name (e.g. {path}/compare.json).")
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
