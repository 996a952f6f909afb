"""recallk.report.block: the report block printed by the score stage."""

from __future__ import annotations

import numpy as np

from recallk import format_report, retrieval_summary


def test_format_report_has_seed_block():
    rng = np.random.default_rng(1)
    q, g = rng.normal(size=(17, 6)), rng.normal(size=(29, 6))
    ql, gl = rng.integers(0, 5, 17), rng.integers(0, 5, 29)
    report = format_report(retrieval_summary(q, g, ql, gl, ks=[1, 5, 10]))
    lines = report.splitlines()
    for prefix in ("[evaluation]", "  num queries:", "  num gallery:   29", "  embedding_dim: 6", "[recall]",
                   "  recall@1:", "  recall@5:", "  recall@10:"):
        assert any(line.startswith(prefix) for line in lines), prefix
    assert lines.index("[evaluation]") < lines.index("[recall]")



def test_split_metrics_declares_recall_at_k_alone():
    """recall.json (the declared metrics file, one `dvc exp show` column each) gets recall@K's means; the other
    means lead intervals.json, in the suite's order, then the per-metric details; the counts go to counts.json;
    nothing is lost or doubled. Without recall scored, every mean is declared."""
    from recallk.report.block import split_metrics

    metrics = {"recall@1": 0.5, "recall@10": 0.75, "precision@1": 0.5, "map@r": 0.25, "mrr": 0.6, "num_queries": 4,
               "num_excluded_queries": 0, "tie_sensitive@1": 1,
               "num_gallery": 9, "embedding_dim": 3, "capped_ks": [10], "near_duplicates_train_eval": 2,
               "num_skipped_images": 0,
               "num_embedding_copy_queries": 1, "recall@1_ci_low": 0.1, "recall@1_ci_high": 0.9,
               "recall@1_class_mean": 0.5, "recall@1_without_embedding_copies": 0.4}
    declared, counts, detail = split_metrics(metrics)
    assert declared == {"recall@1": 0.5, "recall@10": 0.75}
    assert list(counts) == ["num_queries", "num_excluded_queries", "tie_sensitive@1", "num_gallery", "embedding_dim",
                            "capped_ks", "near_duplicates_train_eval", "num_skipped_images",
                            "num_embedding_copy_queries"]
    assert list(detail) == ["precision@1", "map@r", "mrr", "recall@1_ci_low", "recall@1_ci_high",
                            "recall@1_class_mean", "recall@1_without_embedding_copies"]
    assert {**declared, **counts, **detail} == metrics
    no_recall = split_metrics({"map@r": 0.25, "mrr": 0.5, "map@r_ci_low": 0.1})
    assert no_recall == ({"map@r": 0.25, "mrr": 0.5}, {}, {"map@r_ci_low": 0.1})


def test_a_capped_k_is_marked_and_named():
    """issue 38: recall@K at a K holding every query's whole gallery (``capped_ks``) is marked on its lines and
    named once; the other Ks, and a metrics dict without the key (an older counts.json), are not marked."""
    from recallk.report.block import CAPPED_MARK

    metrics = {"recall@1": 0.5, "recall@10": 1.0, "precision@10": 0.3, "map@r": 0.4, "num_queries": 4,
               "num_excluded_queries": 0, "num_gallery": 9, "embedding_dim": 3, "capped_ks": [10]}
    lines = format_report(metrics).splitlines()
    assert sorted(line.split(":")[0].strip() for line in lines if line.endswith(CAPPED_MARK)) == [
        "precision@10", "recall@10"]
    assert "  K = 10: at or above every query's gallery, recall@K is 1.0 by construction; use a smaller K (score.ks)" \
        in lines
    older = format_report({k: v for k, v in metrics.items() if k != "capped_ks"})
    assert CAPPED_MARK not in older and "K = 10" not in older
