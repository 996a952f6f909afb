"""recall@K engine (recallk.score.similarity) and the Python API (stages.score).

Toy cases pin the documented conventions (cosine, tie rule, self-match,
exclusion); a brute-force oracle cross-checks the blocked implementation on
seeded synthetic data.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from conftest import save_image
from recallk.score.metrics import first_positive_ranks, recall_at_k, retrieval_summary
from recallk.score.similarity import cosine_block, l2_normalize
from recallk import evaluate, format_report


# --------------------------------------------------------------------------- oracle

def oracle(q, g, q_labels, g_labels, ks, q_ids=None, g_ids=None):
    """Brute force: python sort per query, tie -> smaller gallery index, self skipped."""
    sims = cosine_block(l2_normalize(q), l2_normalize(g).astype(np.float64).T)  # the engine's similarity
    ql, gl = [str(x) for x in q_labels], [str(x) for x in g_labels]
    ranks, n_pos, tops = [], [], []
    for i in range(len(q)):
        cand = [j for j in range(len(g)) if q_ids is None or g_ids is None or g_ids[j] != q_ids[i]]
        order = sorted(cand, key=lambda j: (-sims[i, j], j))
        pos = [r for r, j in enumerate(order) if gl[j] == ql[i]]
        ranks.append(pos[0] if pos else -1)
        n_pos.append(len(pos))
        tops.append(order)
    kept = [i for i in range(len(q)) if n_pos[i] > 0]
    recall = {f"recall@{k}": sum(any(gl[j] == ql[i] for j in tops[i][:min(k, len(tops[i]))]) for i in kept)
              / len(kept) for k in ks}
    return recall, np.array(ranks), np.array(n_pos), len(kept)


def make_case(kind, seed):
    """Seeded synthetic query/gallery sets exercising one feature each."""
    rng = np.random.default_rng(seed)
    nq, ng, d = 17, 29, 6
    q_ids = g_ids = None
    q, g = rng.normal(size=(nq, d)), rng.normal(size=(ng, d))
    ql, gl = rng.integers(0, 5, nq), rng.integers(0, 5, ng)
    if kind == "duplicates":  # exact ties: repeated gallery rows, some queries equal to gallery rows
        g[1::3] = g[0:-1:3][: len(g[1::3])]
        q[:5] = g[:5]
    elif kind == "grid":  # integer vectors in {-1, 0, 1}: many equal cosines
        q, g = rng.integers(-1, 2, (nq, 3)), rng.integers(-1, 2, (ng, 3))
    elif kind == "leave_one_out":  # queries == gallery, self-match excluded by id
        q, ql = g, gl
        q_ids = g_ids = [f"img{j:03d}" for j in range(ng)]
    elif kind == "overlap_grid":  # partial overlap by id plus ties
        g = rng.integers(-1, 2, (ng, 3))
        q, ql = g[5:5 + nq], gl[5:5 + nq]
        g_ids = list(range(100, 100 + ng))
        q_ids = g_ids[5:5 + nq]
    elif kind == "absent_labels":  # labels 5..7 never occur in the gallery -> excluded queries
        ql = rng.integers(0, 8, nq)
    elif kind == "string_labels":
        ql = np.array([f"cls{x}" for x in ql])
        gl = [f"cls{x}" for x in gl]
    elif kind == "near_ties":  # 256-d, gallery = one direction + 1e-6 noise: cosines differ by ~1e-7,
        # below float32 product error, so only the exact float64 re-decision orders them right
        base = rng.normal(size=256)
        g = base + rng.normal(scale=1e-6, size=(ng, 256))
        q = base + rng.normal(scale=1e-6, size=(nq, 256))
    elif kind == "tiny_gallery":  # K far above the gallery size
        g, gl = g[:4], np.array([0, 1, 0, 2])
        ql = rng.integers(0, 3, nq)
    return q, g, ql, gl, q_ids, g_ids


KINDS = ["gaussian", "duplicates", "grid", "leave_one_out", "overlap_grid", "absent_labels", "string_labels",
         "near_ties", "tiny_gallery"]
KS = [1, 2, 5, 10, 40]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", KINDS)
def test_matches_brute_force(kind, seed):
    q, g, ql, gl, q_ids, g_ids = make_case(kind, seed)
    recall, ranks, n_pos, n_kept = oracle(q, g, ql, gl, KS, q_ids, g_ids)

    got_rank, got_pos = first_positive_ranks(q, g, ql, gl, q_ids, g_ids)
    np.testing.assert_array_equal(got_rank, ranks)
    np.testing.assert_array_equal(got_pos, n_pos)
    assert recall_at_k(q, g, ql, gl, KS, q_ids, g_ids) == pytest.approx(recall, abs=0, rel=1e-12)
    summary = retrieval_summary(q, g, ql, gl, KS, q_ids, g_ids)
    assert {k: summary[k] for k in recall} == pytest.approx(recall, abs=0, rel=1e-12)
    assert summary["num_queries"] == n_kept
    assert summary["num_excluded_queries"] == len(q) - n_kept
    assert (summary["num_gallery"], summary["embedding_dim"]) == np.asarray(g).shape


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", KINDS)
def test_tiny_memory_bound_gives_same_result(kind, seed):
    # 0.001 MB -> one query per block; the memory bound must not change any number.
    q, g, ql, gl, q_ids, g_ids = make_case(kind, seed)
    default = first_positive_ranks(q, g, ql, gl, q_ids, g_ids)
    tiny = first_positive_ranks(q, g, ql, gl, q_ids, g_ids, max_memory_mb=0.001)
    np.testing.assert_array_equal(tiny[0], default[0])
    np.testing.assert_array_equal(tiny[1], default[1])
    assert (retrieval_summary(q, g, ql, gl, KS, q_ids, g_ids, max_memory_mb=0.001)
            == retrieval_summary(q, g, ql, gl, KS, q_ids, g_ids))


# --------------------------------------------------------------------------- toy cases

E = np.eye(3)

@pytest.mark.parametrize("g, gl, expected", [
    # negative (index 0) and positive (index 1) both at cosine 1: the negative ranks first -> miss at K=1
    ([[1, 0, 0], [2, 0, 0]], ["neg", "pos"], {"recall@1": 0.0, "recall@2": 1.0}),
    # same tie, positive first in gallery order -> hit at K=1
    ([[2, 0, 0], [1, 0, 0]], ["pos", "neg"], {"recall@1": 1.0, "recall@2": 1.0}),
    # tie at cosine 0 behind a better negative: neg(1.0) > neg(0) = pos(0) by index -> rank 2
    ([[1, 0, 0], [0, 1, 0], [0, 0, 1]], ["neg", "neg", "pos"], {"recall@1": 0.0, "recall@2": 0.0}),
    # zero vector has similarity 0 to everything: ties the orthogonal positive and wins by index
    ([[0, 0, 0], [0, 1, 0]], ["neg", "pos"], {"recall@1": 0.0, "recall@2": 1.0}),
])
def test_tie_rule(g, gl, expected):
    assert recall_at_k([[1, 0, 0]], g, ["pos"], gl, ks=[1, 2]) == expected


def test_zero_vectors_have_similarity_zero_and_no_nan():
    # query 0 is a zero vector: all similarities 0, so its first positive is the first positive by index.
    q = [[0.0, 0.0], [1.0, 0.0]]
    g = [[1.0, 0.0], [0.0, 0.0], [-1.0, 0.0]]
    rank, n_pos = first_positive_ranks(q, g, ["b", "c"], ["a", "b", "c"])
    # q0 (label b): all tie at 0 -> positive g1 at rank 1; q1 (label c): -1 is last -> rank 2
    assert rank.tolist() == [1, 2] and n_pos.tolist() == [1, 1]
    assert not np.isnan(l2_normalize(np.zeros((2, 3)))).any()


def test_self_match_excluded_even_when_k_exceeds_gallery():
    # The seed template flaw: with K >= n_gallery its masked self (-inf) re-enters the top K.
    g = [[1, 0], [0, 1], [1, 1]]
    gl, ids = ["lonely", "b", "b"], ["x", "y", "z"]
    summary = retrieval_summary(g, g, gl, gl, ks=[1, 3, 10], query_ids=ids, gallery_ids=ids)
    # "x" only matches itself -> excluded, not a hit at K=10 although only 2 items remain retrievable.
    # y finds z first; z ties x and y (cosine 0.707) and x wins by index -> y at rank 1.
    assert summary["num_excluded_queries"] == 1 and summary["num_queries"] == 2
    assert summary == {"recall@1": 0.5, "recall@3": 1.0, "recall@10": 1.0, "num_queries": 2,
                       "num_excluded_queries": 1, "num_gallery": 3, "embedding_dim": 2,
                       # z's hit at K=1 depends on the tie with x: y would win it under the opposite rule
                       "tie_sensitive@1": 1, "tie_sensitive@3": 0, "tie_sensitive@10": 0}
    rank, n_pos = first_positive_ranks(g, g, gl, gl, ids, ids)
    assert rank.tolist() == [-1, 0, 1] and n_pos.tolist() == [0, 1, 1]
    # a lone query whose only same-label item is itself: every query excluded -> error, never a hit
    with pytest.raises(ValueError, match="excluded"):
        recall_at_k(g[:1], g, gl[:1], gl, ks=[10], query_ids=ids[:1], gallery_ids=ids)


def test_rank_never_points_at_own_image():
    # Query = gallery item 0; its positive (index 3) is the least similar -> last of the 3 retrievable
    # items, rank n_gallery - 2 = 2 (its own image, at similarity 1, does not take a slot).
    g = np.array([[1.0, 0.0], [0.9, 0.1], [0.5, 0.5], [-1.0, 0.0]])
    gl = ["a", "n1", "n2", "a"]
    rank, n_pos = first_positive_ranks(g[:1], g, ["a"], gl, query_ids=[0], gallery_ids=[0, 1, 2, 3])
    assert rank.tolist() == [2] and n_pos.tolist() == [1]
    out = recall_at_k(g[:1], g, ["a"], gl, ks=[2, 3, 4], query_ids=[0], gallery_ids=[0, 1, 2, 3])
    assert out == {"recall@2": 0.0, "recall@3": 1.0, "recall@4": 1.0}
    # without ids it is a different image: self-similarity 1 counts as the top hit
    assert first_positive_ranks(g[:1], g, ["a"], gl)[0].tolist() == [0]


# --------------------------------------------------------------------------- invariances

@pytest.mark.parametrize("scale", [1e-3, 0.5, 7.0, 1e4])
def test_positive_scaling_is_invariant(scale):
    q, g, ql, gl, _, _ = make_case("gaussian", 3)
    assert recall_at_k(q * scale, g / scale, ql, gl, KS) == recall_at_k(q, g, ql, gl, KS)


@pytest.mark.parametrize("scale", [1e-60, 1e60])
def test_extreme_float64_scale_is_invariant(scale):
    # Finite float64 rows at any scale are documented as accepted ("Any scale"). q0 = g1 (label b) -> rank 0;
    # q1 = g0 (label a) so its positive g1 is second -> rank 1; recall@1 = 0.5. A float32 cast before
    # normalising would turn 1e60 into inf (NaN similarities) and 1e-60 into zero vectors (all ties).
    q, g = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[0.0, 1.0], [1.0, 0.0]])
    with np.errstate(all="ignore"):
        assert first_positive_ranks(q * scale, g * scale, ["b", "b"], ["a", "b"])[0].tolist() == [0, 1]
        assert recall_at_k(q * scale, g * scale, ["b", "b"], ["a", "b"], ks=[1]) == {"recall@1": 0.5}


@pytest.mark.parametrize("seed", range(3))
def test_recall_non_decreasing_in_k(seed):
    q, g, ql, gl, _, _ = make_case("grid", seed)
    values = list(recall_at_k(q, g, ql, gl, ks=range(1, 31)).values())
    assert all(a <= b for a, b in zip(values, values[1:]))
    assert values[-1] == 1.0  # K >= gallery size: every non-excluded query is a hit


def test_ks_order_preserved():
    q, g, ql, gl, _, _ = make_case("gaussian", 0)
    assert list(recall_at_k(q, g, ql, gl, ks=[10, 1, 5])) == ["recall@10", "recall@1", "recall@5"]
    assert list(retrieval_summary(q, g, ql, gl, ks=(5, 2))) == [
        "recall@5", "recall@2", "num_queries", "num_excluded_queries", "tie_sensitive@5", "tie_sensitive@2",
        "num_gallery", "embedding_dim"]


def test_labels_compared_as_strings():
    q, g = [[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]
    # int 1 in the query, "1" in the gallery at the top -> hit
    assert recall_at_k(q, g, [1], ["1", "2"], ks=[1]) == {"recall@1": 1.0}
    assert recall_at_k(q, g, np.array(["1"]), np.array([1, 2]), ks=[1]) == {"recall@1": 1.0}


# --------------------------------------------------------------------------- errors

def _kwargs(**over):
    kw = dict(query_emb=np.ones((2, 3)), gallery_emb=np.eye(3), query_labels=[0, 1], gallery_labels=[0, 1, 2],
              ks=[1])
    kw.update(over)
    return kw


BAD = np.eye(3)
BAD[1, 2] = np.nan
INF = np.eye(3)
INF[2, 0] = np.inf

@pytest.mark.parametrize("kwargs, match", [
    (_kwargs(ks=[0]), "positive integers"),  # zero
    (_kwargs(ks=[1, -5]), "positive integers"),  # negative
    (_kwargs(ks=[1.0]), "positive integers"),  # float, even integral
    (_kwargs(ks=[True]), "positive integers"),  # bool is not a count
    (_kwargs(ks=[]), "positive integers"),  # empty
    (_kwargs(ks="5"), "positive integers"),  # a string, not a list
    (_kwargs(query_emb=np.ones(3), query_labels=[0, 1, 2]), "2-D"),  # 1-D embeddings
    (_kwargs(gallery_emb=np.eye(4), gallery_labels=[0, 1, 2, 3]), "same dimension"),  # 3 vs 4
    (_kwargs(gallery_emb=BAD), r"NaN or inf in 1 row\(s\), first rows \[1\]"),  # NaN row named
    (_kwargs(gallery_emb=INF), r"first rows \[2\]"),  # inf row named
    (_kwargs(query_emb=np.full((2, 3), np.nan)), r"`query_emb` has NaN or inf in 2 row\(s\), first rows \[0, 1\]"),
    (_kwargs(gallery_emb=np.empty((0, 3)), gallery_labels=[]), "gallery_emb` is empty"),
    (_kwargs(query_emb=np.empty((0, 3)), query_labels=[]), "query_emb` is empty"),
    (_kwargs(query_labels=[0]), "query_labels` must have one entry per row"),  # 1 label for 2 rows
    (_kwargs(gallery_labels=[0, 1]), "gallery_labels` must have one entry per row"),
    (_kwargs(query_ids=["a", "b"], gallery_ids=["a", "a", "c"]), "gallery_ids` must be unique"),
    (_kwargs(query_labels=["x", "y"]), "every one of the 2 queries is excluded"),  # no label in the gallery
])
def test_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        retrieval_summary(**kwargs)
    with pytest.raises(ValueError, match=match):
        recall_at_k(**kwargs)


# --------------------------------------------------------------------------- evaluate()

def mean_colour(images):
    return np.array([np.asarray(im, dtype=np.float32).mean(axis=(0, 1)) for im in images])


def flat_pixels(images):
    return np.array([np.asarray(im.resize((4, 4)), dtype=np.float32).ravel() for im in images])


def _solid(path, rgb):
    Image.new("RGB", (8, 8), rgb).save(path)
    return str(path)


def test_evaluate_equals_recall_at_k(tmp_path):
    paths = [str(save_image(tmp_path / f"{i}.png", seed=i)) for i in range(12)]
    labels = [i % 3 for i in range(12)]
    qp, ql, gp, gl = paths[:5], labels[:5], paths[3:], labels[3:]  # paths 3 and 4 overlap
    emb = {p: e for p, e in zip(paths, flat_pixels([Image.open(p).convert("RGB") for p in paths]))}
    expected = recall_at_k(np.array([emb[p] for p in qp]), np.array([emb[p] for p in gp]), ql, gl, KS,
                           query_ids=qp, gallery_ids=gp)
    assert evaluate(qp, ql, gp, gl, flat_pixels, ks=KS) == expected


def test_evaluate_self_match_by_path(tmp_path):
    red = _solid(tmp_path / "red.png", (200, 10, 10))
    near = _solid(tmp_path / "near.png", (190, 20, 10))
    blue = _solid(tmp_path / "blue.png", (10, 10, 200))
    gallery, gl = [red, near, blue], ["x", "y", "x"]
    # red's own file is skipped: nearest is "near" (label y) -> miss at 1, blue found at 2
    assert evaluate([red], ["x"], gallery, gl, mean_colour, ks=[1, 2]) == {"recall@1": 0.0, "recall@2": 1.0}
    # a different spelling of the same path is still the same image
    rel = os.path.relpath(red)
    assert evaluate([rel], ["x"], gallery, gl, mean_colour, ks=[1]) == {"recall@1": 0.0}
    # PIL images carry no identity: the query's twin in the gallery counts as a hit
    imgs = [Image.open(p) for p in gallery]
    assert evaluate(imgs[:1], ["x"], imgs, gl, mean_colour, ks=[1, 2]) == {"recall@1": 1.0, "recall@2": 1.0}


def test_evaluate_accepts_pil_images(tmp_path):
    paths = [str(save_image(tmp_path / f"{i}.png", seed=i)) for i in range(8)]
    labels = [i % 2 for i in range(8)]
    pil = [Image.open(p).convert("RGB") for p in paths]
    assert evaluate(pil[:3], labels[:3], pil[3:], labels[3:], mean_colour, ks=[1, 3]) == \
        evaluate(paths[:3], labels[:3], paths[3:], labels[3:], mean_colour, ks=[1, 3])


def test_evaluate_applies_exif_orientation(tmp_path):
    rotated = tmp_path / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW on display
    Image.new("RGB", (20, 10), (120, 30, 30)).save(rotated, "JPEG", exif=exif)
    upright = save_image(tmp_path / "upright.png", size=(10, 20))
    seen = []

    def encoder(images):
        seen.extend(im.size for im in images)
        return mean_colour(images)

    evaluate([str(rotated)], ["a"], [str(rotated), str(upright)], ["a", "a"], encoder, ks=[1])
    assert seen == [(10, 20)] * 3


def test_evaluate_rejects_bad_ks_before_encoding(tmp_path):
    calls = []
    p = str(save_image(tmp_path / "a.png"))
    with pytest.raises(ValueError, match="positive integers"):
        evaluate([p], ["a"], [p], ["a"], lambda ims: calls.append(ims) or mean_colour(ims), ks=[0])
    assert calls == []


# --------------------------------------------------------------------------- report

def test_format_report_has_seed_block():
    q, g, ql, gl, _, _ = make_case("gaussian", 1)
    report = format_report(retrieval_summary(q, g, ql, gl, ks=[1, 5, 10]))
    lines = report.splitlines()
    for prefix in ("[evaluation]", "  num queries:", "  num gallery:   29", "  embedding_dim: 6", "[recall]",
                   "  recall@1:", "  recall@5:", "  recall@10:"):
        assert any(line.startswith(prefix) for line in lines), prefix
    assert lines.index("[evaluation]") < lines.index("[recall]")


# --------------------------------------------------------------------------- memory bound

def _peak_mib(fn) -> float:
    import tracemalloc
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_block_scratch_memory_stays_under_the_budget():
    """12,000 queries x 3,000 gallery: the full matrix would take 137 MiB in float32 alone."""
    rng = np.random.default_rng(0)
    q, g = rng.normal(size=(12000, 32)).astype(np.float32), rng.normal(size=(3000, 32)).astype(np.float32)
    ql, gl = rng.integers(0, 50, 12000), rng.integers(0, 50, 3000)
    run = lambda mb: _peak_mib(lambda: first_positive_ranks(q, g, ql, gl, max_memory_mb=mb))  # noqa: E731
    baseline = run(1e-6)  # one query per block: what remains is the O(n + m) copies (normalised inputs, labels)
    for budget in (8, 64):
        scratch = run(budget) - baseline
        assert scratch <= budget, f"{scratch:.1f} MiB of block scratch over a {budget} MiB budget"
    assert run(64) - baseline > 8  # the budget is really used: bigger blocks, not a fixed size
