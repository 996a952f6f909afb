"""Shared fixtures: fresh projects, and projects or pipeline repos prepared once per session.

A ``*_base`` fixture is built once per session and never modified: a test that only reads
outputs uses it directly; a test that changes anything takes the private copy fixture next to it
(``shutil.copytree``, so it pays only for the stages it re-runs). The helpers they use are in
``helpers.py`` and, for the score-table projects, ``score_oracle.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from extras import extra
from helpers import (
    CAMERAS,
    PROJECT_CACHE,
    RUNNING_MARKS,
    STAGES,
    UNEVEN_PER_LABEL,
    cache_in,
    commit,
    copy_digits,
    copy_pipeline,
    copy_tree,
    git,
    git_init,
    new_project,
    repro,
    run_ok,
    save_image,
    set_params,
)

#: The projects built by running the stage scripts, and their private copies (which take their base through
#: ``request.getfixturevalue``, out of pytest's sight): a test that takes one is marked ``stage``.
STAGE_PROJECTS = {"split_base", "uneven_base", "camera_base", "split_project", "scored_project", "uneven",
                  "uneven_scored", "camera"}


def private_copy(base: str, folder: str = "proj"):
    """A function-scoped fixture: a private copy (``tmp_path / folder``) of the session fixture ``base``,
    whose embedding cache (the copy of the base's own, ``PROJECT_CACHE``) is the test's."""
    def fixture(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
        copy = copy_tree(request.getfixturevalue(base), tmp_path / folder)
        monkeypatch.setenv("RECALLK_CACHE_DIR", str(copy / PROJECT_CACHE))
        return copy

    fixture.__doc__ = (f"A private copy of ``{base}`` (``tmp_path / {folder!r}``) for a test that changes it; "
                       "the copy of its embedding cache is the test's.")
    return pytest.fixture(fixture)


# ---------------------------------------------------------------------------------------------- embedding cache


@pytest.fixture(scope="session", autouse=True)
def _session_embedding_cache(tmp_path_factory: pytest.TempPathFactory):
    """No test run writes to the per-user cache (``~/.cache/recallk``): session fixtures that encode
    without a cache of their own (``cache_in``) share this one."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RECALLK_CACHE_DIR", str(tmp_path_factory.mktemp("recallk-cache")))
        yield


@pytest.fixture(autouse=True)
def embedding_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's own embedding cache folder (``RECALLK_CACHE_DIR``, inherited by stages, ``dvc`` and
    ``git`` subprocesses through ``tool_env``); a private copy of a session project replaces it with the
    copy of that project's cache."""
    folder = tmp_path / "recallk-cache"
    monkeypatch.setenv("RECALLK_CACHE_DIR", str(folder))
    return folder


# ---------------------------------------------------------------------------------------------- fresh


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A working directory with the project's params.yaml and a 20-per-label digits subset as data root."""
    return new_project(tmp_path / "proj")


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory, the cwd (the split writes paths relative to the cwd)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---------------------------------------------------------------------------------------------- encode


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write ``name.py`` into an importable folder; the modules are forgotten after the test."""
    folder, names = tmp_path / "usermods", []
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))

    def write(name, source):
        (folder / f"{name}.py").write_text(source)
        names.append(name)

    yield write
    for name in names:
        sys.modules.pop(name, None)


@pytest.fixture
def big_jpeg(tmp_path):
    return save_image(tmp_path / "big.jpg", seed=3, size=(2000, 1500), fmt="JPEG").read_bytes()


# ---------------------------------------------------------------------------------------------- ray


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory):
    """One real local Ray cluster (2 CPUs) for the whole session, started by the first ``ray`` test.
    Its workers import from the driver's sys.path (tests/ too: ray_backbones.py) and find the
    Ray tests' control files in ``$RECALLK_RAY_TEST_DIR`` (the yielded folder)."""
    import logging

    from recallk.cluster import worker_env

    ray = extra("ray", "ray")  # every ray test takes this fixture: skipped without the ray extra

    control = tmp_path_factory.mktemp("ray_control")
    env = worker_env()
    env["env_vars"]["RECALLK_RAY_TEST_DIR"] = str(control)
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, logging_level=logging.WARNING, runtime_env=env)
    yield control
    ray.shutdown()


# ---------------------------------------------------------------------------------------------- stage projects


@pytest.fixture(scope="session")
def split_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``project`` after the split stage (committed params). Never modified."""
    proj = new_project(tmp_path_factory.mktemp("split_base") / "proj")
    run_ok(proj, "split", cli=True)  # the command line's exit 0 (the other session projects run in process)
    return proj


@pytest.fixture(scope="session")
def _scored(split_base: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    proj = copy_tree(split_base, tmp_path_factory.mktemp("scored_base") / "proj")
    with cache_in(proj):
        proc = run_ok(proj, "encode", "score")
    return proj, proc.stdout


@pytest.fixture(scope="session")
def scored_base(_scored: tuple[Path, str]) -> Path:
    """``project`` after split, encode (its embedding cache in the project, ``PROJECT_CACHE``) and score.
    Never modified."""
    return _scored[0]


@pytest.fixture(scope="session")
def scored_stdout(_scored: tuple[Path, str]) -> str:
    """What the score stage printed when it built ``scored_base``."""
    return _scored[1]


split_project = private_copy("split_base")
scored_project = private_copy("scored_base")


# ---------------------------------------------------------------------------------------------- score tables


@pytest.fixture(scope="session")
def uneven_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Digits (20, 22 or 24 images per label) with split and encode done. Never modified.

    Unequal label sizes make the per-class (unweighted) means differ from the per-query ones.
    """
    proj = new_project(tmp_path_factory.mktemp("uneven") / "proj", per_label=None)
    root = copy_digits(proj / "data" / "digits", per_label=UNEVEN_PER_LABEL + 4)
    for n, label_dir in enumerate(sorted(p for p in root.iterdir() if p.is_dir())):
        for img in sorted(label_dir.iterdir())[UNEVEN_PER_LABEL + 2 * (n % 3):]:
            img.unlink()
    with cache_in(proj):
        run_ok(proj, "split", "encode")
    return proj


@pytest.fixture(scope="session")
def uneven_scored_base(uneven_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``uneven_base`` plus one score run with the committed params. Never modified."""
    proj = copy_tree(uneven_base, tmp_path_factory.mktemp("uneven_scored") / "proj")
    run_ok(proj, "score")
    return proj


uneven = private_copy("uneven_base")
uneven_scored = private_copy("uneven_scored_base")


@pytest.fixture(scope="session")
def camera_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A manifest data root (path,label,camera) with real digit images; split and encode done. Never modified."""
    proj = new_project(tmp_path_factory.mktemp("camera") / "proj", per_label=None)
    root = copy_digits(proj / "data" / "cams", per_label=UNEVEN_PER_LABEL)
    rows = []
    for label_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for n, img in enumerate(sorted(label_dir.iterdir())):
            rows.append({"path": f"{label_dir.name}/{img.name}", "label": label_dir.name,
                         "camera": CAMERAS[n % len(CAMERAS)]})
    pd.DataFrame(rows).to_csv(root / "manifest.csv", index=False)
    set_params(proj, {"split.data_root": "data/cams", "split.csv": "manifest.csv"})
    with cache_in(proj):
        run_ok(proj, "split", "encode")
    return proj


camera = private_copy("camera_base")


# ---------------------------------------------------------------------------------------------- pipeline repos


@pytest.fixture(scope="session")
def base_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A committed temp repo on branch ``main`` (the pipeline and a 20-per-label digits subset) that
    already ran ``dvc repro`` once and committed the result. Never modified."""
    repo = copy_pipeline(tmp_path_factory.mktemp("base") / "repo")
    git_init(repo, "pipeline and data subset")
    with cache_in(repo):
        ran, _, out = repro(repo)
    assert ran == set(STAGES), out
    commit(repo, "dvc repro")
    assert git("status", "--porcelain", cwd=repo).stdout == ""
    return repo


repo = private_copy("base_repo", "repo")  # git history, DVC cache, embedding cache and outputs included


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that takes a project of ``STAGE_PROJECTS`` runs stage scripts: marked ``stage`` (unless it is a
    ``pipeline`` test). Under pytest-xdist (``make test``: ``-n auto --dist loadgroup``) every ``ray`` test runs
    on one worker, so the session starts one Ray cluster, not one per worker."""
    for item in items:
        if STAGE_PROJECTS & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("pipeline"):
            item.add_marker(pytest.mark.stage)
        if item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Keep the running test's markers for ``helpers.run_module`` (before its fixtures run: a session project is
    built in the setup of the first test that takes it)."""
    RUNNING_MARKS.clear()
    RUNNING_MARKS.update(mark.name for mark in item.iter_markers())
