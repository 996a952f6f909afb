"""The embeddings-only mode: catalogs built from a manifest of ids (no image file read), the contract
on them, and the precomputed backbone they need."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import ROOT
from leakage_helpers import run_prepare, write_planted_images
from recallk.data import catalog, contract
from recallk.encode import precomputed
from recallk.encode.base import NO_FILE
from recallk.encode.embed import embed
from recallk.encode.settings import EncodeSettings
from recallk.errors import InputError
from recallk.settings.base import from_mapping


def ids_manifest(root: Path, n: int = 60, labels: int = 6, extra: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    lines = [f"image_id,label{extra and ',' + extra}"]
    lines += [f"id{i:03d},c{i % labels}" + (f",{'train' if i % 3 == 0 else 'val' if i % 3 == 1 else 'gallery'}"
                                             if extra == "split" else "") for i in range(n)]
    (root / "m.csv").write_text("\n".join(lines) + "\n")
    return root


def test_a_manifest_of_ids_builds_a_catalog_without_reading_any_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ids_manifest(tmp_path / "data")
    out = run_prepare(Path("data"), csv="m.csv", strategy="class_disjoint")
    assert not out.files and out.near_duplicates is None and out.summary is None
    assert list(out.catalog.columns) == list(catalog.CATALOG_COLUMNS)
    assert out.catalog[list(catalog.FILE_COLUMNS)].isna().all().all()
    assert len(out.split) == 60 and set(out.split["split"]) == {"train", "val", "gallery"}
    text = contract.as_text(out.catalog)
    contract.validate(text, contract.catalog_schema(), source="catalog", csv_lines=True)
    assert not contract.has_files(text)


def test_split_images_none_ignores_the_path_column_and_given_splits_are_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ids_manifest(tmp_path / "data", extra="split")
    text = (tmp_path / "data" / "m.csv").read_text().replace("image_id,label,split", "image_id,label,split")
    lines = text.splitlines()
    lines = [lines[0] + ",path"] + [f"{line},nowhere/{k}.png" for k, line in enumerate(lines[1:])]
    (tmp_path / "data" / "m.csv").write_text("\n".join(lines) + "\n")
    out = run_prepare(Path("data"), csv="m.csv", strategy="given", images="none")
    assert out.catalog["path"].isna().all() and out.split["split"].tolist()[:3] == ["train", "val", "gallery"]
    with pytest.raises(InputError, match=r"file does not exist"):  # the same manifest, read as files
        run_prepare(Path("data"), csv="m.csv", strategy="given", images="auto")


@pytest.mark.parametrize("rows, match", [
    (["image_id,label", "a,x", "a,y", "b,x"], r"image_id must be unique"),
    (["image_id,label", "a,x", "b,", "c,x"], r"label must not be missing"),
    (["image_id,label,split", "a,x,train", "b,x,test", "c,x,val"], r"split must be one of train, val, gallery"),
    (["label", "x", "y"], r"lacks column\(s\) image_id; it needs a header with path,label or, for embeddings"),
])
def test_a_manifest_of_ids_is_checked_by_the_contract(tmp_path, monkeypatch, rows, match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "m.csv").write_text("\n".join(rows) + "\n")
    strategy = "given" if "split" in rows[0] else "per_class"
    with pytest.raises(InputError, match=match):
        run_prepare(Path("data"), csv="m.csv", strategy=strategy)


def test_split_images_none_needs_a_manifest(tmp_path):
    write_planted_images(tmp_path / "data", {"a": [1, 2]})
    with pytest.raises(InputError, match=r"`split.images: none` builds the catalog from a manifest"):
        run_prepare(tmp_path / "data", images="none")


def test_split_images_files_refuses_a_manifest_of_ids(tmp_path):
    ids_manifest(tmp_path / "data")
    with pytest.raises(InputError, match=r"lacks column\(s\) path.*needs `split.images: auto` or `none`"):
        run_prepare(tmp_path / "data", csv="m.csv", images="files")


def test_the_catalog_contract_refuses_a_mix_of_rows_with_and_without_files():
    cat = pd.DataFrame({"image_id": ["a", "b", "c"], "path": ["p/a.png", "p/b.png", ""], "label": ["x"] * 3,
                        "sha256": ["0" * 64, "1" * 64, ""], "width": ["2", "2", ""], "height": ["2", "2", ""],
                        "phash": ["0" * 16, "1" * 16, ""]})
    with pytest.raises(InputError, match=r"every catalog row describes an image file.*: 1 row\(s\)\n.*image_id 'c'"):
        contract.validate(cat, contract.catalog_schema(), source="catalog.csv", csv_lines=True)
    partial = cat.iloc[:2].copy()
    partial.loc[1, "phash"] = ""
    with pytest.raises(InputError, match=r"every catalog row describes an image file"):
        contract.validate(partial, contract.catalog_schema(), source="catalog.csv", csv_lines=True)
    contract.validate(cat.iloc[:2], contract.catalog_schema(), source="catalog.csv", csv_lines=True)


def test_encode_without_files_needs_the_precomputed_backbone(tmp_path):
    cat = pd.DataFrame({"image_id": ["a", "b"], "path": ["", ""], "label": ["x", "y"], "sha256": ["", ""],
                        "width": ["", ""], "height": ["", ""], "phash": ["", ""]})
    with pytest.raises(InputError, match=r"ids without image files .* `encode.backbone: pixels` has nothing to "
                                         r"encode; set `encode.backbone: precomputed`"):
        embed(cat, from_mapping(EncodeSettings, {"backbone": "pixels", "batch_size": 4, "num_workers": 1,
                                                 "pixels": {"resolution": 4}}))
    np.savez(tmp_path / "e.npz", ids=np.array(["b", "a"]), embeddings=np.array([[1.0, 0], [0, 1.0]]))
    given = {"backbone": "precomputed", "batch_size": 4, "num_workers": 1,
             "precomputed": {"path": str(tmp_path / "e.npz"), "ids": None}}
    emb, prov = embed(cat, from_mapping(EncodeSettings, given))
    np.testing.assert_array_equal(emb, [[0, 1], [1, 0]])
    assert prov["backbone"] == "precomputed"


def test_the_precomputed_placeholder_means_none(tmp_path):
    assert (ROOT / NO_FILE).is_file()  # a committed file: a valid DVC dep
    assert EncodeSettings().precomputed.path == NO_FILE
    with pytest.raises(InputError, match=r"needs `encode.precomputed.path`.*the placeholder for none"):
        precomputed.read_precomputed(NO_FILE, None)
