"""Catalog scan/manifest, the data contract and prepare.prepare(), on real image files."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from conftest import save_image
from recallk.data import catalog, contract, prepare
from stages import split
from recallk.errors import InputError

FRACTIONS = {"train": 0.5, "val": 0.25, "gallery": 0.25}


@pytest.fixture
def work(tmp_path: Path, monkeypatch) -> Path:
    """An empty working directory (build() writes paths relative to the cwd)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def build(data_root: str = "data", csv: str | None = None, **overrides):
    params = dict(data_root=data_root, csv=csv, on_bad_image="error", strategy="per_class",
                  protocol="query_gallery", seed=0, fractions=FRACTIONS) | overrides
    cat, spl, skipped = prepare.prepare(**params)
    assert skipped.empty or params["on_bad_image"] == "skip"
    return cat, spl


def images(root: Path, labels: dict[str, int], seed: int = 0) -> None:
    """``n`` distinct PNGs per label folder."""
    for j, (label, n) in enumerate(labels.items()):
        for i in range(n):
            save_image(root / label / f"{i:03d}.png", seed=seed + 100 * j + i)


def write_csv(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- folder scan


def test_scan_folder_labels_nested_hidden_and_loose_files(work, caplog):
    root = work / "data"
    save_image(root / "cat" / "a.png", seed=1)
    save_image(root / "cat" / "deep" / "er" / "b.png", seed=2)    # nested: still label "cat"
    save_image(root / "dog" / "c.png", seed=3)
    save_image(root / "dog" / ".hidden.png", seed=4)               # hidden file: skipped
    save_image(root / "dog" / ".thumbs" / "d.png", seed=5)         # hidden folder: skipped
    save_image(root / ".cache" / "e.png", seed=6)                  # hidden label folder: skipped
    save_image(root / "loose.png", seed=7)                         # directly in root: ignored
    frame = catalog.scan_folder(root)
    assert frame[["path", "label"]].values.tolist() == [
        ["cat/a.png", "cat"], ["cat/deep/er/b.png", "cat"], ["dog/c.png", "dog"]]
    assert frame["image_id"].tolist() == frame["path"].tolist()
    assert "loose.png" in caplog.text


@pytest.mark.parametrize("setup, match", [
    (lambda root: None, r"does not exist; set `split.data_root`"),                     # no folder
    (lambda root: root.mkdir(), r"holds no images; put each label's images in a sub-folder"),  # empty
    (lambda root: save_image(root / "x.png"), r"holds no images"),                     # only loose files
    (lambda root: root.write_text("x"), r"is not a folder"),                           # a file, not a folder
])
def test_scan_folder_errors(work, setup, match):
    setup(work / "data")
    with pytest.raises(InputError, match=match):
        catalog.scan_folder(work / "data")


# ---------------------------------------------------------------- manifest CSV


def test_manifest_keeps_extra_columns_and_reads_labels_as_text(work):
    root = work / "data"
    for i in range(4):
        save_image(root / "img" / f"{i}.png", seed=i)
    write_csv(root / "m.csv", "image_id,path,label,group\n"
                              "d,img/3.png,1.0,g2\n"
                              "a,img/0.png,1,g1\n"
                              "c,img/2.png,01,g2\n"
                              "b,img/1.png,1,g1\n")
    cat, _ = build(csv="m.csv", strategy="class_disjoint",
                   fractions={"train": 0.0, "val": 0.5, "gallery": 0.5})
    assert list(cat.columns) == ["image_id", "path", "label", "sha256", "width", "height", "phash", "group"]
    assert cat["image_id"].tolist() == ["a", "b", "c", "d"]          # sorted by image_id
    assert cat["label"].tolist() == ["1", "1", "01", "1.0"]           # text, not numbers
    assert cat["group"].tolist() == ["g1", "g1", "g2", "g2"]
    assert cat["path"].tolist() == ["data/img/0.png", "data/img/1.png", "data/img/2.png", "data/img/3.png"]
    assert cat[["width", "height"]].drop_duplicates().values.tolist() == [[12, 12]]


@pytest.mark.parametrize("text, match", [
    ("path,group\na.png,g\n", r"lacks column\(s\) label; it needs a header with path,label"),  # no label
    ("image_id,label\nx,a\n", r"lacks column\(s\) path"),                                      # no path
    ("path,label\n", r"has no rows"),                                                          # header only
])
def test_manifest_errors(work, text, match):
    write_csv(work / "data" / "m.csv", text)
    with pytest.raises(InputError, match=match):
        catalog.read_manifest(work / "data", "m.csv")


def test_manifest_not_found(work):
    (work / "data").mkdir()
    with pytest.raises(InputError, match=r"manifest .* not found; `split.csv` is a path inside"):
        catalog.read_manifest(work / "data", "nope.csv")


# ---------------------------------------------------------------- catalog output


def test_catalog_columns_and_order_from_folder(work):
    images(work / "data", {"b": 4, "a": 4})
    cat, spl = build()
    assert list(cat.columns) == list(catalog.CATALOG_COLUMNS)
    assert cat["image_id"].tolist() == sorted(cat["image_id"])
    assert cat["sha256"].str.fullmatch(r"[0-9a-f]{64}").all()
    assert list(spl.columns) == ["image_id", "split", "query", "gallery"]
    assert spl["image_id"].tolist() == cat["image_id"].tolist()


@pytest.mark.parametrize("change", [
    {"seed": 7},                                                      # new seed
    {"strategy": "class_disjoint"},                                   # other strategy
    {"fractions": {"train": 0.2, "val": 0.4, "gallery": 0.4}},        # other fractions
    {"protocol": "leave_one_out"},                                    # other protocol
])
def test_catalog_is_byte_identical_when_only_split_params_change(work, change):
    images(work / "data", {f"l{i}": 6 for i in range(6)})
    cat1, split1 = build()
    cat2, split2 = build(**change)
    split.write_outputs([cat1, split1], ["one/catalog.csv", "one/split.csv"])
    split.write_outputs([cat2, split2], ["two/catalog.csv", "two/split.csv"])
    assert (work / "one/catalog.csv").read_bytes() == (work / "two/catalog.csv").read_bytes()
    assert (work / "one/split.csv").read_bytes() != (work / "two/split.csv").read_bytes()
    assert not list(work.rglob("*.tmp"))


# ---------------------------------------------------------------- contract


def test_contract_reports_every_failure_at_once(work):
    root = work / "data"
    images(root, {"a": 4, "b": 4})
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
    images(work / "data", {"a": 2})
    write_csv(work / "data" / "m.csv", "path,label\na/000.png,a\na/001.png,\"  \"\n")  # whitespace label
    with pytest.raises(InputError, match=re.escape(contract.LABEL_RULE) + r": 1 row\(s\)\n.*CSV line 3"):
        build(csv="m.csv")


def test_contract_reports_leakage_between_train_and_gallery(work):
    root = work / "data"
    images(root, {"a": 3})
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


def test_symlink_outside_the_data_root_is_reported_and_not_read(work, monkeypatch):
    root = work / "data"
    images(root, {"a": 4, "b": 4})
    secret = save_image(work / "secret" / "s.png", seed=42)
    (root / "a" / "link.png").symlink_to(secret)
    read: list[Path] = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self.resolve()) or real(self))
    with pytest.raises(InputError) as err:
        build()
    assert "path 'a/link.png', resolves outside the data root" in str(err.value)
    assert contract.FILE_RULE in str(err.value)
    assert secret.resolve() not in read
    assert len(read) == 8  # every other image was read


def test_exif_rotated_jpeg_has_upright_size(work):
    root = work / "data"
    images(root, {"a": 3})
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    Image.new("RGB", (40, 10), "red").save(root / "a" / "rot.jpg", exif=exif.tobytes())
    cat, _ = build()
    row = cat.set_index("image_id").loc["a/rot.jpg"]
    assert (row["width"], row["height"]) == (10, 40)


def test_build_rejects_a_split_without_queries(work):
    images(work / "data", {"a": 4})
    with pytest.raises(InputError, match=r"0 queries .* adjust `split.fractions`"):
        build(fractions={"train": 1.0, "val": 0.0, "gallery": 0.0})


@pytest.mark.parametrize("protocol, expected", [
    # val queries of label b have no gallery image of b: both are excluded at score time
    ("query_gallery", "2 queries (labels: b) have no gallery image of their label"),
    # leave-one-out: b's two images find each other; c's single image has only itself
    ("leave_one_out", "1 queries (labels: c) have no gallery image of their label"),
])
def test_queries_without_positive_are_reported_with_a_count(work, caplog, protocol, expected):
    images(work / "data", {"a": 2, "b": 2, "c": 1})
    write_csv(work / "data" / "m.csv", "path,label,split\n"
              "a/000.png,a,val\na/001.png,a,gallery\nb/000.png,b,val\nb/001.png,b,val\nc/000.png,c,gallery\n")
    with caplog.at_level("WARNING"):
        build(csv="m.csv", strategy="given", protocol=protocol)
    assert expected in caplog.text


def test_unreadable_file_is_reported_by_the_contract(work, monkeypatch):
    images(work / "data", {"a": 3, "b": 3})
    real_read = Path.read_bytes

    def read_bytes(self):
        if self.name == "001.png" and self.parent.name == "b":
            raise PermissionError(13, "Permission denied")
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with pytest.raises(InputError) as info:
        build()
    message = str(info.value)
    assert contract.FILE_RULE in message and "path 'b/001.png'" in message
    assert "cannot read the file (Permission denied); fix its permissions or remove it" in message


def test_contract_rejects_a_label_on_both_sides_under_class_disjoint(work):
    images(work / "data", {"a": 2, "b": 2})
    frame = catalog.probe(Path("data"), catalog.scan_folder(Path("data")))
    frame["split"] = ["train", "gallery", "val", "gallery"]  # label a is in train and in gallery
    with pytest.raises(InputError, match=re.escape(contract.DISJOINT_RULE)) as info:
        contract.validate(frame, contract.image_table_schema(class_disjoint=True), source="data/", csv_lines=False)
    assert "path 'a/000.png'" in str(info.value) and "path 'a/001.png'" in str(info.value)
    assert "b/000.png" not in str(info.value)
    contract.validate(frame, contract.image_table_schema(class_disjoint=False), source="data/", csv_lines=False)  # fine for per_class


def test_missing_label_in_manifest_stays_missing(work):
    images(work / "data", {"a": 2})
    write_csv(work / "data" / "m.csv", "path,label\na/000.png,a\na/001.png,\n")
    with pytest.raises(InputError, match=r"label must not be missing") as info:
        build(csv="m.csv")
    assert "CSV line 3" in str(info.value)
