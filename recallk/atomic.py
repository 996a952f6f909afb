"""All or nothing on disk, even under SIGKILL: several outputs written to temp files and renamed into place.

Each output ``dir/name`` is first written to a temp file ``dir/.name.<8 random characters>.tmp`` beside it
(:func:`temp_name_pattern`; ``.gitignore`` covers the pattern), fsynced, and only when every output is written are
they renamed over their targets. A process killed at any point (SIGKILL, power loss) can leave temp files and,
between two renames, some new outputs with others missing (a stage deletes its old outputs before it starts,
so DVC sees the stage as changed until a run completes); the next write of the same outputs first removes every
such leftover (:func:`remove_leftovers`), so it ends with exactly its outputs and no temp file.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from recallk.errors import InputError, os_advice

_UMASK = os.umask(0)
os.umask(_UMASK)  # read the process umask once (setting it back at once)


def temp_name_pattern(target: str | os.PathLike) -> re.Pattern:
    """The names of the temp files :func:`write_all` makes for ``target`` (``.name.<8 characters>.tmp``)."""
    return re.compile(rf"\.{re.escape(Path(target).name)}\.[A-Za-z0-9_]{{8}}\.tmp")


def remove_leftovers(targets: Sequence[str | os.PathLike]) -> list[Path]:
    """Delete the temp files an interrupted :func:`write_all` of ``targets`` left beside them; return them."""
    removed = []
    for target in map(Path, targets):
        pattern = temp_name_pattern(target)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for entry in os.scandir(target.parent if str(target.parent) else "."):
                if pattern.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


def write_all(writers: Sequence[tuple[str | os.PathLike, Callable[[Path], None]]]) -> None:
    """Write several outputs all or nothing: each ``writer(tmp)`` fills a temp file next to its
    target; only when every one succeeded are they fsynced and renamed over the targets.

    Leftover temp files of an earlier, killed write of the same targets are removed first. On any
    failure every temp file is removed, so no partial or half-updated output remains; an OS error
    (disk full, file-size limit, a missing folder that cannot be made) becomes an :class:`InputError`
    naming the file.
    """
    remove_leftovers([path for path, _ in writers])
    temps: list[tuple[Path, Path]] = []
    try:
        for path, writer in writers:
            target = Path(path)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
                os.close(fd)
                os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600: give the output the user's usual mode
                temps.append((Path(tmp), target))
                writer(Path(tmp))
                with open(tmp, "rb+") as fh:  # on disk before the rename: a crash never leaves an empty file
                    os.fsync(fh.fileno())
            except OSError as exc:
                why = f"{exc.strerror} (errno {exc.errno})" if exc.errno else f"the write was cut short ({exc})"
                raise InputError(f"could not write {target}: {why}. To fix: {os_advice(exc)}, then re-run; no "
                                 "partial output was kept.") from None
        try:
            for tmp, target in temps:
                os.replace(tmp, target)
        except OSError as exc:
            raise InputError(f"could not rename the finished outputs into place ({exc}); delete "
                             f"{', '.join(str(t) for _, t in temps)} and re-run.") from None
    finally:
        for tmp, _ in temps:
            if tmp.exists():
                tmp.unlink()


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write one UTF-8 text file atomically (:func:`write_all`)."""
    write_all([(path, lambda tmp: tmp.write_text(text, encoding="utf-8", newline="\n"))])
