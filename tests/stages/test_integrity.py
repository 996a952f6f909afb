"""Silent wrong numbers, refused at the root: each test names the mechanism it pins.

Unit and stage-level tests (no ``dvc``); the ``dvc repro`` ones are in tests/pipeline/test_integrity_flow.py,
4. (a poisoned embedding cache) in tests/encode/test_poisoned_cache.py, 6. (params.yaml as DVC reads it) in
test_params_yaml.py.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from helpers import ROOT, run_in_process, save_image, set_dotted
from recallk import images
from recallk.data import catalog, contract, prepare
from recallk.data.settings import SplitSettings
from recallk.errors import InputError, quote
from recallk.settings.base import from_mapping
from stages.params import load_section

#: prepare() params of these tests: every image is in val/gallery and, under leave_one_out, a query.
DEFAULTS = dict(data_root="data", csv=None, on_bad_image="error", strategy="per_class", protocol="leave_one_out",
                seed=0, fractions={"train": 0.0, "val": 0.5, "gallery": 0.5}, images="files")


def build(**overrides):
    return prepare.prepare(from_mapping(SplitSettings, DEFAULTS | overrides))


def make_images(root: Path, labels: dict[str, int]) -> None:
    """``n`` distinct PNGs per label folder: ``root/<label>/<i>.png``."""
    for j, (label, n) in enumerate(labels.items()):
        for i in range(n):
            save_image(root / label / f"{i}.png", seed=100 * j + i)


def manifest(root: Path, rows: list[str], header: str = "path,label") -> str:
    (root / "m.csv").write_text(header + "\n" + "".join(r + "\n" for r in rows), encoding="utf-8")
    return "m.csv"


# ================================================================ 1. the same file under two rows


@pytest.mark.parametrize("alias", ["a/./0.png", "a//0.png", "./a/0.png", "a/link.png"])
def test_same_file_under_two_paths_is_refused(work, alias):
    """`a/./0.png`, `a//0.png` or a symlink alias name the file `a/0.png` again: under leave_one_out the
    query would retrieve its own file. The path-once rule compares resolved real paths."""
    make_images(work / "data", {"a": 3, "b": 3})
    if alias == "a/link.png":
        (work / "data" / "a" / "link.png").symlink_to("0.png")
    rows = [f"{lab}/{i}.png,{lab}" for lab in "ab" for i in range(3)] + [f"{alias},a"]
    with pytest.raises(InputError) as info:
        build(csv=manifest(work / "data", rows))
    message = str(info.value)
    assert contract.PATH_ONCE_RULE in message
    assert "CSV line 2, path 'a/0.png'" in message and f"CSV line 8, path '{alias}'" in message


def test_symlink_alias_in_a_folder_scan_is_refused(work):
    make_images(work / "data", {"a": 3, "b": 3})
    (work / "data" / "a" / "zz.png").symlink_to("0.png")
    with pytest.raises(InputError) as info:
        build()
    message = str(info.value)
    assert contract.PATH_ONCE_RULE in message
    assert "path 'a/0.png'" in message and "path 'a/zz.png'" in message


@pytest.mark.parametrize("protocol, splits", [
    ("leave_one_out", None),                      # both copies land in gallery: each retrieves the other
    ("query_gallery", ("val", "gallery")),        # a query and its byte-identical copy in the gallery
    ("query_gallery", ("gallery", "gallery")),    # listed twice in the gallery: counted twice
])
def test_byte_identical_files_in_val_gallery_are_refused(work, protocol, splits):
    """Two files with the same sha256 under two image_ids in val/gallery are one image twice."""
    make_images(work / "data", {"a": 3, "b": 3})
    shutil.copy(work / "data" / "a" / "0.png", work / "data" / "a" / "copy.png")
    if splits is None:
        overrides = {}
        rows = None
    else:
        rows = [f"{lab}/{i}.png,{lab},{s}" for lab in "ab" for i, s in enumerate(("val", "gallery", "gallery"))]
        rows[0] = f"a/0.png,a,{splits[0]}"
        rows.append(f"a/copy.png,a,{splits[1]}")
        overrides = {"csv": manifest(work / "data", rows, header="path,label,split"), "strategy": "given"}
    with pytest.raises(InputError) as info:
        build(protocol=protocol, **overrides)
    message = str(info.value)
    assert contract.EVAL_ONCE_RULE in message
    assert "path 'a/0.png'" in message and "path 'a/copy.png'" in message


def test_byte_identical_files_are_listed_by_content(work):
    """issue 38: 3 copies of one file and 2 of another were 5 rows, listed one by one; they are 2 files: one line
    per content (its sha256), naming its rows, with the counts."""
    make_images(work / "data", {"a": 3, "b": 3})
    for src, copies in (("a/0.png", ("a/copy1.png", "a/copy2.png")), ("b/1.png", ("b/copy.png",))):
        for dest in copies:
            shutil.copy(work / "data" / src, work / "data" / dest)
    with pytest.raises(InputError) as info:
        build()
    lines = str(info.value).splitlines()
    rule = [i for i, line in enumerate(lines) if contract.EVAL_ONCE_RULE in line]
    assert len(rule) == 1 and lines[rule[0]].endswith(": 5 row(s), 2 file content(s)")
    groups = lines[rule[0] + 1:rule[0] + 3]
    sha = {name: hashlib.sha256((work / "data" / name).read_bytes()).hexdigest()[:12]
           for name in ("a/0.png", "b/1.png")}
    assert groups[0].strip().startswith(f"sha256 {sha['a/0.png']}... (3 rows): path 'a/0.png' (")
    assert all(f"path '{p}'" in groups[0] for p in ("a/copy1.png", "a/copy2.png")) and "b/" not in groups[0]
    assert groups[1].strip().startswith(f"sha256 {sha['b/1.png']}... (2 rows): path 'b/1.png' (")
    assert "path 'b/copy.png'" in groups[1] and "a/" not in groups[1]
    assert sum(line.count("path '") for line in lines[rule[0] + 1:]) == 5  # each row named once


def test_byte_identical_files_in_train_only_are_fine(work):
    make_images(work / "data", {"a": 3, "b": 3, "c": 2})
    shutil.copy(work / "data" / "c" / "0.png", work / "data" / "c" / "copy.png")
    rows = ([f"{lab}/{i}.png,{lab},{s}" for lab in "ab" for i, s in enumerate(("val", "gallery", "gallery"))]
            + ["c/0.png,c,train", "c/1.png,c,train", "c/copy.png,c,train"])
    cat, _, _ = build(csv=manifest(work / "data", rows, header="path,label,split"), strategy="given")
    assert len(cat) == 9


@pytest.mark.stage
def test_split_stage_refuses_a_self_retrieving_alias(project):
    """End to end: the stage exits 2 with one message instead of a leave_one_out recall@1 of 1.0."""
    root = project / "data" / "digits"
    rows = [f"{p.parent.name}/{p.name},{p.parent.name}" for p in sorted(root.glob("*/*.png"))]
    first = rows[0].split(",")[0]
    rows.append(first.replace("/", "/./") + "," + rows[0].split(",")[1])
    (root / "m.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    params = (project / "params.yaml").read_text()
    params = params.replace("csv: null", "csv: m.csv").replace("protocol: query_gallery", "protocol: leave_one_out")
    params = params.replace("strategy: class_disjoint", "strategy: per_class")
    (project / "params.yaml").write_text(params)
    proc = run_in_process("split", cwd=project)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert contract.PATH_ONCE_RULE in proc.stderr
    assert not (project / "data" / "prepared" / "catalog.csv").exists()


# ================================================================ 2. no folder drops out of a scan silently


def unreadable(monkeypatch, *folders: Path) -> None:
    """``os.scandir`` fails on ``folders`` as on a folder without read permission (the tests may run as root)."""
    real_scandir = os.scandir
    blocked = {os.path.abspath(f) for f in folders}

    def scandir(path="."):
        if os.path.abspath(path) in blocked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_unreadable_label_folder_and_sub_folder_are_named(work, monkeypatch):
    """os.walk dropped an unreadable folder without a word: its images vanished from the catalog."""
    make_images(work / "data", {"a": 3, "b": 3, "c": 3})
    save_image(work / "data" / "b" / "deep" / "x.png", seed=50)
    unreadable(monkeypatch, work / "data" / "a", work / "data" / "b" / "deep")
    with pytest.raises(InputError) as info:
        catalog.scan_folder(Path("data"))
    message = str(info.value)
    assert "2 folder(s) or link(s) cannot be scanned" in message
    assert "a/ cannot be read (Permission denied); fix its permissions" in message
    assert "b/deep/ cannot be read (Permission denied)" in message


def test_unreadable_data_root_is_an_input_error(work, monkeypatch):
    make_images(work / "data", {"a": 2})
    unreadable(monkeypatch, work / "data")
    with pytest.raises(InputError, match=r"data root 'data' cannot be read \(Permission denied\)"):
        catalog.scan_folder(Path("data"))


@pytest.mark.parametrize("link, target, named", [
    ("a/back", "..", "a/back/ is a symlink loop"),            # a folder link to its own parent
    ("a/deep/up", "../..", "a/deep/up/ is a symlink loop"),   # to the data root, from a sub-folder
    ("a/self.png", "self.png", "a/self.png is a symlink loop"),  # a file link to itself
    ("loop", "loop", "loop is a symlink loop"),               # a label "folder" that is a loop
])
def test_symlink_loops_are_named(work, link, target, named):
    make_images(work / "data", {"a": 3, "b": 3})
    (work / "data" / "a" / "deep").mkdir()
    (work / "data" / link).symlink_to(target)
    with pytest.raises(InputError, match="cannot be scanned") as info:
        catalog.scan_folder(Path("data"))
    assert named in str(info.value)


def test_linked_sub_folder_is_scanned_not_dropped(work):
    """A link to a folder inside a label folder was not followed (its images vanished); it is followed
    like a label folder that is a link, and the contract then judges its files."""
    make_images(work / "data", {"a": 3, "b": 3})
    save_image(work / "data" / ".store" / "x.png", seed=60)
    (work / "data" / "a" / "more").symlink_to("../.store", target_is_directory=True)
    assert "a/more/x.png" in catalog.scan_folder(Path("data"))["path"].tolist()


@pytest.mark.stage
def test_split_stage_names_a_symlink_loop_without_a_traceback(project):
    (project / "data" / "digits" / "3" / "loop.png").symlink_to("loop.png")
    proc = run_in_process("split", cwd=project)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "3/loop.png is a symlink loop" in proc.stderr


def test_manifest_row_naming_a_symlink_loop_is_a_contract_failure(work):
    make_images(work / "data", {"a": 3, "b": 3})
    (work / "data" / "a" / "loop.png").symlink_to("loop.png")
    rows = [f"{lab}/{i}.png,{lab}" for lab in "ab" for i in range(3)] + ["a/loop.png,a"]
    with pytest.raises(InputError) as info:
        build(csv=manifest(work / "data", rows))
    assert "CSV line 8, path 'a/loop.png', is a symlink loop; point the link at a file or remove it" in str(info.value)


# ================================================================ 3. a manifest DVC cannot see


@pytest.mark.parametrize("where", ["../elsewhere.csv", "ABSOLUTE", "link.csv", "sub/../../elsewhere.csv"])
def test_manifest_outside_the_data_root_is_refused(work, where):
    """DVC tracks only `split.data_root`: a manifest outside it could change without re-running the split."""
    make_images(work / "data", {"a": 3, "b": 3})
    rows = [f"{lab}/{i}.png,{lab}" for lab in "ab" for i in range(3)]
    (work / "elsewhere.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    if where == "ABSOLUTE":
        where = str(work / "elsewhere.csv")
    if where == "link.csv":
        (work / "data" / "link.csv").symlink_to(work / "elsewhere.csv")
    with pytest.raises(InputError) as info:
        build(csv=where)
    message = str(info.value)
    assert f"`split.csv` is {where!r}, which is not inside `split.data_root` ('data')" in message
    assert "Move the manifest into 'data'" in message and "`split.csv: " in message


def test_manifest_in_a_sub_folder_of_the_data_root_is_fine(work):
    make_images(work / "data", {"a": 3, "b": 3})
    rows = [f"{lab}/{i}.png,{lab}" for lab in "ab" for i in range(3)]
    (work / "data" / "lists").mkdir()
    (work / "data" / "lists" / "m.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    cat, _, _ = build(csv="lists/m.csv")
    assert len(cat) == 6


# ================================================================ 5. pixels of more than 8 bits


def tiff(array: np.ndarray, mode: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array, mode).save(buf, "TIFF")
    return buf.getvalue()


def grey(img: Image.Image) -> np.ndarray:
    assert img.mode == "RGB"
    rgb = np.asarray(img)
    assert (rgb == rgb[..., :1]).all()
    return rgb[..., 0]


def test_float_image_in_0_1_is_scaled_not_black():
    """Mode F brightness 0..1 became levels 0 or 1 (black): it is scaled to 0..255."""
    values = np.linspace(0, 1, 16, dtype=np.float32).reshape(4, 4)
    assert Image.open(io.BytesIO(tiff(values, "F"))).mode == "F"
    np.testing.assert_array_equal(grey(images.decode(tiff(values, "F"))), np.rint(values * 255).astype(np.uint8))


def test_16_bit_levels_in_mode_i_keep_their_scale():
    levels = (np.arange(16, dtype=np.int32).reshape(4, 4) * 4369)  # 0 .. 65535
    np.testing.assert_array_equal(grey(images.decode(tiff(levels, "I"))), np.rint(levels / 257).astype(np.uint8))


@pytest.mark.parametrize("array, mode, why", [
    (np.array([[0, 70000], [100000, 2**31 - 1]], np.int32), "I",
     "32-bit integer pixels (mode I) span 0..2.14748e+09, beyond 16-bit levels 0..65535"),
    (np.array([[-5, 0], [10, 20]], np.int32), "I", "span -5..20, beyond 16-bit levels"),
    (np.array([[0.0, 0.5], [2.0, 255.0]], np.float32), "F", "floating-point pixels (mode F) span 0..255, beyond 0..1"),
    (np.array([[0.0, np.nan], [0.5, 1.0]], np.float32), "F", "include NaN or inf"),
])
def test_pixels_of_unknown_scale_are_refused(array, mode, why):
    """Mode I above 65535 was divided by 257 and clipped to white; mode F beyond 0..1 was clipped."""
    with pytest.raises(images.DECODE_ERRORS, match=re.escape(why)) as info:
        images.decode(tiff(array, mode))
    assert "save the image with 8 or 16 bits per channel" in str(info.value)


def test_split_stage_names_an_image_of_unknown_scale(work):
    make_images(work / "data", {"a": 3, "b": 3})
    (work / "data" / "a" / "wide.tif").write_bytes(tiff(np.array([[0, 70000]], np.int32), "I"))
    with pytest.raises(InputError) as info:
        build()
    assert ("path 'a/wide.tif', Pillow cannot decode it (32-bit integer pixels (mode I) span 0..70000, beyond "
            "16-bit levels 0..65535" in str(info.value))


# ================================================================ 7. quoted values are bounded


def test_quote_cuts_long_values_and_says_how_long():
    assert quote("abc") == "'abc'"
    long = quote("x" * 1000)
    assert long == "'" + "x" * 199 + "... (1002 characters in all)"
    assert quote(list(range(10)), limit=8) == "[0, 1, 2... (30 characters in all)"


def longest_line(message: str) -> int:
    return max(len(line) for line in message.splitlines())


@pytest.mark.parametrize("dotted, value", [
    ("split.strategy", "x" * 100_000),              # choice
    ("score.ks", list(range(-1, 2_000))),           # list rule from recallk.checks
    ("split.seed", "s" * 100_000),                  # integer rule from recallk.checks
    ("encode", ["not", "a", "mapping"] * 1_000),    # a section that is not a mapping
])
def test_params_messages_quote_values_within_bounds(tmp_path, dotted, value):
    params = set_dotted(yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8")), dotted, value)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False, width=10**9), encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_section(dotted.split(".")[0] if "." in dotted else "split", path)
    message = str(info.value)
    assert f"`{dotted}`" in message and "characters in all)" in message
    assert longest_line(message) < 600, message[:1000]


def test_contract_rows_quote_cells_within_bounds(work):
    make_images(work / "data", {"a": 3, "b": 3})
    rows = [f"{lab}{i},{lab}/{i}.png,{lab}" for lab in "ab" for i in range(3)]
    rows += [f"id,{'p' * 50_000}.png,a", f"{'q' * 50_000}\x01,a/0.png,a"]  # a missing file; a bad id
    with pytest.raises(InputError) as info:
        build(csv=manifest(work / "data", rows, header="image_id,path,label"))
    message = str(info.value)
    assert "CSV line 8, path 'ppppp" in message and "CSV line 9, path 'a/0.png', image_id 'qqqq" in message
    assert message.count("characters in all)") >= 2
    assert longest_line(message) < 600, message[:1000]
