"""recallk.score.ranking.faiss_backend through the score stage: the same outputs as numpy, a quiet loader.

(The API-level cross-check of the two backends is in tests/score/test_ranking.py.)"""

from __future__ import annotations

from helpers import EVALUATED_OUTPUTS, RANKING_OUTPUTS, extra, read_metrics, run_ok, set_params

extra("faiss", "faiss")  # without it, this file is skipped (an error under make test)


def test_faiss_backend_matches_numpy(uneven_scored, uneven_scored_base):
    set_params(uneven_scored, {"score.backend": "faiss"})
    run_ok(uneven_scored, "score")
    assert read_metrics(uneven_scored) == read_metrics(uneven_scored_base)
    for rel in RANKING_OUTPUTS:  # the report page differs only where it names the backend
        assert (uneven_scored / rel).read_bytes() == (uneven_scored_base / rel).read_bytes(), rel
    for rel in EVALUATED_OUTPUTS:  # these differ only where they name the backend
        text = (uneven_scored / rel).read_text()
        assert "backend faiss" in text and text.replace("backend faiss", "backend numpy") == \
            (uneven_scored_base / rel).read_text(), rel


def test_faiss_backend_keeps_its_loader_quiet(scored_project):
    set_params(scored_project, {"score.backend": "faiss"})
    proc = run_ok(scored_project, "score")
    assert "faiss" not in proc.stderr.lower(), proc.stderr
