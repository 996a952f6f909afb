"""The many-systems workflow for real, as docs/leaderboard.md shows it, in a temp repo: three
backbones queued with `dvc exp run --queue` and run with `dvc exp run --run-all`, then `recallk leaderboard` over
every experiment; five precomputed checkpoints queued and run the same way, `recallk track` over them, and
`recallk report` of the backbones and the series. Kept fast: 200 digits, numpy backbones (the built-in `pixels`
and two callables), one queue worker for all eight experiments."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import commit, dvc, run, run_queue

pytestmark = pytest.mark.pipeline

#: Three cheap backbones: the built-in one at another resolution, and two callables of encoders/tiny.py.
BACKBONES = {
    "pixels8": ["-S", "encode.backbone=pixels", "-S", "encode.pixels.resolution=8"],
    "gray": ["-S", "encode.backbone=callable:encoders.tiny:gray", "-S", "encode.callable.module_file=encoders"],
    "noise": ["-S", "encode.backbone=callable:encoders.tiny:noise", "-S", "encode.callable.module_file=encoders"],
}
TINY = '''import numpy as np


def gray(images):
    """8 x 8 grey levels."""
    return np.asarray([np.asarray(i.convert("L").resize((8, 8)), dtype=np.float32).ravel() / 255 for i in images])


def noise(images):
    """Pure noise (seeded by the image's first pixels): a backbone that learned nothing."""
    out = []
    for image in images:
        seed = int(np.asarray(image.resize((4, 4))).sum())
        out.append(np.random.default_rng(seed).normal(size=16).astype(np.float32))
    return np.asarray(out)
'''
#: Noise added to the pixel embeddings at each checkpoint (times their spread): training that converges.
CHECKPOINTS = {"ckpt1": 3.0, "ckpt2": 1.2, "ckpt3": 0.6, "ckpt4": 0.3, "ckpt5": 0.25}


def recallk(*args: str, cwd: Path):
    return run([sys.executable, "-m", "recallk.cli", *args], cwd=cwd, check=False)


def test_queued_backbones_and_checkpoints_then_leaderboard_track_and_report(repo: Path) -> None:
    start = time.perf_counter()
    (repo / "encoders").mkdir()
    (repo / "encoders/__init__.py").write_text("")
    (repo / "encoders/tiny.py").write_text(TINY)
    ids = np.load(repo / "data/embeddings/ids.npy", allow_pickle=False)
    pixels = np.load(repo / "data/embeddings/embeddings.npy")
    (repo / "checkpoints").mkdir()
    rng = np.random.default_rng(0)
    for name, noise in CHECKPOINTS.items():
        embeddings = (pixels + rng.normal(0, noise * pixels.std(), pixels.shape)).astype(np.float32)
        np.savez(repo / f"checkpoints/{name}.npz", ids=ids, embeddings=embeddings)
    commit(repo, "the encoders and the checkpoints' embeddings")  # queued experiments run a copy of the commit

    for name, changes in BACKBONES.items():
        dvc("exp", "run", "--queue", "--name", name, *changes, cwd=repo)
    for name in CHECKPOINTS:
        dvc("exp", "run", "--queue", "--name", name, "-S", "encode.backbone=precomputed",
            "-S", f"encode.precomputed.path=checkpoints/{name}.npz", cwd=repo)
    restarts = run_queue(repo)
    queued = time.perf_counter() - start

    board = recallk("leaderboard", "HEAD", *BACKBONES, "--metric", "recall@1", "--metric", "map@r",
                    "--json", "board.json", "--md", "board.md", "--permutations", "2000", "--resamples", "1000",
                    cwd=repo)
    assert board.returncode == 0, board.stderr
    result = json.loads((repo / "board.json").read_text())
    assert [s["name"] for s in result["systems"]] == ["HEAD", *BACKBONES]
    rows = result["metrics"]["map@r"]["rows"]
    assert rows[-1]["system"] == "noise" and rows[-1]["p_adjusted"] < 0.05  # the backbone that learned nothing
    assert not set(rows[-1]["group"]) & set(rows[0]["group"])  # is worse than the best, in a group of its own
    pairs = result["metrics"]["map@r"]["pairs"]
    assert len(pairs) == 6 and {p["a"] for p in pairs} | {p["b"] for p in pairs} == {"HEAD", *BACKBONES}
    every = recallk("leaderboard", "HEAD", "--experiments", "*", "--metric", "map@r", "--json", "every.json",
                    "--permutations", "500", "--resamples", "300", cwd=repo)  # the README's one command
    assert every.returncode == 0, every.stderr
    named = [s["name"] for s in json.loads((repo / "every.json").read_text())["systems"]]
    assert named == ["HEAD", *sorted([*BACKBONES, *CHECKPOINTS])]

    track = recallk("track", *CHECKPOINTS, "--png", "track.png", "--json", "track.json", "--permutations", "2000",
                    "--resamples", "1000", cwd=repo)
    assert track.returncode == 0, track.stderr
    entry = json.loads((repo / "track.json").read_text())["metrics"]["map@r"]
    series = entry["series"]
    assert [point["system"] for point in series] == list(CHECKPOINTS)
    assert series[1]["delta_prev"]["delta"] > 0 and series[2]["delta_prev"]["delta"] > 0  # training helps early on
    assert "ckpt1" not in entry["indistinguishable"] and {"ckpt4", "ckpt5"} <= set(entry["indistinguishable"])
    assert (repo / "track.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    report = recallk("report", "HEAD", *BACKBONES, "--out", "backbones.html", "--permutations", "500",
                     "--resamples", "300", cwd=repo)
    assert report.returncode == 0, report.stderr
    trend = recallk("report", *CHECKPOINTS, "--ordered", "--out", "checkpoints.html", "--permutations", "500",
                    "--resamples", "300", cwd=repo)
    assert trend.returncode == 0, trend.stderr
    page = (repo / "backbones.html").read_text(encoding="utf-8")
    assert "encoders.tiny:gray (fingerprint" in page and "Trend over the ordered points" not in page  # provenance
    page = (repo / "checkpoints.html").read_text(encoding="utf-8")
    assert "Trend over the ordered points" in page and "precomputed" in page and "<script src" not in page
    print(f"queue + run-all of {len(BACKBONES) + len(CHECKPOINTS)} experiments: {queued:.1f} s ({restarts} "
          f"restart(s)); whole flow {time.perf_counter() - start:.1f} s; load {os.getloadavg()[0]:.1f}")
