"""Every file that can change the embeddings is a DVC dependency, with no hand-editing of dvc.yaml
(class ``stale``): under real ``dvc repro`` in temporary git repos.

* ``encode.callable.module_file``: the module of a ``callable:`` backbone. Before, edits to it were
  invisible to DVC ("Stage 'encode' didn't change") unless the user added it to dvc.yaml; now it is
  the dep ``${encode.callable.module_file}``, and the encode stage refuses a callable whose source is
  not that file (or inside that folder), so the dep cannot silently point elsewhere.
* ``encode.precomputed.ids``: the ids file of an ``.npy`` of embeddings. Before, replacing it (the
  same embeddings, ids in another order) gave "didn't change" and stale metrics.

Both default to committed placeholders, as DVC cannot track null.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import commit, copy_pipeline, git_init, repro, set_params

pytestmark = pytest.mark.pipeline

MODULE = '''import numpy as np


def embed(images):
    """Mean colour per image, times SCALE (edit SCALE's sign to change the ranking)."""
    return np.array([np.asarray(im, dtype=np.float32).mean(axis=(0, 1)) * SCALE + OFFSET for im in images])


SCALE = {scale}
OFFSET = np.array({offset}, dtype=np.float32)
'''


def recall(repo: Path) -> dict:
    return json.loads((repo / "metrics/recall.json").read_text(encoding="utf-8"))


def test_editing_a_callable_module_reencodes(tmp_path):
    repo = copy_pipeline(tmp_path / "repo", per_label=6)
    (repo / "mybackbone.py").write_text(MODULE.format(scale=1.0, offset=[1.0, 2.0, 3.0]))
    set_params(repo, {"encode.backbone": "callable:mybackbone:embed", "encode.callable.module_file": "mybackbone.py",
                      "score.bootstrap.resamples": 20, "score.failures.queries": 0})
    git_init(repo)
    ran, _, out = repro(repo)
    assert ran == {"split", "encode", "score", "index"}, out
    first = (repo / "data/embeddings/embeddings.npy").read_bytes()
    commit(repo, "repro")
    ran, skipped, out = repro(repo)
    assert not ran, out

    # edit the module only: DVC sees it, encode and score re-run, the embeddings change
    (repo / "mybackbone.py").write_text(MODULE.format(scale=-3.0, offset=[9.0, -1.0, 0.5]))
    ran, skipped, out = repro(repo)
    assert ran == {"encode", "score", "index"} and skipped == {"split"}, out
    assert (repo / "data/embeddings/embeddings.npy").read_bytes() != first
    assert "mybackbone.py" in (repo / "dvc.lock").read_text()


def test_a_callable_whose_module_file_is_not_set_is_refused(tmp_path):
    repo = copy_pipeline(tmp_path / "repo", per_label=3)
    (repo / "mybackbone.py").write_text(MODULE.format(scale=1.0, offset=[0.0, 0.0, 1.0]))
    set_params(repo, {"encode.backbone": "callable:mybackbone:embed"})  # module_file left at its placeholder
    git_init(repo)
    ran, _, out = repro(repo, check=False)
    assert "encode" in ran and "Traceback" not in out, out
    assert "set `encode.callable.module_file: mybackbone.py`" in out, out


def test_replacing_the_ids_file_of_an_npy_reencodes(tmp_path):
    repo = copy_pipeline(tmp_path / "repo", per_label=6)
    set_params(repo, {"score.bootstrap.resamples": 20, "score.failures.queries": 0})
    git_init(repo)
    ran, _, out = repro(repo)  # the catalog, to know the ids
    ids = pd.read_csv(repo / "data/prepared/catalog.csv", dtype=str)["image_id"].tolist()
    labels = pd.read_csv(repo / "data/prepared/catalog.csv", dtype=str)["label"].astype(int).to_numpy()
    rng = np.random.default_rng(0)
    emb = (np.eye(10)[labels] + rng.normal(scale=0.3, size=(len(ids), 10))).astype(np.float32)
    (repo / "emb").mkdir()
    np.save(repo / "emb/vectors.npy", emb)
    (repo / "emb/ids.txt").write_text("\n".join(ids) + "\n", encoding="utf-8")
    set_params(repo, {"encode.backbone": "precomputed", "encode.precomputed.path": "emb/vectors.npy",
                      "encode.precomputed.ids": "emb/ids.txt"})
    ran, _, out = repro(repo)
    assert ran == {"encode", "score", "index"}, out
    good = recall(repo)["recall@1"]
    commit(repo, "precomputed")

    # the same vectors, the ids file replaced in place (shuffled: another row per id)
    (repo / "emb/ids.txt").write_text("\n".join(rng.permutation(ids)) + "\n", encoding="utf-8")
    ran, skipped, out = repro(repo)
    assert ran == {"encode", "score", "index"} and skipped == {"split"}, out
    assert recall(repo)["recall@1"] < good
    assert "emb/ids.txt" in (repo / "dvc.lock").read_text()


def test_the_placeholders_exist_and_match_the_library():
    from helpers import ROOT
    from recallk.encode.base import NO_FILE
    from recallk.encode.settings import EncodeSettings

    defaults = EncodeSettings()  # one committed placeholder file stands for every null path param
    assert defaults.precomputed.path == defaults.precomputed.ids == defaults.callable.module_file == NO_FILE
    assert (ROOT / NO_FILE).is_file(), NO_FILE
    dvc_yaml = (ROOT / "dvc.yaml").read_text()
    assert "${encode.precomputed.ids}" in dvc_yaml and "${encode.callable.module_file}" in dvc_yaml
