"""Shared fixtures: project paths, a subprocess runner for stages and dvc, image makers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "data" / "digits"


def tool_env() -> dict[str, str]:
    """Environment for subprocesses: this interpreter's bin first, git identity, no DVC analytics."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(DVC_NO_ANALYTICS="1", GIT_AUTHOR_NAME="test", GIT_AUTHOR_EMAIL="test@example.com",
               GIT_COMMITTER_NAME="test", GIT_COMMITTER_EMAIL="test@example.com")
    return env


def run(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command; on an unexpected exit code fail with its output."""
    proc = subprocess.run(args, cwd=cwd, env=tool_env(), capture_output=True, text=True)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def run_module(module: str, *args: str, cwd: Path, check: bool = False) -> subprocess.CompletedProcess:
    """Run ``python -m <module> args`` in ``cwd`` (a stage script, usually)."""
    return run([sys.executable, "-m", module, *args], cwd=cwd, check=check)


def dvc(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "dvc", *args], cwd=cwd, check=check)


def git(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return run(["git", *args], cwd=cwd, check=check)


def save_image(path: Path, seed: int = 0, size: tuple[int, int] = (12, 12), mode: str = "RGB", fmt: str | None = None) -> Path:
    """Write a small seeded random image (real pixels through Pillow)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "L": 1}[mode]
    arr = rng.integers(0, 256, size=(size[1], size[0], channels), dtype=np.uint8)
    Image.fromarray(arr[..., 0] if channels == 1 else arr, mode).save(path, format=fmt)
    return path


def copy_digits(dest: Path, per_label: int) -> Path:
    """Copy the first ``per_label`` committed digit images of every label into ``dest``."""
    for label_dir in sorted(p for p in DIGITS.iterdir() if p.is_dir()):
        target = dest / label_dir.name
        target.mkdir(parents=True, exist_ok=True)
        for img in sorted(label_dir.iterdir())[:per_label]:
            shutil.copy2(img, target / img.name)
    return dest


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A working directory with the project's params.yaml and a 20-per-label digits subset as data root."""
    work = tmp_path / "proj"
    work.mkdir()
    shutil.copy2(ROOT / "params.yaml", work / "params.yaml")
    copy_digits(work / "data" / "digits", per_label=20)
    return work
