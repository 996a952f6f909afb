"""Every way to rank, on every seeded case, against the brute-force oracle: one test per case.

The paths: the numpy engine's direct path and its tiles (both forced, ``Budget.DIRECT_CELLS``), for the
complete ranking, the first-positive pass, the capped recall pass and the top-L pass; a plain batch's first
positives straight from its arrays (float32 copies of the cases without ids or exclusions,
``direct.plain_first_ranks``); the torch backend (CPU torch, the GPU's code); and the FAISS oracle's complete
ranking (tests/faiss_oracle.py). Each is held to the oracle (every metric, the ranks, M_q, the opposite-rule first
rank), and every field of the direct and tiled rankings (and of a plain batch's) is identical. (Three matrices
once ran these cases apart: the direct path against the tiles, the top-L pass against the oracle, FAISS against
numpy.)
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
from recallk.score.ranking import Budget, Ranking, engine

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


def _assert_same_fields(a: Ranking, b: Ranking) -> None:
    """Every field of two rankings identical: values, types and dtypes."""
    for field in dataclasses.fields(Ranking):
        x, y = getattr(a, field.name), getattr(b, field.name)
        assert type(x) is type(y), field.name
        np.testing.assert_array_equal(x, y, err_msg=field.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, field.name


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
        _assert_same_fields(direct, tiles)
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


#: The first-positive passes a plain batch's route serves (recall and mrr; recall alone, capped).
FIRST_PASSES = ((["recall", "mrr"], None), (["recall"], 1), (["recall"], 5))


def _plain(case: dict) -> dict:
    """The case as a training loop's batch: float32 embeddings, integer labels, no ids and no exclusions."""
    return {**case, "query_emb": np.asarray(case["query_emb"], dtype=np.float32),
            "gallery_emb": np.asarray(case["gallery_emb"], dtype=np.float32), "query_ids": None, "gallery_ids": None,
            "exclude": ()}


@pytest.mark.filterwarnings("ignore::UserWarning")  # K above the gallery, same rows: warned, and tested elsewhere
@pytest.mark.parametrize("kind, seed", [c for c in CASES if c[0] != "string_labels"])
def test_the_plain_batch_route_matches_the_oracle(kind, seed, monkeypatch, caplog):
    # a plain batch's first positives straight from its arrays (direct.plain_first_ranks, no Problem) when the raw
    # product decides, else the Problem's route from the unit rows: every field of the Ranking that of the Problem's
    # route (direct.plain_data refused) and of the tiles, and the oracle's
    case = _plain(make_big_case(kind, seed) if kind in BIG_KINDS else make_case(kind, seed))
    expected, detail = case_oracle(case)
    first = np.array([r[0] if r else -1 for r in detail["ranks"]])
    taken = []
    for names, cap in FIRST_PASSES:
        ranks = None if cap is None else Pass.first(cap)
        plain = _forced(monkeypatch, caplog, "direct", lambda n=names, r=ranks: rank_case(case, n, ranks=r))
        taken.append("plain data" in ranking_logs(caplog)[0])
        with monkeypatch.context() as patch:
            patch.setattr(engine, "plain_data", lambda data: False)
            problem = _forced(monkeypatch, caplog, "direct", lambda n=names, r=ranks: rank_case(case, n, ranks=r))
        tiles = _forced(monkeypatch, caplog, "tiles", lambda n=names, r=ranks: rank_case(case, n, ranks=r))
        _assert_same_fields(plain, problem)
        _assert_same_fields(plain, tiles)
        np.testing.assert_array_equal(plain.first_rank, first if cap is None else np.minimum(first, cap))
        assert plain.n_retrievable.tolist() == detail["n_retrievable"]
        assert_matches_oracle(case_summary(case, metrics=names), expected)
    if kind in ("gaussian", "absent_labels"):  # no ties: the raw product decides every query
        assert all(taken)
    if kind in ("duplicates", "zero_rows"):  # exact ties, zero rows: the unit rows decide
        assert not any(taken)
