"""Captions for text <-> image retrieval (split.captions, split.protocol: text_image): the captions file read and
checked against the catalog, the captions table's contract, the params rule that pairs the two, the ambiguous
captions warning, and the split stage writing data/prepared/captions.csv."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pandas as pd
import pytest

from helpers import assert_no_outputs, run_fails, run_ok, save_image, set_params, tiny_project
from leakage_helpers import run_prepare
from recallk.data import contract
from recallk.data.captions import CAPTION_COLUMNS
from recallk.data.settings import SplitSettings
from recallk.errors import InputError
from recallk.settings.base import checked
from stages.runner import read_captions

CAPTIONS = "data/prepared/captions.csv"


def ids_project(root: Path, captions: list[str] | str, n: int = 8) -> Path:
    """A manifest of ``n`` ids (``id0`` .. ``idN``; even ids train, odd ids val/gallery) and a captions file
    ``caps.csv`` of ``captions`` (lines after the header ``image_id,caption``, or the whole text)."""
    root.mkdir(parents=True, exist_ok=True)
    splits = ["train", "val", "train", "gallery"]
    (root / "m.csv").write_text("image_id,label,split\n" + "".join(f"id{i},c{i},{splits[i % 4]}\n" for i in range(n)))
    text = captions if isinstance(captions, str) else "image_id,caption\n" + "".join(f"{c}\n" for c in captions)
    (root / "caps.csv").write_text(text, encoding="utf-8")
    return root


def label_folders(root: Path, per_label: int) -> Path:
    """Labels ``a`` and ``b``, ``per_label`` seeded 20 x 20 images each (``a/0.png`` ...)."""
    for label in ("a", "b"):
        for i in range(per_label):
            save_image(root / label / f"{i}.png", seed=10 * ord(label) + i, size=(20, 20))
    return root


def prepare(root: Path, **overrides):
    params = {"csv": "m.csv", "strategy": "given", "protocol": "text_image", "captions": "caps.csv"} | overrides
    return run_prepare(root, **params)


def test_the_captions_table_keeps_the_file_order_and_numbers_each_images_captions(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ids_project(Path("data"), ["id1,a red car", "id0,\"a dog, running\"", "id1,another car", "id3,a cat",
                               "id1,  spaces kept  "])
    out = prepare(Path("data"))
    table = out.captions
    assert list(table.columns) == list(CAPTION_COLUMNS)
    assert table["caption_id"].tolist() == ["id1#0", "id0#0", "id1#1", "id3#0", "id1#2"]
    assert table["caption"].tolist() == ["a red car", "a dog, running", "another car", "a cat", "  spaces kept  "]
    assert table["split"].tolist() == ["val", "train", "val", "gallery", "val"]
    assert out.caption_summary == {"num_captions": 5, "num_captioned_images": 3, "num_eval_captions": 4,
                                   "num_ambiguous_captions": 0, "num_skipped_captions": 0}
    # text_image: every eval image plays both roles (an image -> text query, a text -> image gallery item)
    eval_rows = out.split["split"].isin(["val", "gallery"])
    assert out.split["query"].eq(eval_rows).all() and out.split["gallery"].eq(eval_rows).all()


@pytest.mark.parametrize("row, rule, line", [
    ("id1,", contract.CAPTION_EMPTY_RULE, 3),
    ("id1,   ", contract.CAPTION_EMPTY_RULE, 3),
    ('id1,"two\nlines"', contract.CAPTION_TEXT_RULE, 3),
    ("id1,a\tb", contract.CAPTION_TEXT_RULE, 3),
    ("id1,abc\u202egpj", contract.CAPTION_TEXT_RULE, 3),
    ("id1," + "x" * (contract.MAX_CAPTION_LENGTH + 1), contract.CAPTION_LENGTH_RULE, 3),
    ("id99,a caption of no image", contract.CAPTION_IMAGE_RULE, 3),
    (",a caption without an id", contract.CAPTION_IMAGE_RULE, 3),
])
def test_each_bad_caption_row_is_refused_naming_its_line_and_rule(tmp_path, monkeypatch, row, rule, line):
    monkeypatch.chdir(tmp_path)
    ids_project(Path("data"), ["id3,a good caption", row])
    with pytest.raises(InputError) as info:
        prepare(Path("data"))
    text = str(info.value)
    assert text.startswith("data contract failed for data/caps.csv (1 rule(s) broken)"), text
    assert f"{rule}: 1 row(s)" in text and f"CSV line {line}" in text and "line 2" not in text


def test_every_failing_row_is_listed_at_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ids_project(Path("data"), ["id1,", "id3,fine", "nope,x", "id5,a\u2028b", "id7,"])
    with pytest.raises(InputError, match=r"\(3 rule\(s\) broken\)") as info:
        prepare(Path("data"))
    text = str(info.value)
    assert f"{contract.CAPTION_EMPTY_RULE}: 2 row(s)" in text and "CSV line 2" in text and "CSV line 6" in text
    assert "image_id 'nope'" in text and f"{contract.CAPTION_TEXT_RULE}: 1 row(s)" in text


@pytest.mark.parametrize("text, match", [
    ("image_id,text\nid1,a\n", r"captions file 'data/caps.csv' lacks column\(s\) caption; it needs a header "
                               r"image_id,caption"),
    ("image_id,caption\n", r"captions file 'data/caps.csv' has no rows"),
    ("image_id,caption,caption\nid1,a,b\n", r"captions file 'data/caps.csv' names a column more than once"),
])
def test_a_malformed_captions_file_is_one_error(tmp_path, monkeypatch, text, match):
    monkeypatch.chdir(tmp_path)
    ids_project(Path("data"), text)
    with pytest.raises(InputError, match=match):
        prepare(Path("data"))


def test_a_captions_file_that_is_not_utf8_or_not_in_the_data_root_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ids_project(Path("data"), ["id1,a"])
    (tmp_path / "data" / "caps.csv").write_bytes(b"image_id,caption\nid1,caf\xe9\n")
    with pytest.raises(InputError, match=r"captions file 'data/caps.csv' is not a readable UTF-8 CSV"):
        prepare(Path("data"))
    (tmp_path / "outside.csv").write_text("image_id,caption\nid1,a\n")
    with pytest.raises(InputError, match=r"`split.captions` is '../outside.csv', which is not inside "
                                         r"`split.data_root`.*edits to this captions file would never re-run"):
        prepare(Path("data"), captions="../outside.csv")
    with pytest.raises(InputError, match=r"captions file 'data/missing.csv' not found; `split.captions` is a path"):
        prepare(Path("data"), captions="missing.csv")


@pytest.mark.parametrize("given, match", [
    ({"captions": "caps.csv"}, r"`split` `captions` is 'caps.csv', but `protocol` is 'query_gallery'.*Set "
                               r"`split.protocol: text_image`, or `split.captions: null`"),
    ({"captions": "caps.csv", "protocol": "leave_one_out"}, r"but `protocol` is 'leave_one_out'"),
    ({"protocol": "text_image"}, r"`split` `protocol` is text_image, which scores captions against images, but "
                                 r"`captions` is null. Set `split.captions`"),
])
def test_captions_and_the_text_image_protocol_go_together_at_the_params_check(given, match):
    errors: list[str] = []
    checked(SplitSettings, given, "split", errors)
    assert len(errors) == 1 and re.search(match, errors[0]), errors


def test_a_protocol_with_captions_is_fine_and_the_default_has_none():
    errors: list[str] = []
    checked(SplitSettings, {"captions": "c.csv", "protocol": "text_image"}, "split", errors)
    checked(SplitSettings, {}, "split", errors)
    assert not errors and SplitSettings().captions is None


def test_exact_captions_shared_by_eval_images_are_warned_and_counted(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    # id1, id3, id5 are eval images; id0 is train (its copy of the text makes no query ambiguous)
    ids_project(Path("data"), ["id1,a dog", "id3,a dog", "id5,a dog", "id0,a cat", "id1,a cat", "id3,A dog",
                               "id1,a dog"])
    with caplog.at_level(logging.WARNING, logger="recallk.data.captions"):
        out = prepare(Path("data"))
    assert out.caption_summary["num_ambiguous_captions"] == 4  # the four eval rows of "a dog"
    assert out.caption_summary["num_eval_captions"] == 6
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("4 caption(s) of eval images are the exact text of a caption of another eval image: "
                              "'a dog' ('id1', 'id3', 'id5')"), warning
    assert "'a cat'" not in warning and "num_ambiguous_captions" in warning


def test_captions_of_train_images_only_leave_nothing_to_score(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ids_project(Path("data"), ["id0,a dog", "id2,a cat"])
    with pytest.raises(InputError, match=r"none of the 2 captions of data/caps.csv describes an eval image"):
        prepare(Path("data"))


def test_captions_of_a_skipped_image_are_dropped_and_counted(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    root = label_folders(Path("data"), 3)
    (root / "b" / "9.png").write_bytes(b"not an image")
    (root / "caps.csv").write_text("image_id,caption\nb/9.png,broken\na/0.png,zero\nb/9.png,again\nb/1.png,one\n")
    with caplog.at_level(logging.WARNING, logger="recallk.data.captions"):
        out = run_prepare(root, on_bad_image="skip", protocol="text_image", captions="caps.csv",
                          fractions={"train": 0.0, "val": 0.5, "gallery": 0.5})
    assert out.captions["caption_id"].tolist() == ["a/0.png#0", "b/1.png#0"]
    assert out.caption_summary["num_skipped_captions"] == 2
    assert any("dropped 2 caption(s) of 1 skipped image(s)" in r.getMessage() for r in caplog.records)


def test_the_captions_table_is_checked_again_where_it_is_read(tmp_path):
    path = tmp_path / "captions.csv"
    pd.DataFrame({"caption_id": ["x#0", "x#5"], "image_id": ["x", "x"], "caption": ["a", "b"],
                  "split": ["val", "val"]}).to_csv(path, index=False)
    with pytest.raises(InputError, match=r"caption_id must be <image_id>#<n>.*\n.*CSV line 3.*\n.*re-run split"):
        read_captions(path)
    pd.DataFrame(columns=list(CAPTION_COLUMNS)).to_csv(path, index=False)
    assert read_captions(path).empty


# ------------------------------------------------------------------------------------------- the split stage


@pytest.mark.stage
def test_the_split_stage_writes_captions_and_their_counts(tmp_path):
    proj = tiny_project(tmp_path)
    run_ok(proj, "split")
    assert (proj / CAPTIONS).read_text() == "caption_id,image_id,caption,split\n"  # always written: header only
    provenance = json.loads((proj / "data/prepared/provenance.json").read_text())
    assert provenance["captions"] is None and provenance["num_captions"] == 0

    (proj / "data/digits/caps.csv").write_text('image_id,caption\nc/0.png,"a c, zero"\nc/1.png,one\nd/2.png,two\n'
                                               "a/0.png,a train image\n")
    set_params(proj, {"split.protocol": "text_image", "split.captions": "caps.csv"})
    run_ok(proj, "split")
    table = read_captions(proj / CAPTIONS)
    assert table["caption_id"].tolist() == ["c/0.png#0", "c/1.png#0", "d/2.png#0", "a/0.png#0"]
    assert table["caption"].iloc[0] == "a c, zero"
    provenance = json.loads((proj / "data/prepared/provenance.json").read_text())
    assert {k: provenance[k] for k in ("captions", "num_captions", "num_captioned_images", "num_ambiguous_captions")
            } == {"captions": "caps.csv", "num_captions": 4, "num_captioned_images": 4, "num_ambiguous_captions": 0}
    assert provenance["protocol"] == "text_image"


@pytest.mark.stage
def test_a_refused_captions_file_leaves_no_split_output(tmp_path):
    proj = tiny_project(tmp_path)
    (proj / "data/digits/caps.csv").write_text("image_id,caption\nc/0.png,\n")
    set_params(proj, {"split.protocol": "text_image", "split.captions": "caps.csv"})
    run_fails(proj, "split", "data contract failed for data/digits/caps.csv", contract.CAPTION_EMPTY_RULE,
              "CSV line 2")
    assert_no_outputs(proj)
    set_params(proj, {"split.protocol": "query_gallery"})
    run_fails(proj, "split", "`split` `captions` is 'caps.csv', but `protocol` is 'query_gallery'")
    assert_no_outputs(proj)


def test_a_captions_file_among_label_folders_is_no_image(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    root = label_folders(Path("data"), 2)
    (root / "caps.csv").write_text("image_id,caption\na/0.png,zero\n")
    params = {"protocol": "text_image", "fractions": {"train": 0.0, "val": 0.5, "gallery": 0.5}}
    with caplog.at_level(logging.WARNING):
        out = run_prepare(root, captions="caps.csv", **params)
    assert len(out.catalog) == 4 and not [r for r in caplog.records if r.levelno >= logging.WARNING]
    (root / "b" / "more.csv").write_text("image_id,caption\nb/1.png,one\n")
    out = run_prepare(root, captions="b/./more.csv", **params)  # inside a label folder: not an image of b either
    assert len(out.catalog) == 4 and out.captions["caption_id"].tolist() == ["b/1.png#0"]


def test_the_report_has_a_captions_line_and_runs_without_captions_keep_their_id():
    from recallk.report.block import format_report
    from recallk.report.provenance import evaluation_id, provenance

    base = {"data_root": "data", "manifest": None, "num_images": 10, "num_labels": 2, "num_skipped_images": 0,
            "images": "none", "strategy": "given", "protocol": "text_image", "seed": 0}
    split = base | {"captions": "caps.csv", "num_captions": 50, "num_captioned_images": 10, "num_eval_captions": 25,
                    "num_ambiguous_captions": 2, "num_skipped_captions": 0}
    score = {"exclude_same": [], "whiten": "none", "backend": "numpy", "bootstrap": {"resamples": 0, "unit": "query"}}
    lines = provenance(split, None, score)
    assert lines["captions"] == ("caps.csv: 50 captions of 10 images, 25 of eval images scored, 2 ambiguous (the "
                                 "exact text of another eval image's caption)")
    metrics = {"num_queries": 5, "num_excluded_queries": 0, "num_gallery": 5, "embedding_dim": 4}
    assert "  captions:      caps.csv: 50 captions of 10 images" in format_report(metrics, lines)
    # a split without captions: no line, and the id of the provenance before captions existed
    none = base | {"protocol": "query_gallery", "captions": None, "num_captions": 0, "num_captioned_images": 0,
                   "num_eval_captions": 0, "num_ambiguous_captions": 0, "num_skipped_captions": 0}
    assert "captions" not in provenance(none, None, score)
    assert evaluation_id(none, None, score) == evaluation_id(base | {"protocol": "query_gallery"}, None, score)
    assert evaluation_id(split, None, score) != evaluation_id(base, None, score)
