"""Silent wrong numbers under a real ``dvc repro``: what DVC records must be what the stages ran with.

Each test builds a small self-contained project (the stage scripts, the library, dvc.yaml,
params.yaml and a few digits per label) in a temporary git repository.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers import ROOT, copy_digits, dvc, git

pytestmark = pytest.mark.pipeline

PROJECT_FILES = (".dvc/config", ".dvc/.gitignore", ".dvcignore", ".gitignore", "dvc.yaml", "params.yaml")


def make_repo(where: Path, per_label: int = 4, **params_lines: str) -> Path:
    """A committed git + DVC project; ``params_lines`` replace whole lines of the committed params.yaml
    (``**{"  seed: 0": "  seed: 010"}``), written as text so that no YAML tool re-spells them."""
    repo = where / "repo"
    for folder in ("stages", "recallk"):
        shutil.copytree(ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for rel in PROJECT_FILES:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, repo / rel)
    copy_digits(repo / "data" / "digits", per_label=per_label)
    text = (repo / "params.yaml").read_text(encoding="utf-8")
    for old, new in params_lines.items():
        assert old + "\n" in text, old
        text = text.replace(old + "\n", new + "\n", 1)
    (repo / "params.yaml").write_text(text, encoding="utf-8")
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "init", cwd=repo)
    return repo


def assert_repro_refused(repo: Path, *fragments: str) -> str:
    """``dvc repro`` fails in the split stage with our one-line error, and records nothing."""
    proc = dvc("repro", cwd=repo, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"dvc repro succeeded:\n{out}"
    assert "error: " in out and "Traceback" not in out, out
    for fragment in fragments:
        assert fragment in out, f"{fragment!r} not in:\n{out}"
    assert not (repo / "dvc.lock").exists(), "dvc.lock was written for a refused run"
    return out


def test_octal_looking_seed_is_refused_not_run_with_another_value(tmp_path):
    """`seed: 010`: DVC (YAML 1.2) records 10 in dvc.lock; the split stage (PyYAML, YAML 1.1) ran with 8."""
    repo = make_repo(tmp_path, **{"  seed: 0": "  seed: 010"})
    assert_repro_refused(repo, "`split.seed` (line 7) is written 010", "write 10 or 8")


def test_manifest_outside_the_data_root_is_refused(tmp_path):
    """`split.csv: ../elsewhere.csv` ran, but DVC tracks only the data root: editing the manifest left
    `dvc repro` skipping the split, and the metrics stale."""
    repo = make_repo(tmp_path, **{"  csv: null": "  csv: ../elsewhere.csv", "  strategy: class_disjoint":
                                  "  strategy: per_class"})
    rows = [f"{p.parent.name}/{p.name},{p.parent.name}" for p in sorted((repo / "data" / "digits").glob("*/*.png"))]
    (repo / "data" / "elsewhere.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "manifest", cwd=repo)
    assert_repro_refused(repo, "`split.csv` is '../elsewhere.csv', which is not inside `split.data_root`",
                         "`split.csv: elsewhere.csv`")


def test_leave_one_out_alias_of_a_file_is_refused(tmp_path):
    """`a/./0.png` next to `a/0.png` under leave_one_out: each query retrieved its own file (recall@1 1.0)."""
    repo = make_repo(tmp_path, **{"  csv: null": "  csv: m.csv", "  strategy: class_disjoint": "  strategy: per_class",
                                  "  protocol: query_gallery": "  protocol: leave_one_out"})
    files = sorted((repo / "data" / "digits").glob("*/*.png"))
    rows = [f"{p.parent.name}/{p.name},{p.parent.name}" for p in files]
    rows.append(f"0/./{files[0].name},0")  # the first file again, under another image_id
    (repo / "data" / "digits" / "m.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "manifest", cwd=repo)
    assert_repro_refused(repo, "a file must be listed once", f"CSV line 2, path '0/{files[0].name}'",
                         f"CSV line {len(rows) + 1}, path '0/./{files[0].name}'")
