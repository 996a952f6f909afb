"""The checkpoint workflow for real: precomputed embeddings per checkpoint run as DVC experiments, then `recallk
leaderboard` over every experiment, `recallk track` over the series and `recallk report`. The experiments run in
the workspace one after the other: `dvc exp run --queue` takes ~4x longer here (a worker and a workspace copy per
experiment) and is proven by tests/pipeline/test_queued_experiments.py; the refs it leaves are the same."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import commit, dvc, run

pytestmark = pytest.mark.pipeline

#: Noise added to the pixel embeddings at each checkpoint (times their spread): training that converges.
NOISE = {"ckpt1": 3.0, "ckpt2": 0.25}


def recallk(*args: str, cwd: Path):
    return run([sys.executable, "-m", "recallk.cli", *args], cwd=cwd, check=False)


def test_checkpoints_run_as_experiments_then_leaderboard_track_and_report(repo: Path) -> None:
    ids = np.load(repo / "data/embeddings/ids.npy", allow_pickle=False)
    pixels = np.load(repo / "data/embeddings/embeddings.npy")
    (repo / "checkpoints").mkdir()
    rng = np.random.default_rng(0)
    for name, noise in NOISE.items():
        embeddings = (pixels + rng.normal(0, noise * pixels.std(), pixels.shape)).astype(np.float32)
        np.savez(repo / f"checkpoints/{name}.npz", ids=ids, embeddings=embeddings)
    commit(repo, "the checkpoints' embeddings")
    for name in NOISE:
        dvc("exp", "run", "--name", name, "-S", "encode.backbone=precomputed",
            "-S", f"encode.precomputed.path=checkpoints/{name}.npz", cwd=repo)

    board = recallk("leaderboard", "HEAD", "--experiments", "ckpt*", "--metric", "recall@1", "--metric", "map@r",
                    "--json", "board.json", "--permutations", "2000", "--resamples", "1000", cwd=repo)
    assert board.returncode == 0, board.stderr
    result = json.loads((repo / "board.json").read_text())
    assert [s["name"] for s in result["systems"]] == ["HEAD", *NOISE]  # the commit, then every experiment
    rows = result["metrics"]["map@r"]["rows"]
    assert rows[-1]["system"] == "ckpt1" and rows[-1]["p_adjusted"] < 0.05  # the noisy checkpoint is worse
    assert not set(rows[-1]["group"]) & set(rows[0]["group"])  # and in a group of its own

    track = recallk("track", *NOISE, "--png", "track.png", "--json", "track.json", "--permutations", "2000",
                    "--resamples", "1000", cwd=repo)
    assert track.returncode == 0, track.stderr
    entry = json.loads((repo / "track.json").read_text())["metrics"]["map@r"]
    assert entry["indistinguishable"] == ["ckpt2"] and entry["series"][1]["delta_prev"]["delta"] > 0
    assert (repo / "track.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    report = recallk("report", "HEAD", *NOISE, "--ordered", "--out", "many.html", "--permutations", "500",
                     "--resamples", "300", cwd=repo)
    assert report.returncode == 0, report.stderr
    page = (repo / "many.html").read_text(encoding="utf-8")
    assert "Trend over the ordered points" in page and "precomputed" in page  # each run's evaluated.json
