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

