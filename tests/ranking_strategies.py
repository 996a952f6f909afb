"""Hypothesis strategies of the ranking tests (re-exported by tests/ranking_cases.py): small integer problems
with exact ties, zero vectors, ids and exclusions, and continuous random problems."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


@st.composite
def integer_problems(draw):
    """Small problems with integer embeddings in [-2, 2]: exact ties, zero vectors, optional ids/exclusion."""
    d = draw(st.integers(1, 3))
    m = draw(st.integers(1, 8))
    g = draw(hnp.arrays(np.int64, (m, d), elements=st.integers(-2, 2)))
    gl = draw(st.lists(st.integers(0, 2), min_size=m, max_size=m))
    mode = draw(st.sampled_from(["query_gallery", "leave_one_out", "same_set_no_ids"]))
    if mode == "query_gallery":
        n = draw(st.integers(1, 6))
        q = draw(hnp.arrays(np.int64, (n, d), elements=st.integers(-2, 2)))
        ql = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        with_ids = draw(st.booleans())
        g_ids = draw(st.lists(st.integers(0, 9), min_size=m, max_size=m, unique=True)) if with_ids else None
        q_ids = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)) if with_ids else None
    else:
        n, q, ql = m, g, gl
        q_ids = g_ids = list(range(m)) if mode == "leave_one_out" else None
    exclude = []
    if draw(st.booleans()):
        values = st.sampled_from(["c0", "c1", None, ""])
        exclude.append((draw(st.lists(values, min_size=n, max_size=n)),
                        draw(st.lists(values, min_size=m, max_size=m))))
    return dict(query_emb=q, gallery_emb=g, query_labels=ql, gallery_labels=gl, query_ids=q_ids,
                gallery_ids=g_ids, exclude=exclude)


@st.composite
def gaussian_problems(draw):
    """Continuous random problems (no exact ties): sizes and label counts drawn, values from a drawn seed."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n, m, d, labels = draw(st.integers(1, 12)), draw(st.integers(1, 20)), draw(st.integers(2, 8)), draw(
        st.integers(1, 4))  # d >= 2: in 1-D every cosine is +-1
    return dict(query_emb=rng.normal(size=(n, d)), gallery_emb=rng.normal(size=(m, d)),
                query_labels=rng.integers(0, labels, n), gallery_labels=rng.integers(0, labels, m),
                query_ids=None, gallery_ids=None, exclude=()), rng
