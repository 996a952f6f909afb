"""recallk compare end to end: two DVC experiments in a temp repo, and a branch in a fresh clone (the CI recipe)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import cache_in, copy_tree, dvc, git, run_module

pytestmark = pytest.mark.pipeline


def _recall_json(repo: Path, rev: str) -> dict:
    """The means (recall@K's in recall.json, the others in intervals.json) and the counts (counts.json) a revision
    committed."""
    return {key: value for name in ("recall", "counts", "intervals")
            for key, value in json.loads(git("show", f"{rev}:metrics/{name}.json", cwd=repo).stdout).items()}


@pytest.fixture(scope="module")
def scored(base_repo, tmp_path_factory) -> Path:
    """A repo on main with pixels at 16x16 scored and committed (a copy of the session's ``base_repo``), and an
    experiment `small` (pixels at 4x4)."""
    repo = copy_tree(base_repo, tmp_path_factory.mktemp("cmp") / "repo")
    with cache_in(repo):  # the copy's own embedding cache
        dvc("exp", "run", "-n", "small", "-S", "encode.pixels.resolution=4", cwd=repo)
    return repo


def test_compare_a_revision_with_an_experiment(scored, tmp_path):
    out = tmp_path / "r.json"
    proc = run_module("recallk.compare", "main", "small", "--json", str(out), "--md", str(tmp_path / "r.md"),
                      cwd=scored)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    exp_commit = git("rev-parse", "refs/exps/" + _exp_ref(scored), cwd=scored).stdout.strip()
    base, small = _recall_json(scored, "main"), _recall_json(scored, exp_commit)
    assert result["queries"] == base["num_queries"] == small["num_queries"]
    for key in ("recall@1", "map@r", "map", "mrr", "precision@5"):  # the stage's own means, paired query by query
        m = result["metrics"][key]
        assert m["mean_a"] == pytest.approx(base[key], abs=1e-9) and m["mean_b"] == pytest.approx(small[key], abs=1e-9)
        assert m["ci_low"] <= m["delta"] <= m["ci_high"] and 0 < m["p"] <= 1 and m["p_holm"] >= m["p"]
    assert "main (" in proc.stdout and "small (" in proc.stdout and "recall@1" in proc.stdout
    assert "A backbone: pixels" in proc.stdout and "B backbone: pixels" in proc.stdout  # what each side evaluated
    assert result["evaluated"][0]["split"] == "class_disjoint, query_gallery, seed 0"
    assert (tmp_path / "r.md").read_text().startswith("**A**: `main (")


def _exp_ref(repo: Path) -> str:
    refs = git("for-each-ref", "--format=%(refname)", "refs/exps", cwd=repo).stdout.split()
    (ref,) = [r for r in refs if r.endswith("/small")]
    return ref.removeprefix("refs/exps/")


def test_ci_recipe_compares_branches_in_a_fresh_clone_without_a_dvc_cache(scored, tmp_path):
    dvc("exp", "branch", "small", "small-pixels", cwd=scored)
    clone = tmp_path / "clone"
    git("clone", "-q", str(scored), str(clone), cwd=tmp_path)
    git("fetch", "-q", "origin", "small-pixels:small-pixels", cwd=clone)
    assert not (clone / ".dvc" / "cache").exists()  # nothing but git
    same = run_module("recallk.compare", "main", "main", "--fail-if-worse", "recall@1", cwd=clone)
    assert same.returncode == 0, same.stderr
    assert " +0.0000 " in same.stdout  # a system against itself: no difference
    gate = run_module("recallk.compare", "main", "small-pixels", "--json", str(tmp_path / "g.json"),
                      "--fail-if-worse", "map@r", cwd=clone)
    worse = json.loads((tmp_path / "g.json").read_text())["metrics"]["map@r"]
    assert worse["delta"] < 0, worse  # 4x4 pixels retrieve worse than 16x16
    assert gate.returncode == (1 if worse["p_holm"] < 0.05 else 0), gate.stderr
    if gate.returncode:
        assert "significantly worse than A on map@r" in gate.stderr


def test_compare_two_experiments(scored, tmp_path):
    dvc("exp", "run", "-n", "tiny", "-S", "encode.pixels.resolution=2", cwd=scored)
    out = tmp_path / "two.json"
    proc = run_module("recallk.compare", "small", "tiny", "--json", str(out), cwd=scored)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    small = _recall_json(scored, git("rev-parse", "refs/exps/" + _exp_ref(scored), cwd=scored).stdout.strip())
    assert result["metrics"]["recall@1"]["mean_a"] == pytest.approx(small["recall@1"], abs=1e-9)
    assert result["queries"] == small["num_queries"]


def test_an_unknown_revision_is_one_clear_error(scored):
    proc = run_module("recallk.compare", "main", "no-such-exp", cwd=scored)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "'no-such-exp' is not a file, a folder, a git revision or a DVC experiment" in proc.stderr
