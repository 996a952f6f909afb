"""Faults and determinism: SIGKILL during score, two encodes sharing one cache, BLAS thread counts,
catalog row order. Real dvc and real subprocesses in temp git repos."""

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
import yaml

from conftest import copy_digits, run_module, tool_env
from test_pipeline import copy_project, git_init, repro, set_param

pytestmark = pytest.mark.pipeline

SCORE_OUTS = ("metrics/recall.json", "metrics/per_class.csv", "metrics/recall_curve.csv",
              "data/scores/per_query.csv")
ALL_OUTS = ("data/prepared/catalog.csv", "data/prepared/split.csv", "data/prepared/skipped.csv",
            "data/embeddings/embeddings.npy", "data/embeddings/ids.npy") + SCORE_OUTS


def _bytes(repo: Path, rels) -> dict[str, bytes]:
    return {rel: (repo / rel).read_bytes() for rel in rels}


def _env(**extra: str) -> dict[str, str]:
    return {**tool_env(), **extra}


def test_sigkill_during_score_leaves_nothing_and_repro_is_byte_identical(tmp_path: Path) -> None:
    repo = copy_project(tmp_path / "repo")
    git_init(repo)
    repro(repo)
    before = _bytes(repo, SCORE_OUTS + ("dvc.lock",))
    # a slow score (many bootstrap resamples, from a private params file) killed mid-run
    slow = yaml.safe_load((repo / "params.yaml").read_text())
    slow["score"]["bootstrap"]["resamples"] = 1_000_000
    (repo / "slow.yaml").write_text(yaml.safe_dump(slow))
    proc = subprocess.Popen([sys.executable, "-m", "stages.score", "--params", "slow.yaml"], cwd=repo,
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # the stage removes its stale outputs first: once all are gone it is scoring; kill it then
        deadline = time.monotonic() + 60
        while (any((repo / rel).exists() for rel in SCORE_OUTS) and proc.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.01)
        assert proc.poll() is None, "score finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    for rel in SCORE_OUTS:  # the stale outputs were removed first, and nothing half-written appeared
        assert not (repo / rel).exists(), rel
    assert list(repo.rglob("*.tmp")) == []
    ran, _, out = repro(repo)
    assert ran == {"score"}, out
    assert _bytes(repo, SCORE_OUTS + ("dvc.lock",)) == before


def test_two_encodes_at_once_share_the_cache_without_corruption(tmp_path: Path) -> None:
    cache = tmp_path / "shared-cache"
    repos = []
    for name in ("a", "b"):
        repo = copy_project(tmp_path / name)
        git_init(repo)
        repos.append(repo)
        assert run_module("stages.split", cwd=repo).returncode == 0
    procs = [subprocess.Popen([sys.executable, "-m", "dvc", "repro", "encode"], cwd=repo,
                              env=_env(RECALLK_CACHE_DIR=str(cache)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for repo in repos]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    a, b = (_bytes(r, ("data/embeddings/embeddings.npy", "data/embeddings/ids.npy")) for r in repos)
    assert a == b
    with contextlib.closing(sqlite3.connect(cache / "embeddings.sqlite")) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        n_rows = db.execute("SELECT count(*) FROM embedding").fetchone()[0]
    n_files = pd.read_csv(repos[0] / "data/prepared/catalog.csv")["sha256"].nunique()
    assert n_rows == n_files  # each image stored once although both runs encoded at the same time


@pytest.mark.parametrize("whiten", ["none", "pca"])
def test_one_or_two_blas_threads_give_byte_identical_lock_and_outputs(tmp_path: Path, whiten: str) -> None:
    results = []
    for threads in ("1", "2"):
        repo = copy_project(tmp_path / f"t{threads}")
        set_param(repo, "score.whiten", whiten)
        git_init(repo)
        proc = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=repo, capture_output=True, text=True,
                              env=_env(OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads,
                                       RECALLK_CACHE_DIR=str(tmp_path / f"cache{threads}")))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        results.append(_bytes(repo, ALL_OUTS + ("dvc.lock",)))
    assert results[0] == results[1]


def test_catalog_row_order_does_not_change_any_score_output(tmp_path: Path) -> None:
    outputs = []
    for order in ("sorted", "shuffled"):
        work = tmp_path / order
        work.mkdir()
        (work / "params.yaml").write_text((Path(__file__).parents[1] / "params.yaml").read_text())
        root = copy_digits(work / "data" / "digits", per_label=12)
        rows = sorted(f"{p.parent.name}/{p.name},{p.parent.name}" for p in root.rglob("*.png"))
        if order == "shuffled":
            rows = list(pd.Series(rows).sample(frac=1.0, random_state=7))
        (root / "manifest.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
        params = yaml.safe_load((work / "params.yaml").read_text())
        params["split"]["csv"] = "manifest.csv"
        params["split"]["strategy"] = "per_class"
        (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        for stage in ("stages.split", "stages.encode", "stages.score"):
            proc = run_module(stage, cwd=work)
            assert proc.returncode == 0, proc.stderr
        outputs.append(_bytes(work, ALL_OUTS))
    assert outputs[0] == outputs[1]


def _limited(limit_bytes: int):
    """preexec_fn: a file-size limit like `ulimit -f`; Python ignores SIGXFSZ, so writes fail with EFBIG."""
    import resource

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, resource.RLIM_INFINITY))
    return apply


@pytest.mark.parametrize("stage, limit, outs", [
    # score: the per-query table is the largest output; nothing of the four may survive
    ("stages.score", 1024, SCORE_OUTS),
    # encode: the embedding matrix exceeds the limit (the cache lives elsewhere, unlimited beforehand)
    ("stages.encode", 64 * 1024, ("data/embeddings/embeddings.npy", "data/embeddings/ids.npy")),
])
def test_a_failed_write_leaves_no_output_and_says_what_happened(project: Path, tmp_path: Path, stage: str,
                                                                  limit: int, outs) -> None:
    env = _env(RECALLK_CACHE_DIR=str(tmp_path / "cache"))
    for before in ("stages.split", "stages.encode", "stages.score"):
        assert subprocess.run([sys.executable, "-m", before], cwd=project, env=env,
                              capture_output=True).returncode == 0
    good = _bytes(project, outs)
    proc = subprocess.run([sys.executable, "-m", stage], cwd=project, env=env, capture_output=True, text=True,
                          preexec_fn=_limited(limit))
    assert proc.returncode == 2, proc.stderr
    assert "could not write" in proc.stderr and "ulimit -f" in proc.stderr and "Traceback" not in proc.stderr
    assert not any((project / rel).exists() for rel in outs) and list(project.rglob("*.tmp")) == []
    assert subprocess.run([sys.executable, "-m", stage], cwd=project, env=env, capture_output=True).returncode == 0
    assert _bytes(project, outs) == good


def test_a_failed_cache_write_keeps_the_cache_intact(project: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = _env(RECALLK_CACHE_DIR=str(cache))
    assert subprocess.run([sys.executable, "-m", "stages.split"], cwd=project, env=env).returncode == 0
    set_param(project, "encode.batch_size", 8)
    proc = subprocess.run([sys.executable, "-m", "stages.encode"], cwd=project, env=env, capture_output=True,
                          text=True, preexec_fn=_limited(96 * 1024))  # the cache file outgrows it mid-run
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "embedding cache" in proc.stderr
    assert not (project / "data/embeddings/embeddings.npy").exists()
    with contextlib.closing(sqlite3.connect(cache / "embeddings.sqlite")) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        kept = db.execute("SELECT count(*) FROM embedding").fetchone()[0]
    assert 0 < kept < 200  # some batches committed before the limit hit, not all
    assert subprocess.run([sys.executable, "-m", "stages.encode"], cwd=project, env=env).returncode == 0
    resumed = _bytes(project, ("data/embeddings/embeddings.npy",))
    fresh_env = _env(RECALLK_CACHE_DIR=str(tmp_path / "fresh"))
    assert subprocess.run([sys.executable, "-m", "stages.encode"], cwd=project, env=fresh_env).returncode == 0
    assert _bytes(project, ("data/embeddings/embeddings.npy",)) == resumed
