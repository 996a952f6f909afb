"""recallk.score.similarity: unit rows, and zero rows that stay zero (cosine 0 with everything, never NaN)."""

from __future__ import annotations

import numpy as np

from recallk.score.similarity import l2_normalize


def test_zero_rows_stay_zero_and_never_nan():
    unit = l2_normalize(np.array([[0.0, 0.0, 0.0], [3.0, 0.0, 4.0], [0.0, 0.0, 0.0]]))
    assert not np.isnan(unit).any()
    np.testing.assert_array_equal(unit[[0, 2]], 0.0)
    np.testing.assert_allclose(unit[1], [0.6, 0.0, 0.8], rtol=1e-6)
