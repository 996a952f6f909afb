"""The ``precomputed`` backbone: embeddings computed elsewhere, checked against the catalog.

``encode.precomputed.path`` is either an ``.npz`` with arrays ``ids`` and
``embeddings``, or an ``.npy`` of embeddings with ``encode.precomputed.ids``
naming the aligned ids (an ``.npy`` of strings, or a ``.txt`` with one id per
line). Nothing is unpickled: arrays load with ``allow_pickle=False``.

The encode stage depends on ``${encode.precomputed.path}`` (dvc.yaml), so replacing the file re-runs
encode and score. Its default is :data:`recallk.encode.base.NO_FILE`, a committed
file that stands for "none" (DVC cannot track null). ``encode.precomputed.ids`` is a dep too (default
the same file), so replacing the ids file of an ``.npy`` re-runs them as well.

Headers are read before any data: an ``.npy`` whose header claims more data than the file holds, an
``.npz`` member that is not an ``.npy`` or that inflates far beyond its compressed size (a deflate bomb),
and complex or non-numeric embeddings are refused before anything is allocated.
"""

from __future__ import annotations

import math
import os
import zipfile
from pathlib import Path
from typing import IO, Sequence

import numpy as np

from recallk.checks import unusable_rows
from recallk.encode.base import is_no_file
from recallk.errors import InputError, clip, quote

NAME = "precomputed"
#: The defaults of ``encode.precomputed.path`` and ``encode.precomputed.ids``: the committed file standing
#: for "no file".


#: An ``.npz`` member above :data:`INFLATION_FLOOR` bytes may inflate to at most this many times its compressed
#: size: float embeddings barely compress (about 1.1x), so a member that inflates 200x is a deflate bomb.
MAX_INFLATION = 200
INFLATION_FLOOR = 64 << 20


def _header(fh: IO[bytes], available: int, source: str) -> tuple[tuple[int, ...], np.dtype]:
    """Read an ``.npy`` header from ``fh`` and check it against the ``available`` bytes (file or member size)
    before anything is allocated: the shape must be non-negative integers whose data fits in the file."""
    try:
        version = np.lib.format.read_magic(fh)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(fh)
    except (ValueError, OSError, EOFError, SyntaxError, zipfile.BadZipFile) as exc:
        raise InputError(f"{source} is not an .npy array ({clip(str(exc))}); save it with numpy.save / numpy.savez "
                         "(numbers and strings only, no objects).") from None
    if dtype.hasobject:
        raise InputError(f"cannot load {source}: it holds Python objects (dtype {dtype}), which are never "
                         "unpickled; save it with numpy.save / numpy.savez (numbers and strings only, no objects).")
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InputError(f"{source}: its header claims an impossible shape {quote(shape)}; save it again with "
                         "numpy.save.")
    need = math.prod(shape) * dtype.itemsize
    left = available - fh.tell()
    if need > left:
        raise InputError(f"{source}: its header claims shape {quote(shape)} of {dtype} ({need:,} bytes), but the "
                         f"file holds {max(left, 0):,} bytes of data (truncated, or a forged header); save it again "
                         "with numpy.save.")
    return shape, dtype


def _load_npy(path: Path, what: str) -> np.ndarray:
    """One array from an ``.npy`` file, its header checked first (:func:`_header`)."""
    source = f"{what} {quote(str(path))}"
    with open(path, "rb") as fh:
        if fh.read(4) == b"PK\x03\x04":
            raise InputError(f"{source} is an .npz archive, not one array; save it with numpy.save, "
                             "or give the .npz (with arrays ids and embeddings) as `encode.precomputed.path`.")
        fh.seek(0)
        _header(fh, os.fstat(fh.fileno()).st_size, source)
        fh.seek(0)
        try:
            return np.load(fh, allow_pickle=False)
        except (OSError, EOFError, ValueError) as exc:
            raise InputError(f"cannot load {source} ({clip(str(exc))}); save it with numpy.save.") from None


def load_npz(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Arrays ``ids`` and ``embeddings`` of an ``.npz``, each member's header and sizes checked first."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        with open(path, "rb") as fh:
            if fh.read(4) == b"PK\x03\x04":
                raise InputError(f"cannot load precomputed embeddings {quote(path)} ({clip(str(exc))}); save it with "
                                 "numpy.savez (numbers and strings only, no objects).") from None
        raise InputError(f"{quote(path)} is not an .npz archive; save it with numpy.savez(path, ids=..., "
                         "embeddings=...), or name an .npy file with `encode.precomputed.ids`.") from None
    out = {}
    with archive:
        names = set(archive.namelist())
        missing = [key for key in ("ids", "embeddings") if f"{key}.npy" not in names and key not in names]
        if missing:
            raise InputError(f"{quote(path)} lacks array(s) {', '.join(missing)}; save it with "
                             "numpy.savez(path, ids=..., embeddings=...).")
        members = {key: archive.getinfo(f"{key}.npy" if f"{key}.npy" in names else key)
                   for key in ("ids", "embeddings")}
        for member in members.values():  # every header and size first, then any data
            source = f"precomputed embeddings {quote(path)} (member {quote(member.filename)})"
            if not member.filename.endswith(".npy"):
                raise InputError(f"{source} is not an .npy array; save the archive with numpy.savez(path, ids=..., "
                                 "embeddings=...).")
            if member.file_size > INFLATION_FLOOR and member.file_size > MAX_INFLATION * max(member.compress_size, 1):
                raise InputError(f"{source} inflates from {member.compress_size:,} to {member.file_size:,} bytes "
                                 f"(over {MAX_INFLATION}x: a deflate bomb, not embeddings); save real arrays with "
                                 "numpy.savez.")
            with archive.open(member) as fh:
                _header(fh, member.file_size, source)
        for key, member in members.items():
            source = f"precomputed embeddings {quote(path)} (member {quote(member.filename)})"
            try:
                with archive.open(member) as fh:
                    out[key] = np.load(fh, allow_pickle=False)
            except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
                raise InputError(f"cannot load {source} ({clip(str(exc))}); save it with numpy.savez "
                                 "(numbers and strings only, no objects).") from None
    return out["ids"], out["embeddings"]


def named_file(path: str | None, key: str, what: str, needs: str) -> Path:
    """The file ``encode.precomputed.<key>`` names (``what``: precomputed embeddings, ...); an InputError saying
    ``needs`` (what the run needs it for) when it is the placeholder for none, or naming the param when no file is
    there."""
    if not path or is_no_file(path):
        raise InputError(f"{needs}; it is {quote(path)}, the placeholder for none.")
    if not Path(path).is_file():
        raise InputError(f"{what} {quote(path)} not found; fix `encode.precomputed.{key}` (it must name a file).")
    return Path(path)


def read_precomputed(path: str | None, ids_path: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(ids, embeddings)`` as stored, or raise a InputError naming the fix.

    An ids ``.txt`` is UTF-8 with one id per line; a byte-order mark (Windows editors write one) is
    not part of the first id.
    """
    file = named_file(path, "path", "precomputed embeddings",
                      "`encode.backbone: precomputed` needs `encode.precomputed.path` (an .npz with ids and "
                      "embeddings, or an .npy with `encode.precomputed.ids`)")
    if file.suffix == ".npz":
        return load_npz(path)
    if not ids_path or is_no_file(ids_path):
        raise InputError(f"{quote(path)} holds embeddings only; set `encode.precomputed.ids` to the aligned ids file.")
    if not Path(ids_path).is_file():
        raise InputError(f"ids file {quote(ids_path)} not found; fix `encode.precomputed.ids` (it must name a file).")
    if ids_path.endswith(".txt"):
        try:
            ids = np.array(Path(ids_path).read_text(encoding="utf-8-sig").splitlines())
        except UnicodeDecodeError as exc:
            raise InputError(f"ids file {quote(ids_path)} is not UTF-8 text ({exc}); save one id per line as "
                             "UTF-8.") from None
    else:
        ids = _load_npy(Path(ids_path), "ids file")
    return ids, _load_npy(file, "precomputed embeddings")


def _text_ids(ids: np.ndarray, source: str) -> np.ndarray:
    """``ids`` as text: byte strings (dtype ``S``, as Python 2 or h5py wrote them) are decoded as UTF-8,
    and one that is not UTF-8 is an InputError naming its row (numpy's own cast decodes ASCII only)."""
    if ids.dtype.kind != "S":
        return ids.astype(str)
    flat = ids.ravel()
    for row, raw in enumerate(flat.tolist()):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{source}: id {row} is the byte string {quote(raw)}, which is not UTF-8 ({exc.reason} "
                             f"at byte {exc.start}); store ids as text (numpy.str_) or UTF-8 bytes.") from None
    return np.array([raw.decode("utf-8") for raw in flat.tolist()], dtype=str).reshape(ids.shape)


#: How :func:`align`'s messages name an item and its id, by ``what``: the catalog's images, or the captions.
_ITEMS = {"image": ("catalog image", "image_id", "every catalog image_id"),
          "caption": ("caption", "caption_id", "every caption_id of data/prepared/captions.csv")}


def align(ids: np.ndarray, emb: np.ndarray, catalog_ids: Sequence[str], source: str, what: str = "image") -> np.ndarray:
    """Rows of ``emb`` in catalog order; every id present, one dimension, finite, non-zero. ``what``: ``image``
    (``catalog_ids`` are the catalog's image ids) or ``caption`` (the captions table's caption ids)."""
    item, id_name, every = _ITEMS[what]
    if emb.ndim != 2 or emb.dtype.kind not in "iuf":
        why = " (complex numbers have no cosine here: store the real vectors)" if emb.dtype.kind == "c" else ""
        raise InputError(f"{source}: embeddings must be a numeric 2-D array (n, d); got shape {emb.shape}, "
                        f"dtype {emb.dtype}{why}.")
    ids = _text_ids(np.asarray(ids), source)
    if ids.ndim != 1 or len(ids) != len(emb):
        raise InputError(f"{source}: ids of shape {ids.shape} for {len(emb)} embedding rows; they must be a list "
                        "aligned one to one with the rows.")
    row = {image_id: i for i, image_id in enumerate(ids)}
    if len(row) != len(ids):
        raise InputError(f"{source}: ids repeat; give every embedding row its own {id_name}.")
    missing = [i for i in catalog_ids if i not in row]
    if missing:
        raise InputError(f"{source}: {len(missing)} {item}(s) have no embedding, e.g. "
                        f"{', '.join(missing[:5])}; compute embeddings for {every}.")
    out = emb[[row[i] for i in catalog_ids]].astype(np.float32)
    bad = unusable_rows(out)
    if bad.any():
        names = np.asarray(catalog_ids)[bad][:10].tolist()
        raise InputError(f"{source}: NaN, inf or all-zero embeddings for {int(bad.sum())} {what}(s): "
                        f"{', '.join(names)}; fix them at the source.")
    return out
