"""End-to-end tests of the DVC pipeline: real ``dvc repro`` in temporary git repositories.

A module-scoped base repo (the project's stages, dvc.yaml, params.yaml and a
20-per-label digits subset at ``data/digits``) is committed, reproduced once and
committed again; each test works on its own copy (including ``.git`` and the
DVC cache), so it pays only for the repros it needs.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import ROOT, copy_digits, dvc, git, run_module, save_image

pytestmark = pytest.mark.pipeline

PER_LABEL = 20
STAGES = ("split", "encode", "score")
CATALOG = "data/prepared/catalog.csv"
SPLIT = "data/prepared/split.csv"
EMBEDDINGS = "data/embeddings/embeddings.npy"
IDS = "data/embeddings/ids.npy"
METRICS = "metrics/recall.json"
STAGE_OUTS = {"split": (CATALOG, SPLIT), "encode": (EMBEDDINGS, IDS), "score": (METRICS,)}
PROJECT_FILES = (".dvc/config", ".dvc/.gitignore", ".dvcignore", ".gitignore", "dvc.yaml", "params.yaml")

RAN_RE = re.compile(r"Running stage '([^']+)'")
SKIPPED_RE = re.compile(r"Stage '([^']+)' didn't change, skipping")


# ---------------------------------------------------------------------------------------------- helpers


def copy_project(dest: Path, *, full_data: bool = False, with_results: bool = False) -> Path:
    """Copy the project's pipeline files into ``dest`` (not a git repo yet)."""
    dest.mkdir(parents=True, exist_ok=True)
    for package in ("stages", "recallk"):  # the stages' code deps (dvc.yaml)
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for rel in PROJECT_FILES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    if full_data:
        shutil.copytree(ROOT / "data" / "digits", dest / "data" / "digits")
    else:
        copy_digits(dest / "data" / "digits", per_label=PER_LABEL)
    if with_results:
        for rel in ("dvc.lock", METRICS, "data/prepared/.gitignore", "data/embeddings/.gitignore"):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return dest


def git_init(repo: Path, message: str = "init") -> None:
    git("init", "-q", "-b", "main", cwd=repo)
    commit(repo, message)


def commit(repo: Path, message: str) -> None:
    git("add", "-A", cwd=repo)
    git("commit", "-q", "--allow-empty", "-m", message, cwd=repo)


def repro(repo: Path, *args: str, check: bool = True) -> tuple[set[str], set[str], str]:
    """Run ``dvc repro``; return (stages run, stages skipped as unchanged, combined output)."""
    proc = dvc("repro", *args, cwd=repo, check=check)
    out = proc.stdout + proc.stderr
    return set(RAN_RE.findall(out)), set(SKIPPED_RE.findall(out)), out


def snapshot(repo: Path, rels) -> dict[str, tuple[bytes, int]]:
    """Bytes and mtime (ns) of each output path."""
    return {rel: ((repo / rel).read_bytes(), (repo / rel).stat().st_mtime_ns) for rel in rels}


def outs_of(*stages: str) -> list[str]:
    return [p for s in stages for p in STAGE_OUTS[s]]


def assert_untouched(repo: Path, before: dict[str, tuple[bytes, int]]) -> None:
    after = snapshot(repo, before)
    for rel, (data, mtime) in before.items():
        assert after[rel][0] == data, f"{rel} changed bytes although its stage was skipped"
        assert after[rel][1] == mtime, f"{rel} was rewritten (mtime changed) although its stage was skipped"


def set_param(repo: Path, dotted: str, value) -> None:
    """Set ``section.key[.sub]`` in the repo's params.yaml (rewrites the file with PyYAML)."""
    path = repo / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    node = params
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node[key]
    node[leaf] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


def metrics(repo: Path) -> dict:
    return json.loads((repo / METRICS).read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def base_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A committed temp repo on branch ``main`` that already ran ``dvc repro`` once."""
    repo = copy_project(tmp_path_factory.mktemp("base") / "repo")
    git_init(repo, "pipeline and data subset")
    ran, _, out = repro(repo)
    assert ran == set(STAGES), out
    commit(repo, "dvc repro")
    assert git("status", "--porcelain", cwd=repo).stdout == ""
    return repo


@pytest.fixture
def repo(base_repo: Path, tmp_path: Path) -> Path:
    """A private copy of the base repo (git history, DVC cache and outputs included)."""
    dest = tmp_path / "repo"
    shutil.copytree(base_repo, dest, symlinks=True)
    shutil.rmtree(dest / ".dvc" / "tmp", ignore_errors=True)  # state DB / locks belong to the original
    return dest


# ---------------------------------------------------------------------------------------------- 1-5: what re-runs


def test_no_change_runs_nothing(repo: Path) -> None:
    before = snapshot(repo, outs_of(*STAGES))
    ran, skipped, out = repro(repo)
    assert ran == set(), out
    assert skipped == set(STAGES), out
    assert_untouched(repo, before)
    assert git("status", "--porcelain", cwd=repo).stdout == ""


def test_score_ks_change_reruns_only_score(repo: Path) -> None:
    before = snapshot(repo, outs_of("split", "encode"))
    set_param(repo, "score.ks", [1, 3])
    ran, skipped, out = repro(repo)
    assert ran == {"score"}, out
    assert skipped == {"split", "encode"}, out
    assert_untouched(repo, before)
    m = metrics(repo)
    assert "recall@3" in m and "recall@1" in m, m
    assert "recall@5" not in m and "recall@10" not in m, m


def test_split_seed_change_reruns_split_and_score_not_encode(repo: Path) -> None:
    catalog_before = (repo / CATALOG).read_bytes()
    split_before = (repo / SPLIT).read_bytes()
    enc_before = snapshot(repo, outs_of("encode"))
    set_param(repo, "split.seed", 1)
    ran, skipped, out = repro(repo)
    assert ran == {"split", "score"}, out
    assert skipped == {"encode"}, out
    assert (repo / CATALOG).read_bytes() == catalog_before, "the catalog must not depend on split params"
    assert (repo / SPLIT).read_bytes() != split_before, "seed 1 should give another split assignment"
    assert_untouched(repo, enc_before)


def test_backbone_change_reruns_encode_and_score_not_split(repo: Path) -> None:
    assert metrics(repo)["embedding_dim"] == 3 * 16 * 16
    split_before = snapshot(repo, outs_of("split"))
    set_param(repo, "encode.pixels.resolution", 8)
    ran, skipped, out = repro(repo)
    assert "Stage 'encode' is cached" not in out, "DVC restored stale embeddings from its run-cache:\n" + out
    assert ran == {"encode", "score"}, out
    assert skipped == {"split"}, out
    assert_untouched(repo, split_before)
    assert metrics(repo)["embedding_dim"] == 3 * 8 * 8


def test_new_image_reruns_split(repo: Path) -> None:
    catalog_before = (repo / CATALOG).read_text(encoding="utf-8")
    save_image(repo / "data" / "digits" / "3" / "9999.png", seed=7, size=(8, 8), mode="L")
    ran, _, out = repro(repo)
    assert "split" in ran, out
    catalog_after = (repo / CATALOG).read_text(encoding="utf-8")
    assert catalog_after != catalog_before
    assert len(catalog_after.splitlines()) == len(catalog_before.splitlines()) + 1
    assert "3/9999.png" in catalog_after


# ---------------------------------------------------------------------------------------------- 6-8: reproducibility


def test_fresh_clone_reproduces_byte_identical(base_repo: Path, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    git("clone", "-q", str(base_repo), str(clone), cwd=tmp_path)
    assert not (clone / ".dvc" / "cache").exists()
    assert not (clone / CATALOG).exists()
    # metrics/recall.json is git-tracked (cache: false), so score would be skipped as up to date;
    # delete it so every stage must regenerate its outputs in the clone.
    (clone / METRICS).unlink()
    ran, _, out = repro(clone)
    assert ran == set(STAGES), out
    assert git("status", "--porcelain", cwd=clone).stdout == "", "dvc.lock / metrics did not regenerate identically"
    for rel in outs_of(*STAGES):
        assert (clone / rel).read_bytes() == (base_repo / rel).read_bytes(), rel


def test_split_stage_twice_from_scratch_is_byte_identical(repo: Path, base_repo: Path) -> None:
    results = []
    for _ in range(2):
        shutil.rmtree(repo / "data" / "prepared")
        proc = run_module("stages.split", cwd=repo)
        assert proc.returncode == 0, proc.stderr
        results.append(((repo / CATALOG).read_bytes(), (repo / SPLIT).read_bytes()))
    assert results[0] == results[1]
    # and identical to what `dvc repro` produced (and dvc.lock recorded) in the base repo
    assert results[0] == ((base_repo / CATALOG).read_bytes(), (base_repo / SPLIT).read_bytes())
    status = json.loads(dvc("status", "split", "--json", cwd=repo).stdout or "{}")
    assert status == {}, status


def test_metrics_diff_between_branches(repo: Path) -> None:
    # split.seed 2 moves other labels into val/gallery: recall@1 0.98 -> 1.0 on the 20-per-label subset.
    old = metrics(repo)
    git("checkout", "-q", "-b", "other-seed", cwd=repo)
    set_param(repo, "split.seed", 2)
    ran, _, out = repro(repo)
    assert ran == {"split", "score"}, out
    commit(repo, "split.seed 2")
    new = metrics(repo)
    assert new["recall@1"] != old["recall@1"], (old, new)

    proc = dvc("metrics", "diff", "main", "--json", cwd=repo)
    diff = json.loads(proc.stdout)
    assert set(diff) == {METRICS}, diff
    entry = diff[METRICS]["recall@1"]
    assert entry["old"] == pytest.approx(old["recall@1"])
    assert entry["new"] == pytest.approx(new["recall@1"])
    assert entry["old"] != entry["new"]
    assert entry["diff"] == pytest.approx(new["recall@1"] - old["recall@1"])
    assert "embedding_dim" not in diff[METRICS], "unchanged metrics are hidden without --all"

    full = json.loads(dvc("metrics", "diff", "main", "HEAD", "--all", "--json", cwd=repo).stdout)
    assert full[METRICS]["embedding_dim"] == {"old": 768, "new": 768, "diff": 0}
    assert full[METRICS]["recall@1"]["new"] == pytest.approx(new["recall@1"])

    md = dvc("metrics", "diff", "main", "--md", cwd=repo).stdout
    assert "recall@1" in md and METRICS in md


def test_no_param_named_like_dvc_metadata() -> None:
    """DVC (3.x, treeverse/dvc#10296) drops every key named ``size`` or ``nfiles`` -- params included --
    from the run-cache key, so changing such a param restores the previous run's outputs instead of
    re-running the stage. No param may use those names."""
    reserved = {"size", "nfiles"}

    def keys(node, prefix=""):
        if isinstance(node, dict):
            for k, v in node.items():
                yield f"{prefix}{k}", k
                yield from keys(v, f"{prefix}{k}.")

    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    bad = [dotted for dotted, k in keys(params) if k in reserved]
    assert not bad, f"params {bad} are invisible to DVC's run-cache; rename them"


def test_committed_project_reproduces_byte_identical(tmp_path: Path) -> None:
    """``make check-repro`` as a test: the committed dvc.lock and metrics regenerate byte-identical."""
    proj = copy_project(tmp_path / "proj", full_data=True, with_results=True)
    git_init(proj, "committed project")
    repro(proj)
    stale = [rel for rel in ("dvc.lock", METRICS) if (proj / rel).read_bytes() != (ROOT / rel).read_bytes()]
    assert not stale, (f"{stale} do not regenerate byte-identical; run `dvc repro` and commit them:\n"
                       + git("diff", "--", *stale, cwd=proj).stdout)


# ---------------------------------------------------------------------------------------------- 9: dvc.yaml structure


PACKAGES = ("stages", "recallk")


def _module_path(module: str) -> Path:
    parts = module.split(".")
    as_file = ROOT.joinpath(*parts).with_suffix(".py")
    return as_file if as_file.is_file() else ROOT.joinpath(*parts, "__init__.py")


def _is_ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _direct_imports(module: str) -> set[str]:
    """Our modules imported (at any nesting level, so lazy imports count) by ``module``, with the
    packages above each one, whose ``__init__.py`` runs first."""
    path = _module_path(module)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if _is_ours(a.name))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if not _is_ours(base):
                continue
            found.add(base)
            for alias in node.names:  # `from recallk.data import catalog` imports a submodule
                sub = f"{base}.{alias.name}"
                if _module_path(sub).is_file():
                    found.add(sub)
    parents = {".".join(m.split(".")[:i]) for m in found | {module} for i in range(1, m.count(".") + 1)}
    return found | parents


def _closure(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        mod = todo.pop()
        if mod not in seen:
            seen.add(mod)
            todo.extend(_direct_imports(mod) - seen)
    return seen


def _covered(file: str, deps: set[str]) -> bool:
    return any(file == d or file.startswith(d.rstrip("/") + "/") for d in deps)


def test_dvc_yaml_stages_depend_on_their_code_and_params() -> None:
    """Each stage's code deps are exactly its import closure: every file it may run is a dep
    (a folder dep counts for the files in it) and no dep holds code it never imports."""
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    assert set(spec["stages"]) == set(STAGES)
    for name, stage in spec["stages"].items():
        match = re.match(r"python -m (stages\.\w+)\b", " ".join(stage["cmd"].split()))
        assert match, f"stage {name}: unexpected cmd {stage['cmd']!r}"
        module = match.group(1)
        assert module == f"stages.{name}"
        needed = {str(_module_path(m).relative_to(ROOT).as_posix()) for m in _closure(module)}
        code_deps = {d for d in stage["deps"] if _is_ours(d.split("/")[0])}
        missing = {f for f in needed if not _covered(f, code_deps)}
        assert not missing, f"stage {name} imports {sorted(missing)} but does not list them in deps"
        for dep in code_deps:
            assert (ROOT / dep).exists(), f"stage {name}: dep {dep} does not exist"
            files = ({p.relative_to(ROOT).as_posix() for p in (ROOT / dep).rglob("*.py")} if (ROOT / dep).is_dir()
                     else {dep})
            extra = files - needed
            assert not extra, f"stage {name} lists code it does not import (needless re-runs): {sorted(extra)}"
        assert stage.get("params") == [name], f"stage {name} must depend on exactly its own params section"
    assert "recallk/images.py" not in spec["stages"]["score"]["deps"], "an image-decoding change must not re-score"

    score_outs = spec["stages"]["score"]["outs"]
    assert {METRICS: {"cache": False}} in score_outs
    assert METRICS in spec.get("metrics", [])
    # the split stage reads its data root through params interpolation
    assert "${split.data_root}" in spec["stages"]["split"]["deps"]


def test_closure_walker_sees_from_package_imports_and_parent_packages() -> None:
    """Guard the helper above: ``from recallk.data import catalog`` imports recallk.data.catalog, and
    importing a submodule runs its packages' ``__init__.py``."""
    closure = _closure("stages.split")
    assert {"recallk.data.catalog", "recallk.data.contract", "recallk.data.splitting", "recallk.images",
            "recallk", "recallk.data"} <= closure
    assert "recallk.score.metrics" not in closure and "recallk.encode.registry" not in closure


# ---------------------------------------------------------------------------------------------- 10: failure


def test_invalid_param_fails_cleanly_without_outputs(repo: Path) -> None:
    set_param(repo, "score.ks", [0])
    proc = dvc("repro", cwd=repo, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert set(RAN_RE.findall(out)) == {"score"}, out
    assert "`score.ks` must be positive integers" in out, out
    assert "Traceback" not in out, out
    assert not (repo / METRICS).exists(), "a failed score stage left metrics/recall.json behind"
    assert not list((repo / "metrics").glob(".recall.json.*.tmp")), "stray temp files in metrics/"


# ---------------------------------------------------------------------------------------------- 11: plots


def test_dvc_plots_show_the_recall_curve(repo: Path) -> None:
    curve_csv = "metrics/recall_curve.csv"
    proc = dvc("plots", "show", "--json", cwd=repo)
    assert curve_csv in proc.stdout
    shown = json.loads(proc.stdout)
    assert not shown.get("errors"), shown
    (plot,) = shown["data"][curve_csv]
    values = plot["content"]["data"]["values"]
    curve = pd.read_csv(repo / curve_csv)
    assert [(int(v["k"]), float(v["recall"])) for v in values] == list(zip(curve["k"], curve["recall"]))
    assert plot["content"]["encoding"]["x"]["field"] == "k"
    html = dvc("plots", "show", "-o", "plots_out", cwd=repo)
    assert html.returncode == 0
    page = (repo / "plots_out" / "index.html").read_text(encoding="utf-8")
    assert "recall_curve" in page
