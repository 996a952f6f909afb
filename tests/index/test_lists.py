"""An index's answers as ranked lists under the exact engine's rules, and the label metrics of those lists
against a brute-force recomputation (ties included)."""

from __future__ import annotations

import numpy as np
import pytest

from recallk.index.lists import exclusion_bound, label_values, ranked_lists, short_lists, undetermined
from recallk.score.registry import metric_keys

METRICS = ("recall", "precision", "r_precision", "map@r", "map", "mrr")
KS = (1, 3, 5)


def brute_force(lists: list[list[int]], q_label: list[int], g_label: np.ndarray, R: list[int],
                M: list[int]) -> dict[str, list[float]]:
    """Each metric from its textbook definition, one query at a time (a positive not listed: not retrieved)."""
    out: dict[str, list[float]] = {key: [] for key in metric_keys(METRICS, KS)}
    for items, label, r, m in zip(lists, q_label, R, M):
        pos = [i + 1 for i, g in enumerate(items) if g_label[g] == label]  # 1-based places of listed positives
        if r == 0:
            for key in out:
                out[key].append(np.nan)
            continue
        for k in KS:
            out[f"recall@{k}"].append(float(any(p <= k for p in pos)))
            out[f"precision@{k}"].append(sum(p <= k for p in pos) / min(k, m))
        out["r_precision"].append(sum(p <= r for p in pos) / r)
        out["map@r"].append(sum((j + 1) / p for j, p in enumerate(pos) if p <= r) / r)
        out["map"].append(sum((j + 1) / p for j, p in enumerate(pos)) / r)
        out["mrr"].append(1.0 / pos[0] if pos else 0.0)
    return out


@pytest.mark.parametrize("seed, depth", [
    (0, 4),    # lists shorter than most R: truncated r_precision / map@r / map
    (1, 12),   # lists as deep as the gallery
    (2, 7),    # in between, with queries without any positive (R = 0: NaN)
])
def test_label_values_equal_a_brute_force_recomputation(seed, depth) -> None:
    rng = np.random.default_rng(seed)
    m, n = 12, 30
    g_label = rng.integers(0, 3, m)
    q_label = rng.integers(0, 4, n)  # label 3 has no gallery item: R = 0
    # scores on a coarse grid: many exact ties, broken by gallery row
    scores = rng.integers(0, 4, (n, m)).astype(np.float32)
    ids = np.tile(np.arange(m), (n, 1))
    own = np.full(n, -1)
    columns, _ = ranked_lists(ids, scores, own, [], depth)
    lists = [[int(g) for g in row if g >= 0] for row in columns]
    for row, s, listed in zip(ids, scores, lists):  # the tie rule: -score, then gallery row
        assert listed == sorted(row.tolist(), key=lambda g, s=s: (-s[g], g))[:depth]
    R = [int(np.count_nonzero(g_label == label)) for label in q_label]
    M = [m] * n
    got = label_values(columns, q_label, g_label, np.array(R), np.array(M), METRICS, KS)
    want = brute_force(lists, q_label.tolist(), g_label, R, M)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-15, atol=0, equal_nan=True, err_msg=key)


def test_ranked_lists_drop_what_exact_never_retrieves() -> None:
    """The query's own row, rows sharing an exclusion value and the -1 padding are dropped; the rest keep
    their order; a list that comes up short is padded and counted."""
    ids = np.array([[5, 2, 7, -1, 1], [3, 0, 4, 6, -1]])
    scores = np.array([[0.9, 0.8, 0.8, np.nan, 0.1], [0.5, 0.5, 0.4, 0.3, np.nan]], dtype=np.float32)
    own = np.array([5, -1])  # query 0 is gallery row 5
    camera_q, camera_g = np.array([0, -1]), np.array([1, 0, 0, 1, 1, 1, 1, 0])  # query 0's camera: rows 1, 2, 7
    columns, kept = ranked_lists(ids, scores, own, [(camera_q, camera_g)], 3)
    assert columns.tolist() == [[-1, -1, -1], [0, 3, 4]]  # query 1: missing camera never matches; tie 0 < 3
    assert np.isnan(kept[0]).all() and kept[1].tolist() == pytest.approx([0.5, 0.5, 0.4])
    assert short_lists(columns, np.array([4, 7])) == 1
    assert exclusion_bound(own, [(camera_q, camera_g)]).tolist() == [1 + 3, 0]


@pytest.mark.parametrize("seed, depth, exhausted", [
    (3, 3, False),   # shallow lists: most metrics open for some query
    (4, 6, False),   # in between
    (5, 12, False),  # lists as deep as the gallery: every list complete, everything reported
    (6, 3, True),    # shallow, but the index had nothing more to return: complete, everything reported
])
def test_a_metric_is_unreported_exactly_when_a_deeper_list_could_change_it(seed, depth, exhausted) -> None:
    """Every metric key undetermined leaves reported has, from the lists cut at ``depth``, the value the same index's
    full lists give; and a shallow cut leaves some key unreported."""
    rng = np.random.default_rng(seed)
    m, n = 12, 40
    g_label, q_label = rng.integers(0, 3, m), rng.integers(0, 3, n)
    ids = np.array([rng.permutation(m) for _ in range(n)])
    scores = np.tile(np.arange(m, 0, -1, dtype=np.float32), (n, 1))  # the index's order as given
    own = np.full(n, -1)
    R = np.array([np.count_nonzero(g_label == label) for label in q_label])
    M = np.full(n, m)
    cut, _ = ranked_lists(ids, scores, own, [], depth)
    unreported = undetermined(cut, q_label, g_label, R, M, np.full(n, exhausted), METRICS, KS)
    keys = metric_keys(METRICS, KS)
    if exhausted:  # the index returned only these: its lists are complete as they are
        assert unreported == []
        return
    at_cut = label_values(cut, q_label, g_label, R, M, METRICS, KS)
    full = label_values(ranked_lists(ids, scores, own, [], m)[0], q_label, g_label, R, M, METRICS, KS)
    for key in keys:
        same = np.allclose(at_cut[key], full[key], rtol=0, atol=1e-15, equal_nan=True)
        assert same or key in unreported, key  # a value a deeper list changes is never reported
    assert (depth >= m) == (unreported == [])
