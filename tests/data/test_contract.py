"""recallk.data.contract: every rule of the image table, all failures reported at once, row by row."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from helpers import (
    build,
    save_image,
    write_csv,
    write_images,
)
from leakage_helpers import run_prepare, smooth
from recallk.data import catalog, contract
from recallk.errors import InputError


def test_contract_reports_every_failure_at_once(work):
    root = work / "data"
    write_images(root, {"a": 4, "b": 4})
    (root / "a" / "notes.png").write_text("not an image")
    png = (root / "a" / "000.png").read_bytes()
    (root / "a" / "trunc.png").write_bytes(png[: len(png) // 2])
    outside = save_image(work / "outside.png", seed=99)
    write_csv(root / "m.csv", "image_id,path,label,split\n"
                              "i0,a/000.png,a,train\n"                  # line 2: fine
                              "i1,a/001.png,a,gallery\n"                # line 3: duplicate id (with line 4)
                              "i1,a/002.png,a,val\n"                    # line 4: duplicate id
                              "i3,a/missing.png,a,val\n"                # line 5: missing file
                              "i4,a/notes.png,a,val\n"                  # line 6: not an image
                              "i5,a/trunc.png,a,val\n"                  # line 7: truncated PNG
                              f"i6,{outside},a,val\n"                   # line 8: absolute path
                              "i7,../outside.png,a,val\n"               # line 9: '..' path
                              "i8,b/000.png,,val\n"                     # line 10: empty label
                              "i9,b/001.png,b,test\n"                   # line 11: invalid split
                              "i10,b/002.png,b,gallery\n"               # line 12: fine
                              "i11,b/003.png,b,val\n")                  # line 13: fine
    with pytest.raises(InputError) as err:
        build(csv="m.csv", strategy="given")
    msg = str(err.value)
    assert msg.startswith("data contract failed for data/m.csv")
    expected = [
        (contract.FILE_RULE, "CSV line 5, path 'a/missing.png'", "file does not exist"),
        (contract.FILE_RULE, "CSV line 6, path 'a/notes.png'", "Pillow cannot decode it"),
        (contract.FILE_RULE, "CSV line 7, path 'a/trunc.png'", "truncated"),
        ("image_id must be unique", "CSV line 3, path 'a/001.png'", "image_id 'i1'"),
        ("image_id must be unique", "CSV line 4, path 'a/002.png'", "image_id 'i1'"),
        (contract.PATH_RULE, f"CSV line 8, path '{outside}'", "image_id 'i6'"),
        (contract.PATH_RULE, "CSV line 9, path '../outside.png'", "image_id 'i7'"),
        ("label must not be", "CSV line 10, path 'b/000.png'", "image_id 'i8'"),
        (contract.SPLIT_RULE, "CSV line 11, path 'b/001.png'", "image_id 'i9'"),
    ]
    for rule, where, detail in expected:
        assert rule in msg
        line = next((ln for ln in msg.splitlines() if where in ln), None)
        assert line is not None and detail in line, where
    for fine in ("CSV line 2,", "CSV line 12,", "CSV line 13,"):
        assert fine not in msg


def test_contract_blank_label_is_reported(work):
    write_images(work / "data", {"a": 2})
    write_csv(work / "data" / "m.csv", "path,label\na/000.png,a\na/001.png,\"  \"\n")  # whitespace label
    with pytest.raises(InputError, match=re.escape(contract.LABEL_RULE) + r": 1 row\(s\)\n.*CSV line 3"):
        build(csv="m.csv")


def test_missing_label_in_manifest_stays_missing(work):
    write_images(work / "data", {"a": 2})
    write_csv(work / "data" / "m.csv", "path,label\na/000.png,a\na/001.png,\n")
    with pytest.raises(InputError, match=r"label must not be missing") as info:
        build(csv="m.csv")
    assert "CSV line 3" in str(info.value)


def test_contract_reports_leakage_between_train_and_gallery(work):
    root = work / "data"
    write_images(root, {"a": 3})
    shutil.copy(root / "a" / "000.png", root / "a" / "copy.png")  # same bytes, other name
    write_csv(root / "m.csv", "path,label,split\n"
                              "a/000.png,a,train\n"
                              "a/001.png,a,val\n"
                              "a/002.png,a,gallery\n"
                              "a/copy.png,a,gallery\n")
    with pytest.raises(InputError) as err:
        build(csv="m.csv", strategy="given")
    msg = str(err.value)
    assert contract.LEAK_RULE in msg
    assert "CSV line 2, path 'a/000.png'" in msg and "CSV line 5, path 'a/copy.png'" in msg
    assert "a/001.png" not in msg and "a/002.png" not in msg


def test_contract_rejects_a_label_on_both_sides_under_class_disjoint(work):
    write_images(work / "data", {"a": 2, "b": 2})
    frame = catalog.probe(Path("data"), catalog.scan_folder(Path("data")))
    frame["split"] = ["train", "gallery", "val", "gallery"]  # label a is in train and in gallery
    with pytest.raises(InputError, match=re.escape(contract.DISJOINT_RULE)) as info:
        contract.validate(frame, contract.image_table_schema(class_disjoint=True), source="data/", csv_lines=False)
    assert "path 'a/000.png'" in str(info.value) and "path 'a/001.png'" in str(info.value)
    assert "b/000.png" not in str(info.value)
    # fine for per_class
    contract.validate(frame, contract.image_table_schema(class_disjoint=False), source="data/", csv_lines=False)


# ================================================================ invisible controls, the value at fault (issue 25)
# Moved from the hostile corpus (test_hostile_labels.py): text that displays as something else passed the
# control-character rule (silent), and a bad split value was not echoed (message); each failed before.


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


# ---------------------------------------------------------------- safe relative paths (issue 25)
# A colon inside a name is an ordinary character; drive letters, URL schemes, NUL and line breaks are not
# (moved from the hostile corpus, test_hostile_messages.py).


@pytest.mark.parametrize("path, safe", [
    ("type:A/0.png", True),   # a colon inside a name
    ("a/b:c.png", True),
    ("C:/x.png", False),      # a Windows drive
    ("c:x.png", False),       # drive-relative
    ("s3://bucket/x.png", False),   # a URL scheme
    ("file:///etc/passwd", False),
    ("a/\x00.png", False),    # NUL
    ("a/\n.png", False),      # a line break
])
def test_safe_relative_paths(path, safe):
    assert contract.is_safe_relative(path) is safe
