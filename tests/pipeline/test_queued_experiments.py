"""Queued experiments run in copies of the workspace and share the per-user embedding cache."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, copy_pipeline, dvc, git_init, run, run_queue

pytestmark = pytest.mark.pipeline

ENCODED_RE = re.compile(r"encoded (\d+) images, served (\d+) from the cache \(([^)]+)\)")


def test_the_second_queued_experiment_encodes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `dvc exp run --queue` runs each experiment in its own temporary copy of the workspace (.dvc/tmp/exps):
    # a cache under the working directory started empty in each. The default cache is the user's
    # ($XDG_CACHE_HOME/recallk here, a folder of this test's), shared by both.
    monkeypatch.delenv("RECALLK_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    repo = copy_pipeline(tmp_path / "repo")
    git_init(repo, "pipeline and data subset")  # nothing ran in the workspace: both experiments encode
    for name, change in (("first", "encode.batch_size=32"), ("second", "score.ks=[1,2]")):
        dvc("exp", "run", "--queue", "--name", name, "-S", change, cwd=repo)
    run_queue(repo)  # one worker: one experiment after the other (started again if DVC's worker dies)
    counts = {}
    for name in ("first", "second"):
        log = dvc("queue", "logs", name, cwd=repo).stdout
        found = ENCODED_RE.findall(log)
        assert len(found) == 1, log
        counts[name] = int(found[0][0]), int(found[0][1])
        assert Path(found[0][2]) == tmp_path / "xdg" / "recallk" / "embeddings.sqlite"
    assert sorted(counts.values()) == [(0, 200), (200, 0)], counts  # whichever ran second was served every image
    assert not list(repo.rglob("embeddings.sqlite"))  # no cache in the workspace or its copies


def documented_checkpoint_commands() -> str:
    """The shell block of step 2 of docs/leaderboard.md's checkpoint workflow, as a reader copies it."""
    text = (ROOT / "docs/leaderboard.md").read_text(encoding="utf-8")
    start = text.index("```sh\n", text.index("**Track the checkpoints, queue one experiment per checkpoint**")) + 6
    return textwrap.dedent(text[start:text.index("```", start)])


def test_the_documented_checkpoint_loop_works_as_written(repo: Path) -> None:
    # The checkpoints' embeddings are new, untracked files (step 1); a queued experiment runs a copy of the last
    # commit, so the documented commands track them first, and `dvc queue status` shows what --run-all's exit
    # status does not (it is 0 when an experiment failed). Two checkpoints instead of five, to stay fast.
    commands = documented_checkpoint_commands()
    assert "for e in 1 2 3 4 5; do" in commands and commands.count("dvc exp run --run-all --jobs 1\n") == 1, commands
    queue, check = commands.split("dvc exp run --run-all --jobs 1\n")
    ids = np.load(repo / "data/embeddings/ids.npy", allow_pickle=False)
    pixels = np.load(repo / "data/embeddings/embeddings.npy")
    (repo / "checkpoints").mkdir()
    rng = np.random.default_rng(0)
    for e in (1, 2):
        noisy = (pixels + rng.normal(0, pixels.std() / e, pixels.shape)).astype(np.float32)
        np.savez(repo / f"checkpoints/ckpt{e}.npz", ids=ids, embeddings=noisy)
    run(["bash", "-euo", "pipefail", "-c", queue.replace("for e in 1 2 3 4 5;", "for e in 1 2;")], cwd=repo)
    run_queue(repo)  # the documented `dvc exp run --run-all --jobs 1`, started again if DVC's worker dies
    status = run(["bash", "-euo", "pipefail", "-c", check], cwd=repo).stdout
    states = dict(re.findall(r"^\S+\s+(ckpt\d)\s.*\s(\w+)$", status, re.M))
    assert states == {"ckpt1": "Success", "ckpt2": "Success"}, status
