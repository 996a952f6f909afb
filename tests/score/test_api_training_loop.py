"""The Python API in a training loop: the hostile cases of issue "Nothing silently wrong" (class ``api``).

Each failed before (a raise that kills the loop, a silent recall@1 of 1.0, a RuntimeError from a
tensor that requires grad) and passes now.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from PIL import Image

from extras import extra
from recallk import evaluate, recall_at_k
from recallk.errors import InputError
from recallk.score.metrics import first_positive_ranks, retrieval_metrics, retrieval_summary

Q = np.array([[1.0, 0.0], [0.0, 1.0]])
G = np.array([[1.0, 0.1], [0.1, 1.0], [0.7, 0.7]])


@pytest.mark.parametrize("kwargs", [
    dict(query_labels=["a", "b"], gallery_labels=["a", "b", "c"], exclude=[(["a", "b"], ["a", "b", "c"])]),
    # every positive shares the query's value (the label itself); no query label in the gallery is an error
    dict(query_labels=["a", "a"], gallery_labels=["a", "b", "c"], query_ids=["p", "q"], gallery_ids=["p", "q", "r"],
         exclude=[(["c", "c"], ["c", "c", "d"])]),  # every positive shares the query's camera
    dict(query_labels=["a", "b"], gallery_labels=["a", "b", "c"], query_ids=["p", "q"],
         gallery_ids=["p", "q", "r"]),  # each query's only positive is itself
])
def test_every_query_excluded_gives_nan_and_a_warning(kwargs):
    with pytest.warns(RuntimeWarning, match="every one of the 2 queries is excluded.*returning NaN"):
        got = retrieval_metrics(Q, G, ks=[1, 2], **kwargs)
    assert list(got) == ["recall@1", "recall@2", "precision@1", "precision@2", "r_precision", "map@r", "map", "mrr"]
    assert all(np.isnan(v) for v in got.values())
    with pytest.warns(RuntimeWarning):
        summary = retrieval_summary(Q, G, ks=[1], **{k: v for k, v in kwargs.items() if k != "exclude"},
                                    exclude=kwargs.get("exclude", ()))
    assert np.isnan(summary["recall@1"]) and summary["num_queries"] == 0 and summary["num_excluded_queries"] == 2


def test_the_stage_still_refuses_every_query_excluded():
    from recallk.score.metrics import rank, summarize
    from recallk.score.retrieval_data import RetrievalData
    from recallk.score.settings import ScoreSettings

    settings = ScoreSettings(ks=(1,), metrics=("recall",))
    ranking = rank(RetrievalData(Q, G, ["a", "b"], ["a", "b", "c"], exclude=[(["a", "b"], ["a", "b", "c"])]),
                   settings)  # every positive excluded
    with pytest.raises(InputError, match="every one of the 2 queries is excluded.*Put same-label images"):
        summarize(ranking, settings)


def test_same_rows_as_queries_and_gallery_without_ids_warn():
    emb = np.random.default_rng(0).normal(size=(6, 3))
    labels = [0, 0, 1, 1, 2, 2]
    with pytest.warns(UserWarning, match="same rows and no ids were passed.*recall@1 is 1.0"):
        assert recall_at_k(emb, emb, labels, labels, ks=[1]) == {"recall@1": 1.0}
    with pytest.warns(UserWarning, match="same rows"):
        recall_at_k(emb, emb.copy(), labels, labels, ks=[1])  # equal rows, another array
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ids = np.arange(6)
        recall_at_k(emb, emb, labels, labels, ks=[1], query_ids=ids, gallery_ids=ids)  # ids: no warning
        recall_at_k(emb[:3], emb, labels[:3], labels, ks=[1])  # different sets: no warning


def test_the_same_pil_object_in_both_lists_is_the_same_image():
    red, near, blue = (Image.new("RGB", (4, 4), c) for c in [(200, 10, 10), (190, 20, 10), (10, 10, 200)])

    def colour(images):
        return np.array([np.asarray(im, dtype=np.float32).mean(axis=(0, 1)) for im in images])

    # red never retrieves itself: its nearest other is `near` (label y), then blue (x)
    assert evaluate([red], [red, near, blue], ["x"], ["x", "y", "x"], encoder_fn=colour, ks=[1, 2]) == \
        {"recall@1": 0.0, "recall@2": 1.0}


def test_a_tensor_that_requires_grad_is_detached():
    torch = extra("torch", "torch")  # skipped without the torch extra (an error under make test)
    q = torch.tensor(Q, requires_grad=True)
    g = torch.tensor(G, requires_grad=True)
    assert recall_at_k(q, g, ["a", "b"], ["a", "b", "c"], ks=[1]) == \
        recall_at_k(Q, G, ["a", "b"], ["a", "b", "c"], ks=[1])

    def encoder(images):  # a training loop's encoder output: requires grad
        return torch.ones(len(images), 2, requires_grad=True) * torch.arange(1, len(images) + 1)[:, None]

    imgs = [Image.new("RGB", (2, 2)) for _ in range(3)]
    assert evaluate(imgs[:1], imgs[1:], ["a"], ["a", "b"], encoder_fn=encoder, ks=[1]) == {"recall@1": 1.0}


def test_first_positive_ranks_as_documented():
    # q0 (a): gallery order by cosine is g0 (a), g2, g1; q1 (b): g1 (b), g2, g0
    first, positives = first_positive_ranks(Q, G, ["a", "b"], ["a", "b", "c"])
    assert first.tolist() == [0, 0] and positives.tolist() == [1, 1]
    first, positives = first_positive_ranks(Q, G, ["c", "z"], ["a", "b", "c"])
    assert first.tolist() == [1, -1] and positives.tolist() == [1, 0]  # -1 exactly where there is no positive
    assert "0-based rank" in first_positive_ranks.__doc__ and "-1 when the query has no positive" in \
        " ".join(first_positive_ranks.__doc__.split())
