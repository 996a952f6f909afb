"""Hostile corpus, round 2 (issue 25): labels, ids and paths with invisible controls, a bad split value
that the message did not echo, K beyond every gallery accepted silently, Pillow warnings naming no file.

Defect classes: ``silent`` (text that displays as something else passed the control-character rule; an
undefined K passed without a word) and ``message`` (the value or the file at fault not named). Each case
failed on the code before this file and passes after.
"""

from __future__ import annotations

import io
import logging
import struct
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from leakage_helpers import run_prepare, smooth
from recallk import retrieval_metrics
from recallk.data import catalog, contract
from recallk.errors import InputError
from recallk.images import decode

# ---------------------------------------------------------------- the control-character rule


def table(**column: list[str]) -> pd.DataFrame:
    """An ids-only image table (embeddings-only manifest rows), one column replaced."""
    base = {"image_id": ["a/0", "a/1", "b/0", "b/1"], "label": ["a", "a", "b", "b"],
            "split": ["val", "gallery", "val", "gallery"]}
    return pd.DataFrame(base | column)


def contract_message(frame: pd.DataFrame) -> str:
    with pytest.raises(InputError) as info:
        contract.validate(frame, contract.image_table_schema(class_disjoint=False, files=False),
                          source="manifest.csv", csv_lines=True)
    return str(info.value)


HIDDEN = [
    ("b\x85", r"'b\x85'"),                       # NEL, a C1 control (a line break to some readers)
    ("b\x9b31m", r"'b\x9b31m'"),                 # CSI, the C1 escape of terminal colour codes
    ("b\u2028c", r"'b\u2028c'"),                 # LINE SEPARATOR
    ("b\u2029", r"'b\u2029'"),                   # PARAGRAPH SEPARATOR
    ("abc\u202egpj.exe", r"'abc\u202egpj.exe'"),  # RIGHT-TO-LEFT OVERRIDE: shows as abcexe.jpg
    ("b\u2066x\u2069", r"'b\u2066x\u2069'"),     # LEFT-TO-RIGHT ISOLATE ... POP DIRECTIONAL ISOLATE
    ("b\u200f", r"'b\u200f'"),                   # RIGHT-TO-LEFT MARK
    ("b\x7f", r"'b\x7f'"),                       # DEL (was refused for labels, not for image ids)
]


@pytest.mark.parametrize("label, shown", HIDDEN)
def test_invisible_controls_in_a_label_fail_the_label_rule(label, shown):
    message = contract_message(table(label=["a", "a", label, label]))
    assert contract.LABEL_TEXT_RULE in message and "CSV line 4" in message and f"label {shown}" in message


@pytest.mark.parametrize("image_id, shown", HIDDEN)
def test_invisible_controls_in_an_image_id_fail_the_id_rule(image_id, shown):
    message = contract_message(table(image_id=["a/0", "a/1", image_id, "b/1"]))
    assert contract.IMAGE_ID_RULE in message and f"image_id {shown}" in message


@pytest.mark.parametrize("path", ["a/abc\u202egpj.png", "a/x\x85.png", "a/x\u2028.png"])
def test_invisible_controls_in_a_path_are_not_safe(path):
    assert not contract.is_safe_relative(path)


def test_ordinary_unicode_still_passes():
    """Accents, CJK, emoji with a zero-width joiner and a right-to-left script are text, not controls."""
    labels = ["caf\u00e9", "\u732b", "\U0001f468\u200d\U0001f469", "\u05e9\u05dc\u05d5\u05dd"]
    frame = pd.DataFrame({"image_id": [f"{i}/{j}" for i in range(4) for j in range(2)],
                          "label": [x for x in labels for _ in range(2)], "split": ["val", "gallery"] * 4})
    contract.validate(frame, contract.image_table_schema(class_disjoint=False, files=False),
                      source="manifest.csv", csv_lines=True)


def test_a_label_folder_with_a_bidi_override_is_refused(tmp_path):
    """Folder mode: the one label rule (the folder name is the label)."""
    for k, label in enumerate(("a", "b", "c", "abc\u202egpj")):
        (tmp_path / label).mkdir()
        for seed in range(4):
            smooth(seed + 10 * k).save(tmp_path / label / f"{seed}.png")
    with pytest.raises(InputError, match="bidirectional") as info:
        run_prepare(tmp_path)
    # the rule of labels, and of ids and paths too (the folder name is in both)
    assert contract.LABEL_TEXT_RULE in str(info.value) and r"label 'abc\u202egpj'" in str(info.value)


# ---------------------------------------------------------------- echo the value at fault


@pytest.mark.parametrize("value, shown", [
    ("tset", "split 'tset'"),             # a typo
    ("Val", "split 'Val'"),               # the case
    ("val ", "split 'val '"),             # a trailing space, visible only quoted
])
def test_a_bad_split_value_is_echoed(value, shown):
    message = contract_message(table(split=["val", "gallery", value, "gallery"]))
    assert contract.SPLIT_RULE in message and f"CSV line 4, image_id 'b/0', {shown}" in message


# ---------------------------------------------------------------- K beyond every gallery


def embeddings(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 8))


def test_k_beyond_every_gallery_warns_once_naming_each_k():
    labels = [0, 1, 0, 1, 2, 2]
    with pytest.warns(UserWarning) as caught:
        retrieval_metrics(embeddings(6), embeddings(6, 1), labels, labels, ks=[1, 8, 20])
    said = [str(w.message) for w in caught if "larger than every query's gallery" in str(w.message)]
    assert said == ["K = 8, 20 is larger than every query's gallery (at most 6 retrievable items): recall@K is "
                    "1.0 for every query with a positive there; use K up to 6 (`ks` / `score.ks`)."]


def test_k_within_the_gallery_says_nothing():
    labels = [0, 1, 0, 1, 2, 2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        retrieval_metrics(embeddings(6), embeddings(6, 1), labels, labels, ks=[1, 6])


# ---------------------------------------------------------------- Pillow's warnings name the file


def jpeg_with_broken_exif() -> bytes:
    """An 8x8 JPEG whose EXIF ImageDescription claims 100 bytes at an offset past the block's end."""
    tiff = (b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1) + struct.pack("<HHII", 0x010E, 2, 100, 26)
            + struct.pack("<I", 0))
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buf, "JPEG", exif=b"Exif\x00\x00" + tiff)
    return buf.getvalue()


def test_a_pillow_exif_warning_names_the_file(caplog):
    with caplog.at_level(logging.WARNING, logger="recallk.images"), warnings.catch_warnings():
        warnings.simplefilter("error")  # logged, not warned nameless
        decode(jpeg_with_broken_exif(), name="data/x/broken.jpg")
    assert any(r.getMessage().startswith("data/x/broken.jpg: Pillow warns: Tag data larger than file")
               for r in caplog.records), caplog.text


def test_the_split_probe_names_each_file_pillow_warns_about(tmp_path, caplog):
    """Twice the same warning, for two files: each is named (the default filter showed the first only)."""
    for name in ("one.jpg", "two.jpg"):
        (tmp_path / "a").mkdir(exist_ok=True)
        (tmp_path / "a" / name).write_bytes(jpeg_with_broken_exif())
    frame = pd.DataFrame({"image_id": ["a/one.jpg", "a/two.jpg"], "path": ["a/one.jpg", "a/two.jpg"],
                          "label": ["a", "a"]})
    with caplog.at_level(logging.WARNING, logger="recallk.images"):
        catalog.probe(tmp_path, frame)
    named = {Path(r.getMessage().split(":")[0]).name for r in caplog.records if "Pillow warns" in r.getMessage()}
    assert named == {"one.jpg", "two.jpg"}


def test_without_a_name_pillow_warnings_are_warned_as_before():
    with pytest.warns(UserWarning, match="Tag data larger than file"):
        decode(jpeg_with_broken_exif())
