"""The direct path's first positive without a float64 product of every cell: the raw float32 product's error
bound holds, and each route (raw product decides, float32 unit product decides, near cells re-scored, the
exact product for a wide window) gives the exact product's first ranks under both tie rules."""

from __future__ import annotations

import numpy as np
import pytest

from recallk.score.passes import Pass
from recallk.score.ranking import direct
from recallk.score.ranking.problem import Problem
from recallk.score.retrieval_data import RetrievalData
from recallk.score.similarity import cosine_block, l2_normalize


def _raw_scores(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """What :func:`direct._raw_first_ranks` compares: the raw float32 product scaled by the float32 norms."""
    sx = 1 / np.sqrt(np.einsum("ij,ij->i", x, x).astype(np.float64))
    sy = 1 / np.sqrt(np.einsum("ij,ij->i", y, y).astype(np.float64))
    return (x @ y.T) * sx[:, None] * sy[None, :]


@pytest.mark.parametrize("d", [1, 7, 256, 1024])
def test_raw_error_bound_holds(d):
    rng = np.random.default_rng(d)
    worst = 0.0
    for scale in (2.0**-19, 1e-3, 1.0, 1e3, 2.0**19):  # squared norms inside [2**-40, 2**40]
        x = (rng.standard_normal((24, d)) * scale / np.sqrt(d)).astype(np.float32)
        near = x + (1e-4 * scale / np.sqrt(d) * rng.standard_normal((24, d))).astype(np.float32)  # near-parallel
        y = np.concatenate([near, np.round(x * 8 / scale) * scale / 8, -x]).astype(np.float32)  # quantised, opposite
        y = y[np.any(y != 0, axis=1)]  # no zero rows (the raw route leaves them to the unit rows)
        exact = cosine_block(l2_normalize(x), l2_normalize(y).astype(np.float64).T)
        worst = max(worst, float(np.abs(_raw_scores(x, y) - exact).max()))
    assert worst <= direct.raw_error_bound(d)


def _cases():
    rng = np.random.default_rng(7)
    centres = rng.standard_normal((5, 32)).astype(np.float32)
    ql, gl = rng.integers(0, 5, 40), rng.integers(0, 5, 60)
    q = centres[ql] + rng.standard_normal((40, 32)).astype(np.float32)
    g = centres[gl] + rng.standard_normal((60, 32)).astype(np.float32)
    dup = g.copy()
    dup[30:] = dup[:30]  # exact ties, positives and others
    zero = q.copy()
    zero[::3] = 0  # all-zero queries tie every cell
    ids = np.arange(60)
    return {
        "clustered": (q, g, ql, gl, {}),
        "duplicates": (q, dup, ql, gl, {}),
        "near-ties": (q, g + np.float32(1e-7) * (g > 0), ql, gl, {}),
        "zero queries": (zero, g, ql, gl, {}),
        "float64": (q.astype(np.float64), g.astype(np.float64), ql, gl, {}),
        "leave-one-out": (dup, dup, gl, gl, {"query_ids": ids, "gallery_ids": ids}),
        "exclusions": (q, dup, ql, gl, {"exclude": [(ql % 2, gl % 2)]}),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_every_route_gives_the_exact_products_first_ranks(name, monkeypatch):
    q, g, ql, gl, kw = _cases()[name]
    routes = []  # (route, whether it decided), in the order taken

    def spy(route):
        real = getattr(direct, route)

        def call(*args):
            found = real(*args)
            routes.append((route, found is not None))
            return found
        return call

    for route in ("_raw_first_ranks", "_window_first_ranks", "_first_ranks"):
        monkeypatch.setattr(direct, route, spy(route))
    p = Problem.build(RetrievalData(q, g, ql, gl, **kw), unit_bytes=0)
    got = direct.direct_ranks(p, Pass.first())
    monkeypatch.undo()
    exact = direct.direct_ranks(Problem.build(RetrievalData(q, g, ql, gl, **kw)), Pass.every())
    n_pos, offsets, ranks, opposite = exact
    has = n_pos > 0
    assert np.array_equal(got[0], n_pos) and np.array_equal(got[3], opposite)
    assert np.array_equal(got[2], ranks[offsets[:-1][has]])  # each query's first positive
    decided = [route for route, done in routes if done]
    expected = {"clustered": "_raw_first_ranks", "float64": "_window_first_ranks", "zero queries": "_first_ranks"}
    if name in expected:
        assert decided[0] == expected[name]
    if name in ("duplicates", "leave-one-out"):  # every best positive has its twin: exact ties, re-scored
        assert decided[0] in ("_window_first_ranks", "_first_ranks") and routes[0] == ("_raw_first_ranks", False)
