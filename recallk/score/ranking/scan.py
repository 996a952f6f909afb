"""The scan kernel: count the cells of a tile surely above each line's window, re-score the undecided ones.

A float32 score differs from the exact one by at most ``tol`` (Higham's gamma_d
bound), so a cell is surely above a threshold when its float32 score is above
the threshold's window ``[lo, hi]`` (:func:`round_outward` makes the window's ends safe
in float32), and undecided inside it; undecided cells are re-scored exactly by
:func:`exact_pairs`. Exact tiles (:func:`exact_product`) are the float64
product rounded once, as :func:`recallk.score.similarity.cosine_block`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

#: Undecided pairs re-scored at a time (float64 scratch of 2 x 256 x d x 8 bytes, 2 MiB at d = 512).
_EXACT_CHUNK = 256
#: Cells compared at a time (two boolean scratches of this many bytes, 0.5 MiB each, that stay in
#: the cache; one row at least, so more for galleries wider than this).
_CHUNK_CELLS = 2**19
#: A scan compares only the lines that reach their window when they are fewer than 1 in this many.
_FEW_LINES = 4


def scan_block(sims: np.ndarray, sides: Sequence[tuple], scratch: Buffers) -> list[np.ndarray]:
    """Count the cells of ``sims`` surely above each line's window, and hand on the undecided ones.

    ``sides``: (axis, lo, hi, sink) per side counted, axis 1 for the rows (``lo``/``hi``
    one entry per row), axis 0 for the columns (one per column). Returns, per side, each
    line's number of cells above ``hi``; the undecided cells (in [lo, hi]) of each chunk go
    to ``sink(lines, others)``.

    In chunks of rows that stay in the cache, read for both sides: each line's maximum
    first (lines below their window, most of them when queries rank their positives
    high, need nothing more); then one compare for the cells above ``hi`` (counted as
    bytes) and one for those at or above ``lo``, over the chunk or, when few lines reach
    their window, over those lines only. The window is the difference of the two compares,
    usually a few cells per line (every cell only for degenerate data such as all-zero
    queries), found by scanning 8 cells at a time.
    """
    height, width = sims.shape
    step = max(1, _CHUNK_CELLS // max(1, width))
    out = [np.zeros(lo.size, dtype=np.int64) for _, lo, _, _ in sides]
    for k0 in range(0, height, step):
        chunk = sims[k0:k0 + step]
        for (axis, lo, hi, sink), above in zip(sides, out):
            first = k0 if axis == 1 else 0  # the chunk's first line: rows count from k0, columns from 0
            n_lines = chunk.shape[1 - axis]
            low, high = lo[first:first + n_lines], hi[first:first + n_lines]
            lines = np.flatnonzero(chunk.max(axis=axis) >= low)  # those with a cell at or above their window
            if not lines.size:
                continue
            if lines.size * _FEW_LINES >= n_lines:  # most lines: compare the whole chunk
                lines = np.arange(n_lines)
            part = chunk if lines.size == n_lines else chunk[lines] if axis == 1 else chunk[:, lines]
            counts, line, other = _count_lines(part, low[lines], high[lines], axis, scratch)
            above[first + lines] += counts
            if line.size:
                sink(first + lines[line], other + (k0 - first))  # the other side of a column is a row from k0
    return out


def _count_lines(block: np.ndarray, low: np.ndarray, high: np.ndarray, axis: int, scratch: Buffers):
    """For :func:`scan_block`: per line of ``block`` (rows for axis 1, columns for axis 0) the cells above
    ``high``, and the cells in [low, high] as (line, index along the line) pairs."""
    h, w = block.shape
    low, high = (low[:, None], high[:, None]) if axis == 1 else (low, high)
    o = np.greater(block, high, out=scratch.get("over", (h, w), bool))
    counts = _byte_sums(o, axis)
    window, in_window = word_mask(scratch, "window", (h, w))
    np.greater_equal(block, low, out=in_window)
    np.logical_xor(in_window, o, out=in_window)  # at or above low, not above high
    r, c = sparse_cells(window, w)
    return (counts, r, c) if axis == 1 else (counts, c, r)


def word_mask(scratch: Buffers, name: str, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """A reused boolean scratch of whole 8-byte words (its tail past ``shape`` False), and its (h, w) view to
    compare into, for :func:`sparse_cells`."""
    h, w = shape
    words = scratch.get(name, (-(-h * w // 8) * 8,), bool)
    words[h * w:] = False  # the tail of the last word
    return words, words[:h * w].reshape(h, w)


def sparse_cells(words: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    """The (row, column) cells set in a :func:`word_mask` of rows ``w`` wide, in row-major order: only the
    non-zero 8-byte words are looked into (several times faster than ``np.nonzero`` when few cells are set)."""
    nonzero = np.flatnonzero(words.view(np.uint64) != 0)
    flat = (nonzero[:, None] * 8 + np.arange(8)).ravel()
    return np.divmod(flat[words[flat]], w)


def _byte_sums(mask: np.ndarray, axis: int) -> np.ndarray:
    """``mask.sum(axis)`` as int64, summed as bytes into the narrowest type that cannot overflow
    (uint8 for up to 255 terms, uint16 for up to 65,535): several times faster than int64."""
    dtype, most = (np.uint8, 255) if axis == 0 else (np.uint16, 65535)
    u8 = mask.view(np.uint8)
    total = np.zeros(mask.shape[1 - axis], dtype=np.int64)
    for s in range(0, mask.shape[axis], most):
        total += u8[s:s + most].sum(axis=0, dtype=dtype) if axis == 0 else u8[:, s:s + most].sum(axis=1, dtype=dtype)
    return total


def exact_pairs(q: np.ndarray, g: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Exact similarities of the (row, col) pairs: float64 sums of float32 products, rounded to float32."""
    out = np.empty(rows.size, dtype=np.float32)
    a, b = np.empty((min(rows.size, _EXACT_CHUNK), q.shape[1])), np.empty((min(rows.size, _EXACT_CHUNK), q.shape[1]))
    for s in range(0, rows.size, _EXACT_CHUNK):  # small reused float64 buffers: cache-resident, no fresh pages
        r, c = rows[s:s + _EXACT_CHUNK], cols[s:s + _EXACT_CHUNK]
        np.copyto(a[:r.size], q[r])
        np.copyto(b[:r.size], g[c])
        out[s:s + r.size] = np.einsum("ij,ij->i", a[:r.size], b[:r.size])
    return out


def round_outward(x: np.ndarray, up: bool) -> np.ndarray:
    """float64 -> float32 rounded outward, so float32 compares are safe."""
    y = x.astype(np.float32)
    bad = (y < x) if up else (y > x)
    return np.where(bad, np.nextafter(y, np.float32(np.inf if up else -np.inf)), y)


class Buffers:
    """Reused scratch arrays: fresh 100 MB arrays per block would page-fault on every first touch."""

    def __init__(self) -> None:
        self.flat: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        size = math.prod(shape)
        buf = self.flat.get(name)
        if buf is None or buf.size < size:
            buf = self.flat[name] = np.empty(size, dtype=dtype)
        return buf[:size].reshape(shape)


def exact_product(a: np.ndarray, b: np.ndarray, buffers: Buffers) -> tuple[np.ndarray, np.ndarray]:
    """Exact float32 similarities of float64 rows ``a`` x ``b`` (:func:`cosine_block`: float64 product,
    rounded once), and the float64 product they were rounded from (both in ``buffers``)."""
    shape = (a.shape[0], b.shape[0])
    product = np.matmul(a, b.T, out=buffers.get("f64", shape, np.float64))
    out = buffers.get("f32", shape, np.float32)
    np.copyto(out, product, casting="same_kind")
    return out, product
