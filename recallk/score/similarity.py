"""Similarity primitives shared by the ranking engine, the metrics and whitening.

* Similarity is the cosine: rows are L2-normalised (a zero vector stays zero and
  so has similarity 0 to everything); inner products of the float32 unit rows are
  accumulated in float64 and rounded to float32 (see :func:`cosine_block`).
* :func:`float32_dot_error_bound` bounds how far a fast float32 product can be
  from that value, which lets the engine (:mod:`recallk.score.ranking`) use the fast
  product and re-decide only the comparisons it could get wrong.
"""

from __future__ import annotations

import numpy as np

from recallk.threads import run_all

#: Rows normalised at a time (float64 scratch of at most 2 threads x 2 x 512 x d x 8 bytes).
_NORMALIZE_ROWS = 512
#: The smallest positive float64: what a zero row is divided by (any positive divisor leaves it zero).
_TINY = np.float64(5e-324)


def l2_normalize(x: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Return rows scaled to unit L2 norm, as float32; all-zero rows stay zero.

    Computed in float64, in chunks of rows, so the float64 scratch stays small whatever
    the number of rows. float64 rows are first divided by their largest magnitude, so any
    finite scale (1e-200 or 1e200) gives the same direction; narrower inputs (float32,
    float16, integers) need no such step: their squares and sums can neither overflow nor
    underflow in float64. With ``rows``, returns ``l2_normalize(x)[rows]`` without the
    intermediate copy.

    Two threads share the chunks (:func:`recallk.threads.run_all`), each in its own scratch
    reused chunk after chunk (a fresh float64 copy per chunk would fault in new pages every
    time, which costs more than the arithmetic).
    """
    x = np.asarray(x)
    n = x.shape[0] if rows is None else len(rows)
    out = np.empty((n,) + x.shape[1:], dtype=np.float32)
    if n <= _NORMALIZE_ROWS:  # one chunk: no threads to start (they cost more than the work)
        _unit_chunk(x if rows is None else x[rows], out)
        return out
    steps = range(0, n, _NORMALIZE_ROWS)

    def share(first: int) -> None:  # every other chunk; the chunks are independent
        size = (_NORMALIZE_ROWS,) + x.shape[1:]
        gathered, scratch = None if rows is None else np.empty(size, x.dtype), np.empty(size)
        for start in steps[first::2]:
            stop = min(start + _NORMALIZE_ROWS, n)
            part = x[start:stop] if rows is None else \
                np.take(x, rows[start:stop], axis=0, mode="clip", out=gathered[:stop - start])  # no extra buffer
            _unit_chunk(part, out[start:stop], scratch[:stop - start])

    run_all(share, (0, 1))
    return out


def _unit_chunk(part: np.ndarray, out: np.ndarray, scratch: np.ndarray | None = None) -> None:
    """:func:`l2_normalize` of one chunk of rows into ``out``: a float64 copy (into ``scratch`` if given) divided
    in place, rounded once to float32."""
    chunk = np.empty(part.shape) if scratch is None else scratch
    np.copyto(chunk, part, casting="unsafe")  # exact for floats and for integers up to 2**53
    if part.size and needs_peak(part.dtype):  # |x| and max are exact; a zero row's peak and norm read _TINY,
        # not 0: 0 / _TINY is 0 (-0 stays -0), as 0 / 1
        peak = np.maximum.reduce(np.abs(part), axis=1, keepdims=True)
        chunk /= np.maximum(peak, _TINY, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", chunk, chunk))
    chunk /= np.maximum(norms, _TINY, out=norms)[:, None]
    np.copyto(out, chunk, casting="same_kind")


def needs_peak(dtype: np.dtype) -> bool:
    """Whether rows of ``dtype`` are divided by their largest magnitude before their norm (:func:`l2_normalize`):
    float64 and wider only. A float32 square is below 2**256 and a sum of a million of them below 2**276, far
    inside float64's range (2**1024), and the smallest square (2**-298) is a normal float64: their norms need
    no scaling to stay in range, so narrower rows skip the step (a pass over the chunk and a division). The
    unit rows are as exact either way (within a float32 ulp of the exact direction; tests/score/test_similarity.py)."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" and dtype.itemsize >= 8


def cosine_block(q_unit: np.ndarray, g_unit_t: np.ndarray) -> np.ndarray:
    """Similarities of unit rows ``q_unit`` (b, d) to the columns of ``g_unit_t`` (d, m), as float32.

    Products of float32 values are exact in float64, so accumulating in float64
    and rounding once to float32 makes the result practically independent of the
    BLAS kernel and so of the block size: exactly cancelling terms give exactly 0,
    and a float64 summation-order difference (about 1e-16) changes the float32
    value only when it straddles a rounding boundary, which is vanishingly rare.
    """
    return (q_unit.astype(np.float64) @ g_unit_t).astype(np.float32)


def float32_dot_error_bound(d: int) -> float:
    """Bound on |float32 dot - exact similarity| for unit float32 rows of dimension ``d``.

    Any summation order gives at most gamma_d * sum|q_i g_i| with gamma_d = d u / (1 - d u),
    u = 2**-24 (Higham, Accuracy and Stability, 3.1), and sum|q_i g_i| <= |q| |g|, which is
    1 up to the rows' own rounding. The extra 2u covers that, the exact value's final
    rounding to float32 and its float64 accumulation error (for d up to millions).
    """
    u = 2.0**-24
    return d * u / (1 - d * u) + 2 * u
