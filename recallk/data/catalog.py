"""Build the image table from a data root: a folder per label, or a manifest CSV.

:func:`read_source` gives one row per image (``image_id, path, label`` plus any
extra CSV columns and the CSV's ``split``), and :func:`probe` adds what the file
itself says (``sha256, width, height, phash``, a ``problem`` when it cannot be used, its
``real_path``, the file's identity, and whether it has ``transparent`` pixels, composited over
``split.background`` before the pHash is taken). A manifest of ids without image files (no ``path``
column, or ``split.images: none``) gets those columns empty from :func:`without_files`.
Nothing is judged here; :mod:`recallk.data.contract` decides what is acceptable.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import logging
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd

from recallk.data import nearcopy
from recallk.data.contract import is_safe_relative
from recallk.data.phash import phash
from recallk.errors import InputError, clip, quote
from recallk.images import DECODE_ERRORS, DEFAULT_BACKGROUND, decode_noting_transparency, describe_error
from recallk.progress import Progress

log = logging.getLogger(__name__)

REQUIRED_CSV_COLUMNS = ("path", "label")
#: Catalog columns, in order; extra CSV columns follow them.
CATALOG_COLUMNS = ("image_id", "path", "label", "sha256", "width", "height", "phash")
#: The catalog columns that describe an image file (empty in an embeddings-only catalog).
FILE_COLUMNS = ("path", "sha256", "width", "height", "phash")


#: Folders that are never a data root: scanning one would read the whole machine (every file hashed
#: and decoded). A filesystem root and the home folder are refused too (:func:`check_root`).
SYSTEM_ROOTS = frozenset({"/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/media", "/mnt", "/opt",
                          "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/Users",
                          "/System", "/Library", "/Volumes", "/private", "/private/tmp", "/private/var"})


def is_system_root(folder: Path) -> bool:
    """A filesystem root, the home folder or one of :data:`SYSTEM_ROOTS` (after resolving links)."""
    real = Path(os.path.realpath(folder))
    return real.parent == real or real.as_posix() in SYSTEM_ROOTS or real == Path(os.path.realpath(Path.home()))


def check_root(root: Path) -> None:
    if not root.exists():
        raise InputError(f"data root {quote(str(root))} does not exist; set `split.data_root` in params.yaml to your "
                         "image folder.")
    if not root.is_dir():
        raise InputError(f"data root {quote(str(root))} is not a folder; set `split.data_root` to the folder that "
                         "holds the images.")
    if is_system_root(root):
        raise InputError(f"data root {quote(str(root))} is a system folder (it resolves to "
                         f"{quote(os.path.realpath(root))}); the split would hash and decode every file under it. "
                         "Set `split.data_root` to the folder that holds your label folders or manifest.")


def _name_problem(rel: str, name: str) -> str | None:
    """Why a file or folder name cannot be catalogued (one that is not UTF-8 text cannot be written to
    the catalog CSV, nor named in params or a manifest), or None."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return (f"{rel}{name.encode('utf-8', 'backslashreplace').decode('ascii', 'backslashreplace')} has a name "
                f"that is not UTF-8 text (bytes {os.fsencode(name)!r}); rename it with UTF-8 characters")
    return None


def _is_dir(entry: os.DirEntry) -> bool | None:
    """Whether ``entry`` is a folder (a link to one counts); None when that cannot be told (a symlink loop)."""
    try:
        return entry.is_dir()
    except OSError:
        return None


def _scan_label(root: Path, folder: str, label: str, ancestors: tuple[str, ...],
                rows: list[tuple[str, str]], problems: list[str]) -> None:
    """Add a row per file under ``folder`` (any depth; links to folders are followed) to ``rows``, and a
    line per folder that cannot be listed (or leads back to one of its own ``ancestors``) to ``problems``."""
    rel = Path(folder).relative_to(root).as_posix()
    try:
        with os.scandir(folder) as it:
            entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
    except OSError as exc:
        problems.append(f"{rel}/ cannot be read ({exc.strerror or exc}); fix its permissions or move it out of the "
                        "data root")
        return
    subfolders = []
    for entry in entries:
        kind = _is_dir(entry)
        bad_name = _name_problem(f"{rel}/", entry.name)
        if bad_name:
            problems.append(bad_name)
        elif kind is None:
            problems.append(f"{rel}/{entry.name} is a symlink loop; point the link at a file or folder, or remove it")
        elif not kind:
            rows.append((f"{rel}/{entry.name}", label))
        else:
            subfolders.append(entry)
    for entry in subfolders:
        real = os.path.realpath(entry.path)
        if real in ancestors:
            problems.append(f"{rel}/{entry.name}/ is a symlink loop (it leads back to a folder that holds it); "
                            "remove the link")
        else:
            _scan_label(root, entry.path, label, ancestors + (real,), rows, problems)


def scan_folder(root: Path, not_images: tuple[str, ...] = ()) -> pd.DataFrame:
    """One row per file under ``root/<label>/`` (any depth); hidden files and folders are skipped.

    Links to folders are followed, as a label folder that is a link is. Every folder that cannot be
    listed (permissions, a symlink loop) is an :class:`~recallk.errors.InputError` naming it: a
    folder that silently drops out would change the numbers without a word. ``not_images`` (paths relative
    to ``root``, the captions file) are neither rows nor loose files.
    """
    check_root(root)
    rows: list[tuple[str, str]] = []
    loose: list[str] = []
    problems: list[str] = []
    try:
        with os.scandir(root) as it:
            top = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
    except OSError as exc:
        raise InputError(f"data root {quote(str(root))} cannot be read ({exc.strerror or exc}); fix its permissions "
                         "or set `split.data_root` to a readable folder.") from None
    for entry in top:
        kind = _is_dir(entry)
        bad_name = _name_problem("", entry.name)
        if bad_name:
            problems.append(bad_name)
        elif kind is None:
            problems.append(f"{entry.name} is a symlink loop; point the link at a label folder, or remove it")
        elif not kind:
            loose.append(entry.name)
        else:
            _scan_label(root, entry.path, entry.name, (os.path.realpath(root), os.path.realpath(entry.path)),
                        rows, problems)
    if problems:
        raise InputError(f"data root {quote(str(root))}: {len(problems)} folder(s) or link(s) cannot be scanned "
                         "(or have a name that is not UTF-8), so their images would be missing from the catalog:\n  - "
                         + "\n  - ".join(problems))
    skip = {os.path.normpath(name) for name in not_images}  # the captions file: data, not an image
    loose = [name for name in loose if name not in skip]
    rows = [(rel, label) for rel, label in rows if os.path.normpath(rel) not in skip]
    if loose:
        log.warning("ignoring %d file(s) directly under %s (images belong in a folder per label): %s",
                    len(loose), root, ", ".join(loose[:5]))
    if not rows:
        raise InputError(
            f"data root {quote(str(root))} holds no images; put each label's images in a sub-folder "
            f"named after the label (e.g. {root}/cat/001.jpg), or set `split.csv` to a manifest."
        )
    frame = pd.DataFrame(rows, columns=["path", "label"], dtype=object)
    frame.insert(0, "image_id", frame["path"])
    return frame


def read_manifest(root: Path, csv_name: str, images: str = "files") -> pd.DataFrame:
    """Read a manifest CSV (``path,label`` and optional ``image_id``, ``split``, extra columns).

    ``csv_name`` must name a file inside ``root`` (relative, no ``..``, no link out of it): DVC
    tracks only the data root, so a manifest elsewhere could change without re-running the split.
    ``images`` is ``split.images``: ``files`` needs a ``path`` column; ``auto`` reads a manifest
    without one as ids only (``image_id,label``: embeddings-only); ``none`` never reads images (a
    ``path`` column is dropped).

    Every column is read as text, so label ``1`` and ``1.0`` stay different (the split stage warns, naming them:
    :func:`recallk.data.contract.same_number_labels`), and
    empty cells become missing values for the contract to report.
    """
    csv_path, frame = read_text_csv(root, csv_name, "csv", "manifest")
    if images == "none" and "path" in frame.columns:
        log.warning("split.images: none: ignoring the path column of %s (no image is read)", csv_path)
        frame = frame.drop(columns="path")
    ids_only = images != "files" and "path" not in frame.columns
    required = ("image_id", "label") if ids_only else REQUIRED_CSV_COLUMNS
    missing = [c for c in required if c not in frame.columns]
    if missing:
        ids_hint = ("" if images == "files" else " or, for embeddings without image files, image_id,label")
        raise InputError(
            f"manifest {quote(str(csv_path))} lacks column(s) {', '.join(missing)}; it needs a header with "
            f"path,label{ids_hint} (optional: image_id, split, extra columns). "
            f"Found: {', '.join(map(clip, frame.columns))}."
            + (" A manifest of ids without image files needs `split.images: auto` or `none`."
               if images == "files" and "path" in missing and "image_id" in frame.columns else "")
        )
    if frame.empty:
        raise InputError(f"manifest {quote(str(csv_path))} has no rows; list one image per row.")
    frame = frame.astype(object).where(frame != "", None)
    if "image_id" not in frame.columns:
        frame.insert(0, "image_id", frame["path"])
    first = ["image_id", "label"] if ids_only else ["image_id", "path", "label"]
    return frame[first + [c for c in frame.columns if c not in first]]


#: What ``recallk datasets prepare`` writes beside a benchmark's manifest: ``<manifest>.protocol.json``, the
#: protocol's ``name`` and ``sizes`` (and the release's counts), which the split stage records.
PROTOCOL_SUFFIX = ".protocol.json"


def benchmark_protocol(root: Path, csv_name: str | None) -> dict[str, Any] | None:
    """``{"name", "sizes"}`` of the standard protocol a ``recallk datasets prepare`` manifest was written for (the
    :data:`PROTOCOL_SUFFIX` file beside it, inside the data root, so a DVC dep of the split), or None for a manifest
    of one's own or a folder per label. A protocol file that is not that JSON is one error naming it."""
    if csv_name is None:
        return None
    path = root / Path(csv_name).with_suffix(PROTOCOL_SUFFIX)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        protocol = {"name": str(data["name"]), "sizes": {str(k): int(v) for k, v in data["sizes"].items()}}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{quote(str(path))}, the protocol file `recallk datasets prepare` wrote beside the "
                         f"manifest, is not its JSON ({type(exc).__name__}: {clip(str(exc))}): prepare the dataset "
                         "again, or delete the file to use the manifest as one's own.") from None
    return protocol


def file_in_root(root: Path, name: str, key: str, what: str) -> Path:
    """``root / name``, the file the param ``split.<key>`` names (a ``what``: manifest, captions file), which must
    lie inside the data root (relative, no ``..``, no link out of it: DVC tracks only the data root, so a file
    elsewhere could change without re-running the split) and exist."""
    check_root(root)
    path = root / name
    if not (is_safe_relative(name) and Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))):
        raise InputError(f"`split.{key}` is {quote(name)}, which is not inside `split.data_root` "
                         f"({quote(str(root))}): DVC tracks only the data root (the split stage's dependency "
                         f"${{split.data_root}} in dvc.yaml), so edits to this {what} would never re-run the split. "
                         f"Move the {what} into {quote(str(root))} and give its path relative to it "
                         f"(e.g. `split.{key}: {clip(Path(name).name)}`).")
    if not path.is_file():
        raise InputError(f"{what} {quote(str(path))} not found; `split.{key}` is a path inside `split.data_root`.")
    return path


def check_header(csv_path: Path, what: str = "manifest") -> None:
    """Refuse a ``what`` (manifest, captions file) header that names a column twice, as written
    (``label,label``: pandas would silently rename the second ``label.1`` and use the first) or once spaces are
    stripped (``label`` and ``label ``)."""
    with open(csv_path, newline="", encoding="utf-8-sig") as fh:
        header = next(csv.reader(fh), [])
    seen: dict[str, list[str]] = {}
    for name in header:
        seen.setdefault(name.strip(), []).append(name)
    repeated = {name: raw for name, raw in seen.items() if len(raw) > 1}
    if repeated:
        listed = "; ".join(f"{quote(name)} as {', '.join(map(quote, raw))}" for name, raw in repeated.items())
        raise InputError(f"{what} {quote(str(csv_path))} names a column more than once in its header (spaces "
                         f"around names are ignored): {clip(listed)}; give every column its own name.")


def read_text_csv(root: Path, name: str, key: str, what: str) -> tuple[Path, pd.DataFrame]:
    """The path and the rows of the CSV file ``name`` that the param ``split.<key>`` names inside the data root
    ``root`` (a ``what``: manifest, captions file; :func:`file_in_root`), read as text: every cell a string (an
    empty one ``""``), a UTF-8 BOM dropped, the header's names stripped of spaces (a name given twice is refused:
    :func:`check_header`). A file that is not a readable UTF-8 CSV is one InputError naming it."""
    path = file_in_root(root, name, key, what)
    try:
        check_header(path, what)
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError, csv.Error) as exc:
        raise InputError(f"{what} {quote(str(path))} is not a readable UTF-8 CSV ({clip(str(exc))}); "
                         "fix the file.") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    return path, frame


def read_source(root: Path, csv_name: str | None, images: str = "files", not_images: tuple[str, ...] = ()
                ) -> pd.DataFrame:
    """The image table of a folder per label, or of a manifest (without a ``path`` column: ids only); a folder
    scan leaves out ``not_images`` (paths relative to ``root``: the captions file)."""
    if csv_name is None:
        if images == "none":
            raise InputError("`split.images: none` builds the catalog from a manifest of ids and labels: set "
                             "`split.csv` to a CSV (image_id,label[,split,...]) inside `split.data_root`, or set "
                             "`split.images: auto` to read the image folders.")
        return scan_folder(root, not_images)
    return read_manifest(root, csv_name, images)


def without_files(frame: pd.DataFrame) -> pd.DataFrame:
    """The image table of a manifest of ids (embeddings-only): the file columns empty, nothing read."""
    out = frame.copy()
    out.insert(1, "path", pd.Series([None] * len(out), index=out.index, dtype=object))
    for column in ("sha256", "phash", *PROBE_ONLY_COLUMNS):
        out[column] = pd.Series([None] * len(out), index=out.index, dtype=object)
    for column in ("width", "height"):
        out[column] = pd.Series([pd.NA] * len(out), index=out.index, dtype="Int64")
    return out


#: Problems that make an image unreadable (``split.on_bad_image: skip`` drops these rows).
UNREADABLE = ("Pillow cannot decode", "cannot read the file")


def unreadable(frame: pd.DataFrame) -> pd.Series:
    """Rows whose file exists inside the data root but cannot be read or decoded."""
    return frame["problem"].fillna("").astype(str).str.startswith(UNREADABLE)


def probe_file(root: Path, rel: object, resolved_root: Path | None = None, background: str = DEFAULT_BACKGROUND,
               ) -> tuple[str | None, int | None, int | None, str | None, str | None, str | None, bytes | None,
                          bool | None]:
    """Return ``(sha256, width, height, phash, problem, real_path, thumb, transparent)`` for one image path
    relative to ``root``.

    ``phash`` is :func:`recallk.data.phash.phash` of the decoded (upright RGB) image, its transparency composited
    over ``background`` (``split.background``, as encode decodes it), ``thumb`` its
    :func:`recallk.data.nearcopy.thumbnail` (the near-duplicate check's second measure; not kept in the catalog),
    ``transparent`` whether compositing changed a pixel (:func:`recallk.images.decode_noting_transparency`).

    ``real_path`` is the file's absolute path with ``.``, ``//`` and symlinks resolved, the
    identity the contract's path-once rule compares (``a/./0.png``, ``a//0.png`` and a
    symlink to ``a/0.png`` are one file). Paths that are not safe and relative are not
    opened at all (the contract reports them); files that resolve outside ``root`` are not read.
    """
    if not is_safe_relative(rel):
        return None, None, None, None, None, None, None, None
    full = root / str(rel)
    real = os.path.realpath(full)  # never raises: a symlink loop stays unresolved and fails the stat below
    if not Path(real).is_relative_to(resolved_root or root.resolve()):
        return (None, None, None, None, "resolves outside the data root (a symlink?); copy the file into the data root",
                real, None, None)
    try:
        mode = os.stat(full).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, None, None, None, "is a symlink loop; point the link at a file or remove it", real, None, None
        if exc.errno in (errno.EACCES, errno.EPERM):
            return (None, None, None, None, f"cannot be reached ({exc.strerror}: a folder on its path is not "
                    "readable); fix the folder's permissions", real, None, None)
        if exc.errno == errno.ENAMETOOLONG:
            return None, None, None, None, "the path is too long for the file system; shorten it", real, None, None
        return None, None, None, None, "file does not exist; fix the path or remove the row", real, None, None
    if stat.S_ISDIR(mode):
        return (None, None, None, None, "is a folder, not an image file; name a file or remove the row", real, None,
                None)
    if not stat.S_ISREG(mode):
        return (None, None, None, None, "is not a regular file (a FIFO, socket or device); name an image file or "
                "remove the row", real, None, None)
    try:
        data = full.read_bytes()
    except OSError as exc:
        return (None, None, None, None, f"cannot read the file ({exc.strerror}); fix its permissions or remove it",
                real, None, None)
    digest = hashlib.sha256(data).hexdigest()
    try:
        image, transparent = decode_noting_transparency(data, name=location(root, rel), background=background)
    except DECODE_ERRORS as exc:
        return (digest, None, None, None,
                f"Pillow cannot decode it ({describe_error(exc)}); replace or remove the file", real, None, None)
    return digest, image.width, image.height, phash(image), None, real, nearcopy.thumbnail(image), transparent


#: Columns :func:`probe` adds that the catalog file does not keep (the contract reads the first two, the
#: near-duplicate check the thumbnails, the split stage's provenance counts the transparent images).
PROBE_ONLY_COLUMNS = ("problem", "real_path", "thumb", "transparent")


def probe(root: Path, frame: pd.DataFrame, workers: int = 4, background: str = DEFAULT_BACKGROUND) -> pd.DataFrame:
    """Add ``sha256, width, height, phash, problem, real_path, thumb, transparent`` columns by reading every image
    once (threads), its transparency composited over ``background`` (``split.background``)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        resolved = root.resolve()
        results = []
        with Progress(len(frame), "hash+decode", "img", log) as bar:
            for result in pool.map(lambda rel: probe_file(root, rel, resolved, background), frame["path"]):
                results.append(result)
                bar.update(1)
    out = frame.copy()
    probed = pd.DataFrame(results, columns=["sha256", "width", "height", "phash", *PROBE_ONLY_COLUMNS],
                          index=frame.index)
    out["sha256"] = probed["sha256"].astype(object)
    out["width"] = probed["width"].astype("Int64")
    out["height"] = probed["height"].astype("Int64")
    out["phash"] = probed["phash"].astype(object)
    for column in PROBE_ONLY_COLUMNS:
        out[column] = probed[column].astype(object)
    return out


def location(root: Path, rel: str) -> str:
    """Where the encode stage finds an image: relative to the working directory when inside it."""
    full = Path(os.path.abspath(root / rel))
    try:
        return full.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return full.as_posix()
