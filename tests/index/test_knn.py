"""The two k-NN recall definitions against the reference code of ann-benchmarks and big-ann-benchmarks,
ported below as published, on their own unit tests and on random cases with ties."""

from __future__ import annotations

import numpy as np
import pytest

from recallk.index.knn import ann_benchmarks_recall, big_ann_benchmarks_recall

# ---------------------------------------------------------------- the reference functions, ported verbatim
# ann-benchmarks, ann_benchmarks/plotting/metrics.py (github.com/erikbern/ann-benchmarks, knn_threshold and
# get_recall_values; distances, smaller is better).


def knn_threshold(data, count, epsilon):
    return data[count - 1] + epsilon


def ann_get_recall_values(dataset_distances, run_distances, count, threshold, epsilon=1e-3):
    recalls = np.zeros(len(run_distances))
    for i in range(len(run_distances)):
        t = threshold(dataset_distances[i], count, epsilon)
        actual = 0
        for d in run_distances[i][:count]:
            if d <= t:
                actual += 1
        recalls[i] = actual
    return (np.mean(recalls) / float(count), np.std(recalls) / float(count), recalls)


# big-ann-benchmarks, benchmark/plotting/metrics.py as merged (github.com/harsha-simhadri/big-ann-benchmarks,
# PR #74, commit 1f70e53d21eae85f53c07b9703bd3ccaeefc65a4; unchanged on main at
# 452e508b72e98f1be6e7bca1a6c98dbf1bc5e967; MIT licence): compute_recall_without_distance_ties,
# compute_recall_with_distance_ties and get_recall_values, verbatim but for the names and the layout.


def compute_recall_without_distance_ties(true_ids, run_ids, count):
    return len(set(true_ids) & set(run_ids))


def compute_recall_with_distance_ties(true_ids, true_dists, run_ids, count):
    # This function assumes "true_dists" is monotonic either increasing or decreasing
    found_tie = False
    gt_size = np.shape(true_dists)[0]
    if gt_size == count:
        # nothing fancy to do in this case
        recall = len(set(true_ids[:count]) & set(run_ids))
    else:
        dist_tie_check = true_dists[count - 1]  # tie check anchored at count-1 in GT dists
        set_end = gt_size
        for i in range(count, gt_size):
            is_close = abs(dist_tie_check - true_dists[i]) < 1e-6
            if not is_close:
                set_end = i
                break
        found_tie = set_end > count
        recall = len(set(true_ids[:set_end]) & set(run_ids))
    return recall, found_tie


def big_get_recall_values(true_nn, run_nn, count, count_ties=True):
    true_ids, true_dists = true_nn
    if not count_ties:
        true_ids = true_ids[:, :count]
        assert true_ids.shape == run_nn.shape
    recalls = np.zeros(len(run_nn))
    queries_with_ties = 0
    for i in range(len(run_nn)):
        if count_ties:
            recalls[i], found_tie = compute_recall_with_distance_ties(true_ids[i], true_dists[i], run_nn[i], count)
            if found_tie:
                queries_with_ties += 1
        else:
            recalls[i] = compute_recall_without_distance_ties(true_ids[i], run_nn[i], count)
    return (np.mean(recalls) / float(count), np.std(recalls) / float(count), recalls, queries_with_ties)


# ---------------------------------------------------------------- the tests


def as_scores(distances: list[float], width: int) -> np.ndarray:
    """Distances ``1 - cosine`` as one row of cosines, NaN-padded to ``width``."""
    row = np.full(width, np.nan)
    row[:len(distances)] = 1.0 - np.asarray(distances, dtype=np.float64)
    return row[None, :]


@pytest.mark.parametrize("run, expected", [
    ([], 0.0),             # nothing returned
    ([0.2, 0.3], 0.5),     # the second item beyond the 2nd exact distance 0.25 (+ 1e-3)
    ([0.2], 0.5),          # one item returned, within
    ([0.2, 0.25], 1.0),    # both within
])
def test_ann_benchmarks_own_fixture(run, expected) -> None:
    """ann-benchmarks' test/metrics_test.py::test_recall: exact distances [0.1, 0.25], count 2."""
    exact = [0.1, 0.25]
    assert ann_get_recall_values([exact], [run], 2, knn_threshold)[0] == pytest.approx(expected)
    assert ann_benchmarks_recall(as_scores(exact, 2), as_scores(run, 2), 2)[0] == pytest.approx(expected)


# big-ann-benchmarks' own unit tests, tests/recall_tests.py (same source and commits as above: the 15 cases of
# main_tests(), before its dataset tests), one row each: true_ids, true_dists, run_ids, count, the expected
# recall without ties and with ties, verbatim.
E = 1e-6 - 1e-7
BIG_ANN_CASES = [
    # no distance ties, 1 query and k=3
    ([[0, 1, 2]], [[0.0, 1.0, 2.0]], [[0, 1, 2]], 3, 1.0, 1.0),
    # no distance ties but not 1.0 recall, 1 query and k=3
    ([[0, 1, 2]], [[0.0, 1.0, 2.0]], [[0, 1, 3]], 3, 2.0 / 3.0, 2.0 / 3.0),
    # no ties, 2 queries and k=3
    ([[0, 1, 2], [2, 1, 0]], [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]], [[0, 1, 2], [2, 1, 0]], 3, 1.0, 1.0),
    # no distance ties, 1 query, k=3, GT array is larger than run array
    ([[0, 1, 2, 3]], [[0.0, 1.0, 2.0, 3.0]], [[0, 1, 2]], 3, 1.0, 1.0),
    # an out-of-bounds distance tie, 1 query, k=3, GT array is larger than run array
    ([[0, 1, 2, 3]], [[0.0, 1.0, 2.0, 2.0]], [[0, 1, 2]], 3, 1.0, 1.0),
    # from bigann-1B: GT size 11, run 10, no ties to consider
    ([[937541801, 221456167, 336118969, 971823307, 267986685, 544978851, 815975675, 615142927, 640142873, 994367459,
       504814]],
     [[55214., 58224., 58379., 58806., 59251., 59256., 60302., 60573., 60843., 60950., 61125.]],
     [[221456167, 336118969, 971823307, 640142873, 994367459, 504814, 87356234, 628179290, 928121617, 397551598]],
     10, 0.5, 0.5),
    # ties at beginning, 2 queries and k=3
    ([[0, 1, 2, 3], [3, 2, 1, 0]], [[0.0, 0.0, 1.0, 2.0], [0.0, 0.0, 1.0, 2.0]], [[0, 1, 3], [3, 2, 0]], 3,
     np.mean([2.0, 2.0]) / 3, np.mean([2.0, 2.0]) / 3),
    # ties at beginning and ties have small diff, 2 queries and k=3
    ([[0, 1, 2, 3], [3, 2, 1, 0]], [[0.0, 0.0 + E, 1.0, 2.0], [0.0, 0.0 + E, 1.0, 2.0]], [[0, 1, 3], [3, 2, 0]], 3,
     np.mean([2.0, 2.0]) / 3, np.mean([2.0, 2.0]) / 3),
    # possible ties at beginning but diff is just beyond the 1e-6 threshold, 2 queries and k=3
    ([[0, 1, 2, 3], [3, 2, 1, 0]], [[0.0, 0.0 + 1e-6, 1.0, 2.0], [0.0, 0.0 + 1e-6, 1.0, 2.0]], [[0, 1, 3], [3, 2, 0]],
     3, np.mean([2.0, 2.0]) / 3, np.mean([2.0, 2.0]) / 3),
    # ties in middle, 2 queries and k=3
    ([[0, 1, 2, 3], [3, 2, 1, 0]], [[0.0, 1.0, 1.0, 2.0], [0.0, 1.0, 1.0, 2.0]], [[0, 1, 3], [3, 2, 0]], 3,
     np.mean([2.0, 2.0]) / 3, np.mean([2.0, 2.0]) / 3),
    # ties at count-1 and 1 tie after, 2 queries and k=3
    ([[0, 1, 2, 3], [3, 2, 1, 0]], [[0.0, 1.0, 2.0, 2.0], [0.0, 1.0, 2.0, 2.0]], [[0, 1, 3], [3, 2, 0]], 3,
     np.mean([2.0, 2.0]) / 3.0, np.mean([3.0, 3.0]) / 3.0),
    # ties at count-1 and 1 tie after and 1 after that that is close (as published: the same arrays), k=3
    ([[0, 1, 2, 3], [3, 2, 1, 0]], [[0.0, 1.0, 2.0, 2.0], [0.0, 1.0, 2.0, 2.0]], [[0, 1, 3], [3, 2, 0]], 3,
     np.mean([2.0, 2.0]) / 3.0, np.mean([3.0, 3.0]) / 3.0),
    # ties at count-1 and several close ties after, 2 queries and k=3
    ([[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0]],
     [[0.0, 1.0, 2.0, 2.0, 2.0 + E, 2.0 + 1e-6], [0.0, 1.0, 2.0, 2.0, 2.0 + E, 2.0 + 1e-6]],
     [[0, 1, 4], [5, 4, 0]], 3, np.mean([2.0, 2.0]) / 3, np.mean([3.0, 2.0]) / 3.0),
    # two independent tie groups, 2 queries and k=3
    ([[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0]], [[0.0, 0.0, 2.0, 3.0, 3.0, 4.0], [0.0, 0.0, 2.0, 3.0, 3.0, 4.0]],
     [[0, 1, 5], [5, 4, 1]], 3, np.mean([2.0, 2.0]) / 3.0, np.mean([2.0, 2.0]) / 3.0),
    # two independent tie groups, 2 queries and k=4
    ([[0, 1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1, 0]],
     [[0.0, 0.0, 2.0, 3.0, 3.0, 4.0, 5.0], [0.0, 0.0, 2.0, 3.0, 3.0, 4.0, 5.0]],
     [[0, 1, 5, 7], [5, 4, 1, 7]], 4, np.mean([2.0, 2.0]) / 4.0, np.mean([2.0, 2.0]) / 4.0),
]


@pytest.mark.parametrize("true_ids, true_dists, run_ids, count, no_ties, with_ties", BIG_ANN_CASES)
def test_big_ann_benchmarks_own_unit_tests(true_ids, true_dists, run_ids, count, no_ties, with_ties) -> None:
    """Each case of big-ann-benchmarks' tests/recall_tests.py: the ported reference gives its expected values
    (as its test_recall asserts, ``==``), and so does big_ann_benchmarks_recall (the mean over queries)."""
    true_nn = (np.array(true_ids), np.array(true_dists))
    assert big_get_recall_values(true_nn, np.array(run_ids), count, False)[0] == no_ties
    assert big_get_recall_values(true_nn, np.array(run_ids), count, True)[0] == with_ties
    ours, tied = big_ann_benchmarks_recall(*true_nn, np.array(run_ids), count)
    assert ours.mean() == pytest.approx(with_ties, rel=1e-15)
    assert tied == big_get_recall_values(true_nn, np.array(run_ids), count, True)[3]


def tied_case(rng: np.random.Generator, n: int, depth: int, levels: int) -> tuple[np.ndarray, ...]:
    """Exact neighbours with many ties (distances on a coarse grid, some 1e-7 apart) and a noisy run."""
    dists = np.sort(rng.integers(0, levels, size=(n, depth)) / levels + rng.choice([0, 1e-7], size=(n, depth)),
                    axis=1)
    ids = np.array([rng.permutation(3 * depth)[:depth] for _ in range(n)])
    run_ids = np.array([rng.permutation(3 * depth)[:depth] for _ in range(n)])
    swap = rng.random((n, depth)) < 0.5  # half the run's ids are exact ones, shuffled
    run_ids = np.where(swap, ids[np.arange(n)[:, None], rng.permutation(depth)], run_ids)
    run_dists = np.sort(dists + rng.choice([0, 0.0005, 0.01], size=(n, depth)), axis=1)
    return dists, ids, run_ids, run_dists


@pytest.mark.parametrize("levels, k", [
    (4, 5),    # very coarse distances: big tie groups spanning the k-th
    (20, 7),   # some ties, a few running past the k-th
    (20, 10),  # k = the depth of the exact table: nothing past it to extend to
    (1000, 3),  # almost no ties beyond the 1e-7 pairs
])
def test_both_definitions_match_the_references_on_random_ties(levels, k) -> None:
    rng = np.random.default_rng(levels)
    dists, ids, run_ids, run_dists = tied_case(rng, 60, 10, levels)
    ann = ann_benchmarks_recall(1.0 - dists, 1.0 - run_dists, k)
    ref = ann_get_recall_values(dists, run_dists, k, knn_threshold)[2] / k
    np.testing.assert_allclose(ann, ref, rtol=0, atol=1e-12)
    big, tied = big_ann_benchmarks_recall(ids, dists, run_ids, k)
    _, _, ref_counts, ref_tied = big_get_recall_values((ids, dists), run_ids[:, :k], k)
    np.testing.assert_array_equal(big, ref_counts / k)
    assert tied == ref_tied
    assert ref_tied > 0 or levels == 1000 or k == 10  # the coarse cases do exercise ties past the k-th


def test_tie_group_beyond_k_counts_as_a_true_neighbour() -> None:
    """An item tied with the k-th exact one, past position k, is a true neighbour for big-ann-benchmarks (the
    exact ids run on while a distance is within 1e-6 of the k-th) and for ann-benchmarks (within 1e-3)."""
    dists = np.array([[0.1, 0.2, 0.2, 0.5]])
    ids = np.array([[7, 8, 9, 3]])
    run_ids, run_dists = np.array([[7, 9]]), np.array([[0.1, 0.2]])  # 9 is tied with the 2nd exact item, 8
    assert big_ann_benchmarks_recall(ids, dists, run_ids, 2)[0][0] == 1.0
    assert ann_benchmarks_recall(1 - dists, 1 - run_dists, 2)[0] == 1.0
    run_ids = np.array([[7, 3]])  # 3 is beyond the tie group: not a true neighbour under either
    assert big_ann_benchmarks_recall(ids, dists, run_ids, 2)[0][0] == 0.5
    assert ann_benchmarks_recall(1 - dists, as_scores([0.1, 0.5], 2), 2)[0] == 0.5
