"""The banded Hamming search of near-duplicate pHashes against brute force, and pHash on real images
(the leakage checks without DVC; the split policies are in test_leakage.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from leakage_helpers import near_copy, run_prepare, smooth, write_planted_images
from recallk.data import phash


def random_codes(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)
    planted = n // 5  # near pairs at 1..12 bits, and exact repeats
    for k in range(planted):
        bits = rng.choice(64, size=int(rng.integers(1, 13)), replace=False)
        codes[n - 1 - k] = codes[k] ^ np.uint64(sum(1 << int(b) for b in bits))
    if n >= 100:
        codes[planted:planted + 10] = codes[planted + 10:planted + 20]
    return codes


# ---------------------------------------------------------------------------------------- banded search


@pytest.mark.parametrize("n, seed", [(0, 0), (1, 0), (2, 1), (300, 2), (3000, 3)])
@pytest.mark.parametrize("max_distance", [0, 1, 3, 8, 10, 12, 16])
def test_banded_search_equals_brute_force(n, seed, max_distance):
    codes = random_codes(n, seed)
    got = phash.near_pairs(codes, max_distance)
    want = phash.near_pairs_brute(codes, max_distance)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert (got[0] < got[1]).all() and (got[2] <= max_distance).all()


@pytest.mark.parametrize("max_distance", [2, 5, 9])
def test_every_band_count_finds_the_same_pairs(max_distance):
    """Any number of bands is correct (the plan only picks the fastest)."""
    codes = random_codes(800, 7)
    want = phash.near_pairs_brute(codes, max_distance)
    for bands in range(1, max_distance + 2):
        if phash._ball(64 // bands + 1, -(-(max_distance // bands) // 2)) > 5000:
            continue  # a valid plan, but too many keys per hash to enter: plan() never picks it
        got = phash.near_pairs(codes, max_distance, bands=bands)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_many_equal_hashes_pair_with_each_other_and_their_neighbours():
    codes = np.array([5] * 40 + [5 ^ 0b11] * 3 + [2**63], dtype=np.uint64)
    i, j, d = phash.near_pairs(codes, 2)
    assert len(i) == 43 * 42 // 2 and set(d.tolist()) == {0, 2}
    assert 43 not in set(i.tolist()) | set(j.tolist())


def test_plan_stays_sub_quadratic():
    """At 100,000 hashes the plan's bands keep the expected candidates far below n^2/2."""
    n = 100_000
    for d in (4, 8, 10):
        m = phash.plan(n, d)
        radius = -(-(d // m) // 2)
        entries = [n * phash._ball(w, radius) for _, w in phash._bands(m)]
        candidates = sum(e * e / 2 / 2.0 ** w for e, (_, w) in zip(entries, phash._bands(m)))
        assert candidates < n * n / 2 / 20


def test_popcount_fallback_matches():
    x = random_codes(1000, 4)
    table = phash._POP8[x.view(np.uint8).reshape(-1, 8)].sum(axis=1)
    np.testing.assert_array_equal(phash.popcount(x), table)


def test_clusters_are_connected_components():
    labels = phash.clusters(6, np.array([0, 1, 4]), np.array([1, 2, 5]))
    assert labels[0] == labels[1] == labels[2] and labels[4] == labels[5]
    assert len({labels[0], labels[3], labels[4]}) == 3


# ---------------------------------------------------------------------------------------- pHash


def test_phash_is_16_hex_and_close_for_a_near_copy():
    a, b = smooth(1), smooth(2)
    ha, hb, hc = phash.phash(a), phash.phash(b), phash.phash(near_copy(a))
    assert len(ha) == 16 and int(ha, 16) >= 0 and ha == phash.phash(smooth(1))
    dist = lambda x, y: bin(int(x, 16) ^ int(y, 16)).count("1")  # noqa: E731
    assert dist(ha, hc) <= 6 < 10 < dist(ha, hb)


def test_catalog_has_phash_and_it_ignores_split_params(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_planted_images(tmp_path / "data", {"a": [1, 2, 3, 4], "b": [5, 6, 7, 8]})
    first = run_prepare(Path("data"))
    other = run_prepare(Path("data"), seed=3, near_duplicates={"policy": "group", "max_distance": 4})
    assert first.catalog["phash"].str.fullmatch(r"[0-9a-f]{16}").all()
    pd.testing.assert_frame_equal(first.catalog, other.catalog)
