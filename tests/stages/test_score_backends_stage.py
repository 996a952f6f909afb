"""The score stage with `score.backend: torch` (on CPU torch, the GPU code path): every output that does
not name the backend is byte-identical to the numpy engine's, for the device's own passes (the top-L metrics,
MRR) and, through the numpy engine, full `map`."""

from __future__ import annotations

import pytest

from extras import extra
from helpers import RANKING_OUTPUTS, SCORE_OUTPUTS, assert_no_outputs, read_bytes, run_fails, set_params
from recallk.atomic import remove_outputs

pytestmark = pytest.mark.stage

#: Without full `map` the torch backend ranks on the device (full map is the numpy engine's pass).
DEVICE_METRICS = ["recall", "precision", "r_precision", "map@r", "mrr"]


def _score(project, monkeypatch, params: dict) -> dict[str, bytes]:
    from stages import score

    set_params(project, params)
    monkeypatch.chdir(project)
    monkeypatch.setenv("RECALLK_NO_REPORT", "1")
    remove_outputs([project / rel for rel in RANKING_OUTPUTS])
    score.main([])
    return read_bytes(project, RANKING_OUTPUTS)


@pytest.mark.parametrize("backend, extra_params", [
    ("torch", {"score.device": "cpu"}),                          # one shard, the default tiles
    ("torch", {"score.device": "cpu", "score.shards": 3}),       # the gallery in 3 shards, merged per query
    ("torch", {"score.device": "cpu", "score.matmul": "bfloat16"}),  # a wider window, the same re-score
])
@pytest.mark.parametrize("metrics", [DEVICE_METRICS, None])  # None: the committed metrics (full map among them)
def test_torch_backend_writes_the_numpy_bytes(scored_project, monkeypatch, caplog, backend, extra_params, metrics):
    extra("torch", "torch")
    chosen = {} if metrics is None else {"score.metrics": metrics}
    want = _score(scored_project, monkeypatch, chosen)
    with caplog.at_level("DEBUG", logger="recallk.score.ranking.torch_backend"):
        got = _score(scored_project, monkeypatch, {**chosen, "score.backend": backend, **extra_params})
    assert got == want
    said = " ".join(r.getMessage() for r in caplog.records if r.name == "recallk.score.ranking.torch_backend")
    if metrics is None:
        assert "every rank (full map) from the numpy engine" in said
    else:  # ranked on the device, as asked
        shards = extra_params.get("score.shards", 1)
        matmul = extra_params.get("score.matmul", "float32")
        assert f"torch backend on cpu ({matmul}, {shards} shard(s))" in said, said


@pytest.mark.parametrize("params, fragments", [
    # no GPU (CUDA hidden where there is one): the param and the fix named
    ({"score.device": "cuda"}, ["`score.device: cuda` needs a CUDA GPU", "set `score.device: cpu` or `auto`"]),
    # TF32 is a GPU format: the CPU lacks it, and a silent float32 is not what was asked
    ({"score.device": "cpu", "score.matmul": "tf32"}, ["`score.matmul: tf32` needs a CUDA GPU with TF32",
                                                       "Set `score.matmul: float32`"]),
    # engine: ray searches the shards on CPU torch: the GPU asked for would not run
    ({"score.engine": "ray", "score.device": "cuda"}, ["sets `device: cuda` with `engine: ray`", "`engine: local`"]),
    # an old params file: the removed faiss backend, refused before any work, naming what to use instead
    ({"score.backend": "faiss", "score.engine": "ray"}, ["`score.backend` no longer takes `faiss`", "use `numpy`",
                                                          "the index stage's `Flat` kind"]),
    # an old params file: the renamed embedding check
    ({"score.near_duplicates": {"min_cosine": 0.99}}, ["`score.near_duplicates` was renamed to "
                                                       "`score.embedding_copies`"]),
])
def test_bad_device_params_stop_the_stage_with_one_message(scored_project, monkeypatch, params, fragments):
    # through the real stage: exit 2, one message, no traceback, and none of the stage's outputs left behind
    extra("torch", "torch")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    set_params(scored_project, {"score.backend": "torch", **params} if "score.backend" not in params else params)
    run_fails(scored_project, "score", *fragments)
    assert_no_outputs(scored_project, SCORE_OUTPUTS)
