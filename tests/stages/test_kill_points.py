"""All or nothing under SIGKILL: each stage (and ``recallk compare --json/--md``) is killed at every write and
rename of :mod:`recallk.atomic` in turn, each run starting from the leftovers of the run killed before it.

A forked child SIGKILLs itself just before the n-th ``chmod`` of a fresh temp file (it exists, empty: a write
cut short), the n-th ``fsync`` (written, not renamed) or the n-th ``os.replace`` (some outputs renamed, the
others not). After each kill the project must hold exactly what that run had done so far (so every leftover of
the run killed before it was removed) and miss at least one output (so DVC, whose dvc.lock lists them all, sees
the stage as changed); the real run after the last kill must leave exactly the full output set, byte-identical
to an uninterrupted run, and no temp file. To stay fast, a stage's killed runs replay its tail (remove its
outputs, then the one ``write_all`` of all of them, recorded from a real run: the test checks it covers the
stage's OUTPUTS); one real run of the stage is killed too, between two renames. compare runs for real each time.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import types
from pathlib import Path
from typing import Callable

import pytest

import recallk.atomic
from helpers import out
from hostile_cases import make_project
from recallk.compare import cli as compare_cli
from stages import encode, score, split
from stages.runner import remove_outputs

pytestmark = pytest.mark.stage

HOOKED = ("chmod", "fsync", "replace")


def killed_at(point: int, run: Callable[[], None], cwd: Path) -> bool:
    """Run ``run()`` in a forked child in ``cwd`` that SIGKILLs itself at its ``point``-th write or rename
    (1-based, over :data:`HOOKED` calls of recallk.atomic); True when it was killed, False when it finished."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.chdir(cwd)
            calls = [0]

            def hooked(name):
                real = getattr(os, name)

                def call(*args, **kwargs):
                    calls[0] += 1
                    if calls[0] == point:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real(*args, **kwargs)
                return call

            proxy = types.SimpleNamespace(**{n: getattr(os, n) for n in dir(os) if not n.startswith("__")})
            for name in HOOKED:
                setattr(proxy, name, hooked(name))
            recallk.atomic.os = proxy
            sys.stdout = sys.stderr = open(os.devnull, "w")
            run()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, f"the run at kill point {point} failed (exit {os.WEXITSTATUS(status)})"
    return False


def temps(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob(".*.tmp"))


def expected_after(point: int, n: int) -> tuple[int, int]:
    """(outputs renamed into place, temp files) after a kill at ``point`` of ``n`` outputs: each output's
    temp file is chmod-ed then fsynced (points 1..2n), then the n renames (points 2n+1..3n)."""
    if point <= 2 * n:
        return 0, (point + 1) // 2
    renamed = point - 2 * n - 1
    return renamed, n - renamed


def check_kill(point: int, run: Callable[[], None], root: Path, outputs: list[Path], want: dict) -> None:
    """Kill ``run`` at ``point`` and check what it left (see the module docstring)."""
    n = len(outputs)
    assert killed_at(point, run, root), f"no kill at point {point}: fewer writes than {n} outputs"
    renamed, left = expected_after(point, n)
    present = [p for p in outputs if p.exists()]
    assert present == outputs[:renamed], f"point {point}: outputs {present}"
    assert len(temps(root)) == left, f"point {point}: temp files {temps(root)} (an earlier run's left over?)"
    assert len(present) < n  # DVC sees a missing output: the stage is changed until a run completes
    for p in present:
        assert p.read_bytes() == want[p]  # what is in place is whole


def assert_all_or_nothing(root: Path, outputs: list[Path], run: Callable[[], None],
                          replay: Callable[[], None] | None = None) -> None:
    """Kill ``replay`` (default ``run``) at every point in turn, ``run`` once between two renames, then finish
    ``run`` (in this process); compare with the bytes of the first, uninterrupted ``run``."""
    run()
    want = {p: p.read_bytes() for p in outputs}
    n = len(outputs)
    for point in range(1, 3 * n + 1):
        check_kill(point, replay or run, root, outputs, want)
    check_kill(2 * n + 2, run, root, outputs, want)  # the real run, after its first rename
    run()
    assert {p: p.read_bytes() for p in outputs} == want and temps(root) == []


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_project(tmp_path_factory.mktemp("kill"))


@pytest.mark.parametrize("stage, module", [
    ("split", split),    # 5 outputs: the catalog, split, skipped and near-duplicate CSVs, provenance.json
    ("encode", encode),  # 3 outputs: embeddings.npy, ids.npy, provenance.json (the cache is not an output)
    ("score", score),    # 12 outputs: metrics, tables, the failure sheet and the HTML report
])
def test_a_stage_killed_at_any_write_or_rename_is_all_or_nothing_at_the_next_run(tiny, stage, module, monkeypatch):
    monkeypatch.setenv("RECALLK_NO_REPORT", "1")
    monkeypatch.chdir(tiny)
    # the earlier stages' outputs, made here when this case runs alone or on another worker than theirs
    for earlier in (split, encode)[:("split", "encode", "score").index(stage)]:
        if not all((tiny / p).is_file() for p in earlier.OUTPUTS.values()):
            earlier.main([])
    outputs = [tiny / p for p in module.OUTPUTS.values()]
    assert [str(p.relative_to(tiny)) for p in outputs] == [out(stage, p) for p in module.OUTPUTS.values()]
    recorded = []
    real = module.write_all

    def record(writers):
        recorded[:] = list(writers)
        real(writers)

    monkeypatch.setattr(module, "write_all", record)

    def replay():  # the stage's first and last steps, without the work between them
        remove_outputs(outputs)
        real(recorded)

    def run():
        module.main([])
        assert [tiny / p for p, _ in recorded] == outputs  # one write_all of every output, in OUTPUTS' order

    assert_all_or_nothing(tiny, outputs, run, replay)


def test_compare_json_and_md_killed_at_any_write_or_rename(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny)
    table = tiny / "metrics" / "per_query.csv"
    if not table.exists():
        for module in (split, encode, score):
            module.main([])
    (tmp_path / "a.csv").write_bytes(table.read_bytes())
    monkeypatch.chdir(tmp_path)
    outputs = [tmp_path / "res" / "c.json", tmp_path / "res" / "c.md"]  # res/ is made by the first run
    args = ["a.csv", str(table), "--json", "res/c.json", "--md", "res/c.md", "--resamples", "20",
            "--permutations", "20"]
    assert_all_or_nothing(tmp_path, outputs, lambda: compare_cli.main(args))
    shutil.rmtree(tmp_path / "res")
