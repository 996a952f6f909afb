"""Queued experiments run in copies of the workspace and share the per-user embedding cache."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import copy_pipeline, dvc, git_init, run_queue

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
