"""``score.backend: torch`` on CPU torch (the GPU code path): the numpy engine's rankings and metrics, byte for byte,
on the adversarial suite at every block/tile size and shard count, on hypothesis' integer problems, through the API;
and one clear error per bad input."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from extras import extra
from ranking_cases import PROPERTY
from ranking_strategies import integer_problems
from recallk.errors import InputError
from recallk.score.metrics import Scorer, first_positive_ranks, rank, recall_at_k, retrieval_metrics
from recallk.score.passes import Pass
from recallk.score.ranking import torch_tiles as tt
from recallk.score.ranking.problem import Problem
from recallk.score.ranking.torch_api import stand_in
from recallk.score.ranking.torch_backend import TorchOptions, rank_data_torch
from recallk.score.ranking.torch_device import resolve
from recallk.score.ranking.torch_tiles import matmul_bound, near_ties
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import ScoreSettings
from recallk.score.similarity import float32_dot_error_bound
from recallk.score.values import per_query
from torch_cases import ADVERSARIAL, PASSES, adversarial_case, differences

torch = extra("torch", "torch")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", ADVERSARIAL)
def test_adversarial_suite_matches_numpy_at_every_layout(kind):
    # each kind is built to defeat float32 candidates (ties, 1-ulp gaps, overflowing buffers, exclusions, K >= M)
    assert differences(adversarial_case(kind)) == []


@PROPERTY
@given(case=integer_problems(), layout=st.sampled_from([(1, 1, 1), (2, 3, 2), (7, 7, 7), (4096, 4096, 1)]),
       which=st.sampled_from(range(len(PASSES))))
def test_integer_problems_match_numpy(case, layout, which):
    # integer embeddings in [-2, 2]: exact ties and zero rows everywhere, ids and exclusions drawn
    assume(set(case["query_labels"]) & set(case["gallery_labels"]))  # else an error (tests/score/test_properties.py)
    assert differences(case, layouts=[layout], passes=[PASSES[which]]) == []


@pytest.mark.parametrize("kind", ["duplicates", "ulp_ties", "leave_one_out", "k_above_gallery"])
def test_bfloat16_candidates_give_the_same_bytes(kind):
    # `score.matmul: bfloat16` (CPU torch has it): its wider window keeps more candidates, the re-score is the same
    assert differences(adversarial_case(kind), layouts=[(7, 7, 1), (4096, 4096, 2)], precision="bfloat16") == []


@pytest.mark.parametrize("kind", ["leave_one_out", "exclude_same"])
def test_embeddings_given_as_tensors_give_the_same_bytes(kind):
    # the embeddings handed over as torch tensors (bench/gpu_score_check.py's on-device runs; here on the CPU)
    assert differences(adversarial_case(kind), layouts=[(7, 7, 2)], as_tensors=True) == []


def test_large_k_over_many_tiles_has_no_cap():
    # K far beyond FAISS's GPU 2,048 and PML's 1,023, over a gallery wider than the default tile: every K exact
    rng = np.random.default_rng(3)
    q, g = rng.normal(size=(40, 8)), rng.normal(size=(6000, 8))
    ql, gl = rng.integers(0, 3, 40), rng.integers(0, 3, 6000)
    g[1000:1400] = g[0]  # 400 exact duplicates: ties across the tile borders
    settings = ScoreSettings(ks=(1, 1024, 2049, 4500), metrics=("recall", "precision", "map@r", "mrr"))
    want = Scorer(settings)(q, g, ql, gl)
    for options in ({}, {"shards": 3}):
        assert Scorer(replace(settings, backend="torch", device="cpu", **options))(q, g, ql, gl) == want


def test_float32_candidates_ignore_a_callers_reduced_matmul_precision():
    # torch.set_float32_matmul_precision("medium") lets oneDNN multiply float32 in bfloat16 on a CPU, outside the
    # float32 bound: the backend holds its products to IEEE float32 meanwhile and restores the caller's setting
    rng = np.random.default_rng(1)
    data = RetrievalData(rng.normal(size=(300, 512)), rng.normal(size=(900, 512)), rng.integers(0, 5, 300),
                         rng.integers(0, 5, 900))
    p = Problem.build(data)
    q, g = torch.from_numpy(p.q), torch.from_numpy(p.gp)
    rows = np.arange(300)

    def top():
        with tt.matmul_mode(torch, q.device, "float32"):
            inside = torch.backends.mkldnn.matmul.fp32_precision
            vals, cols = tt.candidates(torch, p, q, g, rows, (0, 900), tt.Keep(50, 900, "float32"))
        return inside, vals.numpy().tobytes(), cols.numpy().tobytes()

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        plain = top()
        torch.set_float32_matmul_precision("medium")
        reduced = top()
        assert torch.backends.mkldnn.matmul.fp32_precision == "bf16"  # the caller's, restored
    finally:
        torch.set_float32_matmul_precision(before)
    assert plain[0] == reduced[0] == "ieee"
    assert reduced == plain  # the same bits


def test_a_gpu_without_bfloat16_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    with pytest.raises(InputError, match=r"`score.matmul: bfloat16` needs a GPU with bfloat16; Tesla T4 has none"):
        resolve(torch, "cuda", "bfloat16")


def test_tensors_are_ranked_where_they_are():
    # the rows normalised by torch on the device give the numpy engine's bits (the same float64 steps)
    case = adversarial_case("exclude_same")
    data = RetrievalData(**case)
    q, g = torch.from_numpy(case["query_emb"]), torch.from_numpy(case["gallery_emb"])
    settings = ScoreSettings(ks=(1, 5), metrics=("recall", "precision", "map@r", "mrr"))
    numpy_metrics = Scorer(settings)(**case)
    got = rank_data_torch(data, Pass.top(5), 512, TorchOptions(), tensors=(q, g))
    want = rank_data_torch(data, Pass.top(5), 512, TorchOptions())
    np.testing.assert_array_equal(got.first_rank, want.first_rank)
    np.testing.assert_array_equal(got.ranks, want.ranks)
    torch_case = dict(case, query_emb=q, gallery_emb=g)
    assert Scorer(settings, backend="torch", device="cpu")(**torch_case) == numpy_metrics


def test_device_tensors_path_ranks_from_stand_ins():
    # what a GPU tensor gets: the data holds zero-cost stand-ins of its shape, the rows are normalised by torch
    case = adversarial_case("leave_one_out")
    q = torch.from_numpy(case["query_emb"])
    data = RetrievalData(stand_in(q), stand_in(q), case["query_labels"], case["gallery_labels"],
                         query_ids=case["query_ids"], gallery_ids=case["gallery_ids"], same_set=True)
    got = rank_data_torch(data, Pass.top(10), 512, TorchOptions(block_rows=7), tensors=(q, q))
    want = rank_data_torch(RetrievalData(**case), Pass.top(10), 512, TorchOptions())
    for field in ("n_positives", "n_retrievable", "offsets", "ranks", "first_rank", "first_rank_opposite"):
        assert getattr(got, field).tobytes() == getattr(want, field).tobytes(), field


def test_full_map_and_the_api_match_numpy():
    # full map needs every rank: the numpy engine finishes it; the public function takes backend and device
    case = adversarial_case("duplicates")
    want = retrieval_metrics(**case, ks=(1, 5))
    assert retrieval_metrics(**case, ks=(1, 5), backend="torch", device="cpu") == want


@pytest.mark.parametrize("kind", ["duplicates", "leave_one_out", "k_above_gallery"])
def test_recall_at_k_and_first_positive_ranks_take_backend_and_device(kind):
    # the two narrow public functions take the same backend and device as retrieval_metrics, with the same result
    case = adversarial_case(kind)
    assert recall_at_k(**case, ks=(1, 3), backend="torch", device="cpu") == recall_at_k(**case, ks=(1, 3))
    first, n_pos = first_positive_ranks(**case, backend="torch", device="cpu")
    want_first, want_n_pos = first_positive_ranks(**case)
    assert first.tobytes() == want_first.tobytes() and n_pos.tobytes() == want_n_pos.tobytes()


@pytest.mark.parametrize("function", [recall_at_k, first_positive_ranks])
def test_narrow_functions_keep_off_cpu_tensors_where_they_are(function):
    # tensors off the CPU are checked on their device, never copied to numpy: the meta device's missing float64
    # is the error (a copy to the host would fail on the meta tensor's missing data instead)
    q, g = torch.empty(2, 3, device="meta"), torch.empty(3, 3, device="meta")
    with pytest.raises(InputError, match=r"lacks float64"):
        function(q, g, [0, 1], [0, 1, 2], backend="torch")


@pytest.mark.parametrize("d, matmul, at_least", [
    (512, "float32", 512 * 2.0**-24),      # Higham's gamma_d: about d u
    (512, "tf32", 2 * 2.0**-11),           # inputs rounded to 10 stored bits, both sides
    (64, "bfloat16", 3 * 2.0**-8),         # inputs and the result rounded to bfloat16
])
def test_matmul_bound_covers_its_format(d, matmul, at_least):
    assert matmul_bound(d, matmul) >= at_least
    assert matmul_bound(d, "float32") >= float32_dot_error_bound(d)  # never tighter than the numpy engine's


def test_bound_holds_on_worst_case_products():
    # float32 products of unit rows never leave the certified window around the exact value
    rng = np.random.default_rng(0)
    q = rng.normal(size=(64, 512)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    g = np.abs(q) + 1e-3  # all-positive terms: no cancellation, the largest accumulation error
    g = (g / np.linalg.norm(g, axis=1, keepdims=True)).astype(np.float32)
    fast = (torch.from_numpy(np.abs(q)) @ torch.from_numpy(g).T).numpy().astype(np.float64)
    exact = np.abs(q).astype(np.float64) @ g.astype(np.float64).T
    assert np.abs(fast - exact).max() <= matmul_bound(512)


def test_only_near_ties_are_rescored():
    # a score within 2 tol of a neighbour's may be out of order (both re-scored); one farther keeps its score
    slack = 2 * matmul_bound(512)
    row = torch.tensor([[0.9, 0.9 - slack / 2, 0.5, 0.5 - 1.01 * slack, float("-inf"), float("-inf")]])
    assert near_ties(torch, row, slack).tolist() == [[True, True, False, False, False, False]]


def _settings(**fields):
    return ScoreSettings(backend="torch", **fields)


@pytest.mark.parametrize("make, fields, match", [
    # score.device: cuda on a machine torch sees no GPU on (the GPU hidden where there is one)
    (lambda: (np.ones((2, 3)), np.eye(3)), {"device": "cuda"}, r"`score.device: cuda` needs a CUDA GPU.*cpu"),
    # TF32 is a GPU format: the CPU lacks it, and a silent float32 is not what was asked
    (lambda: (np.ones((2, 3)), np.eye(3)), {"device": "cpu", "matmul": "tf32"}, r"`score.matmul: tf32`.*CPU"),
    # the two sets on two devices
    (lambda: (torch.ones(2, 3), torch.empty(3, 3, device="meta")), {},
     r"`query_emb` is on cpu and `gallery_emb` on meta"),
    # a device without float64 for the exact re-score
    (lambda: (torch.empty(2, 3, device="meta"), torch.empty(3, 3, device="meta")), {}, r"lacks float64"),
    # tensors on the CPU, the param asking for the GPU
    (lambda: (torch.ones(2, 3), torch.eye(3)), {"device": "cuda"}, r"`score.device: cuda` needs a CUDA GPU"),
])
def test_bad_device_input_is_one_clear_error(monkeypatch, make, fields, match):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    q, g = make()
    with pytest.raises(InputError, match=match):
        Scorer(_settings(**fields))(q, g, [0, 1], [0, 1, 2])


@pytest.mark.parametrize("capability, bf16, matmul, match", [
    ((7, 5), True, "tf32",
     r"`score.matmul: tf32` needs a CUDA GPU with TF32 \(compute capability 8.0 or more\); Tesla T4 has none"),
    ((8, 0), False, "bfloat16", r"`score.matmul: bfloat16` needs a GPU with bfloat16; Tesla T4 has none"),
])
def test_a_gpu_without_the_format_is_refused(monkeypatch, capability, bf16, matmul, match):
    # a GPU torch sees, but older than the format asked for (TF32 needs compute capability 8.0, as on an A100)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16)
    with pytest.raises(InputError, match=match):
        resolve(torch, "cuda", matmul)
    assert resolve(torch, "cuda", "float32") == "cuda"  # float32 needs nothing more


def test_tensors_on_another_device_than_asked_are_refused():
    # the caller's tensors live elsewhere than `score.device` says: moved by the caller, or `auto` ranks there
    q, g = torch.empty(2, 3, device="meta"), torch.empty(3, 3, device="meta")
    with pytest.raises(InputError, match=r"the embeddings are tensors on meta but `score.device` is cpu: move them "
                                         r"\(`.to\('cpu'\)`\) or set `score.device: auto`"):
        resolve(torch, "cpu", "float32", q, g)


@pytest.mark.parametrize("fields, match", [
    ({"backend": "torch", "matmul": "fp8"}, r"`matmul` must be one of float32, tf32, bfloat16. Got 'fp8'"),
    ({"backend": "torch", "shards": 0}, r"`shards` must be an integer between 1 and 4096. Got 0"),
    # the torch backend's settings with the numpy engine would be ignored
    ({"shards": 3}, r"ScoreSettings sets `shards: 3` with `backend: numpy`, but only `backend: torch` reads it"),
    ({"backend": "numpy", "matmul": "tf32", "device": "cuda"},
     r"sets `matmul: tf32` and `device: cuda` with `backend: numpy`.*reads them"),
    # engine: ray searches the shards on CPU torch in its tasks: a GPU or TF32 asked for would not run
    ({"backend": "torch", "engine": "ray", "device": "cuda"},
     r"sets `device: cuda` with `engine: ray`, but the Ray tasks search .* on CPU torch.*`engine: local`"),
    ({"backend": "torch", "engine": "ray", "matmul": "tf32", "device": "cuda"},
     r"sets `device: cuda` and `matmul: tf32` with `engine: ray`.*remove them"),
])
def test_scorer_checks_the_torch_settings(fields, match):
    with pytest.raises(InputError, match=match):
        Scorer(ScoreSettings(**fields))


@pytest.mark.ray
def test_shards_on_ray_tasks_match_numpy(ray_cluster):
    # score.engine: ray with the torch backend: each of 3 shards searched by a task of the real local cluster
    case = adversarial_case("exclude_same")
    data = RetrievalData(**case)
    settings = ScoreSettings(ks=(1, 5, 10), metrics=("recall", "precision", "map@r", "mrr"), backend="torch",
                             engine="ray", shards=3, device="cpu")
    want = per_query(rank(data, replace(settings, backend="numpy", engine="local")), settings)
    got = per_query(rank(data, settings), settings)
    assert all(got[key].tobytes() == value.tobytes() for key, value in want.items())


@pytest.mark.ray
def test_full_map_with_engine_ray_runs_the_numpy_tiles_on_ray(ray_cluster, monkeypatch):
    # every rank is the numpy engine's pass: with score.engine: ray its tiles go to Ray tasks, not one node
    from recallk.score.ranking import ray_tiles

    made = []

    class Recorded(ray_tiles.RayTiles):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(ray_tiles, "RayTiles", Recorded)
    case = adversarial_case("leave_one_out")
    settings = ScoreSettings(ks=(1, 5), metrics=("recall", "map", "map@r"), backend="torch", engine="ray",
                             device="cpu")
    want = Scorer(replace(settings, backend="numpy", engine="local"))(**case)
    assert Scorer(settings)(**case) == want
    assert len(made) == 1 and made[0].passes >= 1 and made[0].jobs >= 1


def test_gpu_score_check_runs_on_the_cpu(capsys):
    # the device check's tiny run (what a machine without CUDA gets): the suite identical, the speed part sane
    spec = importlib.util.spec_from_file_location("gpu_score_check", ROOT / "bench" / "gpu_score_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--tiny"]) == 0
    out = capsys.readouterr().out
    # 7 cases in float32 and in bfloat16 (the CPU has it; TF32 and device tensors are the GPU's runs), one for speed
    assert "no CUDA GPU checked" in out and out.count("identical") == 15 and "DIFFERS" not in out
    assert "candidates float32, arrays:" in out and "candidates bfloat16, arrays:" in out


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_collapsed_rows_are_handed_to_the_numpy_engine(leave_one_out, caplog):
    """Collapsed embeddings (half the rows one direction, 1e-6 apart): their candidate buffers would grow to the
    gallery and every candidate be re-scored; rows overflowing with more than HAND_OVER slots beyond L go to the
    numpy engine instead, at every layout and pass, and from device tensors (stand-ins) too: the same bytes."""
    rng = np.random.default_rng(5)
    m, d = 700, 16
    g = rng.normal(size=(m, d))
    g[:500] = g[0] + 1e-6 * rng.normal(size=(500, d))
    gl = rng.integers(0, 3, m)
    ids = list(range(m)) if leave_one_out else None
    q, ql = (g, gl) if leave_one_out else (np.vstack([g[:60], g[600:]]), rng.integers(0, 3, 160))
    case = dict(query_emb=q, gallery_emb=g, query_labels=ql, gallery_labels=gl, query_ids=ids, gallery_ids=ids)
    layouts = [(None, None, 1), (7, 64, 2)]
    with caplog.at_level("DEBUG", logger="recallk.score.ranking.torch_backend"):
        assert differences(case, layouts=layouts) == []
    assert any("handed to the numpy engine" in r.getMessage() for r in caplog.records)
    tq, tg = torch.from_numpy(q), torch.from_numpy(g)
    stand = RetrievalData(stand_in(tq), stand_in(tg), ql, gl, query_ids=ids, gallery_ids=ids,
                          same_set=leave_one_out or None)
    for ranks in (Pass.top(10), Pass.first(), Pass.first(5)):
        got = rank_data_torch(stand, ranks, 512, TorchOptions(block_rows=32), tensors=(tq, tg))
        want = rank_data_torch(RetrievalData(**case), ranks, 512, TorchOptions())  # host rows: as numpy's above
        for field in ("n_positives", "offsets", "ranks", "first_rank", "first_rank_opposite"):
            assert getattr(got, field).tobytes() == getattr(want, field).tobytes(), (ranks, field)
