"""recallk.data.prepare.prepare(): the catalog and split tables of a data root, and the split stage's writer."""

from __future__ import annotations

import pytest

from helpers import build, write_csv, write_images
from recallk.data import catalog
from recallk.errors import InputError
from stages import split


def test_catalog_columns_and_order_from_folder(work):
    write_images(work / "data", {"b": 4, "a": 4})
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
    write_images(work / "data", {f"l{i}": 6 for i in range(6)})
    cat1, split1 = build()
    cat2, split2 = build(**change)
    split.write_outputs([cat1, split1], ["one/catalog.csv", "one/split.csv"])
    split.write_outputs([cat2, split2], ["two/catalog.csv", "two/split.csv"])
    assert (work / "one/catalog.csv").read_bytes() == (work / "two/catalog.csv").read_bytes()
    assert (work / "one/split.csv").read_bytes() != (work / "two/split.csv").read_bytes()
    assert not list(work.rglob("*.tmp"))


def test_build_rejects_a_split_without_queries(work):
    write_images(work / "data", {"a": 4})
    with pytest.raises(InputError, match=r"0 queries .* adjust `split.fractions`"):
        build(fractions={"train": 1.0, "val": 0.0, "gallery": 0.0})


@pytest.mark.parametrize("protocol, expected", [
    # val queries of label b have no gallery image of b: both are excluded at score time
    ("query_gallery", "2 queries (labels: b) have no gallery image of their label"),
    # leave-one-out: b's two images find each other; c's single image has only itself
    ("leave_one_out", "1 queries (labels: c) have no gallery image of their label"),
])
def test_queries_without_positive_are_reported_with_a_count(work, caplog, protocol, expected):
    write_images(work / "data", {"a": 2, "b": 2, "c": 1})
    write_csv(work / "data" / "m.csv", "path,label,split\n"
              "a/000.png,a,val\na/001.png,a,gallery\nb/000.png,b,val\nb/001.png,b,val\nc/000.png,c,gallery\n")
    with caplog.at_level("WARNING"):
        build(csv="m.csv", strategy="given", protocol=protocol)
    assert expected in caplog.text

