"""Near-duplicate images: a 64-bit perceptual hash per image, and every pair within a Hamming distance.

* :func:`phash`: imagehash's pHash (``hash_size=8``: the 32x32 grey image's 2-D DCT, its 8x8
  lowest frequencies against their median), as 16 hex characters. A function of the pixels only,
  so the catalog column it fills never depends on split params.
* :func:`near_pairs`: every pair of hashes within ``max_distance`` bits, without an all-pairs loop.
  Multi-index hashing: the 64 bits are cut into ``m`` bands; two hashes within ``d`` bits differ in
  at most ``floor(d / m)`` bits of some band (pigeonhole). Each hash is entered once per band under
  every key within ``ceil(floor(d / m) / 2)`` bits of its band value, so two hashes whose band values
  are within ``floor(d / m)`` bits meet under a common key; only those candidates are compared in
  full (a popcount). ``m`` is chosen per call to minimise the expected work for ``n`` hashes.
* :func:`clusters`: the connected components of the pairs (union-find, for ``policy: group``).
* :func:`pair_table` / :func:`counts`: the report (``id_a, id_b, label_a, label_b, split_a, split_b,
  distance``) and its four counts; :func:`warned`: the pairs worth a warning (same-label query-gallery
  pairs are positives, counted apart).
"""

from __future__ import annotations

import itertools
import math
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
from PIL import Image

HASH_BITS = 64
#: What the ``phash`` column holds; bump it (and re-run split) if :func:`phash` could change its values.
#: Pairs compared per chunk of candidates (about 40 bytes each).
_CHUNK = 1 << 22
PAIR_COLUMNS = ["id_a", "id_b", "label_a", "label_b", "split_a", "split_b", "distance"]


def phash(image: Image.Image) -> str:
    """The 64-bit pHash of ``image`` as 16 lowercase hex characters."""
    import imagehash  # a core dependency, imported when first needed (it loads scipy and PyWavelets)

    return f"{int(str(imagehash.phash(image, hash_size=8)), 16):016x}"


def to_codes(hexes: Sequence[str]) -> np.ndarray:
    """16-hex-character hashes -> uint64 codes."""
    return np.array([int(h, 16) for h in hexes], dtype=np.uint64)


_POP8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64 (numpy >= 2 has a kernel; older ones sum a byte table)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x).astype(np.int64)
    return _POP8[np.ascontiguousarray(x, dtype=np.uint64).view(np.uint8).reshape(-1, 8)].sum(axis=1).astype(np.int64)


def _bands(m: int) -> list[tuple[int, int]]:
    """``(shift, width)`` of ``m`` bands covering 64 bits, widths differing by at most one."""
    widths = [HASH_BITS // m + (i < HASH_BITS % m) for i in range(m)]
    shifts = np.cumsum([0] + widths[:-1])
    return [(int(s), w) for s, w in zip(shifts, widths)]


def _ball(width: int, radius: int) -> int:
    return sum(math.comb(width, w) for w in range(radius + 1))


#: Measured cost of one band entry (sorted) against one candidate pair (compared): about 10 to 1.
_ENTRY_COST = 10


def plan(n: int, max_distance: int) -> int:
    """The number of bands with the least expected work for ``n`` uniformly spread hashes: entries
    written (n per band and key, sorted) plus the candidates they make (pairs sharing a key)."""
    best, best_cost = 1, math.inf
    for m in range(1, min(max_distance + 1, HASH_BITS) + 1):
        radius = math.ceil((max_distance // m) / 2)
        cost = 0.0
        for _, width in _bands(m):
            entries = n * _ball(width, radius)
            cost += _ENTRY_COST * entries + entries * entries / 2 / 2.0 ** width
        if cost < best_cost:
            best, best_cost = m, cost
    return best


def _masks(width: int, radius: int) -> np.ndarray:
    """Every ``width``-bit value with at most ``radius`` bits set (the flips of one band key)."""
    out = [0]
    for w in range(1, radius + 1):
        out += [sum(1 << b for b in bits) for bits in itertools.combinations(range(width), w)]
    return np.array(out, dtype=np.uint64)


def _group_pairs(keys: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Positions ``(p, q)``, ``p < q``, of every two entries with equal keys, ``keys`` sorted; in chunks of
    about :data:`_CHUNK` pairs (a generator of arrays)."""
    n = keys.size
    if n < 2:
        return
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    sizes = np.diff(np.r_[starts, n])
    multi = sizes > 1
    starts, sizes = starts[multi], sizes[multi]
    if not starts.size:
        return
    # each entry pairs with the later entries of its group
    pos = np.repeat(starts, sizes) + (np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes))
    later = np.repeat(starts + sizes, sizes) - pos - 1
    keep = later > 0
    pos, later = pos[keep], later[keep]
    total = np.cumsum(later)
    lo = 0
    while lo < pos.size:
        base = total[lo - 1] if lo else 0
        hi = max(lo + 1, int(np.searchsorted(total, base + _CHUNK, side="right")))
        p, c = pos[lo:hi], later[lo:hi]
        first = np.repeat(p, c)
        offsets = np.arange(first.size) - np.repeat(np.cumsum(c) - c, c)
        yield first, first + 1 + offsets
        lo = hi


def _distinct_pairs(codes: np.ndarray, max_distance: int,
                    bands: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs ``(a, b, distance)``, ``a < b``, of *distinct* codes within ``max_distance`` (indices into ``codes``)."""
    n = codes.size
    m = bands or plan(n, max_distance)
    radius = math.ceil((max_distance // m) / 2)
    found: list[np.ndarray] = []
    for shift, width in _bands(m):
        band = (codes >> np.uint64(shift)) & np.uint64((1 << width) - 1)
        masks = _masks(width, radius)
        keys = (band[:, None] ^ masks[None, :]).ravel()
        items = np.repeat(np.arange(n, dtype=np.int64), masks.size)
        order = np.argsort(keys, kind="stable")
        keys, items = keys[order], items[order]
        for p, q in _group_pairs(keys):
            a, b = items[p], items[q]
            dist = popcount(codes[a] ^ codes[b])
            ok = (dist <= max_distance) & (a != b)
            a, b = np.minimum(a[ok], b[ok]), np.maximum(a[ok], b[ok])
            found.append(a * n + b)
    if not found:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    flat = np.unique(np.concatenate(found))
    a, b = flat // n, flat % n
    return a, b, popcount(codes[a] ^ codes[b])


def near_pairs(codes: np.ndarray, max_distance: int, bands: int | None = None,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of hashes within ``max_distance`` bits: ``(i, j, distance)``, ``i < j``, sorted by (i, j).

    ``codes`` are uint64 hashes (:func:`to_codes`); equal codes pair at distance 0. ``bands`` forces
    the number of bands (default: :func:`plan`). The work grows with the candidates, not with n².
    """
    codes = np.asarray(codes, dtype=np.uint64)
    if codes.size < 2:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    uniq, inverse = np.unique(codes, return_inverse=True)
    inverse = inverse.ravel()
    ua, ub, ud = _distinct_pairs(uniq, max_distance, bands)
    # expand each pair of distinct codes to its images, and add the images sharing a code
    by_code = np.argsort(inverse, kind="stable")
    code_start = np.searchsorted(inverse[by_code], np.arange(uniq.size))
    code_size = np.diff(np.r_[code_start, codes.size])
    rep = code_size[ua] * code_size[ub]
    pair_a = np.repeat(np.arange(ua.size), rep)
    k = np.arange(pair_a.size) - np.repeat(np.cumsum(rep) - rep, rep)
    sb = code_size[ub][pair_a]
    i = by_code[code_start[ua][pair_a] + k // sb]
    j = by_code[code_start[ub][pair_a] + k % sb]
    dist = ud[pair_a]
    same_i, same_j = [], []
    for p, q in _group_pairs(inverse[by_code]):
        same_i.append(by_code[p])
        same_j.append(by_code[q])
    if same_i:
        i = np.concatenate([i] + same_i)
        j = np.concatenate([j] + same_j)
        dist = np.concatenate([dist, np.zeros(sum(s.size for s in same_i), dtype=np.int64)])
    lo, hi = np.minimum(i, j), np.maximum(i, j)
    order = np.lexsort((hi, lo))
    return lo[order].astype(np.int64), hi[order].astype(np.int64), dist[order].astype(np.int64)


def near_pairs_brute(codes: np.ndarray, max_distance: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The all-pairs reference of :func:`near_pairs` (tests and the benchmark), in blocks of rows."""
    codes = np.asarray(codes, dtype=np.uint64)
    out_i, out_j, out_d = [], [], []
    for r0 in range(0, codes.size, 512):
        rows = np.arange(r0, min(r0 + 512, codes.size))
        dist = popcount((codes[rows, None] ^ codes[None, :]).ravel()).reshape(rows.size, codes.size)
        ii, jj = np.nonzero((dist <= max_distance) & (np.arange(codes.size)[None, :] > rows[:, None]))
        out_i.append(rows[ii])
        out_j.append(jj)
        out_d.append(dist[ii, jj])
    cat = (lambda parts: np.concatenate(parts).astype(np.int64)) if out_i else (lambda parts: np.zeros(0, np.int64))
    return cat(out_i), cat(out_j), cat(out_d)


def clusters(n: int, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """The component of each of ``n`` items under the pairs ``(i, j)`` (union-find; labels 0..k-1)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(i.size, dtype=np.int8), (i, j)), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def pair_table(ids: pd.Series, labels: pd.Series, splits: pd.Series, i: np.ndarray, j: np.ndarray,
               dist: np.ndarray) -> pd.DataFrame:
    """The report: one row per pair, ``id_a < id_b`` (as text), sorted by distance, then ids."""
    ids, labels, splits = (np.asarray(s, dtype=object) for s in (ids, labels, splits))
    swap = ids[i].astype(str) > ids[j].astype(str)
    a, b = np.where(swap, j, i), np.where(swap, i, j)
    table = pd.DataFrame({"id_a": ids[a], "id_b": ids[b], "label_a": labels[a], "label_b": labels[b],
                          "split_a": splits[a], "split_b": splits[b], "distance": np.asarray(dist, dtype=np.int64)},
                         columns=PAIR_COLUMNS)
    return table.sort_values(["distance", "id_a", "id_b"], kind="stable").reset_index(drop=True)


def leaking(table: pd.DataFrame, query: dict, gallery: dict) -> pd.Series:
    """Pairs across the train/eval border, or a query's near copy in the gallery (a leak either way)."""
    return train_eval(table) | query_gallery(table, query, gallery)


def train_eval(table: pd.DataFrame) -> pd.Series:
    return table["split_a"].eq("train") != table["split_b"].eq("train")


def query_gallery(table: pd.DataFrame, query: dict, gallery: dict) -> pd.Series:
    """Pairs where one image is a query and the other in the gallery (``query``/``gallery``: id -> flag)."""
    qa, qb = table["id_a"].map(query).astype(bool), table["id_b"].map(query).astype(bool)
    ga, gb = table["id_a"].map(gallery).astype(bool), table["id_b"].map(gallery).astype(bool)
    return (qa & gb) | (qb & ga)


def counts(table: pd.DataFrame, query: dict, gallery: dict) -> dict[str, int]:
    """The four counts of the split stage's provenance and metrics. ``near_duplicates_same_label_query_gallery``
    is the part of ``near_duplicates_query_gallery`` whose two images share a label: a query and a positive
    it is meant to find (another rendering of one symbol, another view of one instance), not a leak by
    itself; the warnings leave them out (:func:`warned`)."""
    qg = query_gallery(table, query, gallery)
    same = table["label_a"].eq(table["label_b"])
    return {"near_duplicates_train_eval": int(train_eval(table).sum()),
            "near_duplicates_query_gallery": int(qg.sum()),
            "near_duplicates_cross_label": int((~same).sum()),
            "near_duplicates_same_label_query_gallery": int((qg & same).sum())}


def warned(table: pd.DataFrame, query: dict, gallery: dict) -> pd.Series:
    """The pairs the split stage and the report warn about: across the train/eval border, or a query and a
    gallery image of *different* labels (a same-label query-gallery pair is a positive: counted apart)."""
    return train_eval(table) | (query_gallery(table, query, gallery) & table["label_a"].ne(table["label_b"]))
