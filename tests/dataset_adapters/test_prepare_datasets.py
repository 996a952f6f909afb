"""``recallk datasets prepare`` (recallk.datasets) on fixture trees in each official format
(tests/dataset_fixtures.py): the manifest and counts, the split stage's library reading it, the score
suite with the protocol's params against torchreid's evaluation (re-ID) and pytorch-metric-learning's
conventions (leave-one-out), the layout errors, the count check, the CLI and ``--apply``. The real-DVC
round trips are tests/pipeline/test_datasets_flow.py."""

from __future__ import annotations

import json
import logging
import re
import shutil

import numpy as np
import pandas as pd
import pytest

from dataset_fixtures import PARAMS, WRITERS, write_cars_folders, write_cub, write_reid
from helpers import ROOT
from recallk.data.prepare import prepare_all
from recallk.data.settings import SplitSettings
from recallk.datasets import DATASETS, prepare
from recallk.datasets.cli import main
from recallk.errors import InputError
from recallk.score.settings import BootstrapSettings, ScoreSettings
from recallk.score.suite import SplitSets, score_split
from reference_evals import eval_market1501, pml_leave_one_out, similarity

#: What each dataset's protocol selects (split.protocol, the score rules).
PROTOCOLS = {"cub200": "leave_one_out", "cars196": "leave_one_out", "sop": "leave_one_out",
             "inshop": "query_gallery", "market1501": "query_gallery", "dukemtmc": "query_gallery"}
#: Each protocol's name and the sizes its protocol file gives for the fixture (tests/dataset_fixtures.py).
PROTOCOL_SIZES = {
    "cub200": ("cub200-classes-101-200-loo", {"queries": 9, "gallery": 9, "classes": 3}),
    "cars196": ("cars196-classes-99-196-loo", {"queries": 6, "gallery": 6, "classes": 2}),
    "sop": ("sop-ebay-test-loo", {"queries": 6, "gallery": 6, "classes": 3}),
    "inshop": ("inshop-query-gallery", {"queries": 2, "gallery": 4, "classes": 2}),
    "market1501": ("market1501-query-gallery-reid", {"queries": 6, "gallery": 20, "classes": 6}),
    "dukemtmc": ("dukemtmc-query-gallery-reid", {"queries": 6, "gallery": 20, "classes": 6}),
}


@pytest.mark.parametrize("name", list(WRITERS))
def test_prepare_writes_the_manifest_counts_and_protocol_params(tmp_path, name, caplog):
    want = WRITERS[name](tmp_path)
    with caplog.at_level(logging.WARNING, logger="recallk.datasets"):
        result = prepare(name, tmp_path)
    assert result.counts == want and result.manifest == tmp_path / f"recallk_{name}.csv"
    assert result.params["split"] == {"data_root": str(tmp_path), "csv": f"recallk_{name}.csv",
                                      "strategy": "given", "protocol": PROTOCOLS[name], "images": "files",
                                      "captions": None}  # a caption benchmark's captions set before are unset
    # the protocol file beside the manifest names the protocol and its sizes
    written = json.loads((tmp_path / f"recallk_{name}.protocol.json").read_text(encoding="utf-8"))
    assert written == result.protocol and (written["name"], written["sizes"]) == PROTOCOL_SIZES[name]
    assert written["split_protocol"] == PROTOCOLS[name] and written["counts"] == want and written["captions"] is None
    reid = name in ("market1501", "dukemtmc")
    assert result.params["score"] == {"exclude_same": [], "exclude_same_all": ["label", "camera"] if reid else [],
                                      "junk": "junk" if reid else None}
    # the fixture is small: every count differs, each named with the official number
    assert result.differences and "counts differ from the official release" in caplog.text
    first = next(iter(DATASETS[name].official.items()))
    assert f"(official {first[1]:,})" in caplog.text
    manifest = pd.read_csv(result.manifest, dtype=str, keep_default_na=False)
    assert (tmp_path / manifest["path"]).map(lambda p: p.is_file()).all()
    # the split stage's library reads it under the printed params
    split = prepare_all(SplitSettings(**result.params["split"])).split
    roles = split.groupby("split")[["query", "gallery"]].sum()
    assert int(split["query"].sum()) == want.get("query", want.get("test"))
    assert int(split["gallery"].sum()) == want.get("gallery", want.get("test"))
    assert "train" in roles.index


def test_cars_folder_repackaging(tmp_path):
    want = write_cars_folders(tmp_path)
    result = prepare("cars196", tmp_path)
    assert result.counts == want
    manifest = pd.read_csv(result.manifest, dtype=str)
    assert set(manifest.loc[manifest["split"] == "train", "label"].astype(int)) <= set(range(1, 99))
    assert set(manifest.loc[manifest["split"] == "gallery", "label"].astype(int)) >= {99, 100}


def test_strict_refuses_counts_off_the_official_release(tmp_path):
    write_cub(tmp_path)
    with pytest.raises(InputError, match=r"cub200: counts differ .* test 9 \(official 5,924\).*drop --strict"):
        prepare("cub200", tmp_path, strict=True)
    assert not (tmp_path / "recallk_cub200.csv").exists()  # nothing written


def test_manifest_in_a_folder_above_the_root(tmp_path):
    write_cub(tmp_path / "CUB_200_2011")
    result = prepare("cub200", tmp_path / "CUB_200_2011", out=tmp_path)
    assert result.manifest.parent == tmp_path and result.params["split"]["data_root"] == str(tmp_path)
    assert pd.read_csv(result.manifest)["path"].str.startswith("CUB_200_2011/images/").all()
    with pytest.raises(InputError, match=r"must be .* or a folder that contains it"):
        prepare("cub200", tmp_path, out=tmp_path / "CUB_200_2011")


def _break(root, rel):
    """Remove a file or folder of a fixture tree."""
    target = root / rel
    shutil.rmtree(target) if target.is_dir() else target.unlink()


@pytest.mark.parametrize("name, remove, message", [
    ("cub200", "image_class_labels.txt", r"image_class_labels.txt' not found: .* Expected layout: ROOT/images.txt, "
                                         r"ROOT/image_class_labels.txt"),                   # a list file gone
    ("cub200", "images/001.Bird_1", r"3 listed image\(s\) missing .*images/001.Bird_1/"),   # images not extracted
    ("cars196", "cars_annos.mat", r"cars_annos.mat' not found: .*ROOT/names.csv"),          # neither layout
    ("sop", "Ebay_test.txt", r"Ebay_test.txt' not found: .* Stanford Online Products"),     # half a release
    ("inshop", "list_eval_partition.txt", r"list_eval_partition.txt' not found: .*Eval/"),  # the partition file
    ("market1501", "query", r"market1501: '.*query' not found: .*ROOT/bounding_box_train/, ROOT/query/"),  # a folder
])
def test_partial_layouts_name_the_missing_file_and_the_layout(tmp_path, name, remove, message):
    WRITERS[name](tmp_path)
    _break(tmp_path, remove)
    with pytest.raises(InputError, match=message):
        prepare(name, tmp_path)
    assert not list(tmp_path.glob("recallk_*.csv"))


@pytest.mark.parametrize("name, rel, text, message", [
    ("cub200", "images.txt", "1 images/a.jpg\nnot a line\n", r"line 2 of .*images.txt' is 'not a line'"),
    ("sop", "Ebay_train.txt", "image_id class_id super_class_id path\n1 2 x/y.JPG\n", r"line 2 of .*Ebay_train"),
    ("inshop", "list_eval_partition.txt", "1\nimage_name item_id evaluation_status\nimg/a.jpg id_1 val\n",
     r"line 3 of .*not in the release's"),
])
def test_malformed_lines_are_named(tmp_path, name, rel, text, message):
    WRITERS[name](tmp_path)
    (tmp_path / rel).write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=message):
        prepare(name, tmp_path)


def test_reid_file_not_in_the_naming_scheme(tmp_path):
    write_reid(tmp_path)
    (tmp_path / "query" / "person.jpg").write_bytes(b"")
    with pytest.raises(InputError, match=r"person.jpg' is not named <person id>_c<camera>_"):
        prepare("market1501", tmp_path)


def test_unknown_dataset():
    with pytest.raises(InputError, match=r"unknown dataset 'cub'\. Did you mean `cub200`\? Known: cub200, cars196"):
        prepare("cub", ".")


def scored(tmp_path, name, score=None, edit=None):
    """prepare -> the split library -> random embeddings -> the score suite under the printed score params
    (``score``: params replaced; ``edit(manifest frame)``: the manifest changed before the split)."""
    result = prepare(name, tmp_path)
    if edit is not None:
        frame = pd.read_csv(result.manifest, dtype=str, keep_default_na=False)
        edit(frame)
        frame.to_csv(result.manifest, index=False)
    result.params["score"].update(score or {})
    out = prepare_all(SplitSettings(**result.params["split"]))
    catalog, split = out.catalog.set_index("image_id"), out.split
    ids = catalog.index.to_numpy()
    emb = np.random.default_rng(1).normal(size=(ids.size, 6))
    row = pd.Series(np.arange(ids.size), index=ids)
    queries = split.loc[split["query"], "image_id"].to_numpy()
    gallery = split.loc[split["gallery"], "image_id"].to_numpy()
    settings = ScoreSettings(ks=tuple(range(1, 6)), metrics=("recall", "precision", "r_precision", "map@r", "map"),
                             **result.params["score"], bootstrap=BootstrapSettings(resamples=0))
    sets = SplitSets(emb, row, queries, gallery, split.loc[split["split"] == "train", "image_id"].to_numpy(),
                     result.params["split"]["protocol"] == "leave_one_out")
    metrics, _ = score_split(sets, catalog, settings)
    return metrics, catalog, emb[row[queries]], emb[row[gallery]], queries, gallery


def test_market_protocol_through_the_suite_agrees_with_torchreid(tmp_path):
    write_reid(tmp_path)
    metrics, cat, q, g, queries, gallery = scored(tmp_path, "market1501")
    kept = cat.loc[gallery, "label"].ne("-1").to_numpy()  # torchreid's loader drops the junk files
    pid = {i: int(v) for i, v in cat["label"].items()}
    cam = {i: int(v) for i, v in cat["camera"].items()}
    q_pid, g_pid = np.array([pid[i] for i in queries]), np.array([pid[i] for i in gallery[kept]])
    q_cam, g_cam = np.array([cam[i] for i in queries]), np.array([cam[i] for i in gallery[kept]])
    cmc, m_ap, valid = eval_market1501(-similarity(q, g[kept]).astype(np.float64), q_pid, g_pid, q_cam, g_cam, 5)
    assert valid == 5 and metrics["num_queries"] == 5 and metrics["num_excluded_queries"] == 1  # person 6
    for k in range(1, 6):
        assert abs(metrics[f"recall@{k}"] - cmc[k - 1]) <= 1e-12
    assert abs(metrics["map"] - m_ap) <= 1e-12


def _junk_value(frame):
    frame.loc[frame["junk"] == "True", "junk"] = "maybe"


@pytest.mark.parametrize("name, score, edit, message", [
    # a junk column that is not flags
    ("market1501", {}, _junk_value, r"junk column `junk` must hold true/false .* Got 'maybe'"),
    # junk under leave-one-out: a gallery item is also a query there
    ("cub200", {"junk": "label_text"}, lambda f: f.insert(3, "label_text", "False"),
     r"`score.junk` hides gallery items from every query, but under `split.protocol: leave_one_out`"),
    # a joint column the catalog lacks
    ("market1501", {"exclude_same_all": ["label", "cam"]}, None,
     r"`score.exclude_same_all` names \['cam'\], which the catalog does not have\. Did you mean `camera`\?"),
    # every query's matches are junk
    ("market1501", {"exclude_same_all": ["label", "split_copy"]}, lambda f: f.insert(3, "split_copy", "x"),
     r"every query is excluded: with `score.exclude_same_all: \['label', 'split_copy'\]`"),
])
def test_score_rules_refused_in_the_suite(tmp_path, name, score, edit, message):
    WRITERS[name](tmp_path)
    with pytest.raises(InputError, match=message):
        scored(tmp_path, name, score, edit)


def test_cub_protocol_through_the_suite_agrees_with_pml_conventions(tmp_path):
    write_cub(tmp_path)
    metrics, cat, q, g, queries, gallery = scored(tmp_path, "cub200")
    assert list(queries) == list(gallery) and len(queries) == 9  # classes 101-103, leave-one-out
    want = pml_leave_one_out(similarity(q, q), cat.loc[queries, "label"].to_numpy())
    assert abs(metrics["precision@1"] - want["precision@1"]) <= 1e-12
    assert abs(metrics["r_precision"] - want["r_precision"]) <= 1e-12
    assert abs(metrics["map@r"] - want["map@r"]) <= 1e-12
    assert abs(metrics["recall@4"] - want["recall@4"]) <= 1e-12


# ---------------------------------------------------------------------------------------------- the CLI




def test_cli_prints_the_params_and_apply_keeps_comments(tmp_path, capsys):
    write_reid(tmp_path / "Market")
    params = tmp_path / "params.yaml"
    params.write_text(PARAMS, encoding="utf-8")
    assert main(["prepare", "market1501", str(tmp_path / "Market"), "--apply", "--params", str(params)]) == 0
    printed = capsys.readouterr()
    assert "wrote" in printed.out and "exclude_same_all: [label, camera]" in printed.out
    assert "# protocol market1501-query-gallery-reid (query_gallery): 6 queries, 20 gallery, 6 classes\n" in printed.out
    assert "strategy: given" in printed.out and "warning: market1501: counts differ" in printed.err
    text = params.read_text(encoding="utf-8")
    assert text.startswith("# the project's params (comments must survive --apply)\n")
    assert re.search(rf"\n  data_root: {re.escape(str(tmp_path / 'Market'))} +# where the images are\n", text)
    assert "  ks: [1, 5, 10]\n" in text and "  exclude_same_all: [label, camera]\n" in text
    assert "  junk: junk  # off\n" in text and "  csv: recallk_market1501.csv\n" in text


@pytest.mark.parametrize("args, message", [
    (["prepare", "sop", "{root}"], "error: sop: '{root}/Ebay_train.txt' not found"),       # an empty folder
    (["prepare", "cub200", "{root}", "--apply", "--params", "{root}/none.yaml"], "none.yaml' not found"),
])
def test_cli_errors_exit_2_with_one_line(tmp_path, capsys, args, message):
    if "cub200" in args:
        write_cub(tmp_path)
    code = main([a.format(root=tmp_path) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and message.format(root=tmp_path) in err and err.count("error:") == 1
    assert "Traceback" not in err


@pytest.mark.parametrize("name", list(DATASETS))
def test_each_docs_page_states_the_official_counts_and_the_source(name):
    page = (ROOT / "docs" / "datasets" / f"{name}.md").read_text(encoding="utf-8")
    ds = DATASETS[name]
    for key, value in ds.official.items():
        assert not value or f"{value:,}" in page, (name, key)
    assert f"recallk datasets prepare {name} " in page and "Protocol source" in page
    assert ds.source.split(",")[0] in page
