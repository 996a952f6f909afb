"""The encode and score stages with `engine: ray` (the params, the missing extra) and, on the session's
real local Ray cluster, outputs byte-identical to the local engines'."""

from __future__ import annotations

import copy
import sys

import numpy as np
import pytest

from helpers import ENCODE_OUTPUTS, RANKING_OUTPUTS, read_bytes, set_dotted, set_params
from recallk.atomic import remove_outputs
from recallk.cluster import connect
from recallk.errors import InputError, MissingExtraError
from stages.params import validate_section

DEFAULTS = {"encode": validate_section({}, "encode"), "score": validate_section({}, "score")}


@pytest.mark.parametrize("section, dotted, value, fragment", [
    ("encode", "encode.engine", "spark", "`encode.engine` must be one of"),  # an unknown engine
    ("encode", "encode.ray.num_gpus", -1, "`encode.ray.num_gpus` must be a number of GPUs"),  # negative GPUs
    ("encode", "encode.ray.concurrency", 0, "`encode.ray.concurrency` must be an integer"),  # no actor
    ("encode", "encode.ray.address", 6379, "`encode.ray.address` must be a Ray cluster address"),  # a port only
    ("score", "score.engine", "dask", "`score.engine` must be one of"),  # an unknown engine
    ("score", "score.ray.num_cpus", 0.5, "`score.ray.num_cpus` must be an integer"),  # a fraction of a CPU
])
def test_ray_params_are_checked(section, dotted, value, fragment):
    params = set_dotted({section: copy.deepcopy(DEFAULTS[section])}, dotted, value)
    with pytest.raises(InputError, match=fragment):
        validate_section(params, section)


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as when the extra is not installed
    with pytest.raises(MissingExtraError, match=r"encode.engine: ray needs the ray extra: .*'\.\[ray\]'"):
        connect(None, "encode.engine: ray")


def test_the_params_check_refuses_the_removed_faiss_backend_with_engine_ray():
    # every params rule, cross-field ones included, lives in the settings and runs in the params check, before
    # any work (once, this pair was refused only after the embeddings were loaded)
    from recallk.score.settings import ScoreSettings
    from recallk.settings.base import checked

    errors: list[str] = []
    checked(ScoreSettings, {"engine": "ray", "backend": "faiss"}, "score", errors)
    assert errors == [next(e for e in errors if e.startswith("`score.backend` no longer takes `faiss`"))]


@pytest.mark.ray
def test_resources_the_cluster_lacks_are_named(ray_cluster, tmp_path):
    from helpers import image_catalog
    from recallk.encode.batches import encode_catalog
    from recallk.encode.ray_engine import ray_source
    from recallk.encode.registry import get_backbone
    from recallk.encode.settings import EncodeRaySettings
    from recallk.score.metrics import rank
    from recallk.score.retrieval_data import RetrievalData
    from recallk.score.settings import RaySettings, ScoreSettings

    cat, backbone = image_catalog(tmp_path, range(2)), get_backbone("pixels", {"resolution": 2})
    source = ray_source(backbone, "pixels", {"resolution": 2},
                        EncodeRaySettings(address=None, concurrency=1, num_gpus=1, batch_size=2))
    with pytest.raises(InputError, match=r"`encode.ray.num_gpus` is 1 per actor, but the Ray cluster has 0 GPUs"):
        encode_catalog(cat, backbone, batch_size=2, num_workers=1, source=source)
    emb = np.eye(4, dtype=np.float32)
    with pytest.raises(InputError, match=r"`score.ray.num_cpus` is 8, but the largest node of the Ray cluster has 2"):
        rank(RetrievalData(emb, emb, [0, 0, 1, 1], [0, 0, 1, 1]),
             ScoreSettings(engine="ray", ray=RaySettings(num_cpus=8)))


@pytest.mark.ray
def test_stages_on_ray_write_the_local_bytes(ray_cluster, scored_base, scored_project, tmp_path, monkeypatch):
    """scored_base ran encode and score locally; the same project on Ray (empty cache: every image
    encoded by the actors) writes the same embeddings and the same ranking outputs, byte for byte."""
    from stages import encode, score

    set_params(scored_project, {"encode.engine": "ray", "encode.ray.batch_size": 32, "score.engine": "ray"})
    monkeypatch.chdir(scored_project)
    monkeypatch.setenv("RECALLK_CACHE_DIR", str(tmp_path / "empty_cache"))
    monkeypatch.setenv("RECALLK_NO_REPORT", "1")
    remove_outputs([scored_project / rel for rel in ENCODE_OUTPUTS + RANKING_OUTPUTS])  # files and folders
    encode.main([])
    score.main([])
    assert read_bytes(scored_project, ENCODE_OUTPUTS) == read_bytes(scored_base, ENCODE_OUTPUTS)
    assert read_bytes(scored_project, RANKING_OUTPUTS) == read_bytes(scored_base, RANKING_OUTPUTS)


@pytest.mark.ray
def test_encode_stage_joins_the_cluster_at_ray_address(ray_cluster, scored_base, split_project, tmp_path, monkeypatch):
    """A stage process with RAY_ADDRESS joins that running cluster (this session's) instead of starting one."""
    import ray

    from helpers import run_ok

    set_params(split_project, {"encode.engine": "ray"})
    monkeypatch.setenv("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    monkeypatch.setenv("RECALLK_CACHE_DIR", str(tmp_path / "empty_cache"))
    proc = run_ok(split_project, "encode", cli=True)  # a stage process of its own (this one runs the cluster)
    assert f"joined the Ray cluster at {ray.get_runtime_context().gcs_address}" in proc.stderr
    assert read_bytes(split_project, ENCODE_OUTPUTS) == read_bytes(scored_base, ENCODE_OUTPUTS)
