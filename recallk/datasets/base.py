"""What every dataset adapter shares: the :class:`Layout` it reads, the official counts it checks, and the
helpers that read the release's text files with errors naming the file, the line and the expected layout."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from recallk.errors import InputError, clip, quote

#: Missing image files named in one error, before "and N more".
SHOWN_MISSING = 5


@dataclass(frozen=True)
class Dataset:
    """One benchmark: its name, the release it reads, the expected layout (a sentence for errors and docs),
    its reader, the official counts, the protocol's params and its source.

    ``read(root)`` returns the manifest rows (``path`` relative to ``root``, ``label``, ``split``, extra
    columns) and the counts measured, keyed like ``official``."""

    name: str
    release: str
    layout: str
    read: Callable[[Path, "Dataset"], tuple[pd.DataFrame, dict[str, int]]]
    official: dict[str, int]
    protocol: str
    score: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def missing(self, root: Path, what: str) -> InputError:
        """The error of a file or folder ``what`` the release should have under ``root``."""
        return InputError(f"{self.name}: {quote(str(root / what))} not found: {quote(str(root))} is not an "
                          f"extracted copy of {self.release}. Expected layout: {self.layout}")


def need(root: Path, ds: Dataset, *names: str) -> Path:
    """The first of ``names`` that exists under ``root`` (a release's alternative places), or the error
    naming the first."""
    for name in names:
        if (root / name).exists():
            return root / name
    raise ds.missing(root, names[0])


def read_rows(path: Path, ds: Dataset, pattern: str, skip: int = 0) -> list[re.Match]:
    """The lines of a release's text file after ``skip`` header lines (blank lines ignored), each matched by
    ``pattern``; a line that does not match raises an InputError naming the file, the line and the format."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{ds.name}: {quote(str(path))} is not a readable UTF-8 text file "
                         f"({clip(str(exc))}).") from None
    out, rule = [], re.compile(pattern)
    for number, line in enumerate(lines[skip:], start=skip + 1):
        if not line.strip():
            continue
        match = rule.fullmatch(line.strip())
        if match is None:
            raise InputError(f"{ds.name}: line {number} of {quote(str(path))} is {quote(clip(line))}, not in "
                             f"the release's format. Expected layout: {ds.layout}")
        out.append(match)
    if not out:
        raise InputError(f"{ds.name}: {quote(str(path))} lists no images. Expected layout: {ds.layout}")
    return out


def check_files(root: Path, paths: list[str], ds: Dataset) -> None:
    """Every listed image exists under ``root``, or one error naming the first missing ones and their count."""
    gone = [p for p in paths if not (root / p).is_file()]
    if gone:
        more = f" and {len(gone) - SHOWN_MISSING} more" if len(gone) > SHOWN_MISSING else ""
        raise InputError(f"{ds.name}: {len(gone)} listed image(s) missing under {quote(str(root))}: "
                         f"{', '.join(quote(p) for p in gone[:SHOWN_MISSING])}{more}. Extract the whole release "
                         f"there. Expected layout: {ds.layout}")


def differences(measured: dict[str, int], official: dict[str, int]) -> list[str]:
    """One phrase per count that differs from the official release: "test images 12 (official 5,924)"."""
    return [f"{key.replace('_', ' ')} {measured.get(key, 0):,} (official {want:,})"
            for key, want in official.items() if measured.get(key, 0) != want]
