"""recallk.score.similarity: unit rows, and zero rows that stay zero (cosine 0 with everything, never NaN)."""

from __future__ import annotations

import numpy as np
import pytest

from recallk.score.similarity import l2_normalize


def test_zero_rows_stay_zero_and_never_nan():
    unit = l2_normalize(np.array([[0.0, 0.0, 0.0], [3.0, 0.0, 4.0], [0.0, 0.0, 0.0]]))
    assert not np.isnan(unit).any()
    np.testing.assert_array_equal(unit[[0, 2]], 0.0)
    np.testing.assert_allclose(unit[1], [0.6, 0.0, 0.8], rtol=1e-6)


def _exact_unit(x: np.ndarray) -> np.ndarray:
    """Reference: each row's direction from exact rational arithmetic (math.fsum of exact float64 squares of the
    float32 values, sqrt rounded once), then rounded to float32: what l2_normalize must give to 1 ulp."""
    import math
    out = np.zeros(x.shape, dtype=np.float32)
    for i, row in enumerate(x.astype(np.float64)):
        norm = math.sqrt(math.fsum(v * v for v in row))
        if norm:
            out[i] = (row / norm).astype(np.float32)
    return out


@pytest.mark.parametrize("dtype, scale", [
    (np.float32, 1.0),       # ordinary embeddings
    (np.float32, 2.0**120),  # near float32's top: squares near 2**256, still inside float64's range
    (np.float32, 2.0**-140),  # float32 subnormals: squares near 2**-280, normal float64 values
    (np.float16, 1.0),       # half precision
    (np.int16, 1000.0),      # integer rows
    (np.float64, 1e-200),    # float64 only: divided by the row's peak first (the square would underflow)
    (np.float64, 1e200),     # ... or overflow
])
def test_rows_of_any_dtype_and_scale_get_their_direction_to_one_ulp(dtype, scale):
    rng = np.random.default_rng(3)
    base = rng.normal(size=(1100, 19))  # more than one chunk of 512 rows: the threaded path
    x = (base * scale).astype(dtype)
    unit = l2_normalize(x)
    assert unit.dtype == np.float32 and np.isfinite(unit).all()
    reference = _exact_unit(x.astype(np.float64) / (scale if dtype is np.float64 else 1.0))
    ulps = np.abs(unit.view(np.int32).astype(np.int64) - reference.view(np.int32).astype(np.int64))
    assert ulps.max() <= 1, f"{ulps.max()} ulps off"


def test_a_power_of_two_scale_changes_no_bit_and_rows_pick_the_same_bits():
    # float32 rows skip the peak step: an exact power-of-two scale must still leave every bit as it was,
    # and the rows= path (a gathered subset) must equal the whole array's rows bit for bit.
    rng = np.random.default_rng(4)
    x = rng.normal(size=(1300, 33)).astype(np.float32)
    unit = l2_normalize(x)
    for k in (-100, -7, 9, 100):
        assert l2_normalize(x * np.float32(2.0**k)).tobytes() == unit.tobytes()
    order = rng.permutation(1300)[:1100]
    assert l2_normalize(x, rows=order).tobytes() == unit[order].tobytes()
    assert l2_normalize(x[:7]).tobytes() == unit[:7].tobytes()  # one chunk, no threads
