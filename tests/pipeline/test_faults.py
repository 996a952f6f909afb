"""Faults and determinism under real dvc and real subprocesses in temp git repos: SIGKILL during score,
two encodes sharing one cache, BLAS thread counts, catalog row order. (A stage's failed writes are in
tests/stages/test_runner.py.)"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from helpers import (
    ALL_OUTPUTS,
    CATALOG,
    ENCODE_OUTPUTS,
    SCORE_OUTPUTS,
    STAGES,
    copy_digits,
    copy_pipeline,
    copy_tree,
    git_init,
    new_project,
    read_bytes,
    repro,
    run_ok,
    set_params,
    tool_env,
)

pytestmark = pytest.mark.pipeline


def test_sigkill_during_score_leaves_nothing_and_repro_is_byte_identical(repo: Path, tmp_path: Path) -> None:
    before = read_bytes(repo, SCORE_OUTPUTS + ("dvc.lock",))
    # a slow score (many bootstrap resamples, from a private params file) killed mid-run
    slow = new_project(tmp_path / "slow", per_label=None)
    set_params(slow, {"score.bootstrap.resamples": 1_000_000})
    (repo / "slow.yaml").write_bytes((slow / "params.yaml").read_bytes())
    proc = subprocess.Popen([sys.executable, "-m", "stages.score", "--params", "slow.yaml"], cwd=repo,
                            env=tool_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # the stage removes its stale outputs first: once all are gone it is scoring; kill it then
        deadline = time.monotonic() + 60
        while (any((repo / rel).exists() for rel in SCORE_OUTPUTS) and proc.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.01)
        assert proc.poll() is None, "score finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    for rel in SCORE_OUTPUTS:  # the stale outputs were removed first, and nothing half-written appeared
        assert not (repo / rel).exists(), rel
    assert list(repo.rglob("*.tmp")) == []
    ran, _, out = repro(repo)
    assert ran == {"score"}, out
    assert read_bytes(repo, SCORE_OUTPUTS + ("dvc.lock",)) == before


def test_two_encodes_at_once_share_the_cache_without_corruption(base_repo: Path, tmp_path: Path) -> None:
    cache = tmp_path / "shared-cache"
    repos = [copy_tree(base_repo, tmp_path / name) for name in ("a", "b")]  # split done, an empty shared cache
    procs = [subprocess.Popen([sys.executable, "-m", "dvc", "repro", "--force", "--single-item", "encode"], cwd=repo,
                              env=tool_env(RECALLK_CACHE_DIR=str(cache)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for repo in repos]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    a, b = (read_bytes(r, ENCODE_OUTPUTS) for r in repos)
    assert a == b
    with contextlib.closing(sqlite3.connect(cache / "embeddings.sqlite")) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        n_rows = db.execute("SELECT count(*) FROM embedding").fetchone()[0]
    n_files = pd.read_csv(repos[0] / CATALOG)["sha256"].nunique()
    assert n_rows == n_files  # each image stored once although both runs encoded at the same time


def test_one_or_two_blas_threads_give_byte_identical_lock_and_outputs(tmp_path: Path) -> None:
    # per thread count: one fresh repo, `dvc repro` with score.whiten none, then pca (score re-runs)
    results: dict[str, list[dict[str, bytes]]] = {"none": [], "pca": []}
    for threads in ("1", "2"):
        repo = copy_pipeline(tmp_path / f"t{threads}")
        git_init(repo)
        env = tool_env(OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads,
                       RECALLK_CACHE_DIR=str(tmp_path / f"cache{threads}"))
        for whiten in ("none", "pca"):
            set_params(repo, {"score.whiten": whiten})
            proc = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=repo, capture_output=True, text=True,
                                  env=env)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            results[whiten].append(read_bytes(repo, ALL_OUTPUTS + ("dvc.lock",)))
    for whiten, (one, two) in results.items():
        assert one == two, f"score.whiten {whiten}: 1 and 2 BLAS threads differ"


def test_catalog_row_order_does_not_change_any_score_output(tmp_path: Path) -> None:
    outputs = []
    for order in ("sorted", "shuffled"):
        work = new_project(tmp_path / order, per_label=None)
        root = copy_digits(work / "data" / "digits", per_label=12)
        rows = sorted(f"{p.parent.name}/{p.name},{p.parent.name}" for p in root.rglob("*.png"))
        if order == "shuffled":
            rows = list(pd.Series(rows).sample(frac=1.0, random_state=7))
        (root / "manifest.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
        set_params(work, {"split.csv": "manifest.csv", "split.strategy": "per_class"})
        run_ok(work, *STAGES)
        outputs.append(read_bytes(work, ALL_OUTPUTS))
    assert outputs[0] == outputs[1]
