"""The ranking problem, prepared once after validation: unit vectors, label slices, exclusions, leave-one-out.

The gallery is sorted by label, so each query's positives are one slice of
columns ``[lo, hi)``; within a slice columns keep gallery-index order, the tie
rule. Every driver of the engine (and the faiss backend) reads this one
:class:`Problem`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from recallk.checks import integer_ids, is_missing, same_values
from recallk.score.retrieval_data import RetrievalData, ids_match
from recallk.score.similarity import float32_dot_error_bound, l2_normalize

#: One exclusion column: each query's code, the sorted gallery columns of each code, each column's code.
Group = tuple[np.ndarray, list[np.ndarray], np.ndarray]
#: Rows normalised at a time when unit rows are read from a :class:`UnitRows` (no threads: the tiles' own
#: threads read them).
_READ_ROWS = 512


class UnitRows:
    """Unit rows of ``x`` in the order ``order``, normalised when read: no copy of the whole set.

    ``rows[key]`` (a slice or an integer array of positions) is ``l2_normalize(x, rows=order)[key]``,
    bit for bit (:func:`~recallk.score.similarity.l2_normalize` normalises each row on its own), in
    chunks of ``_READ_ROWS`` rows. It holds nothing but a view of the caller's ``x`` and ``order``, so
    :attr:`nbytes` is 0: the engine counts the rows it reads as tile scratch.

    Parameters
    ----------
    x : ndarray
        (m, d) real rows, the caller's array (validated; not copied).
    order : ndarray, optional
        (k,) rows of ``x`` in the order they are read (None: ``x`` as it is).
    """

    def __init__(self, x: np.ndarray, order: np.ndarray | None = None) -> None:
        self.x = x
        self.whole = order is None  # the rows of ``x`` as they are (``order`` is their range)
        self.order = np.arange(x.shape[0]) if order is None else np.asarray(order)
        self.shape = (self.order.size, x.shape[1])
        self.dtype = np.dtype(np.float32)
        self.ndim = 2

    nbytes = 0  # nothing held

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key) -> np.ndarray:
        picked = self.order[key]
        if picked.ndim == 0:
            return self[np.atleast_1d(key)][0]
        if picked.size <= _READ_ROWS:
            return l2_normalize(self.x, rows=picked)
        out = np.empty((picked.size, self.shape[1]), dtype=np.float32)
        for s in range(0, picked.size, _READ_ROWS):  # one chunk a call: no thread pool of its own
            out[s:s + _READ_ROWS] = l2_normalize(self.x, rows=picked[s:s + _READ_ROWS])
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype)

    def subset(self, rows: np.ndarray) -> UnitRows:
        """The rows at positions ``rows``, still read lazily."""
        return UnitRows(self.x, self.order[rows])


def unit_rows(x: np.ndarray, order: np.ndarray | None, materialize: bool) -> np.ndarray | UnitRows:
    """``l2_normalize(x, rows=order)`` held as one float32 array, or (``materialize`` False) the same rows
    normalised when read (:class:`UnitRows`)."""
    if materialize:
        return l2_normalize(x) if order is None else l2_normalize(x, rows=order)
    return UnitRows(np.asarray(x), order)


def take_rows(rows: np.ndarray | UnitRows, which: np.ndarray) -> np.ndarray | UnitRows:
    """Rows ``which`` of held unit rows (a copy), or of :class:`UnitRows` (still lazy)."""
    return rows.subset(which) if isinstance(rows, UnitRows) else rows[which]


def code_columns(*columns: Any, missing: bool = False) -> list[np.ndarray]:
    """Joint integer codes of label-like columns compared as strings; with ``missing``, None/NaN/"" is -1.

    Codes number the distinct values in the order of their text. Integer columns (all signed or all
    unsigned) and text columns get the same codes without turning every value into a Python object;
    non-negative integers below :data:`_TABLE_SPAN` (a training loop's class indices) through a table
    (:func:`_table_codes`) instead of a sort."""
    if not missing:
        plain = [np.asarray(c).reshape(-1) for c in columns]
        kinds = {a.dtype.kind for a in plain}
        if kinds in ({"i"}, {"u"}, {"U"}):
            joint = np.concatenate(plain)
            top = _table_top(joint) if kinds != {"U"} and joint.size else None
            if top is not None:
                return _split(_table_codes(joint, top), plain)
            values = np.unique(joint)
            codes = np.searchsorted(values, joint)
            if kinds != {"U"} and values.size and not 0 <= values[0] <= values[-1] <= 9:
                by_text = np.empty(values.size, dtype=np.int64)  # integers: number them in the order of their text
                by_text[np.argsort(values.astype(str))] = np.arange(values.size)
                codes = by_text[codes]
            return _split(codes.astype(np.int64, copy=False), plain)
    arrays = [np.asarray(c, dtype=object).reshape(-1) for c in columns]
    text = np.concatenate([a.astype(str) for a in arrays])
    _, codes = np.unique(text, return_inverse=True)
    if missing:
        gone = np.concatenate([np.array([is_missing(v) for v in a], dtype=bool) for a in arrays])
        codes = np.where(gone, -1, codes)
    return _split(codes.reshape(-1).astype(np.int64), arrays)


#: Integer labels in ``[0, _TABLE_SPAN)`` are coded through a table (:func:`_table_codes`), no sort.
_TABLE_SPAN = 2**16


def _table_top(joint: np.ndarray) -> int | None:
    """The largest of the integers ``joint`` when all are in ``[0, _TABLE_SPAN)``, else None. Read as unsigned
    (int32 and wider), a negative value is at least 2**31, so one maximum answers both bounds."""
    if joint.dtype.kind == "i" and joint.dtype.itemsize < 4 and np.minimum.reduce(joint) < 0:
        return None
    top = int(np.maximum.reduce(joint.view(f"u{joint.dtype.itemsize}")))
    return top if top < _TABLE_SPAN else None


def _table_codes(joint: np.ndarray, top: int) -> np.ndarray:
    """:func:`code_columns` of non-negative integers at most ``top``: each value's place in the order of their text
    (:func:`_text_places`) is marked in a table; a marked place's code is the number of marked places before
    it, so the distinct values are numbered in the order of their text."""
    table = _text_places(top)
    places = table[joint]
    marked = np.zeros(table.size, dtype=bool)
    marked[places] = True
    return (marked.cumsum() - 1)[places]


@functools.lru_cache(maxsize=None)
def _text_places_upto(size: int) -> np.ndarray:
    """Place of each integer below ``size`` in the order of the texts of all of them (read-only)."""
    places = np.empty(size, dtype=np.int64)
    places[np.argsort(np.arange(size).astype(str), kind="stable")] = np.arange(size)
    places.flags.writeable = False
    return places


def _text_places(top: int) -> np.ndarray:
    """Places of ``0..top`` in the order of their texts, as :func:`_text_places_upto` of the next power of two
    (at most 17 tables a process: the order of two texts does not depend on which others are ranked)."""
    return _text_places_upto(1 << max(4, top.bit_length()))


def own_rows(query_ids: Sequence[Any], gallery_ids: Sequence[Any]) -> np.ndarray:
    """Each query's gallery row with its id, compared as text like the labels (gallery ids are unique), or -1;
    integer arrays (:func:`~recallk.checks.integer_ids`) are looked up sorted, without a text per id."""
    if integer_ids(query_ids, gallery_ids):
        by_id = np.argsort(gallery_ids, kind="stable")
        ordered = gallery_ids[by_id]
        at = np.minimum(ordered.searchsorted(query_ids), ordered.size - 1)
        return np.where(ordered[at] == query_ids, by_id[at], -1)
    where = {str(gid): j for j, gid in enumerate(gallery_ids)}
    return np.array([where.get(str(qid), -1) for qid in query_ids], dtype=np.int64)


def _split(codes: np.ndarray, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """``codes`` of the concatenated ``arrays``, cut back into one array per column."""
    out, start = [], 0
    for a in arrays:
        out.append(codes[start:start + a.size])
        start += a.size
    return out


@dataclass(frozen=True)
class Problem:
    """Queries and a label-sorted gallery, ready to rank; build it with :meth:`build`.

    Attributes
    ----------
    q : ndarray or UnitRows
        (n, d) unit float32 queries: held, or normalised when read (:class:`UnitRows`) when the
        budget cannot hold them.
    gp : ndarray or UnitRows
        (m, d) unit float32 gallery, sorted by label; held or read as ``q``.
    gindex : ndarray
        (m,) gallery index of each sorted column (the tie rule: smaller first).
    lo, hi : ndarray
        (n,) query ``i``'s label occupies sorted columns ``lo[i]:hi[i]``.
    q_label, g_label : ndarray
        (n,) and (m,) label codes of the queries and of the sorted gallery (equal codes: the same label).
    self_col : ndarray
        (n,) sorted column of the query's own image, or -1.
    groups : list of Group
        One per exclusion column: query codes, the columns of each code, the column codes.
    tol : float
        Bound on ``|float32 product - exact similarity|`` of unit vectors.
    same_set : bool
        Leave-one-out: the queries are the gallery, row for row (query ``i`` is gallery item ``i``).
    """

    q: np.ndarray | UnitRows
    gp: np.ndarray | UnitRows
    gindex: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    q_label: np.ndarray
    g_label: np.ndarray
    self_col: np.ndarray
    groups: list[Group]
    tol: float
    same_set: bool = False

    @classmethod
    def build(cls, data: RetrievalData, unit_bytes: float | None = None) -> Problem:
        """Prepare checked data once.

        Parameters
        ----------
        data : RetrievalData
            The embeddings, labels, ids and exclusions. ``data.same_set`` None detects leave-one-out:
            the same rows, labels, ids and exclusion values.
        unit_bytes : float, optional
            Most bytes of unit copies to hold: the queries' copy (4·d B per query) is held when it fits,
            then the gallery's when both fit; a set that does not is normalised when read
            (:class:`UnitRows`), tile by tile, with the same bits. None: hold both.
        """
        query_emb, gallery_emb, query_labels, gallery_labels = (data.query_emb, data.gallery_emb, data.query_labels,
                                                                data.gallery_labels)
        query_ids, gallery_ids, same_set = data.query_ids, data.gallery_ids, data.same_set
        q_codes, g_codes = code_columns(query_labels, gallery_labels)
        order = g_codes.argsort(kind="stable")
        n, m, d = len(query_emb), len(gallery_emb), np.shape(gallery_emb)[1]
        hold_q = unit_bytes is None or 4 * d * n <= unit_bytes
        hold_g = unit_bytes is None or 4 * d * (n * hold_q + m) <= unit_bytes
        q, gp = unit_rows(query_emb, None, hold_q), unit_rows(gallery_emb, order, hold_g)  # gallery sorted by label
        gp_codes = g_codes[order]
        lo, hi = gp_codes.searchsorted(q_codes, "left"), gp_codes.searchsorted(q_codes, "right")
        self_col = np.empty(n, dtype=np.int64)
        self_col.fill(-1)
        if query_ids is not None and gallery_ids is not None:
            column = np.empty(m, dtype=np.int64)
            column[order] = np.arange(m)
            own = own_rows(query_ids, gallery_ids)
            self_col = np.where(own >= 0, column[np.maximum(own, 0)], -1)
        groups = []
        for q_group, g_group in data.exclude:
            qc, gc = code_columns(q_group, g_group, missing=True)
            gcs = gc[order]
            by_code = np.argsort(gcs, kind="stable")
            bounds = np.searchsorted(gcs[by_code], np.arange(int(max(qc.max(initial=-1), gc.max(initial=-1))) + 2))
            cols = [np.sort(by_code[bounds[c]:bounds[c + 1]]) for c in range(len(bounds) - 1)]
            groups.append((qc, cols, gcs))
        if same_set is None:  # detect it: the same rows, labels, ids and exclusion values
            same_set = (query_ids is None or ids_match(query_ids, gallery_ids)) \
                and (query_emb is gallery_emb or same_values(query_emb, gallery_emb)) \
                and np.array_equal(np.asarray(query_labels).astype(str), np.asarray(gallery_labels).astype(str)) \
                and all(np.array_equal(q_code[order], g_code) for q_code, _, g_code in groups)
        return cls(q, gp, order, lo, hi, q_codes, gp_codes, self_col, groups, float32_dot_error_bound(q.shape[1]),
                   bool(same_set))

    def queries(self, rows: np.ndarray) -> Problem:
        """The problem of queries ``rows`` alone against the whole gallery; never leave-one-out."""
        return replace(self, q=take_rows(self.q, rows), lo=self.lo[rows], hi=self.hi[rows], q_label=self.q_label[rows],
                       self_col=self.self_col[rows],
                       groups=[(q_code[rows], cols, g_code) for q_code, cols, g_code in self.groups],
                       same_set=False)

    def excluded(self, rows: np.ndarray, c0: int, c1: int) -> np.ndarray:
        """Boolean (len(rows), c1 - c0): the cells of columns [c0, c1) each query may not retrieve
        (its own image, and items sharing a value of an exclusion column)."""
        return self.excluded_cells(np.asarray(rows)[:, None], np.arange(c0, c1)[None, :])

    def excluded_cells(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """Boolean, ``rows`` and ``cols`` broadcast together: whether query ``rows[...]`` may not retrieve sorted
        column ``cols[...]`` (its own image, or an item sharing a value of an exclusion column); the cells of
        :meth:`excluded` for any layout of (query, column) pairs."""
        out = self.self_col[rows] == cols
        for q_code, _, g_code in self.groups:
            qc = q_code[rows]
            out |= (g_code[cols] == qc) & (qc >= 0)
        return out

    def _own(self, rows: np.ndarray, c0: int, c1: int) -> tuple[np.ndarray, np.ndarray]:
        """(row, column) cells of each query's own image among columns [c0, c1)."""
        own = self.self_col[rows]
        inside = (own >= c0) & (own < c1)
        return np.flatnonzero(inside), own[inside] - c0

    def mask(self, block: np.ndarray, rows: np.ndarray, c0: int, c1: int) -> None:
        """Set the positive and excluded cells of ``block`` (rows x [c0, c1)) to -inf."""
        lo, hi = np.maximum(self.lo[rows], c0) - c0, np.minimum(self.hi[rows], c1) - c0
        starts = np.flatnonzero(np.r_[True, (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])]) if rows.size else []
        for k0, k1 in zip(starts, np.r_[starts[1:], rows.size]):  # runs of rows of one label (rows come sorted)
            if lo[k0] < hi[k0]:
                block[k0:k1, lo[k0]:hi[k0]] = -np.inf
        self.mask_excluded(block, rows, c0, c1)

    def mask_excluded(self, block: np.ndarray, rows: np.ndarray, c0: int, c1: int) -> None:
        """Set the cells of ``block`` (rows x [c0, c1)) that each query may not retrieve to -inf."""
        if self.groups:
            block[self.excluded(rows, c0, c1)] = -np.inf
        else:  # only the own images: no block-sized boolean mask
            block[self._own(rows, c0, c1)] = -np.inf

    def n_excluded(self) -> np.ndarray:
        """Gallery items each query may not retrieve (its own image and its exclusion groups, counted once)."""
        n = self.q.shape[0]
        if not self.groups:  # only the own images
            return (self.self_col >= 0).astype(np.int64)
        out = np.zeros(n, dtype=np.int64)
        union: dict[tuple, np.ndarray] = {}
        for i in range(n):
            key = tuple(int(qc[i]) for qc, _, _ in self.groups)
            if key not in union:
                parts = [cols[c] for (_, cols, _), c in zip(self.groups, key) if c >= 0]
                union[key] = np.unique(np.concatenate(parts)) if parts else np.empty(0, np.int64)
            cols = union[key]
            s = self.self_col[i]
            inside = s >= 0 and cols.size > 0 and cols[min(np.searchsorted(cols, s), cols.size - 1)] == s
            out[i] = cols.size + (s >= 0 and not inside)
        return out
