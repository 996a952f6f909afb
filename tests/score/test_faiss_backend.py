"""recallk.score.ranking.faiss_backend: identical to the numpy engine on the seeded cases of
tests/ranking_cases.py (the API), and through the score stage: the same outputs as numpy, a quiet loader."""

from __future__ import annotations

import pytest

from extras import extra
from helpers import EVALUATED_OUTPUTS, RANKING_OUTPUTS, read_bytes, read_metrics, run_ok, set_params
from ranking_cases import (
    BIG_KINDS,
    KINDS,
    KS,
    SEEDS,
    assert_same_ranking,
    case_summary,
    make_big_case,
    make_case,
    rank_case,
)
from recallk.score.metrics import retrieval_metrics

extra("faiss", "faiss")  # without it, this file is skipped (an error under make test)


@pytest.mark.parametrize("kind, seed", [(k, s) for k in KINDS for s in SEEDS] + [(k, 0) for k in BIG_KINDS])
def test_faiss_backend_is_identical_to_numpy(kind, seed):
    case = make_big_case(kind, seed) if kind in BIG_KINDS else make_case(kind, seed)
    assert_same_ranking(rank_case(case, backend="faiss"), rank_case(case))
    assert case_summary(case, backend="faiss") == case_summary(case)
    assert retrieval_metrics(ks=KS, backend="faiss", **case) == retrieval_metrics(ks=KS, **case)


def test_faiss_backend_small_memory_bound():
    # one query per FAISS search block
    case = make_case("exclude_two_pairs", 0)
    assert case_summary(case, backend="faiss", max_memory_mb=1e-6) == case_summary(case)


def test_faiss_backend_matches_numpy(uneven_scored, uneven_scored_base):
    set_params(uneven_scored, {"score.backend": "faiss"})
    run_ok(uneven_scored, "score")
    assert read_metrics(uneven_scored) == read_metrics(uneven_scored_base)
    # the report page differs only where it names the backend
    assert read_bytes(uneven_scored, RANKING_OUTPUTS) == read_bytes(uneven_scored_base, RANKING_OUTPUTS)
    for rel in EVALUATED_OUTPUTS:  # these differ only where they name the backend
        text = (uneven_scored / rel).read_text()
        assert "backend faiss" in text and text.replace("backend faiss", "backend numpy") == \
            (uneven_scored_base / rel).read_text(), rel


def test_faiss_backend_keeps_its_loader_quiet(scored_project):
    set_params(scored_project, {"score.backend": "faiss"})
    proc = run_ok(scored_project, "score")
    assert "faiss" not in proc.stderr.lower(), proc.stderr
