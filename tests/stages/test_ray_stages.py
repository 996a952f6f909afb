"""The encode and score stages with `engine: ray` (the params, the missing extra) and, on the session's
real local Ray cluster, outputs byte-identical to the local engines'."""

from __future__ import annotations

import copy
import sys

import pytest

from helpers import ENCODE_OUTPUTS, RANKING_OUTPUTS, read_bytes, set_dotted, set_params
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


@pytest.mark.ray
def test_stages_on_ray_write_the_local_bytes(ray_cluster, scored_base, scored_project, tmp_path, monkeypatch):
    """scored_base ran encode and score locally; the same project on Ray (empty cache: every image
    encoded by the actors) writes the same embeddings and the same ranking outputs, byte for byte."""
    from stages import encode, score

    set_params(scored_project, {"encode.engine": "ray", "encode.ray.batch_size": 32, "score.engine": "ray"})
    monkeypatch.chdir(scored_project)
    monkeypatch.setenv("RECALLK_CACHE_DIR", str(tmp_path / "empty_cache"))
    monkeypatch.setenv("RECALLK_NO_REPORT", "1")
    for rel in ENCODE_OUTPUTS + RANKING_OUTPUTS:
        (scored_project / rel).unlink()
    encode.main([])
    score.main([])
    assert read_bytes(scored_project, ENCODE_OUTPUTS) == read_bytes(scored_base, ENCODE_OUTPUTS)
    assert read_bytes(scored_project, RANKING_OUTPUTS) == read_bytes(scored_base, RANKING_OUTPUTS)
