"""Proof that the evaluator gives the pipeline's numbers: one epoch's embeddings saved to disk and scored by
``python -m stages.score`` (the ``precomputed`` backbone, an embeddings-only catalog) give the evaluator's means,
intervals and per-query values bit for bit, under both protocols."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import CATALOG, PER_QUERY, SPLIT, new_project, read_csv, read_metrics, run_ok, set_params
from recallk.score.settings import ScoreSettings
from recallk.training import Evaluator
from stages.params import load_settings

pytestmark = pytest.mark.stage


def embeddings_project(tmp_path: Path, protocol: str) -> tuple[Path, np.ndarray, np.ndarray]:
    """A project of 72 ids in 8 labels (a manifest, no image), split and encoded from ``pre.npz``: a trained
    model's epoch, saved to disk. Returns the project, the ids and their embeddings."""
    project = new_project(tmp_path / "proj", per_label=None)
    rng = np.random.default_rng(7)
    ids = np.array([f"id{i:03d}" for i in range(72)])
    labels = np.array([f"c{i % 8}" for i in range(72)])
    centres = rng.normal(size=(8, 12))
    emb = (centres[np.arange(72) % 8] + 0.9 * rng.normal(size=(72, 12))).astype(np.float32)
    (project / "data").mkdir()
    pd.DataFrame({"image_id": ids, "label": labels}).to_csv(project / "data" / "m.csv", index=False)
    np.savez(project / "pre.npz", ids=ids, embeddings=emb)
    set_params(project, {"split.data_root": "data", "split.csv": "m.csv", "split.images": "none",
                         "split.protocol": protocol, "split.strategy": "per_class",
                         "encode.backbone": "precomputed",
                         "encode.precomputed": {"path": "pre.npz", "ids": "recallk/encode/no_file.txt"},
                         "score.ks": [1, 3, 5], "score.bootstrap.resamples": 300, "score.bootstrap.seed": 3,
                         "score.failures.queries": 0})
    nofile = project / "recallk" / "encode" / "no_file.txt"
    nofile.parent.mkdir(parents=True)
    nofile.write_text("")
    run_ok(project, "split", "encode", "score")
    return project, ids, emb


@pytest.mark.parametrize("protocol", ["query_gallery", "leave_one_out"])
def test_one_epoch_gives_the_score_stage_numbers_bit_for_bit(tmp_path, protocol):
    project, ids, emb = embeddings_project(tmp_path, protocol)
    split = read_csv(project, SPLIT)
    labels = read_csv(project, CATALOG).set_index("image_id")["label"]
    queries = split.loc[split["query"] == "True", "image_id"].to_numpy()
    gallery = split.loc[split["gallery"] == "True", "image_id"].to_numpy()
    row = pd.Series(np.arange(len(ids)), index=ids)
    settings = load_settings(ScoreSettings, project / "params.yaml")
    if protocol == "leave_one_out":
        assert list(queries) == list(gallery)
        evaluator = Evaluator(labels[queries].to_numpy(), query_ids=queries, settings=settings)
        result = evaluator(0, emb[row[queries].to_numpy()])
    else:
        evaluator = Evaluator(labels[queries].to_numpy(), labels[gallery].to_numpy(), query_ids=queries,
                              gallery_ids=gallery, settings=settings)
        result = evaluator(0, emb[row[queries].to_numpy()], emb[row[gallery].to_numpy()])
    written = read_metrics(project)  # the metrics files, each float read back exactly
    assert list(result.metrics) == evaluator.keys
    assert result.metrics == {k: written[k] for k in evaluator.keys}  # bit for bit: the same floats
    assert result.intervals == {k: (written[f"{k}_ci_low"], written[f"{k}_ci_high"]) for k in evaluator.keys}
    assert (result.num_queries, result.num_excluded_queries, result.num_gallery) == \
        (written["num_queries"], written["num_excluded_queries"], written["num_gallery"])
    full = pd.read_csv(project / PER_QUERY, dtype={"image_id": str, "label": str})
    mine = result.table
    assert list(mine.columns) == [c for c in full.columns if c in mine.columns]
    pd.testing.assert_frame_equal(mine.reset_index(drop=True), full[list(mine.columns)].reset_index(drop=True),
                                  check_dtype=False, check_exact=True)
