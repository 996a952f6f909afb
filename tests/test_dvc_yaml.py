"""The DVC project files: each stage of dvc.yaml depends on exactly the code it imports and its own params
section (dvc.yaml's comment points here), and no param hides from DVC's run-cache. Static checks, no dvc run."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
import yaml

from helpers import ALL_OUTPUTS, ALSO_READS, METRICS, ROOT, STAGES, dvc_outs

#: Split's provenance.json: encode and index read its ``data_root``, a copy of the ``split.data_root`` param, and
#: encode its ``background``, a copy of ``split.background``, so they depend on those params (no file dep, no
#: params dep on the file's values: no extra column in `dvc exp show`).
SPLIT_PROVENANCE = "data/prepared/provenance.json"
#: Params that stand in for an input file a stage reads values of (dvc.yaml says why).
STANDS_IN = {"split.data_root": SPLIT_PROVENANCE, "split.background": SPLIT_PROVENANCE}


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


PACKAGES = ("stages", "recallk")



def _module_path(module: str) -> Path:
    parts = module.split(".")
    as_file = ROOT.joinpath(*parts).with_suffix(".py")
    return as_file if as_file.is_file() else ROOT.joinpath(*parts, "__init__.py")


def _is_ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _run_time_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``, which never run (their imports are for
    type checkers and IDEs)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _direct_imports(module: str) -> set[str]:
    """Our modules imported (at any nesting level, so lazy imports count; not under ``if TYPE_CHECKING:``)
    by ``module``, with the packages above each one, whose ``__init__.py`` runs first."""
    path = _module_path(module)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in _run_time_nodes(tree):
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
        # the index stage follows the score stage's lists: it also reads the score keys its rules come from; a
        # mapping is a value in another file (encode and index: the data root in split's provenance.json)
        params = stage.get("params")
        keys = [p for p in params[1:] if isinstance(p, str) and p not in STANDS_IN]
        assert params[0] == name and all(p.split(".")[0] in ALSO_READS.get(name, ()) for p in keys), \
            f"stage {name} must depend on exactly its own params section"
        assert all(isinstance(p, str) for p in params), f"stage {name}: a params dep on a value in a file: {params}"

    score_outs = spec["stages"]["score"]["outs"]
    assert {METRICS: {"cache": False}} in score_outs
    # the one declared metrics file (recall@K's means, test_the_declared_metrics_are_recall_at_k): not the index
    # timings, not the other means (issue 38)
    assert spec.get("metrics") == [METRICS]
    # the split stage reads its data root through params interpolation
    assert "${split.data_root}" in spec["stages"]["split"]["deps"]


def test_the_declared_metrics_file_is_recall_at_k() -> None:
    """dvc.yaml declares one metrics file, metrics/recall.json, which the score stage fills with recall@K's means
    (recallk.report.block.split_metrics, tests/report/test_block.py): `dvc exp show --only-changed` stays within
    25 columns after 16 experiments with index runs (bench/exp_table_columns.py)."""
    assert yaml.safe_load((ROOT / "dvc.yaml").read_text())["metrics"] == ["metrics/recall.json"]


def test_closure_walker_sees_from_package_imports_and_parent_packages() -> None:
    """Guard the helper above: ``from recallk.data import catalog`` imports recallk.data.catalog, and
    importing a submodule runs its packages' ``__init__.py``."""
    closure = _closure("stages.split")
    assert {"recallk.data.catalog", "recallk.data.contract", "recallk.data.splitting", "recallk.images",
            "recallk", "recallk.data"} <= closure
    assert "recallk.score.metrics" not in closure and "recallk.encode.registry" not in closure



def test_closure_walker_skips_type_checking_imports(tmp_path, monkeypatch) -> None:
    """``recallk/__init__.py`` names the whole API under ``if TYPE_CHECKING:`` for IDEs; those imports never
    run, so they must not put the score code into the split stage's deps (and an ``else`` branch still runs)."""
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
                     "import c\n")
    imported = {a.name for n in _run_time_nodes(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported == {"b", "c"}
    assert "recallk.score.metrics" not in _direct_imports("recallk")


def test_each_stage_runs_its_own_settings_only() -> None:
    """A stage imports the settings module of its own section (its defaults and rules: a dep) and no other
    section's (stages/params.py reads those by name for their key names only), so an encode-only rule
    change re-runs encode alone (tests/pipeline/test_settings_deps.py proves it with dvc status)."""
    from stages.params import SECTIONS

    modules = {section: spec.split(":")[0] for section, spec in SECTIONS.items()}
    for name in STAGES:
        closure = _closure(f"stages.{name}")
        assert {s for s, m in modules.items() if m in closure} == {name, *ALSO_READS.get(name, ())}, name


@pytest.mark.parametrize("name", STAGES)
def test_stage_scripts_own_the_paths_dvc_yaml_lists(name: str) -> None:
    """Each stage script names what it reads and writes (``INPUTS``, ``OUTPUTS``: its options' defaults); its
    ``cmd`` passes no path, its outs are exactly ``OUTPUTS`` and its file deps exactly ``INPUTS``."""
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"][name]
    script = importlib.import_module(f"stages.{name}")
    assert spec["cmd"].split() == ["python", "-m", f"stages.{name}"], "the script's own paths, no flags"
    outs = dvc_outs()[name]
    assert len(set(outs)) == len(outs) and set(outs) == set(script.OUTPUTS.values())
    files = {d for d in spec["deps"] if not _is_ours(d.split("/")[0]) and "${" not in d}
    value_files = {STANDS_IN[p] for p in spec.get("params", []) if p in STANDS_IN}  # a value read in a file
    assert files | value_files == set(script.INPUTS.values()) and not files & value_files
    assert not set(script.INPUTS) & set(script.OUTPUTS)


def test_folder_outs_and_their_readers_agree() -> None:
    """The encode and score stages' outputs are one folder each (one DVC out, one hash column in ``dvc exp
    show``); the stages that read them take the folder, and each writes the files its readers open."""
    from stages import encode, index, score, split

    assert encode.OUTPUTS == {"embeddings": "data/embeddings"} and score.OUTPUTS["scores"] == "data/scores"
    assert score.INPUTS["embeddings"] == index.INPUTS["embeddings"] == encode.OUTPUTS["embeddings"]
    assert index.INPUTS["exact"] == score.OUTPUTS["scores"]
    # nothing else of any stage is written inside a folder out (DVC deletes the folder before its stage runs)
    folders = ("data/embeddings/", "data/scores/")
    assert not [p for m in (split, encode, index, score) for p in m.OUTPUTS.values() if p.startswith(folders)]


def test_the_tests_check_every_output() -> None:
    """``helpers.ALL_OUTPUTS`` (what ``assert_no_outputs`` checks by default) is every out of dvc.yaml, once."""
    scripts = [importlib.import_module(f"stages.{name}") for name in STAGES]
    assert sorted(ALL_OUTPUTS) == sorted(path for script in scripts for path in script.OUTPUTS.values())
    assert len(ALL_OUTPUTS) == len(set(ALL_OUTPUTS)) == 20


def test_the_score_reports_rendering_is_no_dep_of_index() -> None:
    """The failure sheet and the score page are rendering: editing them re-runs score (which draws them), never the
    index stage's ANN sweep (whose code deps are its import closure, checked above)."""
    deps = {name: set(stage["deps"]) for name, stage in
            yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"].items()}
    for rendering in ("recallk/report/failure_sheet.py", "recallk/report/html.py", "recallk/report/block.py"):
        assert _covered(rendering, deps["score"]) and not _covered(rendering, deps["index"]), rendering
