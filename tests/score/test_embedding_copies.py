"""The embedding check of the score suite: gallery items whose cosine to a query reaches
`score.embedding_copies.min_cosine`, the metrics without those queries, and the report block."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from recallk.report.block import format_report
from recallk.report.provenance import provenance
from recallk.score import embedding_copies as copies
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import BootstrapSettings, EmbeddingCopySettings, FailureSettings, ScoreSettings
from recallk.score.suite import SplitSets, score_split


def test_flagged_pairs_and_metrics_without_them():
    cols = np.array([[1, 0], [0, -1], [2, 1]])
    scores = np.array([[0.99, 0.5], [0.97, np.nan], [0.2, 0.1]], dtype=np.float32)
    data = RetrievalData(np.eye(3), np.eye(3), np.array(["a", "b", "a"]), np.array(["a", "b", "a"]),
                         query_ids=np.array(["q0", "q1", "q2"]), gallery_ids=np.array(["g0", "g1", "g2"]))
    pairs = copies.flagged_pairs(cols, scores, data, 0.98)
    assert pairs[["image_id", "rank", "gallery_id"]].values.tolist() == [["q0", 1, "g1"]]
    flagged = np.array([True, False, False])
    values = {"recall@1": np.array([1.0, 0.0, np.nan])}
    assert copies.without(values, flagged, ["recall@1"]) == {"recall@1_without_embedding_copies": 0.0}
    assert copies.without(values, np.array([True, True, False]), ["recall@1"]) == {
        "recall@1_without_embedding_copies": None}


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
    settings = ScoreSettings(ks=(1, 5), metrics=("recall", "map@r"), max_memory_mb=64, whiten=whiten,
                             bootstrap=BootstrapSettings(resamples=0), failures=FailureSettings(0, 0),
                             embedding_copies=EmbeddingCopySettings(min_cosine))
    return score_split(SplitSets(emb, row, queries, gallery, ids[:4], False), cat, settings)


def test_score_split_flags_near_copies_and_reports_without_them():
    metrics, tables = _suite(0.999)
    assert tables["embedding_copies"][["image_id", "gallery_id", "rank"]].values.tolist() == [["i1", "i0", 1]]
    assert metrics["num_embedding_copy_queries"] == 1
    per_query = tables["per_query"].set_index("image_id")
    others = per_query.drop(index="i1")
    assert metrics["recall@1_without_embedding_copies"] == pytest.approx(others["hit@1"].mean())
    assert metrics["map@r_without_embedding_copies"] == pytest.approx(others["ap@r"].mean())
    off, off_tables = _suite(None)
    assert "num_embedding_copy_queries" not in off and off_tables["embedding_copies"].empty
    assert {k: off[k] for k in off} == {k: metrics[k] for k in off}  # the check changes no other number


def test_the_embedding_check_uses_the_stored_embeddings_under_whitening():
    metrics, tables = _suite(0.999, whiten="pca")
    assert tables["embedding_copies"]["gallery_id"].tolist() == ["i0"]
    assert tables["embedding_copies"]["cosine"].iloc[0] == pytest.approx(1.0, abs=1e-6)


def test_report_block_warns_and_names_the_backbone():
    metrics, _ = _suite(0.999)
    metrics.update(near_duplicates_train_eval=2, near_duplicates_query_gallery=1, near_duplicates_cross_label=0)
    split = {"data_root": "d", "manifest": None, "strategy": "per_class", "protocol": "query_gallery", "seed": 0,
             "num_images": 40, "num_labels": 4, "num_skipped_images": 0, "images": "files",
             "near_duplicates": {"policy": "report", "max_distance": 10, "pairs": 3}}
    encode = {"backbone": "mynet", "fingerprint": "f", "embedding_dim": 8}
    score = {"exclude_same": [], "whiten": "none", "backend": "numpy", "embedding_copies": {"min_cosine": 0.999},
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
