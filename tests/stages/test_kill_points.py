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
The index stage's folder of tables is one output (a temp folder renamed into place, each of its files fsynced);
its measured speeds make two real runs differ, so only its replays are compared byte for byte.

Ctrl-C (a real SIGINT, sent by the stage to itself at a write or between two renames) in split and score:
one ``error:`` line, exit code 130, no output and no temp file left (the renamed ones are removed again).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
import types
from pathlib import Path
from typing import Callable

import pytest

import recallk.atomic
from extras import has_extra
from helpers import out, set_params
from hostile_cases import make_project
from recallk.compare import cli as compare_cli
from stages import encode, index, score, split
from stages.runner import remove_outputs, run_stage

pytestmark = pytest.mark.stage

HOOKED = ("chmod", "fsync", "replace")


def hooked_os(on_call: Callable[[str], None]) -> types.SimpleNamespace:
    """``os`` with :data:`HOOKED` calling ``on_call(name)`` first (put in place of recallk.atomic's ``os``)."""
    def hooked(name):
        real = getattr(os, name)

        def call(*args, **kwargs):
            on_call(name)
            return real(*args, **kwargs)
        return call

    proxy = types.SimpleNamespace(**{n: getattr(os, n) for n in dir(os) if not n.startswith("__")})
    for name in HOOKED:
        setattr(proxy, name, hooked(name))
    return proxy


def traced(run: Callable[[], None], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Run ``run()`` here and return its :data:`HOOKED` calls of recallk.atomic, in order: the kill points."""
    calls: list[str] = []
    with monkeypatch.context() as m:
        m.setattr(recallk.atomic, "os", hooked_os(calls.append))
        run()
    return calls


def killed_at(point: int, run: Callable[[], None], cwd: Path) -> bool:
    """Run ``run()`` in a forked child in ``cwd`` that SIGKILLs itself at its ``point``-th write or rename
    (1-based, over :data:`HOOKED` calls of recallk.atomic); True when it was killed, False when it finished."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.chdir(cwd)
            calls = [0]

            def count(_name: str) -> None:
                calls[0] += 1
                if calls[0] == point:
                    os.kill(os.getpid(), signal.SIGKILL)

            recallk.atomic.os = hooked_os(count)
            sys.stdout = sys.stderr = open(os.devnull, "w")
            run()
            code = 0
        finally:
            os._exit(code)
    for _ in range(1200):  # at most 120 s: a child that hangs fails the test instead of blocking the run
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail(f"the run to be killed at point {point} hung (a lock held across the fork?)")
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, f"the run at kill point {point} failed (exit {os.WEXITSTATUS(status)})"
    return False


def temps(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob(".*.tmp"))


def expected_after(point: int, calls: list[str]) -> tuple[int, int]:
    """(outputs renamed into place, temp files or folders) after a kill at ``point`` of a write whose hooked
    calls are ``calls``: each output's temp is made just before its ``chmod`` (so a kill there leaves it), then
    filled and fsynced (a folder: one fsync per file), and the renames come last, one per output."""
    made = calls[:point].count("chmod")
    renamed = calls[:point - 1].count("replace")
    return renamed, made - renamed


def content(path: Path) -> bytes | dict[str, bytes]:
    """A file's bytes, or a folder's files (name -> bytes)."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())} if path.is_dir() else path.read_bytes()


def check_kill(point: int, run: Callable[[], None], root: Path, outputs: list[Path], want: dict | None,
               calls: list[str]) -> None:
    """Kill ``run`` at ``point`` and check what it left (see the module docstring); ``want`` None: not the
    bytes (a real run of a stage that measures time)."""
    n = len(outputs)
    assert killed_at(point, run, root), f"no kill at point {point}: fewer writes than {n} outputs"
    renamed, left = expected_after(point, calls)
    present = [p for p in outputs if p.exists()]
    assert present == outputs[:renamed], f"point {point}: outputs {present}"
    assert len(temps(root)) == left, f"point {point}: temp files {temps(root)} (an earlier run's left over?)"
    assert len(present) < n  # DVC sees a missing output: the stage is changed until a run completes
    for p in present if want is not None else ():
        assert content(p) == want[p]  # what is in place is whole


def assert_all_or_nothing(root: Path, outputs: list[Path], run: Callable[[], None], monkeypatch: pytest.MonkeyPatch,
                          replay: Callable[[], None] | None = None, timed: bool = False) -> None:
    """Kill ``replay`` (default ``run``) at every point in turn, ``run`` once between two renames, then finish
    ``run`` (in this process); compare with the outputs of the first, uninterrupted ``run`` (the replays only,
    when ``timed``: the index stage's outputs hold measured speeds, so two real runs differ)."""
    run()
    want = {p: content(p) for p in outputs}
    calls = traced(replay or run, monkeypatch)
    assert calls.count("chmod") == calls.count("replace") == len(outputs), calls
    for point in range(1, len(calls) + 1):
        check_kill(point, replay or run, root, outputs, want, calls)
    renames = [i for i, name in enumerate(calls, 1) if name == "replace"]
    real_want = None if timed else want
    # the real run killed with one output renamed (at its only rename, for a stage of one folder output)
    check_kill(renames[min(1, len(renames) - 1)], run, root, outputs, real_want, traced(run, monkeypatch))
    run()
    assert all(p.exists() for p in outputs) and temps(root) == []
    assert real_want is None or {p: content(p) for p in outputs} == want


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_project(tmp_path_factory.mktemp("kill"))


@pytest.mark.parametrize("stage, module", [
    ("split", split),    # 5 outputs: the catalog, split, skipped and near-duplicate CSVs, provenance.json
    ("encode", encode),  # 1 output, the folder data/embeddings: embeddings.npy, ids.npy, provenance.json (the
                         # cache is not an output, nor inside it)
    ("score", score),    # 11 outputs: metrics, tables, the folder data/scores, the failure sheet and the HTML report
    ("index", index),    # 2 outputs: index.json, the folder of tables (points.csv and one per point); written
                         # with them, all or none, the 4 measured files (timings, their CSV, PNG, HTML: not outs)
])
def test_a_stage_killed_at_any_write_or_rename_is_all_or_nothing_at_the_next_run(tiny, stage, module, monkeypatch):
    monkeypatch.setenv("RECALLK_NO_REPORT", "1")
    monkeypatch.chdir(tiny)
    if stage == "index" and has_extra("faiss"):  # one point: a folder of two tables (else points.csv alone)
        # one search thread: an OpenMP team made before a fork deadlocks the forked child's next parallel region
        set_params(tiny, {"index.kinds": ["Flat"], "index.threads": 1})
    # the earlier stages' outputs, made here when this case runs alone or on another worker than theirs
    for earlier in (split, encode, score)[:("split", "encode", "score", "index").index(stage)]:
        if not all((tiny / p).exists() for p in earlier.OUTPUTS.values()):
            earlier.main([])
    assert [p for p in module.OUTPUTS.values()] == [out(stage, p) for p in module.OUTPUTS.values()]
    outputs = [tiny / p for p in {**module.OUTPUTS, **getattr(module, "MEASURED", {})}.values()]
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

    assert_all_or_nothing(tiny, outputs, run, monkeypatch, replay, timed=stage == "index")


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
    assert_all_or_nothing(tmp_path, outputs, lambda: compare_cli.main(args), monkeypatch)
    shutil.rmtree(tmp_path / "res")


@pytest.mark.parametrize("stage, module, point", [
    ("split", split, 4),           # while the second of its 5 outputs is written
    # 10 files (a chmod and an fsync each) and the data/scores folder (a chmod, 3 fsyncs): 24 writes, then its 11
    # renames; the second rename: one output already in place
    ("score", score, 2 * 10 + 4 + 2),
])
def test_ctrl_c_in_split_and_score_is_one_line_and_leaves_no_output(tiny, monkeypatch, capsys, stage, module, point):
    """A real SIGINT, sent by the stage (run here, as `python -m stages.<stage>` runs it) to itself at the
    ``point``-th write or rename, with Python's own Ctrl-C handler in place (a test runner may have another)."""
    monkeypatch.setenv("RECALLK_NO_REPORT", "1")
    monkeypatch.chdir(tiny)
    for earlier in (split, encode)[:("split", "encode", "score").index(stage)]:
        if not all((tiny / p).exists() for p in earlier.OUTPUTS.values()):
            earlier.main([])
    calls = [0]

    def ctrl_c(_name: str) -> None:
        calls[0] += 1
        if calls[0] == point:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(recallk.atomic, "os", hooked_os(ctrl_c))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as exited:
            run_stage(module.main, [])
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert exited.value.code == 130 and calls[0] >= point, err
    assert "Traceback" not in err and err.count("error: ") == 1, err
    assert f"error: interrupted (Ctrl-C) before the {stage} stage finished" in err, err
    assert [p for p in module.OUTPUTS.values() if (tiny / p).exists()] == [] and temps(tiny) == []
    # (the next run completes: the kill cases above prove it; each case here makes the outputs it needs)


def test_ctrl_c_in_recallk_compare_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from recallk import cli

    renames = []

    def ctrl_c_at_the_second_rename(name: str) -> None:
        renames.extend([name] if name == "replace" else [])
        if len(renames) == 2:
            raise KeyboardInterrupt  # c.json is in place, c.md not yet

    monkeypatch.setattr(recallk.atomic, "os", hooked_os(ctrl_c_at_the_second_rename))
    monkeypatch.chdir(tmp_path)
    table = "image_id,label,num_positives,num_retrievable,hit@1,evaluated\nq0,a,1,3,1,e\nq1,b,1,3,0,e\n"
    for name in ("a.csv", "b.csv"):
        (tmp_path / name).write_text(table)
    code = cli.main(["compare", "a.csv", "b.csv", "--json", "c.json", "--md", "c.md", "--resamples", "5",
                     "--permutations", "5"])
    out, err = capsys.readouterr()
    assert code == 130 and out == "" and "Traceback" not in err, (code, out, err)
    assert err.startswith("error: interrupted (Ctrl-C) before `recallk compare` finished") and err.count("\n") == 1
    assert len(renames) == 2 and not (tmp_path / "c.json").exists() and not (tmp_path / "c.md").exists()
    assert temps(tmp_path) == []
