"""The two k-NN recall definitions against the reference code of ann-benchmarks and big-ann-benchmarks,
ported below as published, on their own fixture and on random cases with ties."""

from __future__ import annotations

import itertools

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


# big-ann-benchmarks, benchmark/plotting/metrics.py (github.com/harsha-simhadri/big-ann-benchmarks,
# compute_recall_with_distance_ties and get_recall_values with count_ties=True).


def compute_recall_with_distance_ties(true_ids, true_dists, run_ids, count):
    new_dists = np.empty(true_dists.shape[0])
    dup_candidate = true_dists[0]
    new_dists[0] = dup_candidate
    for i in range(1, true_dists.shape[0]):
        if abs(true_dists[i] - dup_candidate) < 1e-6:
            new_dists[i] = dup_candidate
        else:
            new_dists[i] = true_dists[i]
            dup_candidate = true_dists[i]
    grouping_all = [(a, list(b)) for a, b in itertools.groupby(new_dists)]
    grouping_count = grouping_all[0:count]
    new_true_ids = np.empty(0)
    found_tie = False
    for group in grouping_count:
        if len(group[1]) > 1:
            found_tie = True
        add_ids = true_ids[len(new_true_ids): len(new_true_ids) + len(group[1])]
        new_true_ids = np.append(new_true_ids, add_ids)
    recall = len(set(new_true_ids) & set(run_ids))
    return recall, found_tie


def big_get_recall_values(true_nn, run_nn, count):
    true_ids, true_dists = true_nn
    recalls = np.zeros(len(run_nn))
    queries_with_ties = 0
    for i in range(len(run_nn)):
        recalls[i], found_tie = compute_recall_with_distance_ties(true_ids[i], true_dists[i], run_nn[i], count)
        if found_tie:
            queries_with_ties += 1
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
    (20, 10),  # some ties, k = the depth of the exact table
    (1000, 3),  # almost no ties beyond the 1e-7 pairs
])
def test_both_definitions_match_the_references_on_random_ties(levels, k) -> None:
    rng = np.random.default_rng(levels)
    dists, ids, run_ids, run_dists = tied_case(rng, 60, 10, levels)
    ann = ann_benchmarks_recall(1.0 - dists, 1.0 - run_dists, k)
    ref = ann_get_recall_values(dists, run_dists, k, knn_threshold)[2] / k
    np.testing.assert_allclose(ann, ref, rtol=0, atol=1e-12)
    big, tied = big_ann_benchmarks_recall(ids, 1.0 - dists, run_ids, k)
    _, _, ref_counts, ref_tied = big_get_recall_values((ids, dists), run_ids[:, :k], k)
    np.testing.assert_array_equal(big, ref_counts / k)
    assert tied == ref_tied
    assert ref_tied > 0 or levels == 1000  # the coarse cases do exercise ties


def test_tie_group_beyond_k_counts_as_a_true_neighbour() -> None:
    """The two definitions differ where they should: an item tied with the k-th exact one is a true neighbour
    for big-ann-benchmarks (id set of the tie group) and for ann-benchmarks (within the tolerance)."""
    dists = np.array([[0.1, 0.2, 0.2, 0.5]])
    ids = np.array([[7, 8, 9, 3]])
    run_ids, run_dists = np.array([[7, 9]]), np.array([[0.1, 0.2]])  # 9 is tied with the 2nd exact item, 8
    assert big_ann_benchmarks_recall(ids, 1 - dists, run_ids, 2)[0][0] == 1.0
    assert ann_benchmarks_recall(1 - dists, 1 - run_dists, 2)[0] == 1.0
    run_ids = np.array([[7, 3]])  # 3 is beyond the tie group: not a true neighbour under either
    assert big_ann_benchmarks_recall(ids, 1 - dists, run_ids, 2)[0][0] == 0.5
    assert ann_benchmarks_recall(1 - dists, as_scores([0.1, 0.5], 2), 2)[0] == 0.5
