"""``recallk datasets prepare`` for the caption benchmarks (issue 41): Flickr30k and MSCOCO through Karpathy's
split files, text <-> image over the test images (``flickr30k``, ``coco``: the 5K test, every caption kept) and
the 5 folds of COCO 1K (``coco1k --fold N``). Fixture trees in the official layouts (tests/dataset_fixtures.py):
small ones for the manifest, captions, protocol file and params, one with Karpathy's whole COCO test split (5,000
images, 25,010 captions, some images with 6 and 7) for the documented counts; the refusals of a damaged release,
nothing written."""

from __future__ import annotations

import json
import logging
import re
import shutil

import pandas as pd
import pytest
from ruamel.yaml import YAML

from dataset_fixtures import (
    COCO_EXTRA,
    COCO_FOLD_CAPTIONS,
    PARAMS,
    write_coco,
    write_coco_test,
    write_flickr30k,
)
from recallk.data.prepare import prepare_all
from recallk.data.settings import SplitSettings
from recallk.datasets import DATASETS, prepare
from recallk.datasets.cli import main
from recallk.errors import InputError


def _read(path):
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def _written(root):
    return sorted(p.name for p in root.glob("recallk_*"))


@pytest.fixture(scope="module")
def coco_test(tmp_path_factory):
    """Karpathy's whole COCO test split (and one image of each other split), built once."""
    root = tmp_path_factory.mktemp("coco")
    return root, write_coco_test(root)


def test_flickr30k_manifest_captions_protocol_and_params(tmp_path, caplog):
    want = write_flickr30k(tmp_path)
    with caplog.at_level(logging.WARNING, logger="recallk.datasets"):
        result = prepare("flickr30k", tmp_path)
    assert result.counts == want == {"images": 9, "train": 4, "val": 2, "test": 3, "test_captions": 15}
    assert "test 3 (official 1,000); test captions 15 (official 5,000)" in caplog.text  # a part of the release
    assert result.params["split"] == {"data_root": str(tmp_path), "csv": "recallk_flickr30k.csv", "strategy": "given",
                                      "protocol": "text_image", "images": "files",
                                      "captions": "recallk_flickr30k_captions.csv"}
    manifest = _read(result.manifest)
    assert list(manifest.columns) == ["image_id", "path", "label", "split"]
    assert manifest["label"].equals(manifest["image_id"]) and manifest["path"].str.startswith("flickr30k-images/").all()
    # Karpathy's test images are the eval split, and the manifest lists them alone (its train and val images are
    # not evaluated: encode would embed them for nothing; --with-train lists them, below)
    assert manifest["split"].tolist() == ["gallery"] * 3
    captions = _read(result.captions)
    assert list(captions.columns) == ["image_id", "caption"] and len(captions) == 15
    assert captions["image_id"].tolist() == [i for i in manifest["image_id"] for _ in range(5)]  # file order
    # a line break and spaces at a caption's end are dropped (one caption is one line)
    assert captions["caption"].tolist()[:2] == ["Photo 6 shows scene 0 of the test split.",
                                                "Photo 6 shows scene 1 of the test split."]
    protocol = json.loads((tmp_path / "recallk_flickr30k.protocol.json").read_text(encoding="utf-8"))
    assert protocol == result.protocol
    assert protocol["name"] == "flickr30k-karpathy-test" and protocol["sizes"] == {"images": 3, "captions": 15}
    assert protocol["official"]["test_captions"] == 5000 and protocol["captions"] == "recallk_flickr30k_captions.csv"
    # the split stage's library reads both under the printed params
    out = prepare_all(SplitSettings(**result.params["split"]))
    assert int(out.split["query"].sum()) == int(out.split["gallery"].sum()) == 3
    assert out.caption_summary["num_captions"] == out.caption_summary["num_eval_captions"] == 15
    assert out.caption_summary["num_ambiguous_captions"] == 0


def test_with_train_lists_the_images_not_evaluated_as_train(tmp_path):
    write_flickr30k(tmp_path)
    result = prepare("flickr30k", tmp_path, with_train=True)
    manifest = _read(result.manifest)
    assert manifest["split"].tolist() == ["train"] * 6 + ["gallery"] * 3
    assert len(_read(result.captions)) == 15  # the test images' captions alone, as without it
    assert result.protocol["sizes"] == {"images": 3, "captions": 15}
    with pytest.raises(InputError, match="--with-train is for the caption benchmarks"):
        prepare("cub200", tmp_path, with_train=True)


def test_coco_keeps_every_caption_of_the_test_images(tmp_path):
    want = write_coco(tmp_path)
    result = prepare("coco", tmp_path)
    assert result.counts == want == {"images": 10, "train": 2, "val": 2, "restval": 2, "test": 4,
                                     "test_captions": 23}
    manifest = _read(result.manifest)
    assert manifest["path"].str.match(r"val2014/COCO_val2014_\d{12}\.jpg$").all() and len(manifest) == 4
    train = _read(prepare("coco", tmp_path, with_train=True).manifest).query("split == 'train'")
    assert len(train) == 6 and train["path"].str.match(r"(train|val)2014/").all()
    per_image = _read(result.captions)["image_id"].value_counts()
    assert sorted(per_image.tolist()) == [5, 5, 6, 7]  # 6 and 7 captions kept, not cut to 5
    assert result.protocol["name"] == "coco-karpathy-5k-test"
    assert result.protocol["sizes"] == {"images": 4, "captions": 23}
    out = prepare_all(SplitSettings(**result.params["split"]))
    assert out.caption_summary["num_eval_captions"] == 23


def test_coco_whole_test_split_gives_the_documented_counts(coco_test, capsys):
    root, want = coco_test
    assert main(["prepare", "coco", str(root)]) == 0
    printed = capsys.readouterr()
    result_counts = {"images": 5003, "train": 1, "val": 1, "restval": 1, "test": 5000, "test_captions": 25010}
    assert want == result_counts
    assert "# protocol coco-karpathy-5k-test (text_image): 5,000 images, 25,010 captions\n" in printed.out
    # only the splits the fixture leaves out differ from the official release
    assert re.search(r"images 5,003 \(official 123,287\); train 1 \(official 82,783\); val 1 \(official 5,000\); "
                     r"restval 1 \(official 30,504\) \(expected", printed.err)
    captions = _read(root / "recallk_coco_captions.csv")
    assert len(captions) == 25010 and captions["image_id"].nunique() == 5000
    per_image = captions["image_id"].value_counts().value_counts().to_dict()
    assert per_image == {5: 4991, 6: 8, 7: 1}
    protocol = json.loads((root / "recallk_coco.protocol.json").read_text(encoding="utf-8"))
    assert protocol["sizes"] == {"images": 5000, "captions": 25010}
    assert protocol["counts"]["test"] == protocol["official"]["test"] == 5000
    assert protocol["counts"]["test_captions"] == protocol["official"]["test_captions"] == 25010


@pytest.mark.parametrize("fold", [1, 2, 3, 4, 5])
def test_coco1k_fold_is_a_thousand_consecutive_test_images(coco_test, fold):
    root, _ = coco_test
    result = prepare("coco1k", root, fold=fold)
    assert result.manifest == root / f"recallk_coco1k_fold{fold}.csv"
    manifest = _read(result.manifest)
    test_ids = [f"COCO_val2014_{100003 + n:012d}" for n in range(5000)]  # after one train, restval, val image
    assert manifest["split"].eq("gallery").all()  # the fold alone (--with-train: the rest as train)
    assert manifest["image_id"].tolist() == test_ids[1000 * (fold - 1):1000 * fold]
    assert result.protocol["name"] == f"coco-karpathy-1k-fold{fold}"
    assert result.protocol["sizes"] == {"images": 1000, "captions": COCO_FOLD_CAPTIONS[fold]}
    assert result.counts["fold_images"] == 1000 and result.counts["fold_captions"] == COCO_FOLD_CAPTIONS[fold]
    assert not any(d.startswith(("test", "fold")) for d in result.differences)
    # each fold its own captions file: its images' captions
    assert result.captions == root / f"recallk_coco1k_fold{fold}_captions.csv"
    assert len(_read(result.captions)) == COCO_FOLD_CAPTIONS[fold]
    assert result.params["split"]["csv"] == f"recallk_coco1k_fold{fold}.csv"
    assert result.params["split"]["protocol"] == "text_image"


def test_coco1k_folds_cover_the_test_split_once():
    assert sum(COCO_FOLD_CAPTIONS.values()) == 25010 and len(COCO_EXTRA) == 9
    assert DATASETS["coco1k"].official["fold_images"] * 5 == DATASETS["coco"].official["test"]


@pytest.mark.parametrize("name, fold, message", [
    ("coco1k", None, r"coco1k: no fold given; choose one of the 5 folds of 1,000 test images \(--fold N, N from 1 "
                     r"to 5; .*Run the five and average their metrics\."),
    ("coco1k", 6, r"coco1k: fold 6 given; choose one of the 5 folds"),
    ("coco", 2, r"coco: --fold 2 given, but coco has no folds \(only coco1k does"),
])
def test_fold_refusals(tmp_path, name, fold, message):
    write_coco(tmp_path)
    with pytest.raises(InputError, match=message):
        prepare(name, tmp_path, fold=fold)
    assert _written(tmp_path) == []


def _entries(root, dataset="flickr30k"):
    path = root / f"dataset_{dataset}.json"
    return path, json.loads(path.read_text(encoding="utf-8"))


def _edit(root, change, dataset="flickr30k"):
    """Change the fixture's split file: ``change(data)`` edits the parsed JSON in place."""
    path, data = _entries(root, dataset)
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def _no_sentences(data):
    data["images"][7]["sentences"] = []


def _blank_caption(data):
    data["images"][6]["sentences"][2]["raw"] = " \n "


def _control_caption(data):
    data["images"][6]["sentences"][0]["raw"] = "A dog\x00 on grass."


def _split_value(data):
    data["images"][3]["split"] = "testing"


def _same_file(data):
    data["images"][8]["filename"] = data["images"][7]["filename"]


def _no_images(data):
    data.pop("images")


FILE = r"'[^']*dataset_flickr30k.json'"
REPAIR = r"\. Re-extract the release, or correct the line or file named\.$"


@pytest.mark.parametrize("damage, message", [
    # the Karpathy split file is missing
    ("dataset_flickr30k.json",
     r"flickr30k: '[^']*dataset_flickr30k.json' not found: '[^']*' is not an extracted copy of Flickr30k "
     r"\(flickr30k-images\) with Karpathy's split file dataset_flickr30k.json\. Expected layout: "
     r"ROOT/dataset_flickr30k.json \(or ROOT/caption_datasets/dataset_flickr30k.json\) and ROOT/flickr30k-images/"),
    # the image folder is missing
    ("flickr30k-images", r"flickr30k-images' not found"),
    # a test image without its file
    ("flickr30k-images/1000000007.jpg",
     r"flickr30k: 1 listed image\(s\) missing under '[^']*': 'flickr30k-images/1000000007.jpg'\. Extract the whole"),
    # an image with no caption
    (_no_sentences,
     rf"flickr30k: image 8 of {FILE} \('1000000007.jpg'\) has no caption \(`sentences` is empty or missing\): "
     rf"every image of the Karpathy file has its captions; .*{REPAIR}"),
    # a blank caption
    (_blank_caption,
     rf"flickr30k: sentence 3 of image 7 of {FILE} \('1000000006.jpg'\) is empty \(.*\): each caption is one line"),
    # a control character inside a caption
    (_control_caption, rf"sentence 1 of image 7 of {FILE} \('1000000006.jpg'\) holds a control character"),
    # a split Karpathy's files do not have
    (_split_value, rf"image 4 of {FILE} \('1000000003.jpg'\) has split 'testing': a Karpathy split is one of "
                   rf"train, val, restval, test{REPAIR}"),
    # one file listed twice
    (_same_file,
     rf"image 9 of {FILE} lists the image '1000000007' again \(first at image 8 of {FILE}\): one entry per image"),
    # not a Karpathy file
    (_no_images, rf"flickr30k: {FILE} has no `images` list: it is not Karpathy's split file"),
    (b'{"images": [', rf"flickr30k: line 1 of {FILE} is not valid JSON \(Expecting value, column 13\)"),
])
def test_damaged_release_is_refused_and_nothing_written(tmp_path, damage, message):
    """``damage``: a file or folder of the release removed, an edit of the split file's JSON, or its new bytes."""
    write_flickr30k(tmp_path)
    if isinstance(damage, str):
        target = tmp_path / damage
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    elif isinstance(damage, bytes):
        (tmp_path / "dataset_flickr30k.json").write_bytes(damage)  # a file cut short
    else:
        _edit(tmp_path, damage)
    with pytest.raises(InputError, match=message):
        prepare("flickr30k", tmp_path)
    assert _written(tmp_path) == []


def test_coco_image_without_its_folder_name(tmp_path):
    write_coco(tmp_path)
    _edit(tmp_path, lambda d: d["images"][5].pop("filepath"), "coco")
    with pytest.raises(InputError, match=r"coco: image 6 of '[^']*dataset_coco.json' has no `filepath`: each "
                                         r"image of the Karpathy file has a `filepath` \(text\)"):
        prepare("coco", tmp_path)


def test_strict_refuses_a_part_of_the_release(tmp_path):
    write_flickr30k(tmp_path)
    with pytest.raises(InputError, match=r"flickr30k: counts differ .* test 3 \(official 1,000\).*drop --strict"):
        prepare("flickr30k", tmp_path, strict=True)
    assert _written(tmp_path) == []


def test_cli_coco1k_apply_sets_the_text_image_params(tmp_path, capsys):
    write_coco(tmp_path / "coco")
    params = tmp_path / "params.yaml"
    params.write_text(PARAMS, encoding="utf-8")
    assert main(["prepare", "coco1k", str(tmp_path / "coco"), "--fold", "1", "--apply", "--params", str(params)]) == 0
    printed = capsys.readouterr()
    assert "# protocol coco-karpathy-1k-fold1 (text_image): 4 images, 23 captions\n" in printed.out
    assert "captions: recallk_coco1k_fold1_captions.csv" in printed.out
    assert "fold images 4 (official 1,000)" in printed.err
    text = params.read_text(encoding="utf-8")
    assert "  csv: recallk_coco1k_fold1.csv\n" in text and "  protocol: text_image\n" in text
    # the key the section lacked added at its end; the other lines as they were
    assert "  images: files\n  captions: recallk_coco1k_fold1_captions.csv\nscore:\n  ks: [1, 5, 10]\n" in text
    assert text.startswith("# the project's params (comments must survive --apply)\n")
    # the params written are a valid split section, and the split stage's library reads the fold
    out = prepare_all(SplitSettings(**YAML(typ="safe").load(text)["split"]))
    assert out.caption_summary["num_captions"] == 23 and out.caption_summary["num_eval_captions"] == 23
    assert _written(tmp_path / "coco") == ["recallk_coco1k_fold1.csv", "recallk_coco1k_fold1.protocol.json",
                                           "recallk_coco1k_fold1_captions.csv"]


def test_cli_coco1k_without_a_fold_is_one_error_line(tmp_path, capsys):
    write_coco(tmp_path)
    assert main(["prepare", "coco1k", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: coco1k: no fold given") and err.count("\n") == 1 and _written(tmp_path) == []
