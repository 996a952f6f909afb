"""``recallk datasets prepare`` refuses damaged releases (issue 39): each fixture tree is in its official layout
(tests/dataset_fixtures.py), damaged in one way; the refusal is one InputError naming the file, the line (or
the file of a re-ID folder) and the rule, and nothing is written. Also: files that are not UTF-8 or not files,
paths leaving the data root, ``--apply`` all or nothing and in place, a byte-order mark, the count warning."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from dataset_fixtures import (
    WRITERS,
    add_line,
    rename_first,
    set_line,
    write_cars_folders,
    write_cars_mat,
    write_cub,
    write_reid,
    write_sop,
)
from helpers import ROOT
from recallk import cli as top_cli
from recallk.datasets import prepare
from recallk.datasets.cli import main
from recallk.errors import InputError

WRITERS = {**WRITERS, "cars_folders": write_cars_folders}
#: What a refusal of a damaged release ends with.
REPAIR = r"\. Re-extract the release, or correct the line or file named\.$"
LABELS, IMAGES = "image_class_labels.txt", "images.txt"
INSHOP = "list_eval_partition.txt"


def _dataset(fixture: str) -> str:
    return "cars196" if fixture == "cars_folders" else fixture


@pytest.mark.parametrize("fixture, damage, message", [
    # the cases
    # an image listed with two classes (the second line would move it from train into the test gallery)
    ("cub200", lambda r: add_line(r / LABELS, "1 101"),
     rf"line 16 of '[^']*{LABELS}' lists image id 1 again \(first at line 1 of [^)]*\): one class per image"),
    # an image id listed twice (the second file would replace the first)
    ("cub200", lambda r: set_line(r / IMAGES, 2, "1 001.Bird_1/Bird_1_0001_11.jpg"),
     rf"line 2 of '[^']*{IMAGES}' lists image id 1 again \(first at line 1 of .*\): one line per image id"),
    # two classes of one name (their folders would merge into one class)
    ("cars_folders", lambda r: set_line(r / "names.csv", 2, "Car Model 1 2012"),
     r"line 2 of '[^']*names.csv' lists the class name 'Car Model 1 2012' again \(first at line 1 .*merge them"),
    # class 0, below the release's range
    ("cub200", lambda r: set_line(r / LABELS, 1, "1 0"),
     rf"line 1 of '[^']*{LABELS}' gives class '0': a class of CUB-200-2011 .* is a whole number from 1 to 200"),
    # class 999, above it
    ("cub200", lambda r: set_line(r / LABELS, 1, "1 999"), r"gives class '999': .* whole number from 1 to 200"),
    # class 98.6 in cars_annos.mat (not cut to 98)
    ("cars196", lambda r: write_cars_mat(r, classes=(1, 2, 98.6, 100)),
     r"annotation 7 of '[^']*cars_annos.mat' gives class 98.6: .* whole number from 1 to 196"),
    # a list file without its header line (its first image would be taken for the header)
    ("sop", lambda r: set_line(r / "Ebay_train.txt", 1, None),
     r"line 1 of '[^']*Ebay_train.txt' is '1 1 1 bicycle_final/[^']*': the release's header line 1 is "
     r"'image_id class_id super_class_id path' \(a file without it would lose its first image"),
    # In-shop without its header line
    ("inshop", lambda r: set_line(r / INSHOP, 2, None),
     r"line 2 of .* is 'img/WOMEN/[^']*': the release's header line 2 is 'image_name item_id evaluation_status'"),
    # a count line that is not the number of rows
    ("inshop", lambda r: set_line(r / INSHOP, 1, "52712"),
     r"line 1 of .* says 52,712 images: the count line must equal the rows listed \(10 here\)"),
    # a camera written two ways (c01 and c1: two cameras to the junk rule)
    ("market1501", lambda r: rename_first(r / "bounding_box_test", "0001_c1s1", "0001_c01s1"),
     r"file '0001_c01s1_[^']*' of '[^']*bounding_box_test' writes camera 1 as '01': file '0007_c1s1_[^']*' of "
     r"'[^']*bounding_box_train' writes it '1'; one spelling per camera"),
    # a person id written two ways (1 and 0001: two persons to the catalog)
    ("market1501", lambda r: rename_first(r / "bounding_box_test", "0001_c2", "1_c2"),
     r"writes person id 1 as '1': file '0001_c1s1_000000_00.jpg' of '[^']*query' writes it '0001'"),
    # the same in DukeMTMC-reID's naming
    ("dukemtmc", lambda r: rename_first(r / "query", "0002_c2", "0002_c02"), r"writes camera 2 as '02'"),
    # further relations between lines
    # a class that is not the number of the image's class folder
    ("cub200", lambda r: set_line(r / LABELS, 1, "1 2"),
     r"gives image id 1 the class 2: its file '001.Bird_1/[^']*' \(line 1 of .*\) is in the folder of class 1"),
    # a class for an image images.txt does not list
    ("cub200", lambda r: add_line(r / LABELS, "99 1"), r"gives a class to image id 99: .* does not list that id"),
    # a class that is not a whole number in a list file
    ("cub200", lambda r: set_line(r / LABELS, 1, "1 1.5"), r"gives class '1.5': .* whole number"),
    # an SOP class in both files (the protocol evaluates unseen classes)
    ("sop", lambda r: add_line(r / "Ebay_test.txt", "13 1 1 cabinet_final/x.JPG"),
     r"line 8 of '[^']*Ebay_test.txt' lists class 1: line 2 of '[^']*Ebay_train.txt' lists it too"),
    # an SOP class under two super classes
    ("sop", lambda r: set_line(r / "Ebay_train.txt", 3, "2 1 2 bicycle_final/111085120001_1.JPG"),
     r"line 3 of .* gives class 1 the super class 2: line 2 of .* gives it 1; one super class per class"),
    # one image in both SOP files (two classes for one image)
    ("sop", lambda r: add_line(r / "Ebay_test.txt", "13 6 2 bicycle_final/111085120001_0.JPG"),
     r"line 8 of '[^']*Ebay_test.txt' lists the image file '[^']*111085120001_0.JPG' again \(first at line 2 of "
     r"'[^']*Ebay_train.txt'\): one line per image"),
    # an In-shop item written two ways
    ("inshop", lambda r: set_line(r / INSHOP, 4, "img/WOMEN/Dresses/id_00000001/01_1_front.jpg id_1 train"),
     r"line 4 of .* writes item id 1 as '1': line 3 of .* writes it '00000001'"),
    # an In-shop item both in train and in the query/gallery split
    ("inshop", lambda r: set_line(r / INSHOP, 4, "img/WOMEN/Dresses/id_00000001/01_1_front.jpg id_00000001 query"),
     r"line 4 of .* lists item id_00000001 as query: line 3 of .* lists it as train; an item is in train or in"),
])
def test_damaged_releases_are_refused_naming_the_line_and_rule(tmp_path, fixture, damage, message):
    WRITERS[fixture](tmp_path)
    damage(tmp_path)
    with pytest.raises(InputError, match=message + r".*" + REPAIR):
        prepare(_dataset(fixture), tmp_path)
    assert not list(tmp_path.glob("recallk_*.csv"))


def _non_utf8_market_name(root: Path) -> None:
    """A query file whose name is Latin-1 (the byte 0xE9), as an archive extracted under another locale."""
    name = os.fsencode(root / "query") + b"/0001_c1s1_caf\xe9_00.jpg"
    shutil.copyfile(next((root / "query").iterdir()), name)


def _names_csv_folder(root: Path) -> None:
    (root / "names.csv").unlink()
    (root / "names.csv").mkdir()


@pytest.mark.parametrize("fixture, damage, message", [
    # names.csv in another encoding
    ("cars_folders", lambda r: (r / "names.csv").write_bytes(b"Citro\xebn C4 2012\n"),
     r"cars196: '[^']*names.csv' is not UTF-8 text \(byte 5 is b'\\xeb'\): the release's files are plain ASCII"),
    # names.csv a folder
    ("cars_folders", _names_csv_folder, r"cars196: '[^']*names.csv' is a folder, not the release's text file"),
    # a Market file name in another encoding
    ("market1501", _non_utf8_market_name,
     r"file '0001_c1s1_caf\\udce9_00.jpg' of '[^']*query' has a name that is not UTF-8 text: file and folder names "
     r"must be UTF-8"),
    # a list file in another encoding
    ("cub200", lambda r: (r / IMAGES).write_bytes(b"1 001.Bird_1/Gr\xfcn.jpg\n"), r"images.txt' is not UTF-8 text"),
])
def test_files_in_another_encoding_or_not_files_are_one_error(tmp_path, capsys, fixture, damage, message):
    WRITERS[fixture](tmp_path)
    damage(tmp_path)
    with pytest.raises(InputError, match=message):
        prepare(_dataset(fixture), tmp_path)
    assert main(["prepare", _dataset(fixture), str(tmp_path)]) == 2  # the command: one line, no traceback
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert not list(tmp_path.glob("recallk_*.csv"))


def _outside(root: Path) -> Path:
    """A JPEG next to the release root, outside it."""
    target = root.parent / "outside.jpg"
    shutil.copyfile(next((root / "images" / "001.Bird_1").iterdir()), target)
    return target


def _link_out(root: Path) -> None:
    image = next((root / "images" / "001.Bird_1").iterdir())
    image.unlink()
    image.symlink_to(_outside(root))


def _reid_link_out(root: Path) -> None:
    image = sorted((root / "query").iterdir())[0]
    shutil.copyfile(image, root.parent / "outside.jpg")
    image.unlink()
    image.symlink_to(root.parent / "outside.jpg")


@pytest.mark.parametrize("fixture, damage, message", [
    # a '..' part in a list file's path
    ("cub200", lambda r: _outside(r) and set_line(r / IMAGES, 1, "1 ../../outside.jpg"),
     r"line 1 of '[^']*images.txt' names 'images/\.\./\.\./outside.jpg': the split stage's rule: path must be "
     r"relative to the data root, with no '\.\.' part"),
    # an absolute path
    ("sop", lambda r: set_line(r / "Ebay_train.txt", 2, f"1 1 1 {r / 'bicycle_final/111085120001_0.JPG'}"),
     r"line 2 of '[^']*Ebay_train.txt' names '/[^']*': the split stage's rule: path must be relative"),
    # a listed image that is a link to a file outside the root
    ("cub200", _link_out, r"line 1 of '[^']*images.txt' names 'images/001.Bird_1/[^']*', which resolves to "
                          r"'[^']*outside.jpg': the split stage's rule: every image inside the data root"),
    # a re-ID file that is a link out
    ("market1501", _reid_link_out, r"file '0001_c1s1[^']*' of '[^']*query' names 'query/[^']*', which resolves to"),
])
def test_paths_leaving_the_data_root_are_refused_by_prepare(tmp_path, fixture, damage, message):
    root = tmp_path / "release"
    WRITERS[fixture](root)
    damage(root)
    with pytest.raises(InputError, match=message):
        prepare(_dataset(fixture), root)
    assert not list(root.glob("recallk_*.csv"))


# -------------------------------------------------------------------------------------------- --apply

#: The keys --apply sets (each on its own line of the project's params.yaml).
APPLIED = ("data_root", "csv", "strategy", "protocol", "images", "captions", "exclude_same", "exclude_same_all",
           "junk")


def _apply(tmp_path: Path, params: Path, *extra: str) -> int:
    write_reid(tmp_path / "Market")
    return main(["prepare", "market1501", str(tmp_path / "Market"), "--apply", "--params", str(params), *extra])


def test_apply_changes_only_the_lines_of_the_keys_it_sets(tmp_path):
    params = tmp_path / "params.yaml"
    shutil.copyfile(ROOT / "params.yaml", params)
    before = params.read_text(encoding="utf-8").splitlines(keepends=True)
    assert _apply(tmp_path, params) == 0
    after = params.read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(after) == len(before)
    changed = [(old, new) for old, new in zip(before, after) if old != new]
    # every other line byte for byte: the `null`s, comments and spacing the ruamel dump rewrote
    assert {re.match(r" *(\w+):", new)[1] for _, new in changed} <= set(APPLIED)
    assert any(line.rstrip().endswith(": null") for line in after)
    assert "  exclude_same_all: [label, camera]\n" in after and "  csv: recallk_market1501.csv\n" in after


def test_apply_edits_a_linked_params_file_through_its_link_and_keeps_its_mode(tmp_path):
    real = tmp_path / "configs" / "params.yaml"
    real.parent.mkdir()
    shutil.copyfile(ROOT / "params.yaml", real)
    real.chmod(0o640)
    link = tmp_path / "params.yaml"
    link.symlink_to(real)
    assert _apply(tmp_path, link) == 0
    assert link.is_symlink() and link.resolve() == real
    assert "  junk: junk\n" in real.read_text(encoding="utf-8") and real.stat().st_mode & 0o777 == 0o640


def test_apply_adds_a_key_the_section_lacks_and_keeps_a_byte_order_mark(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_bytes("\ufeffsplit:\n  data_root: x  # here\n  csv:\nscore:\n  ks: [1]\n# end\n".encode())
    assert _apply(tmp_path, params) == 0
    text = params.read_bytes().decode("utf-8")
    assert text.startswith("\ufeffsplit:\n  data_root: ") and text.endswith("  junk: junk\n# end\n")
    assert f"  data_root: {tmp_path / 'Market'}  # here\n  csv: recallk_market1501.csv\n  strategy: given\n" in text


def test_apply_failing_leaves_neither_the_manifest_nor_a_changed_params_file(tmp_path, capsys, monkeypatch):
    params = tmp_path / "params.yaml"
    params.write_text("split:\n  csv: null\n", encoding="utf-8")  # no score section
    assert _apply(tmp_path, params) == 2
    assert "has no `score` section" in capsys.readouterr().err
    assert not (tmp_path / "Market" / "recallk_market1501.csv").exists()
    # the params file cannot be renamed into place: the manifest, renamed first, is taken back
    shutil.copyfile(ROOT / "params.yaml", params)
    before = params.read_bytes()
    replace = os.replace

    def failing(src, dst):
        if Path(dst).name == "params.yaml":
            raise OSError(30, "Read-only file system")
        replace(src, dst)

    monkeypatch.setattr("recallk.atomic.os.replace", failing)
    assert _apply(tmp_path, params) == 2
    assert "could not rename the finished outputs into place" in capsys.readouterr().err
    assert not (tmp_path / "Market" / "recallk_market1501.csv").exists() and params.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Market", "params.yaml"]  # no temp file left


# ------------------------------------------------------------------------------ BOM, the count warning


def test_a_byte_order_mark_on_a_list_file_is_dropped(tmp_path):
    write_cub(tmp_path / "plain")
    write_cub(tmp_path / "bom")
    listing = tmp_path / "bom" / IMAGES
    listing.write_bytes(b"\xef\xbb\xbf" + listing.read_bytes())
    plain, bom = (pd.read_csv(prepare("cub200", tmp_path / n).manifest, dtype=str) for n in ("plain", "bom"))
    assert plain.equals(bom) and len(bom) == 15


def test_the_count_warning_is_one_line_saying_when_it_is_expected(tmp_path, capsys):
    write_sop(tmp_path)
    assert top_cli.main(["datasets", "prepare", "sop", str(tmp_path)]) == 0  # with the console's log handler
    err = capsys.readouterr().err
    assert err.count("counts differ") == 1 and err.count("\n") == 1
    assert err.startswith("warning: sop: counts differ from the official release (Stanford Online Products")
    assert "(expected for a part of the release; for the whole release, re-extract it: --strict makes this an " \
           "error)" in err
