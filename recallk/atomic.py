"""All or nothing on disk, even under SIGKILL: several outputs written to temp files and renamed into place.

Each output ``dir/name`` is first written to a temp file ``dir/.name.<8 random characters>.tmp`` beside it
(:func:`temp_name_pattern`; ``.gitignore`` covers the pattern), fsynced, and only when every output is written are
they renamed over their targets. A process killed at any point (SIGKILL, power loss) can leave temp files and,
between two renames, some new outputs with others missing (a stage deletes its old outputs before it starts,
so DVC sees the stage as changed until a run completes); the next write of the same outputs first removes every
such leftover (:func:`remove_leftovers`), so it ends with exactly its outputs and no temp file.

An output may be a folder (:class:`Folder`: the index stage's per-point tables): it is filled in a temp folder
``dir/.name.<8 characters>.tmp`` (every file fsynced) and renamed into place with the others.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from recallk.errors import InputError, os_advice

_UMASK = os.umask(0)
os.umask(_UMASK)  # read the process umask once (setting it back at once)


def temp_name_pattern(target: str | os.PathLike) -> re.Pattern:
    """The names of the temp files :func:`write_all` makes for ``target`` (``.name.<8 characters>.tmp``)."""
    return re.compile(rf"\.{re.escape(Path(target).name)}\.[A-Za-z0-9_]{{8}}\.tmp")


class Folder:
    """A folder output of :func:`write_all`: ``files`` maps each file name in it to its writer (``writer(path)``
    fills that file). The folder is made whole in a temp folder, then renamed over the target (an old folder
    there is removed first)."""

    def __init__(self, files: dict[str, Callable[[Path], None]]) -> None:
        self.files = dict(files)

    def __call__(self, folder: Path) -> None:
        for name, writer in self.files.items():
            writer(folder / name)


def _remove(path: str | os.PathLike) -> None:
    """Delete a file, or a folder with everything in it (a link is removed, never followed); absent is fine."""
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def remove_leftovers(targets: Sequence[str | os.PathLike]) -> list[Path]:
    """Delete the temp files (and temp folders, of a :class:`Folder`) an interrupted :func:`write_all` of
    ``targets`` left beside them; return them."""
    removed = []
    for target in map(Path, targets):
        pattern = temp_name_pattern(target)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for entry in os.scandir(target.parent if str(target.parent) else "."):
                if pattern.fullmatch(entry.name) and (entry.is_file(follow_symlinks=False)
                                                      or entry.is_dir(follow_symlinks=False)):
                    _remove(entry.path)
                    removed.append(Path(entry.path))
    return removed


def remove_outputs(paths: Sequence[str | os.PathLike]) -> None:
    """Delete the outputs ``paths`` (files, or :class:`Folder` outputs) and the leftovers of an interrupted
    write of them (:func:`remove_leftovers`): a stage's first step, so a failed run never leaves an old result
    looking current."""
    remove_leftovers(paths)
    for p in paths:
        _remove(p)


def _fsync(path: Path) -> None:
    """Flush a file, or every file of a folder, to disk."""
    for file in sorted(path.iterdir()) if path.is_dir() else [path]:
        with open(file, "rb+") as fh:
            os.fsync(fh.fileno())


def write_all(writers: Sequence[tuple[str | os.PathLike, Callable[[Path], None]]]) -> None:
    """Write several outputs all or nothing: each ``writer(tmp)`` fills a temp file next to its
    target (a :class:`Folder` writer, a temp folder); only when every one succeeded are they fsynced and
    renamed over the targets.

    Leftover temp files of an earlier, killed write of the same targets are removed first. On any
    failure, Ctrl-C (``KeyboardInterrupt``) included, every temp file is removed, and so is every output
    already renamed into place when it comes between two renames, so no partial or half-updated output remains
    (only SIGKILL, which runs no code, can leave some: the next write removes its leftovers); an OS error
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
                if isinstance(writer, Folder):
                    tmp = tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
                    os.chmod(tmp, 0o777 & ~_UMASK)  # mkdtemp makes 0700: the user's usual mode
                else:
                    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
                    os.close(fd)
                    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600: give the output the user's usual mode
                temps.append((Path(tmp), target))
                writer(Path(tmp))
                _fsync(Path(tmp))  # on disk before the rename: a crash never leaves an empty file
            except OSError as exc:
                why = f"{exc.strerror} (errno {exc.errno})" if exc.errno else f"the write was cut short ({exc})"
                raise InputError(f"could not write {target}: {why}. To fix: {os_advice(exc)}, then re-run; no "
                                 "partial output was kept.") from None
        renamed: list[Path] = []
        try:
            for tmp, target in temps:
                if tmp.is_dir() and os.path.isdir(target) and not os.path.islink(target):
                    shutil.rmtree(target)  # a folder is not renamed over a folder that holds files
                os.replace(tmp, target)
                renamed.append(target)
        except BaseException as exc:  # a failed rename, or Ctrl-C between two: none of the outputs, not some
            for target in renamed:
                _remove(target)
            if isinstance(exc, OSError):
                raise InputError(f"could not rename the finished outputs into place ({exc}); no output was kept: "
                                 "re-run.") from None
            raise
    finally:
        for tmp, _ in temps:
            _remove(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write one UTF-8 text file atomically (:func:`write_all`)."""
    write_all([(path, lambda tmp: tmp.write_text(text, encoding="utf-8", newline="\n"))])
