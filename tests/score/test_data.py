"""recallk.score.retrieval_data.RetrievalData: one retrieval problem's data, checked once when built (every rule named
by argument), held as the engine reads it, and the warnings pointed at the caller's line."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from recallk import recall_at_k
from recallk.errors import InputError
from recallk.score.metrics import Scorer
from recallk.score.retrieval_data import RetrievalData

Q, G = np.ones((2, 3)), np.eye(3)
NAN_ROW1 = np.eye(3)
NAN_ROW1[1, 2] = np.nan


def _data(**over):
    kw = dict(query_emb=Q, gallery_emb=G, query_labels=[0, 1], gallery_labels=[0, 1, 2])
    kw.update(over)
    return RetrievalData(**kw)


@pytest.mark.parametrize("over, message", [
    (dict(query_emb=np.ones(3)), "`query_emb` must be a 2-D array (n, d). Got shape (3,) instead."),
    (dict(query_emb=[[1.0, 2.0], [3.0]]), "`query_emb` must be a 2-D array (n, d) with rows of one length"),
    (dict(gallery_emb=np.ones((3, 0))), "`gallery_emb` has dimension 0 (shape (3, 0))"),
    (dict(gallery_emb=np.array([["a"] * 3] * 3)), "`gallery_emb` must hold real numbers. Got dtype <U1 instead."),
    (dict(gallery_emb=NAN_ROW1), "`gallery_emb` has NaN or inf in 1 row(s), first rows [1]"),
    (dict(query_emb=np.empty((0, 3)), query_labels=[]), "`query_emb` is empty; pass at least one query."),
    (dict(gallery_emb=np.empty((0, 3)), gallery_labels=[]), "`gallery_emb` is empty"),
    (dict(gallery_emb=np.eye(3, 4)), "`query_emb` and `gallery_emb` must have the same dimension. Got 3 and 4"),
    (dict(gallery_labels=[0, 1]), "`gallery_labels` must have one entry per row of the embeddings (3). Got 2"),
    (dict(query_labels=["a", None]), "`query_labels` has missing or unhashable values"),
    (dict(query_ids=["a", "b"]), "pass both `query_ids` and `gallery_ids`"),
    (dict(query_ids=["a", "b"], gallery_ids=[1, "1", 2]), "`gallery_ids` must be unique (compared as text)"),
    (dict(exclude=[("x", "y")]), "each `exclude` entry must be a (query values, gallery values) pair"),
    (dict(exclude=[(["c", "c"], ["c", "c"])]), "each `exclude` entry must be a (query values, gallery values)"),
    (dict(exclude=5), "each `exclude` entry must be a (query values, gallery values) pair"),
    (dict(query_emb=G, query_labels=[0, 1, 2], query_ids=[0, 1, 2], gallery_ids=[2, 1, 0], same_set=True),
     "`same_set=True` needs the queries to be the gallery row for row"),  # the same ids in another order
    (dict(same_set=True, query_ids=[0, 1], gallery_ids=[0, 1, 2]), "`same_set=True` needs the queries"),
    (dict(query_emb=G, query_labels=[0, 1, 2], same_set=True), "`same_set=True` needs the queries"),  # no ids
])
def test_every_rule_is_checked_when_built(over, message):
    with pytest.raises(InputError, match=re.escape(message)):
        _data(**over)


def test_the_checked_data_is_what_the_engine_reads():
    torch = pytest.importorskip("torch")
    q = torch.tensor(Q, requires_grad=True)  # a training loop's output: detached and copied to numpy
    exclude = [(np.array(["c", "d"]), ["c", None, "e"])]
    data = _data(query_emb=q, exclude=exclude, query_ids=["a", "b"], gallery_ids=["a", "x", "y"])
    assert isinstance(data.query_emb, np.ndarray) and data.query_emb.tolist() == Q.tolist()
    assert data.gallery_emb is G  # a valid array is held as it is, not copied
    assert isinstance(data.exclude, tuple) and len(data.exclude) == 1 and data.exclude[0][1] == ["c", None, "e"]
    assert (data.n_queries, data.n_gallery) == (2, 3)
    with pytest.raises(AttributeError):
        data.same_set = True  # frozen: checked once, never changed after


def test_same_rows_without_ids_warn_at_the_callers_line():
    emb, labels = np.eye(3), [0, 1, 2]
    for call in (lambda: RetrievalData(emb, emb, labels, labels),          # built directly
                 lambda: recall_at_k(emb, emb, labels, labels, ks=[1]),     # through a public function
                 lambda: Scorer(ks=[1])(emb, emb, labels, labels)):         # through a Scorer
        with pytest.warns(UserWarning, match="same rows and no ids were passed") as caught:
            call()
        assert [w.filename for w in caught] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RetrievalData(emb, emb, labels, labels, same_set=False)  # the caller said what they are: no warning
        RetrievalData(emb, emb, labels, labels, query_ids=labels, gallery_ids=labels)


@pytest.mark.parametrize("values, bad_rows", [
    ([[3e38, 3e38, 3e38], [3e38, 3e38, 3e38]], None),         # finite, though their float32 sum overflows
    ([[np.inf, 0, 0], [-np.inf, 0, 0]], [0, 1]),              # +inf and -inf: their sum is NaN, still caught
    ([[1, 2, 3], [4, 5, np.nan]], [1]),                       # a NaN
    ([[np.finfo(np.float32).max, 1, 0], [0, 1, np.inf]], [1]),  # an inf beside the largest float32
])
def test_finite_check_takes_a_sum_first_and_still_names_every_bad_row(values, bad_rows):
    emb = np.array(values, dtype=np.float32)
    if bad_rows is None:
        assert _data(query_emb=emb).query_emb.shape == (2, 3)  # accepted
        return
    with pytest.raises(InputError, match=re.escape(f"`query_emb` has NaN or inf in {len(bad_rows)} row(s), "
                                                   f"first rows {bad_rows}")):
        _data(query_emb=emb)
