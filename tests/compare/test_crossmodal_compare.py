"""recallk compare, leaderboard, track and report on text <-> image runs (issue 41): the per-query table holds both
directions (a ``direction`` column), ``--direction`` picks one, text -> image resamples images by default (a
caption's ``label`` is its image), and the means equal the engine's (:func:`recallk.crossmodal_metrics`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from recallk.compare import board_cli, cli, multi_report, paired, sources
from recallk.score.crossmodal import crossmodal_metrics
from recallk.score.settings import BootstrapSettings, ScoreSettings
from recallk.score.text_image import TextImageSets, compact_table, score_text_image
from recallk.tables_contract import csv_file

N_IMAGES, PER_IMAGE = 12, 3
FAST = ["--resamples", "300", "--permutations", "300"]


def arrays(noise: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images, captions (PER_IMAGE per image but the last image, which has none) near their image, and each
    caption's image."""
    rng = np.random.default_rng(0)
    images = rng.normal(size=(N_IMAGES, 6)).astype(np.float32)
    caption_images = np.repeat(np.arange(N_IMAGES - 1), PER_IMAGE)
    noisy = np.random.default_rng(seed).normal(scale=noise, size=(len(caption_images), 6))
    return images, (images[caption_images] + noisy).astype(np.float32), caption_images


def run_folder(where: Path, noise: float, seed: int) -> Path:
    """A folder of score outputs of one text <-> image run: its compact per-query table, as the stage writes it."""
    images, texts, caption_images = arrays(noise, seed)
    ids = np.array([f"img{i:02d}.png" for i in range(N_IMAGES)])
    caption_ids = np.array([f"{ids[i]}#{n % PER_IMAGE}" for n, i in enumerate(caption_images)])
    sets = TextImageSets(ids, images, caption_ids, np.array([f"caption {c}" for c in caption_ids]), caption_images,
                         texts)
    _, per_query = score_text_image(sets, ScoreSettings(ks=(1, 2), bootstrap=BootstrapSettings(resamples=0)))
    where.mkdir(parents=True)
    csv_file(compact_table(per_query), "e0")(where / "per_query.csv")
    return where


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    base = tmp_path_factory.mktemp("runs")
    return [run_folder(base / f"run{n}", noise, seed) for n, (noise, seed) in enumerate([(1.2, 1), (0.6, 2),
                                                                                      (0.3, 3)])]


def compare_json(a: Path, b: Path, tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / f"cmp{len(list(tmp_path.iterdir()))}.json"
    assert cli.main([str(a), str(b), "--json", str(out), *FAST, *extra]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


def test_compare_needs_a_direction_and_pools_none(runs, capsys):
    assert cli.main([str(runs[0]), str(runs[1]), *FAST]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "text <-> image run" in err and "--direction text_to_image" in err


def test_compare_text_to_image_resamples_images(runs, tmp_path, capsys):
    result = compare_json(runs[0], runs[1], tmp_path, "--direction", "text_to_image")
    assert result["by"] == "label" and result["direction"] == "text_to_image"  # a caption's label is its image
    assert "resampling images (each with its queries" in capsys.readouterr().out
    assert result["queries"] == (N_IMAGES - 1) * PER_IMAGE and set(result["metrics"]) == {"recall@1", "recall@2",
                                                                                            "mrr"}
    for side, run in (("mean_a", (1.2, 1)), ("mean_b", (0.6, 2))):
        want = crossmodal_metrics(*arrays(*run), ks=[1, 2])["text_to_image"]
        assert {k: m[side] for k, m in result["metrics"].items()} == pytest.approx(
            {k: want[k] for k in ("recall@1", "recall@2", "mrr")}, abs=1e-9)
    assert result["metrics"]["recall@1"]["delta"] > 0
    explicit = compare_json(runs[0], runs[1], tmp_path, "--direction", "text_to_image", "--by", "label")
    assert explicit["metrics"] == result["metrics"]
    by_query = compare_json(runs[0], runs[1], tmp_path, "--direction", "text_to_image", "--by", "query")
    assert by_query["by"] == "query" and by_query["metrics"]["recall@1"]["delta"] == result["metrics"]["recall@1"][
        "delta"]


def test_compare_image_to_text_has_map(runs, tmp_path):
    result = compare_json(runs[0], runs[2], tmp_path, "--direction", "image_to_text")
    assert result["by"] == "query" and set(result["metrics"]) == {"recall@1", "recall@2", "mrr", "map"}
    want = crossmodal_metrics(*arrays(0.3, 3), ks=[1, 2])["image_to_text"]
    assert result["metrics"]["map"]["mean_b"] == pytest.approx(want["map"], abs=1e-9)


def test_direction_of_an_image_retrieval_table_is_refused(tmp_path):
    frame = paired_table()
    frame.to_csv(tmp_path / "per_query.csv", index=False)
    with pytest.raises(Exception, match="no `direction` column"):
        sources.load(str(tmp_path / "per_query.csv"), direction="text_to_image")


def paired_table():
    import pandas as pd

    return pd.DataFrame({"image_id": ["q0", "q1"], "label": ["a", "b"], "num_positives": [1, 1],
                         "num_retrievable": [3, 3], "hit@1": [1, 0]})


def test_leaderboard_track_and_report(runs, tmp_path, capsys):
    names = [f"r{n}={run}" for n, run in enumerate(runs)]
    assert board_cli.main([*names, "--direction", "text_to_image", *FAST]) == 0
    board = capsys.readouterr().out
    assert "recall@1" in board and "r2" in board
    out = tmp_path / "track.json"
    assert board_cli.track_main([*names, "--direction", "image_to_text", "--png", str(tmp_path / "t.png"),
                                 "--json", str(out), *FAST]) == 0
    assert "map" in json.loads(out.read_text(encoding="utf-8"))["metrics"]
    assert board_cli.main([*names, *FAST]) == 2 and "--direction" in capsys.readouterr().err
    page = tmp_path / "report.html"
    assert multi_report.main([*names, "--direction", "text_to_image", "--out", str(page), *FAST]) == 0
    assert "recall@1" in page.read_text(encoding="utf-8")
    assert paired.default_unit(None, "image_to_text") == "query"
