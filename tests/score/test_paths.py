"""Every way to rank, on every seeded case, against the brute-force oracle: one test per case.

The paths: the numpy engine's direct path and its tiles (both forced, ``Budget.DIRECT_CELLS``), for the
complete ranking, the first-positive pass, the capped recall pass and the top-L pass; the torch backend (CPU
torch, the GPU's code); and the FAISS oracle's complete ranking (tests/faiss_oracle.py). Each is held to the
oracle (every metric, the ranks, M_q, the opposite-rule first rank), and every field of the direct and tiled
rankings is identical. (Three matrices once ran these cases apart: the direct path against the tiles, the top-L
pass against the oracle, FAISS against numpy.)
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from extras import has_extra
from ranking_cases import (
    ALL_KEYS,
    BIG_KINDS,
    KINDS,
    KS,
    SEEDS,
    assert_matches_oracle,
    assert_same_ranking,
    case_oracle,
    case_summary,
    make_big_case,
    make_case,
    rank_case,
    ranking_logs,
    ranks_per_query,
)
from recallk.score.metrics import METRICS, metric_keys, retrieval_metrics
from recallk.score.passes import Pass
from recallk.score.ranking import Budget, Ranking

#: Every seeded case, and the big ones (large enough that the smallest memory bound splits every path).
CASES = [(k, s) for k in KINDS for s in SEEDS] + [(k, 0) for k in BIG_KINDS]
#: The metrics the top-L pass serves (no full map).
TOP_METRICS = ["recall", "precision", "r_precision", "map@r", "mrr"]
#: (metrics, cap) of the passes the direct path and the tiles must agree on.
PASSES = ((METRICS, None), (["recall", "mrr"], None), (["recall"], 1), (["recall"], 5))


def _forced(monkeypatch, caplog, path: str, fn):
    """``fn()`` with the direct path (``direct``) or the tiles (``tiles``) forced; the engine's log says which."""
    with monkeypatch.context() as patch, caplog.at_level(logging.DEBUG, logger="recallk.score.ranking.engine"):
        patch.setattr(Budget, "DIRECT_CELLS", 2**40 if path == "direct" else 0)
        caplog.clear()
        out = fn()
        assert ("direct path" in ranking_logs(caplog)[0]) is (path == "direct")
    return out


@pytest.mark.filterwarnings("ignore::UserWarning")  # K above the gallery, same rows: warned, and tested elsewhere
@pytest.mark.parametrize("kind, seed", CASES)
def test_every_path_matches_the_oracle(kind, seed, monkeypatch, caplog):
    case = make_big_case(kind, seed) if kind in BIG_KINDS else make_case(kind, seed)
    expected, detail = case_oracle(case)
    first = np.array([r[0] if r else -1 for r in detail["ranks"]])
    opposite = np.array(detail["opposite"])

    # 1. the complete ranking (the default route): every metric, the ranks, M_q, the opposite-rule first rank
    got = case_summary(case)
    assert list(got) == ALL_KEYS + ["num_queries", "num_excluded_queries"] + [f"tie_sensitive@{k}" for k in KS] \
        + ["num_gallery", "embedding_dim"]
    assert_matches_oracle(got, expected)
    assert (got["num_gallery"], got["embedding_dim"]) == np.asarray(case["gallery_emb"]).shape
    assert retrieval_metrics(ks=KS, **case) == {key: got[key] for key in ALL_KEYS}  # the keys, in report order
    full = rank_case(case)
    assert full.complete and ranks_per_query(full) == detail["ranks"]
    assert full.n_retrievable.tolist() == detail["n_retrievable"]
    assert full.first_rank_opposite.tolist() == detail["opposite"] and full.first_rank.tolist() == first.tolist()

    # 2. the first-positive pass (recall and mrr), uncapped and capped (recall alone: ranks of cap or more read cap)
    assert_matches_oracle(case_summary(case, metrics=["recall", "mrr"]), expected)
    assert_matches_oracle(case_summary(case, metrics=["recall"]), expected)
    firsts = rank_case(case, metrics=["recall", "mrr"])
    assert not firsts.complete and firsts.n_positives.tolist() == [len(r) for r in detail["ranks"]]
    for cap in (1, 2, 5):
        capped = rank_case(case, metrics=["recall"], ranks=Pass.first(cap))
        assert capped.cap == cap
        np.testing.assert_array_equal(capped.first_rank, np.minimum(first, cap))
        np.testing.assert_array_equal(capped.first_rank_opposite, np.minimum(opposite, cap))

    # 3. the direct path and the tiles, forced: every field of the Ranking identical, and the oracle's
    for names, cap in PASSES:
        ranks = None if cap is None else Pass.first(cap)
        direct, tiles = (_forced(monkeypatch, caplog, path, lambda n=names, r=ranks: rank_case(case, n, ranks=r))
                         for path in ("direct", "tiles"))
        for field in dataclasses.fields(Ranking):
            a, b = getattr(direct, field.name), getattr(tiles, field.name)
            assert type(a) is type(b), field.name
            np.testing.assert_array_equal(a, b, err_msg=field.name)
            if isinstance(a, np.ndarray):
                assert a.dtype == b.dtype, field.name
        np.testing.assert_array_equal(direct.first_rank, first if cap is None else np.minimum(first, cap))
        assert direct.n_retrievable.tolist() == detail["n_retrievable"]
        if direct.complete:
            assert ranks_per_query(direct) == detail["ranks"]

    # 4. the top-L pass on the tiles (every depth served): the metrics it serves, the ranks within each query's L
    with monkeypatch.context() as patch:
        patch.setattr(Budget, "DIRECT_CELLS", 0)
        patch.setattr(Budget, "TOP_DEPTH_SHARE", 1.0)
        top_summary = case_summary(case, metrics=TOP_METRICS)
        top = rank_case(case, TOP_METRICS, ranks=Pass.top(max(KS)))
    assert list(top_summary)[:len(metric_keys(TOP_METRICS, KS))] == metric_keys(TOP_METRICS, KS)
    assert_matches_oracle(top_summary, expected)
    assert top.complete and top.cap is None
    for i, every in enumerate(detail["ranks"]):
        assert top.ranks[top.offsets[i]:top.offsets[i + 1]].tolist() == [r for r in every if r < top.depth[i]]
    assert top.first_rank.tolist() == first.tolist() and top.first_rank_opposite.tolist() == detail["opposite"]

    # 5. the torch backend (CPU torch runs the GPU's code) and 6. the FAISS oracle: the complete ranking's numbers
    others = (["torch"] if has_extra("torch") else []) + (["faiss"] if has_extra("faiss") else [])
    for backend in others:
        fields = {"backend": backend, **({"device": "cpu"} if backend == "torch" else {})}
        assert_same_ranking(rank_case(case, **fields), full)
        assert case_summary(case, **fields) == got, backend


def test_the_faiss_oracle_at_the_smallest_memory_bound():
    # one query per FAISS search block
    case = make_case("exclude_two_pairs", 0)
    assert case_summary(case, backend="faiss", max_memory_mb=1e-6) == case_summary(case)
