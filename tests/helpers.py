"""Helpers shared by the tests (importable as ``helpers``: ``pythonpath = ["tests"]`` in pyproject.toml).

* paths: the repository, the committed digits, the outputs of each stage (dvc.yaml's outs);
* subprocesses: a stage script (only in a test marked ``stage`` or ``pipeline``), ``dvc`` and ``git`` with a
  clean environment;
* data: seeded images, digit subsets, a project folder (``params.yaml`` + images);
* params: :func:`set_params` (dotted keys) and :func:`edit_params` (any change);
* stage runs: :func:`run_ok` and :func:`run_fails` (a clean user error: exit 2, one ``error:``
  message, no traceback), in process (:func:`run_in_process`: the stage runner's exit code and stderr without
  an interpreter start) unless asked for the command line; :func:`assert_no_outputs`, :func:`plant_stale`;
* pipelines: a temp git repo with the project's DVC files, ``dvc repro`` with what ran;
* the cheapest project every stage runs on (:func:`tiny_project`).

Beside it: ``extras.py`` (the optional extras: skip a test whose extra is missing), ``score_oracle.py``
(brute-force metrics for the score-table tests) and ``leakage_helpers.py`` (planted near-duplicate images).
Fixtures built on these live in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "data" / "digits"


def dvc_outs(dvc_yaml: Path = ROOT / "dvc.yaml") -> dict[str, tuple[str, ...]]:
    """Each stage's outs in dvc.yaml, in its order (an out with options, ``- path: {cache: false}``, by its path)."""
    spec = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))
    return {name: tuple(next(iter(out)) if isinstance(out, dict) else out for out in stage.get("outs", ()))
            for name, stage in spec["stages"].items()}


#: Every output, read from dvc.yaml: a stage's new output is checked by every ``assert_no_outputs`` at once.
OUTS = dvc_outs()
SPLIT_OUTPUTS, ENCODE_OUTPUTS, SCORE_OUTPUTS = OUTS["split"], OUTS["encode"], OUTS["score"]
INDEX_OUTPUTS = OUTS["index"]
ALL_OUTPUTS = SPLIT_OUTPUTS + ENCODE_OUTPUTS + SCORE_OUTPUTS + INDEX_OUTPUTS


def out(stage: str, path: str) -> str:
    """``path``, an out of ``stage`` in dvc.yaml (an ImportError at once if it is not: the names below cannot drift)."""
    if path not in OUTS[stage]:
        raise ImportError(f"tests/helpers.py names {path} an output of {stage}, but dvc.yaml's outs of {stage} are "
                          f"{', '.join(OUTS[stage])}")
    return path


CATALOG = out("split", "data/prepared/catalog.csv")
SPLIT = out("split", "data/prepared/split.csv")
SKIPPED = out("split", "data/prepared/skipped.csv")
#: The encode stage's one output, a folder (embeddings.npy, ids.npy, provenance.json), and its files.
EMBEDDINGS_DIR = out("encode", "data/embeddings")
EMBEDDINGS = f"{EMBEDDINGS_DIR}/embeddings.npy"
IDS = f"{EMBEDDINGS_DIR}/ids.npy"
METRICS = out("score", "metrics/recall.json")
COUNTS = out("score", "metrics/counts.json")
PER_CLASS = out("score", "metrics/per_class.csv")
CURVE = out("score", "metrics/recall_curve.csv")
#: The score stage's folder output (per_query.csv, neighbors.csv, embedding_copies.csv) and its full per-query table.
SCORES_DIR = out("score", "data/scores")
PER_QUERY = f"{SCORES_DIR}/per_query.csv"
#: Score outputs that name the settings they ran with (score.backend among them).
EVALUATED_OUTPUTS = (out("score", "metrics/evaluated.json"), out("score", "reports/index.html"))
#: The score outputs that do not depend on score.backend.
RANKING_OUTPUTS = tuple(rel for rel in SCORE_OUTPUTS if rel not in EVALUATED_OUTPUTS)
STAGES = ("split", "encode", "score", "index")
#: Sections a stage reads besides its own: the index stage scores lists by the score stage's rules.
ALSO_READS = {"index": ("score",)}
#: The score-table projects (conftest): per-label counts 20, 22 and 24; a camera column cycling CAMERAS.
UNEVEN_PER_LABEL = 20
CAMERAS = ("cam0", "cam1", "cam2")


# ---------------------------------------------------------------------------------------------- subprocesses


#: Where a session fixture's project keeps its own embedding cache (``cache_in``): copied with the project.
PROJECT_CACHE = Path(".cache") / "recallk"


@contextlib.contextmanager
def cache_in(project: Path):
    """Within the block, the embedding cache (``RECALLK_CACHE_DIR``, read by stages and subprocesses) is
    ``project / PROJECT_CACHE``: a session fixture's own, copied along with the project (:func:`copy_tree`)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RECALLK_CACHE_DIR", str(project / PROJECT_CACHE))
        yield project / PROJECT_CACHE


def tool_env(**extra: str) -> dict[str, str]:
    """Environment for subprocesses: this interpreter's bin first, the repo on PYTHONPATH, a git
    identity, no DVC analytics, plus ``extra``."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(DVC_NO_ANALYTICS="1", GIT_AUTHOR_NAME="test", GIT_AUTHOR_EMAIL="test@example.com",
               GIT_COMMITTER_NAME="test", GIT_COMMITTER_EMAIL="test@example.com")
    env.update(extra)
    return env


def run(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command; on an unexpected exit code fail with its output."""
    proc = subprocess.run(args, cwd=cwd, env=tool_env(), capture_output=True, text=True)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


#: The markers of the running test, kept by conftest.py (``pytest_runtest_setup``): a stage script runs only
#: in a test marked ``stage`` or ``pipeline`` (:func:`run_module`), so ``-m "not stage and not pipeline"``
#: runs no stage subprocess.
RUNNING_MARKS: set[str] = set()
STAGE_MARKS = frozenset({"stage", "pipeline"})


def run_module(module: str, *args: str, cwd: Path, check: bool = False) -> subprocess.CompletedProcess:
    """Run ``python -m <module> args`` in ``cwd`` (a stage script, usually: only in a test marked ``stage`` or
    ``pipeline``)."""
    if module.startswith("stages.") and not RUNNING_MARKS & STAGE_MARKS:
        pytest.fail(f"this test runs `python -m {module}` but is not marked `stage`: add @pytest.mark.stage (or "
                    "pytestmark = pytest.mark.stage to its file), or take a project of conftest.STAGE_PROJECTS",
                    pytrace=False)
    return run([sys.executable, "-m", module, *args], cwd=cwd, check=check)


def dvc(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "dvc", *args], cwd=cwd, check=check)


def git(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return run(["git", *args], cwd=cwd, check=check)


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().split()[0]), 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def run_queue(repo: Path, attempts: int = 3, deadline_s: float = 1200.0) -> int:
    """`dvc exp run --run-all --jobs 1`, started again where DVC's queue worker died: its kombu filesystem broker
    can read a message file while it is being written, the worker exits on the JSONDecodeError and `--run-all`
    waits for ever (treeverse/dvc#10398, #10428, open). The worker's pid file tells: it is removed before each
    start, so only the worker of this start can be found dead; the queued experiments that are left run on the
    next start. Fails when a start dies ``attempts`` times or the whole takes over ``deadline_s`` seconds (no
    hang). Returns the number of restarts."""
    pid_file, log = repo / ".dvc/tmp/exps/celery/dvc-exp-worker-1.pid", repo.parent / "run-all.log"
    end, status = time.monotonic() + deadline_s, ""
    for attempt in range(attempts):
        pid_file.unlink(missing_ok=True)  # a dead worker's: the next worker writes its own
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "dvc", "exp", "run", "--run-all", "--jobs", "1"], cwd=repo,
                                    env=tool_env(), stdout=out, stderr=subprocess.STDOUT)
            dead_since = None
            while proc.poll() is None:
                time.sleep(1)
                if time.monotonic() > end:
                    proc.kill()
                    proc.wait()
                    pytest.fail(f"the queue did not finish in {deadline_s:.0f} s:\n{log.read_text()}")
                if pid_file.exists() and not _alive(pid_file):
                    dead_since = dead_since or time.monotonic()
                    if time.monotonic() - dead_since > 10:  # the worker is gone and --run-all still waits
                        proc.kill()
                        proc.wait()
                else:
                    dead_since = None
        status = dvc("queue", "status", cwd=repo).stdout
        states = [line.split()[-1] for line in status.splitlines()[1:] if line[:1].isalnum() and " " in line]
        assert "Failed" not in states, status + log.read_text()
        if not {"Queued", "Running"} & set(states):
            return attempt
    pytest.fail(f"the queue did not run in {attempts} starts:\n{status}\n{log.read_text()}")


# ---------------------------------------------------------------------------------------------- data


def save_image(path: Path, seed: int = 0, size: tuple[int, int] = (12, 12), mode: str = "RGB",
               fmt: str | None = None) -> Path:
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


def new_project(dest: Path, per_label: int | None = 20) -> Path:
    """A working directory with the project's params.yaml and (unless ``per_label`` is None) a
    ``per_label`` digits subset as its data root."""
    dest.mkdir(parents=True)
    shutil.copy2(ROOT / "params.yaml", dest / "params.yaml")
    if per_label is not None:
        copy_digits(dest / "data" / "digits", per_label=per_label)
    return dest


def copy_tree(src: Path, dest: Path) -> Path:
    """A private copy of a project or repo (outputs, embedding cache, git history and DVC cache
    included; DVC's state DB and locks belong to the original)."""
    shutil.copytree(src, dest, symlinks=True)
    shutil.rmtree(dest / ".dvc" / "tmp", ignore_errors=True)
    return dest


def read_csv(project: Path, rel: str) -> pd.DataFrame:
    """A CSV output as text (every cell a string, empty cells ``""``)."""
    return pd.read_csv(project / rel, dtype=str, keep_default_na=False)


def read_metrics(project: Path) -> dict[str, Any]:
    """recall.json (the means), counts.json (the counts) and, when present, intervals.json (intervals, class
    means) together; each key in one file only, and no count or interval in the declared recall.json."""
    headline = json.loads((project / METRICS).read_text(encoding="utf-8"))
    assert all(isinstance(v, float) for v in headline.values()), f"a count or other non-mean in {METRICS}"
    assert not [k for k in headline if k.endswith(("_ci_low", "_ci_high", "_class_mean"))], "detail in recall.json"
    counts = json.loads((project / COUNTS).read_text(encoding="utf-8"))
    detail_path = project / "metrics/intervals.json"
    detail = json.loads(detail_path.read_text(encoding="utf-8")) if detail_path.is_file() else {}
    assert not set(headline) & set(detail) and not set(counts) & (set(headline) | set(detail))
    return {**headline, **counts, **detail}


def read_bytes(project: Path, rels: Iterable[str]) -> dict[str, bytes]:
    """Each output's bytes; a folder output (``data/embeddings``, ``data/scores``, ``metrics/index``) as each file
    under it."""
    out: dict[str, bytes] = {}
    for rel in rels:
        path = project / rel
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        out.update({p.relative_to(project).as_posix(): p.read_bytes() for p in files})
    return out


# ---------------------------------------------------------------------------------------------- params


def set_dotted(params: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """Set ``section.key[.sub]`` in a params mapping (creating missing mappings); returns ``params``."""
    *parents, leaf = dotted.split(".")
    node = params
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return params


def edit_params(project: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    """Apply ``change(params)`` to the project's params.yaml (rewritten with PyYAML)."""
    path = project / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    change(params)
    path.write_text(yaml.safe_dump(params, sort_keys=False, allow_unicode=True), encoding="utf-8")


def set_params(project: Path, changes: dict[str, Any]) -> None:
    """Set dotted params, ``{"score.bootstrap.seed": 1}``, in the project's params.yaml."""
    def change(params: dict[str, Any]) -> None:
        for key, value in changes.items():
            set_dotted(params, key, value)

    edit_params(project, change)


# ---------------------------------------------------------------------------------------------- stage runs


def _output(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


def run_ok(project: Path, *stages: str, cli: bool = False) -> subprocess.CompletedProcess:
    """Run each stage (``split``, ``encode``, ``score``) in ``project``; each must succeed. Returns the last run.
    In process (:func:`run_in_process`: no interpreter start per stage), or with ``cli`` as ``python -m
    stages.<stage>``: the command line's exit 0, kept by conftest.py's ``split_base`` and by the runs that start
    torch or join a Ray cluster (their process-wide state stays out of the test process)."""
    proc = None
    for stage in stages:
        proc = run_module(f"stages.{stage}", cwd=project) if cli else run_in_process(stage, cwd=project)
        assert proc.returncode == 0, f"{stage} failed\n{_output(proc)}"
        assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def assert_user_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """A clean user error: exit 2, exactly one ``error:`` message, no traceback, every fragment in stderr."""
    out = _output(proc)
    assert proc.returncode == 2, out
    assert "Traceback" not in proc.stderr, out
    assert len(re.findall(r"^error: ", proc.stderr, flags=re.M)) == 1, out
    for fragment in fragments:
        assert fragment in proc.stderr, f"{fragment!r} not in stderr:\n{proc.stderr}"


#: The stage runner's log format (``stages.runner.run_stage``'s ``logging.basicConfig``), for :func:`run_in_process`.
STAGE_LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def run_in_process(stage: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m stages.<stage> args`` in ``cwd``, but in this process: ``stages.runner.run_stage`` of the
    stage's ``main``, so a user error is its one ``error:`` line and exit 2, as from the command line. Returns
    what a subprocess would: the exit code, stdout, and stderr with the stage's log lines (INFO and up, the
    runner's format); any other exception is exit 1 with its traceback on stderr. A message test pays no
    interpreter start; the subprocesses that keep the command line's contract are :func:`run_ok`'s and those
    of tests/stages/test_runner.py. The cwd is on sys.path while it runs (a ``callable:`` backbone's module is
    imported from the project, as ``python -m`` does), and the modules imported from the project are
    forgotten afterwards."""
    import importlib
    import io
    import logging
    import traceback

    from stages import runner

    if not RUNNING_MARKS & STAGE_MARKS:  # as for a stage subprocess (run_module): `-m "not stage"` runs no stage
        pytest.fail(f"this test runs the {stage} stage but is not marked `stage`: add @pytest.mark.stage (or "
                    "pytestmark = pytest.mark.stage to its file), or take a project of conftest.STAGE_PROJECTS",
                    pytrace=False)
    main = importlib.import_module(f"stages.{stage}").main
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter(STAGE_LOG_FORMAT))
    root, before_modules, folder = logging.getLogger(), set(sys.modules), str(cwd)
    level = root.level
    # a console command run in process earlier (recallk.cli.show_progress_lines) leaves a handler on the `recallk`
    # logger that writes to whatever sys.stderr is: a stage subprocess has none, so it is off while the stage runs
    library, library_handlers = logging.getLogger("recallk"), []
    library_handlers[:] = library.handlers
    for h in library_handlers:
        library.removeHandler(h)
    root.addHandler(handler)  # before run_stage: its basicConfig then adds none of its own
    root.setLevel(logging.INFO)
    sys.path.insert(0, folder)
    importlib.invalidate_caches()
    code, home = 0, os.getcwd()
    try:
        os.chdir(cwd)  # contextlib.chdir is Python 3.11+
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runner.run_stage(main, list(args))
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            except Exception:  # a bug, not a user error: the traceback a subprocess would print
                err.write(traceback.format_exc())
                code = 1
    finally:
        os.chdir(home)
        root.removeHandler(handler)
        root.setLevel(level)
        for h in library_handlers:
            library.addHandler(h)
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)
        for name in set(sys.modules) - before_modules:  # a user's module, imported from the project
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(folder + os.sep):
                del sys.modules[name]
    return subprocess.CompletedProcess([sys.executable, "-m", f"stages.{stage}", *args], code, out.getvalue(),
                                       err.getvalue())


def run_fails(project: Path, stage: str, *fragments: str, args: Iterable[str] = ()) -> subprocess.CompletedProcess:
    """Run a stage that must fail as a user error (:func:`assert_user_error`), in process
    (:func:`run_in_process`); returns the run."""
    proc = run_in_process(stage, *args, cwd=project)
    assert_user_error(proc, *fragments)
    return proc


def assert_no_outputs(project: Path, outputs: Iterable[str] = ALL_OUTPUTS) -> None:
    """None of ``outputs`` exists, and no temporary file is left anywhere in the project."""
    left = [p for p in outputs if (project / p).exists()]
    assert not left, f"outputs left behind: {left}"
    assert not list(project.rglob("*.tmp")), f"temporary files left behind: {list(project.rglob('*.tmp'))}"


def plant_stale(project: Path, outputs: Iterable[str]) -> None:
    """Stale outputs of an 'earlier run': a failing stage must remove them (a folder output already there gets a
    stale file in it)."""
    for p in outputs:
        path = project / p
        path = path / "stale.csv" if path.is_dir() else path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("stale\n")


# ---------------------------------------------------------------------------------------------- pipelines (dvc)


PROJECT_FILES = (".dvc/config", ".dvc/.gitignore", ".dvcignore", ".gitignore", "dvc.yaml", "params.yaml",
                 "plots/offline/template.html")  # .dvc/config names it: dvc plots render offline
RAN_RE = re.compile(r"Running stage '([^']+)'")
SKIPPED_RE = re.compile(r"Stage '([^']+)' didn't change, skipping")


def copy_pipeline(dest: Path, *, per_label: int = 20, full_data: bool = False, with_results: bool = False) -> Path:
    """Copy the project's pipeline (code, DVC files, params, a digits subset or all of them) into
    ``dest``, not a git repo yet; ``with_results`` adds the committed dvc.lock and metrics."""
    dest.mkdir(parents=True, exist_ok=True)
    for package in ("stages", "recallk"):  # the stages' code deps (dvc.yaml)
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for rel in PROJECT_FILES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    if full_data:
        shutil.copytree(DIGITS, dest / "data" / "digits")
    else:
        copy_digits(dest / "data" / "digits", per_label=per_label)
    if with_results:
        for rel in ("dvc.lock", METRICS, "data/.gitignore", "data/prepared/.gitignore"):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return dest


def commit(repo: Path, message: str) -> None:
    git("add", "-A", cwd=repo)
    git("commit", "-q", "--allow-empty", "-m", message, cwd=repo)


def git_init(repo: Path, message: str = "init") -> None:
    git("init", "-q", "-b", "main", cwd=repo)
    commit(repo, message)


def repro(repo: Path, *args: str, check: bool = True) -> tuple[set[str], set[str], str]:
    """Run ``dvc repro``; return (stages run, stages skipped as unchanged, combined output)."""
    proc = dvc("repro", *args, cwd=repo, check=check)
    out = proc.stdout + proc.stderr
    return set(RAN_RE.findall(out)), set(SKIPPED_RE.findall(out)), out


# ---------------------------------------------------------------------------------------------- split in-process


SPLIT_FRACTIONS = {"train": 0.5, "val": 0.25, "gallery": 0.25}


def build(data_root: str = "data", csv: str | None = None, **overrides: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``recallk.data.prepare.prepare`` with per_class defaults (paths relative to the cwd): (catalog, split)."""
    from recallk.data import prepare
    from recallk.data.settings import SplitSettings
    from recallk.settings.base import from_mapping

    params = dict(data_root=data_root, csv=csv, on_bad_image="error", strategy="per_class",
                  protocol="query_gallery", seed=0, fractions=SPLIT_FRACTIONS, images="files") | overrides
    cat, spl, skipped = prepare.prepare(from_mapping(SplitSettings, params))
    assert skipped.empty or params["on_bad_image"] == "skip"
    return cat, spl


def write_images(root: Path, labels: dict[str, int], seed: int = 0) -> None:
    """``n`` distinct PNGs per label folder: ``root/<label>/000.png`` ..."""
    for j, (label, n) in enumerate(labels.items()):
        for i in range(n):
            save_image(root / label / f"{i:03d}.png", seed=seed + 100 * j + i)


def write_csv(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- encode


def image_row(path: Path, image_id: str) -> dict[str, str]:
    """A catalog row (``image_id, path, sha256``) for an image file."""
    return {"image_id": image_id, "path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def image_catalog(folder: Path, seeds: Iterable[int], prefix: str = "id") -> pd.DataFrame:
    """One random PNG ``<prefix><i>.png`` (image_id ``<prefix><i>``) per seed; equal seeds give files with
    identical content."""
    return pd.DataFrame([image_row(save_image(folder / f"{prefix}{i}.png", seed=s), f"{prefix}{i}")
                         for i, s in enumerate(seeds)])


# ---------------------------------------------------------------------------------------------- the cheapest project


def tiny_project(where: Path, labels: Sequence[str] = ("a", "b", "c", "d"), per_label: int = 3) -> Path:
    """A project with ``per_label`` 8 x 8 images per label under data/digits/<label>/, 4 x 4 pixels, ks
    [1, 2] and 10 bootstrap resamples: the cheapest project every stage runs on (the hostile-input corpus)."""
    proj = new_project(where / "proj", per_label=None)
    set_params(proj, {"encode.pixels.resolution": 4, "score.ks": [1, 2], "score.bootstrap.resamples": 10})
    for j, label in enumerate(labels):
        for i in range(per_label):
            save_image(proj / "data" / "digits" / label / f"{i}.png", seed=100 * j + i, size=(8, 8))
    return proj


def caption_encoders(letter: str = "a", extra: str = "") -> str:
    """The text of a user module for `encode.backbone: callable:encoders:image` with `encode.callable.text_function:
    text`: 3-d image vectors (the mean colour plus one) and 3-d caption vectors (its length, the count of
    ``letter`` plus one, and 1); ``extra`` is appended (more functions)."""
    return f'''import numpy as np


def image(images):
    return np.array([np.asarray(im, dtype=np.float32).mean(axis=(0, 1)) + 1 for im in images])


def text(captions):
    return np.array([[len(c), c.count("{letter}") + 1, 1.0] for c in captions], dtype=np.float32)
{extra}'''
