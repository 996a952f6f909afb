"""Leakage checks and the embeddings-only mode, without DVC: the banded Hamming search against brute
force, pHash on real images, the three near-duplicate policies of prepare_all(), the embedding check
of the score suite, and catalogs built from a manifest of ids."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from helpers import LEAK_LABELS as LABELS, LEAK_PLANTED as PLANTED, near_copy, planted_pairs, run_module, smooth, \
    write_planted_images
from recallk.data import catalog, contract, near_duplicates as nd, prepare, splitting
from recallk.encode import precomputed
from recallk.encode.embed import embed
from recallk.errors import InputError
from recallk.images import decode
from recallk.score import near_duplicates as copies
from recallk.score.report import format_report, provenance
from recallk.score.suite import score_split
from stages.params import SCHEMA, validate_section

PER_CLASS = {"train": 0.5, "val": 0.25, "gallery": 0.25}


# ---------------------------------------------------------------------------------------- helpers


def run_prepare(root: Path, **overrides) -> prepare.Prepared:
    params = dict(data_root=str(root), csv=None, on_bad_image="error", strategy="per_class",
                  protocol="query_gallery", seed=0, fractions=PER_CLASS, images="auto",
                  near_duplicates={"policy": "report", "max_distance": 10}) | overrides
    return prepare.prepare_all(**params)


def random_codes(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)
    planted = n // 5  # near pairs at 1..12 bits, and exact repeats
    for k in range(planted):
        bits = rng.choice(64, size=int(rng.integers(1, 13)), replace=False)
        codes[n - 1 - k] = codes[k] ^ np.uint64(sum(1 << int(b) for b in bits))
    if n >= 100:
        codes[planted:planted + 10] = codes[planted + 10:planted + 20]
    return codes


# ---------------------------------------------------------------------------------------- banded search


@pytest.mark.parametrize("n, seed", [(0, 0), (1, 0), (2, 1), (300, 2), (3000, 3)])
@pytest.mark.parametrize("max_distance", [0, 1, 3, 8, 10, 12, 16])
def test_banded_search_equals_brute_force(n, seed, max_distance):
    codes = random_codes(n, seed)
    got = nd.near_pairs(codes, max_distance)
    want = nd.near_pairs_brute(codes, max_distance)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert (got[0] < got[1]).all() and (got[2] <= max_distance).all()


@pytest.mark.parametrize("max_distance", [2, 5, 9])
def test_every_band_count_finds_the_same_pairs(max_distance):
    """Any number of bands is correct (the plan only picks the fastest)."""
    codes = random_codes(800, 7)
    want = nd.near_pairs_brute(codes, max_distance)
    for bands in range(1, max_distance + 2):
        if nd._ball(64 // bands + 1, -(-(max_distance // bands) // 2)) > 5000:
            continue  # a valid plan, but too many keys per hash to enter: plan() never picks it
        got = nd.near_pairs(codes, max_distance, bands=bands)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_many_equal_hashes_pair_with_each_other_and_their_neighbours():
    codes = np.array([5] * 40 + [5 ^ 0b11] * 3 + [2**63], dtype=np.uint64)
    i, j, d = nd.near_pairs(codes, 2)
    assert len(i) == 43 * 42 // 2 and set(d.tolist()) == {0, 2}
    assert 43 not in set(i.tolist()) | set(j.tolist())


def test_plan_stays_sub_quadratic():
    """At 100,000 hashes the plan's bands keep the expected candidates far below n^2/2."""
    n = 100_000
    for d in (4, 8, 10):
        m = nd.plan(n, d)
        radius = -(-(d // m) // 2)
        entries = [n * nd._ball(w, radius) for _, w in nd._bands(m)]
        candidates = sum(e * e / 2 / 2.0 ** w for e, (_, w) in zip(entries, nd._bands(m)))
        assert candidates < n * n / 2 / 20


def test_popcount_fallback_matches():
    x = random_codes(1000, 4)
    table = nd._POP8[x.view(np.uint8).reshape(-1, 8)].sum(axis=1)
    np.testing.assert_array_equal(nd.popcount(x), table)


def test_clusters_are_connected_components():
    labels = nd.clusters(6, np.array([0, 1, 4]), np.array([1, 2, 5]))
    assert labels[0] == labels[1] == labels[2] and labels[4] == labels[5]
    assert len({labels[0], labels[3], labels[4]}) == 3


# ---------------------------------------------------------------------------------------- pHash


def test_phash_is_16_hex_and_close_for_a_near_copy():
    a, b = smooth(1), smooth(2)
    ha, hb, hc = nd.phash(a), nd.phash(b), nd.phash(near_copy(a))
    assert len(ha) == 16 and int(ha, 16) >= 0 and ha == nd.phash(smooth(1))
    dist = lambda x, y: bin(int(x, 16) ^ int(y, 16)).count("1")  # noqa: E731
    assert dist(ha, hc) <= 6 < 10 < dist(ha, hb)


def test_catalog_has_phash_and_it_ignores_split_params(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_planted_images(tmp_path / "data", {"a": [1, 2, 3, 4], "b": [5, 6, 7, 8]})
    first = run_prepare(Path("data"))
    other = run_prepare(Path("data"), seed=3, near_duplicates={"policy": "group", "max_distance": 4})
    assert first.catalog["phash"].str.fullmatch(r"[0-9a-f]{16}").all()
    pd.testing.assert_frame_equal(first.catalog, other.catalog)


# ---------------------------------------------------------------------------------------- policies


@pytest.fixture
def planted_root(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    write_planted_images(tmp_path / "data", LABELS, PLANTED)
    return Path("data")


def test_report_lists_exactly_the_planted_pairs_with_their_splits(planted_root):
    out = run_prepare(planted_root)
    table = out.near_duplicates
    assert list(table.columns) == nd.PAIR_COLUMNS
    assert set(zip(table["id_a"], table["id_b"])) == planted_pairs()
    split_of = dict(zip(out.split["image_id"], out.split["split"]))
    assert (table["split_a"] == table["id_a"].map(split_of)).all()
    assert (table["split_b"] == table["id_b"].map(split_of)).all()
    assert table["distance"].is_monotonic_increasing and (table["distance"] <= 10).all()
    crossing = (table["split_a"] == "train") != (table["split_b"] == "train")
    assert out.summary == {"policy": "report", "max_distance": 10, "pairs": 4,
                           "near_duplicates_train_eval": int(crossing.sum()),
                           "near_duplicates_query_gallery": int(nd.query_gallery(
                               table, dict(zip(out.split["image_id"], out.split["query"])),
                               dict(zip(out.split["image_id"], out.split["gallery"]))).sum()),
                           "near_duplicates_cross_label": 1}
    # the report is deterministic
    pd.testing.assert_frame_equal(run_prepare(planted_root).near_duplicates, table)


@pytest.mark.parametrize("strategy", ["per_class", "class_disjoint"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_group_keeps_every_cluster_in_one_split(planted_root, strategy, seed):
    report = run_prepare(planted_root, strategy=strategy, seed=seed)
    grouped = run_prepare(planted_root, strategy=strategy, seed=seed,
                          near_duplicates={"policy": "group", "max_distance": 10})
    table = grouped.near_duplicates
    assert set(zip(table["id_a"], table["id_b"])) == planted_pairs()
    assert (table["split_a"] == table["split_b"]).all(), table
    assert grouped.summary["near_duplicates_train_eval"] == grouped.summary["near_duplicates_query_gallery"] == 0
    # the catalog never depends on the policy; labels without a cluster keep every split
    pd.testing.assert_frame_equal(report.catalog, grouped.catalog)
    if strategy == "per_class":
        untouched = ~report.split["image_id"].str.startswith(("l0/", "l1/", "l2/", "l3/"))
        assert (report.split["split"][untouched] == grouped.split["split"][untouched]).all()


def test_group_under_leave_one_out_keeps_clusters_off_the_train_eval_border(planted_root, caplog):
    out = run_prepare(planted_root, protocol="leave_one_out", near_duplicates={"policy": "group", "max_distance": 10})
    table = out.near_duplicates
    assert (table["split_a"] == table["split_b"]).all() and out.summary["near_duplicates_train_eval"] == 0
    eval_pairs = int(table["split_a"].eq("gallery").sum())  # every eval image is a query and a gallery item
    assert out.summary["near_duplicates_query_gallery"] == eval_pairs
    if eval_pairs:
        assert "under leave_one_out every eval image is a query" in caplog.text


def test_group_without_pairs_is_the_plain_assignment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_planted_images(tmp_path / "data", LABELS)
    for strategy in ("per_class", "class_disjoint"):
        plain = run_prepare(Path("data"), strategy=strategy)
        grouped = run_prepare(Path("data"), strategy=strategy, near_duplicates={"policy": "group", "max_distance": 10})
        assert plain.near_duplicates.empty
        pd.testing.assert_frame_equal(plain.split, grouped.split)


def test_group_warns_when_chained_pairs_make_a_large_cluster(caplog):
    frame = pd.DataFrame({"image_id": [f"i{k}" for k in range(100)], "label": ["a"] * 100})
    frame["sha256"] = frame["image_id"]
    chain = np.arange(11)  # i0~i1, i1~i2, ..., i10~i11: one cluster of 12
    keys = prepare._cluster_keys(frame, (chain, chain + 1, np.ones(11, dtype=np.int64)))
    assert keys[:12].nunique() == 1 and keys[12:].tolist() == frame["sha256"][12:].tolist()
    assert "the largest near-duplicate cluster holds 12 of 100 images (12%): pairs chain" in caplog.text
    caplog.clear()
    prepare._cluster_keys(frame, (chain[:9], chain[:9] + 1, np.ones(9, dtype=np.int64)))
    assert "largest" not in caplog.text


def test_group_under_class_disjoint_takes_joined_labels_together():
    frame = pd.DataFrame({"image_id": [f"{lab}/{i}" for lab in "abcd" for i in range(3)],
                          "label": [lab for lab in "abcd" for _ in range(3)]})
    frame["sha256"] = frame["image_id"]
    groups = frame["sha256"].copy()
    groups[frame["image_id"].isin(["a/0", "d/1"])] = "cluster"  # a cross-label cluster joins a and d
    for seed in range(6):
        result = splitting.assign_splits(frame, strategy="class_disjoint", protocol="query_gallery",
                                         fractions=PER_CLASS, seed=seed, groups=groups)
        side = result.eq("train").groupby(frame["label"]).agg(["all", "any"])
        assert (side["all"] == side["any"]).all()  # every label on one side
        assert side.loc["a", "all"] == side.loc["d", "all"]
        assert result[frame["image_id"] == "a/0"].iloc[0] == result[frame["image_id"] == "d/1"].iloc[0]


def test_error_names_the_leaking_pairs(planted_root):
    report = run_prepare(planted_root, seed=1)
    leaks = report.near_duplicates[nd.leaking(report.near_duplicates,
                                              dict(zip(report.split["image_id"], report.split["query"])),
                                              dict(zip(report.split["image_id"], report.split["gallery"])))]
    assert len(leaks), "seed 1 must put a planted pair across the split"
    with pytest.raises(InputError) as info:
        run_prepare(planted_root, seed=1, near_duplicates={"policy": "error", "max_distance": 10})
    message = str(info.value)
    assert f"{len(leaks)} near-duplicate pair(s) (pHash within 10 of 64 bits) leak across the split" in message
    for row in leaks.itertuples():
        assert f"'{row.id_a}' ({row.label_a}, {row.split_a}) ~ '{row.id_b}'" in message
    assert "split.near_duplicates.policy: group" in message


def test_error_passes_when_no_pair_leaks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_planted_images(tmp_path / "data", LABELS)
    out = run_prepare(Path("data"), near_duplicates={"policy": "error", "max_distance": 10})
    assert out.near_duplicates.empty and out.summary["pairs"] == 0


def test_group_under_given_stops_on_a_crossing_pair(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_planted_images(tmp_path / "data", {"a": [1, 2, 3]}, {"a/copy.png": ("a", 1)})
    rows = ["image_id,path,label,split", "x1,a/1.png,a,val", "x2,a/2.png,a,gallery", "x3,a/3.png,a,gallery",
            "xc,a/copy.png,a,gallery"]
    (tmp_path / "data" / "m.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(InputError, match=r"(?s)`split.strategy: given` fixes every split.*'x1' \(a, val\) ~ 'xc'"):
        run_prepare(Path("data"), csv="m.csv", strategy="given", near_duplicates={"policy": "group", "max_distance": 10})


# ---------------------------------------------------------------------------------------- embedding check


def test_flagged_pairs_and_metrics_without_them():
    cols = np.array([[1, 0], [0, -1], [2, 1]])
    scores = np.array([[0.99, 0.5], [0.97, np.nan], [0.2, 0.1]], dtype=np.float32)
    pairs = copies.flagged_pairs(cols, scores, np.array(["q0", "q1", "q2"]), np.array(["a", "b", "a"]),
                                 np.array(["g0", "g1", "g2"]), np.array(["a", "b", "a"]), 0.98)
    assert pairs[["image_id", "rank", "gallery_id"]].values.tolist() == [["q0", 1, "g1"]]
    flagged = np.array([True, False, False])
    values = {"recall@1": np.array([1.0, 0.0, np.nan])}
    assert copies.without(values, flagged, ["recall@1"]) == {"recall@1_without_near_duplicates": 0.0}
    assert copies.without(values, np.array([True, True, False]), ["recall@1"]) == {
        "recall@1_without_near_duplicates": None}


def _suite(min_cosine, whiten="none"):
    rng = np.random.default_rng(0)
    n = 40
    labels = np.repeat(["a", "b", "c", "d"], n // 4)
    emb = rng.normal(size=(n, 8)).astype(np.float32) + 3 * (np.arange(4).repeat(n // 4)[:, None] == np.arange(8))
    emb[1] = emb[0] * 2.0  # q "i1" is an exact multiple (cosine 1) of gallery "i0"
    ids = np.array([f"i{k}" for k in range(n)])
    row = pd.Series(np.arange(n), index=ids)
    cat = pd.DataFrame({"label": labels}, index=ids)
    queries, gallery = ids[1::2], ids[0::2]
    return score_split(emb, row, cat, queries=queries, gallery=gallery, train=ids[:4], same_set=False,
                       ks=[1, 5], metrics=["recall", "map@r"], max_memory_mb=64, backend="numpy",
                       exclude_same=[], whiten=whiten, bootstrap={"resamples": 0, "confidence": 0.95, "seed": 0,
                                                                  "unit": "query"},
                       near_duplicates={"min_cosine": min_cosine})


def test_score_split_flags_near_copies_and_reports_without_them():
    metrics, tables = _suite(0.999)
    assert tables["near_duplicates"][["image_id", "gallery_id", "rank"]].values.tolist() == [["i1", "i0", 1]]
    assert metrics["num_near_duplicate_queries"] == 1
    per_query = tables["per_query"].set_index("image_id")
    others = per_query.drop(index="i1")
    assert metrics["recall@1_without_near_duplicates"] == pytest.approx(others["hit@1"].mean())
    assert metrics["map@r_without_near_duplicates"] == pytest.approx(others["ap@r"].mean())
    off, off_tables = _suite(None)
    assert "num_near_duplicate_queries" not in off and off_tables["near_duplicates"].empty
    assert {k: off[k] for k in off} == {k: metrics[k] for k in off}  # the check changes no other number


def test_the_embedding_check_uses_the_stored_embeddings_under_whitening():
    metrics, tables = _suite(0.999, whiten="pca")
    assert tables["near_duplicates"]["gallery_id"].tolist() == ["i0"]
    assert tables["near_duplicates"]["cosine"].iloc[0] == pytest.approx(1.0, abs=1e-6)


def test_report_block_warns_and_names_the_backbone():
    metrics, _ = _suite(0.999)
    metrics.update(near_duplicates_train_eval=2, near_duplicates_query_gallery=1, near_duplicates_cross_label=0)
    split = {"data_root": "d", "manifest": None, "strategy": "per_class", "protocol": "query_gallery", "seed": 0,
             "num_images": 40, "num_labels": 4, "num_skipped_images": 0, "images": "files",
             "near_duplicates": {"policy": "report", "max_distance": 10, "pairs": 3}}
    encode = {"backbone": "mynet", "fingerprint": "f", "embedding_dim": 8}
    score = {"exclude_same": [], "whiten": "none", "backend": "numpy", "near_duplicates": {"min_cosine": 0.999},
             "bootstrap": {"resamples": 0, "unit": "query", "confidence": 0.95}}
    text = format_report(metrics, provenance(split, encode, score))
    assert "near-dups:     pHash within 10 of 64 bits, policy report: 3 pair(s)" in text
    assert "cosine >= 0.999 in mynet embeddings" in text
    assert "warning: 2 near-duplicate pair(s) cross train and val/gallery, 1 pair a query with a" in text
    assert "queries with a near copy (embeddings): 1 of 20" in text
    assert f"recall@1:  {metrics['recall@1']:.4f} with them, " in text
    assert "map@r_without" not in text and "[recall]" in text
    quiet = dict(metrics, near_duplicates_train_eval=0, near_duplicates_query_gallery=0)
    assert "warning" not in format_report(quiet, provenance(split, encode, score))
    none = provenance(dict(split, images="none", near_duplicates=None), encode, score)
    assert none["near-dups"].startswith("unavailable (embeddings-only catalog")


# ---------------------------------------------------------------------------------------- embeddings only


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
        embed(cat, backbone="pixels", batch_size=4, num_workers=1, pixels={"resolution": 4})
    np.savez(tmp_path / "e.npz", ids=np.array(["b", "a"]), embeddings=np.array([[1.0, 0], [0, 1.0]]))
    emb, prov = embed(cat, backbone="precomputed", batch_size=4, num_workers=1,
                      precomputed={"path": str(tmp_path / "e.npz"), "ids": None})
    np.testing.assert_array_equal(emb, [[0, 1], [1, 0]])
    assert prov["backbone"] == "precomputed"


def test_the_precomputed_placeholder_means_none(tmp_path):
    assert Path(precomputed.PLACEHOLDER).is_file() or (Path(__file__).parents[1] / precomputed.PLACEHOLDER).is_file()
    assert SCHEMA["encode"]["precomputed"]["path"].default == precomputed.PLACEHOLDER
    with pytest.raises(InputError, match=r"needs `encode.precomputed.path`.*the placeholder for none"):
        precomputed.read_precomputed(precomputed.PLACEHOLDER, None)


# ---------------------------------------------------------------------------------------- params


@pytest.mark.parametrize("section, key, value, match", [
    ("split", "images", "maybe", r"`split.images` must be one of auto, files, none"),
    ("split", "near_duplicates", {"policy": "drop"}, r"`split.near_duplicates.policy` must be one of report, group"),
    ("split", "near_duplicates", {"max_distance": 17}, r"`split.near_duplicates.max_distance` must be an integer "
                                                       r"between 0 and 16"),
    ("split", "near_duplicates", {"max_distance": -1}, r"between 0 and 16"),
    ("score", "near_duplicates", {"min_cosine": 0}, r"`score.near_duplicates.min_cosine` must be a cosine above 0"),
    ("score", "near_duplicates", {"min_cosine": 1.5}, r"must be a cosine above 0 and at most 1"),
    ("score", "near_duplicates", {"min_cosine": "0.9"}, r"Got '0.9' instead"),
    ("encode", "precomputed", {"path": None}, r"`encode.precomputed.path` must be a path: the encode stage depends "
                                             r"on it in dvc.yaml"),
])
def test_new_params_are_checked(section, key, value, match):
    with pytest.raises(InputError, match=match):
        validate_section({section: {key: value}}, section)


def test_new_params_defaults():
    split = validate_section({}, "split")
    assert split["images"] == "auto" and split["near_duplicates"] == {"policy": "report", "max_distance": 10}
    assert validate_section({}, "score")["near_duplicates"] == {"min_cosine": None}
    assert validate_section({"score": {"near_duplicates": {"min_cosine": 1}}}, "score")["near_duplicates"] == {
        "min_cosine": 1}


# ---------------------------------------------------------------------------------------- the split stage


def test_split_stage_writes_the_pairs_and_their_counts(planted_root, tmp_path):
    params = {"split": {"data_root": "data", "strategy": "per_class", "seed": 1}}
    (tmp_path / "params.yaml").write_text(json.dumps(params))
    proc = run_module("stages.split", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    pairs = pd.read_csv(tmp_path / "data/prepared/near_duplicates.csv", dtype=str, keep_default_na=False)
    assert list(pairs.columns) == nd.PAIR_COLUMNS and len(pairs) == 4
    prov = json.loads((tmp_path / "data/prepared/provenance.json").read_text())
    assert prov["images"] == "files" and prov["near_duplicates"]["pairs"] == 4
    assert prov["near_duplicates"]["near_duplicates_cross_label"] == 1
    if prov["near_duplicates"]["near_duplicates_train_eval"] or prov["near_duplicates"]["near_duplicates_query_gallery"]:
        assert "WARNING recallk.data.prepare: near-duplicates (pHash within 10 of 64 bits): 4 pair(s)" in proc.stderr
