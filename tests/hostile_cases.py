"""The hostile-input corpus's shared pieces: its tiny project, manifests and checks of stage output
(imported by tests/stages/test_split_stage_images.py and test_split_stage_manifests.py, each with its own
``proj`` fixture: :func:`make_project` in ``tmp_path``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from helpers import (
    CATALOG,
    EMBEDDINGS,
    IDS,
    STAGES,
    read_csv,
    run_ok,
    set_params,
    tiny_project,
)
from recallk.encode.registry import encode_pixels

LABELS = ("a", "b", "c", "d")
PER_LABEL = 3
RES = 4  # encode.pixels.resolution: every embedding is 3 * 4 * 4 = 48 values in [0, 1]


# ================================================================ helpers


def make_project(where: Path, labels: tuple[str, ...] = LABELS, per_label: int = PER_LABEL) -> Path:
    """params.yaml (tiny pixels backbone, few bootstrap resamples) + data/digits/<label>/<i>.png."""
    return tiny_project(where, labels, per_label)  # at resolution RES


def data_root(proj: Path) -> Path:
    return proj / "data" / "digits"


def pipeline(proj: Path) -> list:
    """Run split, encode, score; each must succeed."""
    return [run_ok(proj, stage) for stage in STAGES]


def assert_line_names(stderr: str, where: str, *details: str) -> None:
    """Some line of ``stderr`` contains ``where`` and every one of ``details``."""
    lines = [ln for ln in stderr.splitlines() if where in ln]
    assert lines, f"{where!r} not named in stderr:\n{stderr}"
    assert any(all(d.lower() in ln.lower() for d in details) for ln in lines), \
        f"no line naming {where!r} says {details}:\n" + "\n".join(lines)


def embeddings(proj: Path) -> dict[str, np.ndarray]:
    """image_id -> its embedding row, checked to align with the catalog."""
    emb = np.load(proj / EMBEDDINGS, allow_pickle=False)
    ids = np.load(proj / IDS, allow_pickle=False).tolist()
    assert ids == read_csv(proj, CATALOG)["image_id"].tolist()
    assert emb.dtype == np.float32 and emb.shape == (len(ids), 3 * RES * RES)
    return dict(zip(ids, emb))


def pixels_of(rgb: np.ndarray) -> np.ndarray:
    """The pixels backbone's embedding of an RGB uint8 array (the reference for decoded images)."""
    return encode_pixels([Image.fromarray(rgb.astype(np.uint8), "RGB")], resolution=RES)[0]


def manifest(proj: Path, rows: list[str], header: str = "path,label", *, strategy: str | None = None,
             bom: bool = False) -> None:
    """Write data/digits/manifest.csv (line 1 = header, rows from line 2) and point `split.csv` at it."""
    text = header + "\n" + "".join(r + "\n" for r in rows)
    (data_root(proj) / "manifest.csv").write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    change = {"split.csv": "manifest.csv"}
    if strategy:
        change["split.strategy"] = strategy
    set_params(proj, change)


def base_rows() -> list[str]:
    """``path,label`` of every generated image, label by label (CSV lines 2..13)."""
    return [f"{label}/{i}.png,{label}" for label in LABELS for i in range(PER_LABEL)]


def given_rows(splits: dict[str, tuple[str, ...]]) -> list[str]:
    """``path,label,split`` rows; ``splits[label]`` gives the split of each of the label's images."""
    return [f"{label}/{i}.png,{label},{s}" for label, per in splits.items() for i, s in enumerate(per)]


def line_of(rows: list[str], row: str) -> int:
    return rows.index(row) + 2


def rgb_block(h: int, w: int, colour: tuple[int, int, int]) -> np.ndarray:
    return np.broadcast_to(np.asarray(colour, np.uint8), (h, w, 3)).copy()
