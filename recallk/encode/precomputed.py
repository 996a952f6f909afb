"""The ``precomputed`` backbone: embeddings computed elsewhere, checked against the catalog.

``encode.precomputed.path`` is either an ``.npz`` with arrays ``ids`` and
``embeddings``, or an ``.npy`` of embeddings with ``encode.precomputed.ids``
naming the aligned ids (an ``.npy`` of strings, or a ``.txt`` with one id per
line). Nothing is unpickled: arrays load with ``allow_pickle=False``.

The encode stage depends on ``${encode.precomputed.path}`` (dvc.yaml), so replacing the file re-runs
encode and score. Its default is :data:`PLACEHOLDER` (:data:`recallk.encode.base.NO_FILE`), a committed
file that stands for "none" (DVC cannot track null). An ``.npz`` holds the ids too; with an ``.npy``, the ids file is not tracked.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Sequence

import numpy as np

from recallk.checks import quote, unusable_rows
from recallk.encode.base import NO_FILE, is_no_file
from recallk.errors import InputError

NAME = "precomputed"
#: The default of ``encode.precomputed.path``: the committed file standing for "no file".
PLACEHOLDER = NO_FILE


def _load_array(path: Path, what: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:  # EOFError: an empty file
        raise InputError(f"cannot load {what} {str(path)!r} ({exc}); save it with numpy.save / numpy.savez "
                        "(numbers and strings only, no objects).") from None


def _load_npy(path: Path, what: str) -> np.ndarray:
    arr = _load_array(path, what)
    if not isinstance(arr, np.ndarray):
        raise InputError(f"{what} {str(path)!r} is an .npz archive, not one array; save it with numpy.save, "
                        "or give the .npz (with arrays ids and embeddings) as `encode.precomputed.path`.")
    return arr


def read_precomputed(path: str | None, ids_path: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(ids, embeddings)`` as stored, or raise a InputError naming the fix."""
    if not path or is_no_file(path):
        raise InputError("`encode.backbone: precomputed` needs `encode.precomputed.path` (an .npz with ids and "
                        f"embeddings, or an .npy with `encode.precomputed.ids`); it is {quote(path)}, the "
                        "placeholder for none.")
    file = Path(path)
    if not file.is_file():
        raise InputError(f"precomputed embeddings {path!r} not found; fix `encode.precomputed.path`.")
    if file.suffix == ".npz":
        npz = _load_array(file, "precomputed embeddings")
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise InputError(f"{path!r} is not an .npz archive; save it with numpy.savez(path, ids=..., "
                            "embeddings=...), or name an .npy file with `encode.precomputed.ids`.")
        with npz:
            missing = {"ids", "embeddings"} - set(npz.files)
            if missing:
                raise InputError(f"{path!r} lacks array(s) {', '.join(sorted(missing))}; save it with "
                                "numpy.savez(path, ids=..., embeddings=...).")
            try:
                return npz["ids"], npz["embeddings"]
            except (ValueError, OSError, zipfile.BadZipFile) as exc:
                raise InputError(f"cannot load precomputed embeddings {path!r} ({exc}); save it with numpy.savez "
                                "(numbers and strings only, no objects).") from None
    if not ids_path:
        raise InputError(f"{path!r} holds embeddings only; set `encode.precomputed.ids` to the aligned ids file.")
    if not Path(ids_path).is_file():
        raise InputError(f"ids file {ids_path!r} not found; fix `encode.precomputed.ids`.")
    if ids_path.endswith(".txt"):
        try:
            ids = np.array(Path(ids_path).read_text(encoding="utf-8").splitlines())
        except UnicodeDecodeError as exc:
            raise InputError(f"ids file {ids_path!r} is not UTF-8 text ({exc}); save one id per line as UTF-8.") from None
    else:
        ids = _load_npy(Path(ids_path), "ids file")
    return ids, _load_npy(file, "precomputed embeddings")


def align(ids: np.ndarray, emb: np.ndarray, catalog_ids: Sequence[str], source: str) -> np.ndarray:
    """Rows of ``emb`` in catalog order; every id present, one dimension, finite, non-zero."""
    if emb.ndim != 2 or not np.issubdtype(emb.dtype, np.number):
        raise InputError(f"{source}: embeddings must be a numeric 2-D array (n, d); got shape {emb.shape}, "
                        f"dtype {emb.dtype}.")
    ids = np.asarray(ids).astype(str)
    if ids.ndim != 1 or len(ids) != len(emb):
        raise InputError(f"{source}: ids of shape {ids.shape} for {len(emb)} embedding rows; they must be a list "
                        "aligned one to one with the rows.")
    row = {image_id: i for i, image_id in enumerate(ids)}
    if len(row) != len(ids):
        raise InputError(f"{source}: ids repeat; give every embedding row its own image_id.")
    missing = [i for i in catalog_ids if i not in row]
    if missing:
        raise InputError(f"{source}: {len(missing)} catalog image(s) have no embedding, e.g. "
                        f"{', '.join(missing[:5])}; compute embeddings for every catalog image_id.")
    out = emb[[row[i] for i in catalog_ids]].astype(np.float32)
    bad = unusable_rows(out)
    if bad.any():
        names = np.asarray(catalog_ids)[bad][:10].tolist()
        raise InputError(f"{source}: NaN, inf or all-zero embeddings for {int(bad.sum())} image(s): "
                        f"{', '.join(names)}; fix them at the source.")
    return out
