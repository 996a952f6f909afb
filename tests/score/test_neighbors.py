"""recallk.score.ranking.neighbors.top_k against brute force: exact scores, the tie rule, self-match, exclusions."""

from __future__ import annotations

import numpy as np
import pytest

from recallk.errors import InputError
from recallk.score.metrics import first_positive_ranks
from recallk.score.ranking.neighbors import top_k
from recallk.score.retrieval_data import RetrievalData
from recallk.score.similarity import cosine_block, l2_normalize


def _data(q, g, q_ids=None, g_ids=None, exclude=()):
    """The retrieval data of ``q`` against ``g`` (labels play no part in the top k)."""
    return RetrievalData(q, g, np.zeros(len(q)), np.zeros(len(g)), query_ids=q_ids, gallery_ids=g_ids, exclude=exclude)


def brute_force(q, g, k, q_ids=None, g_ids=None, exclude=()):
    sims = cosine_block(l2_normalize(q), l2_normalize(g).T)
    cols, scores = [], []
    for i in range(len(q)):
        allowed = np.ones(len(g), dtype=bool)
        if q_ids is not None:
            allowed &= np.asarray([str(x) != str(q_ids[i]) for x in g_ids])
        for qv, gv in exclude:
            if qv[i] not in (None, ""):
                allowed &= np.asarray([w != qv[i] for w in gv])
        idx = np.flatnonzero(allowed)
        order = idx[np.lexsort((idx, -sims[i, idx]))][:k]
        cols.append(np.r_[order, np.full(k - order.size, -1)][:min(k, len(g))])
        scores.append(np.r_[sims[i, order], np.full(k - order.size, np.nan)][:min(k, len(g))])
    return np.array(cols), np.array(scores, dtype=np.float32)


@pytest.mark.parametrize("kind", ["random", "ties", "duplicates"])
@pytest.mark.parametrize("k", [1, 5, 40])  # 40: more than the gallery holds
def test_top_k_is_the_exact_ranking(kind, k):
    rng = np.random.default_rng(k)
    if kind == "random":
        q, g = rng.normal(size=(17, 8)), rng.normal(size=(30, 8))
    elif kind == "ties":  # few distinct directions: many exact ties, broken by gallery index
        q, g = rng.integers(-1, 2, size=(17, 3)).astype(float), rng.integers(-1, 2, size=(30, 3)).astype(float)
    else:  # the queries are gallery items: each query's own image is excluded by id
        g = rng.normal(size=(30, 8))
        q = g[:17].copy()
    ids = (None, None) if kind != "duplicates" else ([f"x{i}" for i in range(17)], [f"x{i}" for i in range(30)])
    cols, scores = top_k(_data(q, g, *ids), k, max_memory_mb=1e-3)  # tiny budget: one query per block
    want_cols, want_scores = brute_force(q, g, k, *ids)
    np.testing.assert_array_equal(cols, want_cols)
    np.testing.assert_array_equal(scores, want_scores)


def test_exclusion_columns_and_missing_values():
    rng = np.random.default_rng(0)
    q, g = rng.normal(size=(6, 4)), rng.normal(size=(9, 4))
    qc = np.array(["x", None, "", "y", "x", "z"], dtype=object)
    gc = np.array(["x", None, "", "y", "x", "z", "", None, "y"], dtype=object)
    cols, _ = top_k(_data(q, g, exclude=[(qc, gc)]), 9)
    want, _ = brute_force(q, g, 9, exclude=[(qc, gc)])
    np.testing.assert_array_equal(cols, want)
    assert (cols[0] == -1).sum() == 2  # query 0 (camera x) may retrieve 7 of the 9


def test_first_positive_in_the_top_k_is_the_engines_first_rank():
    rng = np.random.default_rng(5)
    g = rng.integers(-2, 3, size=(60, 4)).astype(float)  # ties galore
    labels = rng.integers(0, 4, size=60)
    ids = [f"i{j}" for j in range(60)]
    cols, _ = top_k(_data(g, g, ids, ids), 60)
    first, n_pos = first_positive_ranks(g, g, labels, labels, query_ids=ids, gallery_ids=ids)
    for i in range(60):
        hits = np.flatnonzero(labels[cols[i][cols[i] >= 0]] == labels[i])
        assert (hits[0] if hits.size else -1) == first[i]


@pytest.mark.parametrize("k, message", [(0, "`k` must be a positive integer"), (2.5, "`k` must be a positive integer")])
def test_bad_k(k, message):
    with pytest.raises(InputError, match=message):
        top_k(_data(np.eye(2), np.eye(2), [0, 1], [0, 1]), k)
