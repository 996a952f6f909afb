"""Text <-> image retrieval (recallk.score.crossmodal): hand-computed toys, the peers' own code as oracles
(CLIP_benchmark's zero-shot retrieval path, open_clip's ``get_clip_metrics``), image-cluster intervals and the
bad-input table."""

from __future__ import annotations

import numpy as np
import pytest

from extras import extra
from recallk.errors import InputError
from recallk.score.crossmodal import crossmodal_intervals, crossmodal_metrics, crossmodal_per_query
from recallk.stats.resample import bootstrap_means, percentile_interval

IMAGES = np.eye(3)


@pytest.mark.parametrize("texts, captions, t2i, i2t", [
    # each caption nearest its own image: every query hits at rank 1 in both directions
    ([[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0, 0, 1]], [0, 0, 1, 2],
     {"recall@1": 1.0, "mrr": 1.0, "mean_rank": 1.0, "median_rank": 1.0, "num_queries": 4},
     {"recall@1": 1.0, "mrr": 1.0, "map": 1.0, "mean_rank": 1.0, "median_rank": 1.0, "num_queries": 3}),
    # caption 1 describes image 0 but lies near image 1: its image ranks 2nd (text->image); image->text still hits
    # at rank 1 for every image (image 0 with caption 0, image 1 with caption 2, image 2 with caption 3), and
    # image 0's map is 1.0: its captions 0 and 1 rank 1st and 2nd among the four texts (caption 1's 0.1 beats 0)
    ([[1, 0, 0], [0.1, 1, 0], [0, 1, 0], [0, 0, 1]], [0, 0, 1, 2],
     {"recall@1": 0.75, "mrr": 0.875, "mean_rank": 1.25, "median_rank": 1.0, "num_queries": 4},
     {"recall@1": 1.0, "mrr": 1.0, "map": 1.0, "mean_rank": 1.0, "median_rank": 1.0, "num_queries": 3}),
    # image 2 has no caption: it is no image->text query (num_queries 2); its texts' gallery keeps it
    ([[1, 0, 0], [0, 1, 0]], [0, 1],
     {"recall@1": 1.0, "mrr": 1.0, "mean_rank": 1.0, "median_rank": 1.0, "num_queries": 2},
     {"recall@1": 1.0, "mrr": 1.0, "map": 1.0, "mean_rank": 1.0, "median_rank": 1.0, "num_queries": 2}),
    # an exact tie: caption 0 is equally close to images 0 and 1; ties rank by gallery index, so image 0 (its
    # own) first; caption 1 (image 1's) ties the same way and ranks its image 2nd
    ([[1, 1, 0], [1, 1, 0], [0, 0, 1]], [0, 1, 2],
     {"recall@1": 2 / 3, "mrr": (1 + 0.5 + 1) / 3, "mean_rank": 4 / 3, "median_rank": 1.0, "num_queries": 3},
     {"recall@1": 2 / 3, "mrr": (1 + 0.5 + 1) / 3, "map": (1 + 0.5 + 1) / 3, "mean_rank": 4 / 3,
      "median_rank": 1.0, "num_queries": 3}),
])
def test_toy_sets(texts, captions, t2i, i2t):
    got = crossmodal_metrics(IMAGES, np.asarray(texts, dtype=float), captions, ks=[1])
    assert got == {"text_to_image": pytest.approx(t2i, abs=1e-15), "image_to_text": pytest.approx(i2t, abs=1e-15)}


def test_the_median_rank_is_open_clips_rounded_down_median():
    # first ranks 1 and 4: the median 2.5 is reported as 2 (floor(median of 0-based) + 1, open_clip's rule)
    images = np.array([[1.0, 0, 0, 0], [0.9, 0.1, 0, 0], [0.8, 0.2, 0, 0], [0.7, 0.3, 0, 0]])
    texts = np.array([[1.0, 0, 0, 0], [1.0, -0.05, 0, 0]])
    got = crossmodal_metrics(images, texts, [0, 3], ks=[1])["text_to_image"]
    assert (got["mean_rank"], got["median_rank"]) == (2.5, 2.0)


def paired_set(seed: int, n_images: int, per_image: int, dim: int = 32, noise: float = 1.2):
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(n_images, dim)).astype(np.float32)
    captions = np.repeat(np.arange(n_images), per_image)
    texts = (images[captions] + noise * rng.normal(size=(captions.size, dim))).astype(np.float32)
    return images, texts, captions


def normalized(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def smallest_gap_at(scores: np.ndarray, ks) -> float:
    """The smallest gap, over queries and K, between the K-th and (K+1)-th largest score (float64)."""
    ordered = -np.sort(-scores, axis=1)
    return float(min(np.min(ordered[:, k - 1] - ordered[:, k]) for k in ks))


class _Lookup:
    """A CLIP-like model for CLIP_benchmark's ``evaluate``: the 'images' and 'tokens' it is given are row
    numbers, and it returns those rows of fixed embeddings."""

    def __init__(self, torch, images: np.ndarray, texts: np.ndarray) -> None:
        self.images, self.texts = torch.from_numpy(images), torch.from_numpy(texts)

    def encode_image(self, rows):
        return self.images[rows]

    def encode_text(self, rows):
        return self.texts[rows]


def clip_benchmark_run(images: np.ndarray, texts: np.ndarray, captions: np.ndarray, ks) -> dict[str, float]:
    """CLIP_benchmark 1.6.2's own zero-shot retrieval path (``evaluate``) on fixed embeddings: a dataloader of
    (image rows, caption lists) batches and a tokenizer mapping each caption to its row."""
    torch = extra("torch", "torch")
    retrieval = extra("clip_benchmark.metrics.zeroshot_retrieval", "peers")
    per_image = [[f"{row}" for row in np.flatnonzero(captions == i)] for i in range(len(images))]
    batches = [(torch.arange(a, min(a + 64, len(images))), per_image[a:a + 64]) for a in range(0, len(images), 64)]

    def tokenizer(strings):
        return torch.tensor([int(s) for s in strings])

    return retrieval.evaluate(_Lookup(torch, images, texts), batches, tokenizer, "cpu", amp=False,
                              recall_k_list=list(ks))


def near_ties(scores: np.ndarray, ks, gap: float = 1e-5) -> np.ndarray:
    """Queries (rows) whose K-th and (K+1)-th largest scores (float64) are within ``gap`` at some K: there
    float32 rounding may order two items either way."""
    ordered = -np.sort(-scores, axis=1)
    return np.flatnonzero(np.any([ordered[:, k - 1] - ordered[:, k] < gap for k in ks], axis=0))


def test_hit_counts_equal_clip_benchmarks_where_no_ties():
    # 200 images x 5 captions; CLIP_benchmark's "image_retrieval" is text -> image, "text_retrieval" image -> text
    torch = extra("torch", "torch")
    retrieval = extra("clip_benchmark.metrics.zeroshot_retrieval", "peers")
    images, texts, captions = paired_set(0, 200, 5, noise=2.5)
    ks = (1, 5, 10)
    ours = crossmodal_per_query(images, texts, captions, ks=ks)
    exact = normalized(texts.astype(np.float64)) @ normalized(images.astype(np.float64)).T
    scores = torch.from_numpy(normalized(texts)) @ torch.from_numpy(normalized(images)).T
    positive = torch.zeros_like(scores, dtype=torch.bool)
    positive[torch.arange(len(texts)), torch.from_numpy(captions)] = True
    for direction, s, p, e in (("text_to_image", scores, positive, exact), ("image_to_text", scores.T, positive.T,
                                                                           exact.T)):
        close = near_ties(e, ks)
        assert close.size < 0.01 * len(e)  # the few queries named as tie-affected
        for k in ks:  # their per-query path (recall_at_k, as evaluate() batches it)
            theirs = (retrieval.recall_at_k(s, p, k) > 0).numpy()
            differ = np.flatnonzero(theirs != ours.values[direction][f"recall@{k}"].astype(bool))
            assert set(differ) <= set(close), (direction, k)
    # and their whole evaluate() path, whose means (float32, of 1,000 captions and 200 images) give the counts
    theirs = clip_benchmark_run(images, texts, captions, ks)
    hits = {}
    for k in ks:
        hits[k] = [int(np.sum(ours.values[d][f"recall@{k}"])) for d in ("text_to_image", "image_to_text")]
        assert round(theirs[f"image_retrieval_recall@{k}"] * 1000) == hits[k][0]
        assert round(theirs[f"text_retrieval_recall@{k}"] * 200) == hits[k][1]
    assert 0 < hits[1][0] < 1000 and 0 < hits[1][1] < 200  # the set is neither trivial nor hopeless


def test_where_ties_occur_only_the_named_queries_can_differ_from_clip_benchmark():
    # image 1 is an exact copy of image 0, and captions 5..9 (image 1's) copy captions 0..4: every caption of
    # either image ties between the two images, and every such image ties between the two caption sets
    torch = extra("torch", "torch")
    retrieval = extra("clip_benchmark.metrics.zeroshot_retrieval", "peers")
    images, texts, captions = paired_set(1, 60, 5)
    images[1] = images[0]
    texts[5:10] = texts[0:5]
    ours = crossmodal_per_query(images, texts, captions, ks=[1, 5])
    scores = torch.from_numpy(normalized(texts)) @ torch.from_numpy(normalized(images)).T
    positive = torch.zeros_like(scores, dtype=torch.bool)
    positive[torch.arange(len(texts)), torch.from_numpy(captions)] = True
    for k in (1, 5):
        theirs_t2i = (retrieval.recall_at_k(scores, positive, k) > 0).numpy()
        theirs_i2t = (retrieval.recall_at_k(scores.T, positive.T, k) > 0).numpy()
        for direction, theirs in (("text_to_image", theirs_t2i), ("image_to_text", theirs_i2t)):
            differ = np.flatnonzero(theirs != ours.values[direction][f"recall@{k}"].astype(bool))
            assert set(differ) <= set(np.flatnonzero(ours.tie_sensitive[direction])), (direction, k)
    assert set(np.flatnonzero(ours.tie_sensitive["text_to_image"])) == set(range(10))
    assert set(np.flatnonzero(ours.tie_sensitive["image_to_text"])) == {0, 1}


def test_ranks_equal_open_clips_get_clip_metrics_on_a_paired_set():
    torch = extra("torch", "torch")
    train = extra("open_clip_train.train", "open-clip")
    images, texts, captions = paired_set(2, 150, 1, noise=1.5)
    image_n, text_n = normalized(images), normalized(texts)
    scores = text_n.astype(np.float64) @ image_n.astype(np.float64).T
    for s in (scores, scores.T):  # a first rank counts the items above the positive: no other item within 1e-6
        others = np.abs(s - np.diag(s)[:, None]) + np.eye(len(s))
        assert others.min() > 1e-6
    theirs = train.get_clip_metrics(torch.from_numpy(image_n), torch.from_numpy(text_n), 1.0)
    ours = crossmodal_metrics(images, texts, captions, ks=[1, 5, 10])
    for direction in ("text_to_image", "image_to_text"):
        # theirs is mean(0-based) + 1, rounded twice; ours the correctly rounded mean of the 1-based ranks
        assert ours[direction]["mean_rank"] == pytest.approx(theirs[f"{direction}_mean_rank"], rel=4e-16, abs=0)
        assert round(ours[direction]["mean_rank"] * 150) == round(theirs[f"{direction}_mean_rank"] * 150)
        assert ours[direction]["median_rank"] == theirs[f"{direction}_median_rank"]
        for k in (1, 5, 10):
            assert ours[direction][f"recall@{k}"] == theirs[f"{direction}_R@{k}"]
    assert 1 < ours["text_to_image"]["mean_rank"] < 75  # neither perfect nor random


def test_text_to_image_intervals_resample_images_not_captions():
    # the same 100 images with 1 caption each, then with each caption repeated 5 times: the copies add no
    # information, and resampling images gives the very same interval; resampling captions would not
    images, texts, captions = paired_set(3, 100, 1, noise=1.5)
    once = crossmodal_intervals(crossmodal_per_query(images, texts, captions, ks=[1]), 2000, seed=0)
    repeat = np.repeat(np.arange(100), 5)
    five = crossmodal_intervals(crossmodal_per_query(images, texts[repeat], captions[repeat], ks=[1]), 2000, seed=0)
    assert five["text_to_image"]["recall@1"] == once["text_to_image"]["recall@1"]  # sums of 0/1: exact
    for key, interval in once["text_to_image"].items():  # sums of 5 equal floats round apart in the last bit
        assert five["text_to_image"][key] == pytest.approx(interval, rel=1e-12)
    low, high = once["text_to_image"]["recall@1"]
    assert 0 < low < high < 1
    hits = crossmodal_per_query(images, texts[repeat], captions[repeat], ks=[1]).values["text_to_image"]["recall@1"]
    by_caption = percentile_interval(bootstrap_means({"r": hits}, 2000, 0)["r"], 0.95)
    assert by_caption[1] - by_caption[0] < 0.6 * (high - low)  # captions as independent: far too narrow


@pytest.mark.parametrize("captions, match", [
    ([0, 1], r"one image position per caption: 3 captions\. Got shape \(2,\)"),  # one caption short
    ([0, 1, 2.0], r"must be integer positions .* Got dtype float64"),  # floats, not positions
    ([0, 1, 3], r"must lie in \[0, 3\) .* Got 3 at caption 2 \(1 captions outside\)"),  # no image 3
    ([-1, 1, 2], r"Got -1 at caption 0"),  # a negative position
])
def test_bad_caption_images(captions, match):
    with pytest.raises(InputError, match=match):
        crossmodal_metrics(IMAGES, np.eye(3), captions)
