"""Where the evaluator's numbers go (recallk/training/live.py): DVCLive's files, written by a real ``dvclive.Live``
or without it (the same bytes); DVC reading them (``dvc exp show --json`` with the final values and ``--sort-by
recall@1``, ``dvc plots show --json`` with one point per epoch at step = epoch) in a temp git + DVC repository;
and ``recallk track`` reading the run's epochs from the folder."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from extras import extra
from helpers import dvc, git, git_init
from recallk.compare.board_cli import track_main
from recallk.errors import InputError
from recallk.training import Evaluator, LiveFiles
from recallk.training.layout import run_epochs

LABELS = np.repeat(np.arange(8), 5)
CENTRES = np.random.default_rng(1).normal(size=(8, 10))
NOISE = np.random.default_rng(2).normal(size=(40, 10))
EPOCHS = (0, 2, 5)   # evaluated every few epochs: the steps are the epochs, not a count


def run(log, noises=(2.5, 1.2, 0.4), **kwargs) -> list:
    evaluator = Evaluator(LABELS, ks=(1, 3), metrics=["recall", "map@r"], log=log, **kwargs)
    return [evaluator(epoch, CENTRES[LABELS] + noise * NOISE) for epoch, noise in zip(EPOCHS, noises)]


def tsv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def test_without_dvclive_the_files_are_dvclives_layout(tmp_path):
    results = run(LiveFiles(tmp_path / "log"))
    folder = tmp_path / "log"
    names = ["recall@1", "recall@3", "map@r"]
    expected = {f"{k}{part}" for k in names for part in ("", "_ci_low", "_ci_high")}
    assert {p.stem for p in (folder / "plots" / "metrics").glob("*.tsv")} == expected
    rows = tsv(folder / "plots" / "metrics" / "map@r.tsv")
    assert [(int(r["step"]), float(r["map@r"])) for r in rows] == [(e, r.metrics["map@r"]) for e, r in
                                                                     zip(EPOCHS, results)]
    low = tsv(folder / "plots" / "metrics" / "recall@1_ci_low.tsv")
    assert [float(r["recall@1_ci_low"]) for r in low] == [r.intervals["recall@1"][0] for r in results]
    summary = json.loads((folder / "metrics.json").read_text())
    last = results[-1]
    assert summary["step"] == 5 and summary["map@r"] == last.metrics["map@r"]
    assert summary["best_epoch"] == last.best_epoch and summary["recall@3_ci_high"] == last.intervals["recall@3"][1]
    assert (folder / "dvc.yaml").read_text() == "metrics:\n- metrics.json\nplots:\n- plots/metrics:\n    x: step\n"
    assert [r.table_path for r in results] == [str(folder / "per_query" / f"epoch_{e:04d}.csv") for e in EPOCHS]
    assert json.loads((folder / "per_query" / "evaluated.json").read_text())["monitor"] == "map@r"


def test_a_second_run_starts_afresh(tmp_path):
    run(LiveFiles(tmp_path / "log"))
    run(LiveFiles(tmp_path / "log"), noises=(1.0,))
    assert len(tsv(tmp_path / "log" / "plots" / "metrics" / "map@r.tsv")) == 1
    assert [name for name, _ in run_epochs(str(tmp_path / "log"))] == ["epoch0"]


def test_a_log_folder_keeps_what_is_not_dvclives(tmp_path):
    # a project's own plots and pipeline beside the log: only plots/metrics and metrics.json are the log's
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "failures.png").write_bytes(b"png")
    run(LiveFiles(tmp_path))
    run(LiveFiles(tmp_path), noises=(1.0,))
    assert (tmp_path / "plots" / "failures.png").read_bytes() == b"png"
    assert len(tsv(tmp_path / "plots" / "metrics" / "map@r.tsv")) == 1


@pytest.mark.parametrize("make_log", [LiveFiles, str])  # without dvclive, and a folder (a real Live there)
def test_a_folder_with_a_dvc_yaml_of_its_own_is_refused(tmp_path, make_log):
    pipeline = "stages:\n  train:\n    cmd: python train.py\n"
    (tmp_path / "dvc.yaml").write_text(pipeline)
    with pytest.raises(InputError, match=r"holds a dvc\.yaml of its own .*Log to a folder of its own"):
        run(make_log(tmp_path))
    assert (tmp_path / "dvc.yaml").read_text() == pipeline


def test_a_real_dvclive_live_writes_the_same_bytes(tmp_path, monkeypatch):
    dvclive = extra("dvclive", "dvclive")
    monkeypatch.chdir(tmp_path)  # dvclive looks for a repository from the cwd: none here
    run(LiveFiles("mine"))
    run("real")  # a folder, with dvclive installed: a dvclive.Live there
    for mine in sorted(Path("mine").rglob("*")):
        if mine.is_file() and "per_query" not in mine.parts:
            real = Path("real", *mine.parts[1:])
            assert real.read_bytes() == mine.read_bytes(), mine
    assert sorted(p.name for p in Path("real").rglob("*") if p.is_file() and "per_query" not in p.parts) == \
        sorted(p.name for p in Path("mine").rglob("*") if p.is_file() and "per_query" not in p.parts)
    live = dvclive.Live(dir="own", save_dvc_exp=False, dvcyaml=None)
    live.step = 40  # the loop's own step (batches): put back after each epoch's values
    results = run(live)
    assert live.step == 40
    rows = tsv(Path("own", "plots", "metrics", "recall@1.tsv"))
    assert [int(r["step"]) for r in rows] == list(EPOCHS)
    assert [float(r["recall@1"]) for r in rows] == [r.metrics["recall@1"] for r in results]
    assert results[0].table_path == str(Path("own", "per_query", "epoch_0000.csv"))


@pytest.mark.pipeline
@pytest.mark.parametrize("writer", ["files", "dvclive"])
def test_dvc_reads_the_epochs(tmp_path, writer):
    if writer == "dvclive":
        extra("dvclive", "dvclive")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README").write_text("a training run\n")
    git_init(repo)
    dvc("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "dvc", cwd=repo)

    def log_run(noises):
        folder = repo / "dvclive"
        return run(LiveFiles(folder) if writer == "files" else str(folder), noises=noises)

    slow = log_run((3.0, 2.5, 2.0))
    dvc("exp", "save", "-n", "slow", "-I", "dvclive", cwd=repo)
    fast = log_run((2.5, 1.0, 0.3))
    dvc("exp", "save", "-n", "fast", "-I", "dvclive", cwd=repo)
    shown = json.loads(dvc("exp", "show", "--json", cwd=repo).stdout)
    revs = [exp["revs"][0] for row in shown for exp in (row.get("experiments") or [])]
    exps = {rev["name"]: rev["data"]["metrics"]["dvclive/metrics.json"]["data"] for rev in revs}
    for name, results in (("slow", slow), ("fast", fast)):
        final = results[-1]
        assert {k: exps[name][k] for k in final.metrics} == final.metrics
        assert exps[name]["step"] == 5 and exps[name]["best_epoch"] == final.best_epoch
        assert exps[name]["map@r_ci_low"] == final.intervals["map@r"][0]
    for order, first in (("desc", "fast"), ("asc", "slow")):  # names with '@' sort: `--sort-by recall@1`
        table = dvc("exp", "show", "--csv", "--sort-by", "map@r", "--sort-order", order, cwd=repo).stdout
        names = [line.split(",")[0] for line in table.splitlines()[1:] if line.split(",")[0]]
        assert names == [first, "slow" if first == "fast" else "fast"]
        by_recall = dvc("exp", "show", "--csv", "--sort-by", "recall@1", "--sort-order", order, cwd=repo).stdout
        ranked = [line.split(",")[0] for line in by_recall.splitlines()[1:] if line.split(",")[0]]
        values = [{"slow": slow, "fast": fast}[name][-1].metrics["recall@1"] for name in ranked]
        assert sorted(ranked) == ["fast", "slow"] and values == sorted(values, reverse=order == "desc")
        qualified = dvc("exp", "show", "--csv", "--sort-by", "dvclive/metrics.json:map@r", "--sort-order", order,
                        cwd=repo).stdout  # the form to use when another metrics file has the same key
        assert qualified == table
    plots = json.loads(dvc("plots", "show", "--json", cwd=repo).stdout)["data"]
    points = plots["dvclive/plots/metrics/map@r.tsv"][0]["content"]["data"]["values"]
    assert [(int(p["step"]), float(p["map@r"])) for p in points] == [(e, r.metrics["map@r"]) for e, r in
                                                                     zip(EPOCHS, fast)]
    assert plots["dvclive/plots/metrics/map@r.tsv"][0]["content"]["encoding"]["x"]["field"] == "step"


def test_track_reads_the_runs_epochs_from_its_folder(tmp_path, capsys):
    results = run(LiveFiles(tmp_path / "log"))
    assert [name for name, _ in run_epochs(str(tmp_path / "log"))] == ["epoch0", "epoch2", "epoch5"]
    assert run_epochs(str(tmp_path)) is None and run_epochs(str(tmp_path / "log" / "metrics.json")) is None
    out = tmp_path / "track.json"
    code = track_main([str(tmp_path / "log"), "--json", str(out), "--png", str(tmp_path / "track.png"),
                       "--resamples", "500", "--permutations", "500"])
    assert code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert [s["name"] for s in result["systems"]] == ["epoch0", "epoch2", "epoch5"]
    rows = {r["system"]: r["mean"] for r in result["metrics"]["map@r"]["rows"]}
    assert rows == pytest.approx({f"epoch{e}": r.metrics["map@r"] for e, r in zip(EPOCHS, results)}, abs=1e-12)
    assert result["metrics"]["map@r"]["best"] == "epoch5"
