"""recallk.data.catalog: the folder scan, the manifest CSV and the probe of each file."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from helpers import build, save_image, write_csv, write_images
from recallk.data import catalog, contract
from recallk.errors import InputError

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



# ---------------------------------------------------------------- probe: what each file says


def test_symlink_outside_the_data_root_is_reported_and_not_read(work, monkeypatch):
    root = work / "data"
    write_images(root, {"a": 4, "b": 4})
    secret = save_image(work / "secret" / "s.png", seed=42)
    (root / "a" / "link.png").symlink_to(secret)
    read: list[Path] = []
    real = Path.read_bytes
    # only reads under `work` count: a library imported lazily meanwhile reads its own files too
    monkeypatch.setattr(Path, "read_bytes",
                        lambda self: (work in self.resolve().parents and read.append(self.resolve())) or real(self))
    with pytest.raises(InputError) as err:
        build()
    assert "path 'a/link.png', resolves outside the data root" in str(err.value)
    assert contract.FILE_RULE in str(err.value)
    assert secret.resolve() not in read
    assert len(read) == 8  # every other image was read


def test_exif_rotated_jpeg_has_upright_size(work):
    root = work / "data"
    write_images(root, {"a": 3})
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    Image.new("RGB", (40, 10), "red").save(root / "a" / "rot.jpg", exif=exif.tobytes())
    cat, _ = build()
    row = cat.set_index("image_id").loc["a/rot.jpg"]
    assert (row["width"], row["height"]) == (10, 40)


def test_unreadable_file_is_reported_by_the_contract(work, monkeypatch):
    write_images(work / "data", {"a": 3, "b": 3})
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


# ---------------------------------------------------------------- a manifest header, a folder for a file (issue 25)
# Moved from the hostile corpus (test_hostile_messages.py).


def test_read_manifest_checks_the_header_before_pandas(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "m.csv").write_text("path,label,label\na/0.png,a,b\n", encoding="utf-8")
    with pytest.raises(InputError, match="names a column more than once"):
        catalog.read_manifest(root, "m.csv")


def test_probe_tells_a_folder_from_a_missing_file(tmp_path):
    (tmp_path / "a" / "x.png").mkdir(parents=True)
    assert "is a folder" in catalog.probe_file(tmp_path, "a/x.png")[4]
    assert "does not exist" in catalog.probe_file(tmp_path, "a/none.png")[4]


# ---------------------------------------------------------------- system folders as data root (issue 25)
# Moved from the hostile corpus (test_hostile_limits.py): `data_root: /` hashed and decoded every file of the
# machine.


@pytest.mark.parametrize("root", ["/", "/usr", "/etc", "/tmp", "~"])
def test_a_system_folder_is_refused_as_data_root(root):
    """`data_root: /` hashed and decoded every file of the machine."""
    with pytest.raises(InputError, match="is a system folder"):
        catalog.check_root(Path(root).expanduser())


def test_an_ordinary_folder_under_tmp_is_a_data_root(tmp_path):
    catalog.check_root(tmp_path)  # no error
