"""examples/finetune as docs/training.md runs it: the fine-tune stage copied into a new repo, `dvc exp run` with two
learning rates, then `dvc exp show`, `dvc plots diff` (the offline template, rendered in Chromium with no network),
`recallk track` over the epochs and `recallk compare` of the two best epochs (2 epochs each here, not 6)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from extras import extra
from helpers import ROOT, commit, dvc, git, git_init, run
from recallk.compare.sources import resolve_revision

extra("lightning.pytorch", "lightning")

pytestmark = pytest.mark.pipeline

EXAMPLE = ROOT / "examples" / "finetune"
TEMPLATE = ROOT / "plots" / "offline" / "template.html"


def recallk(*args: str, cwd: Path):
    return run([sys.executable, "-m", "recallk.cli", *args], cwd=cwd)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("finetune") / "repo"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("__pycache__"))
    git_init(repo)
    dvc("init", "-q", cwd=repo)
    commit(repo, "the fine-tune stage")
    for name, lr in (("lr-small", "0.01"), ("lr-big", "0.1")):
        dvc("exp", "run", "-n", name, "-S", f"train.lr={lr}", "-S", "train.epochs=2", cwd=repo)
    return repo


def test_dvc_exp_show_lists_both_runs_with_their_metrics(repo):
    shown = json.loads(dvc("exp", "show", "--json", cwd=repo).stdout)
    runs = {exp["name"]: exp["data"] for baseline in shown for exp in (baseline.get("experiments") or [])
            for exp in exp["revs"]}
    assert set(runs) == {"lr-small", "lr-big"}
    for name, lr in (("lr-small", 0.01), ("lr-big", 0.1)):
        data = runs[name]
        assert data["params"]["params.yaml"]["data"]["train"]["lr"] == lr
        metrics = data["metrics"]["dvclive/metrics.json"]["data"]
        assert metrics["step"] == 1 and metrics["best_epoch"] in (0, 1) and 0 < metrics["map@r"] <= 1
        assert metrics["map@r_ci_low"] <= metrics["map@r"] <= metrics["map@r_ci_high"]
    commit = resolve_revision("lr-small", repo)  # the experiment's commit (refs/exps/...)
    tsv = git("show", f"{commit}:dvclive/plots/metrics/map@r.tsv", cwd=repo).stdout.splitlines()
    assert [line.split("\t")[0] for line in tsv] == ["step", "0", "1"]  # step = epoch


def test_dvc_plots_diff_renders_offline(repo, tmp_path):
    dvc("plots", "diff", "lr-small", "lr-big", "--html-template", str(TEMPLATE), "-o", str(tmp_path / "plots"),
        cwd=repo)
    page = tmp_path / "plots" / "index.html"
    assert "cdn.jsdelivr" not in page.read_text(encoding="utf-8")
    offline = pytest.importorskip("report.test_dvc_plots_offline")  # skipped where Chromium is not installed
    seen, dom = offline._offline_dom(page, tmp_path)
    assert seen == {"failed": [], "errors": [], "fetched": []}
    assert len(offline._curves(dom)) >= 2 and ">lr-small<" in dom and ">lr-big<" in dom


def test_recallk_track_reads_every_epoch_and_compare_the_best_ones(repo, tmp_path):
    proc = recallk("track", "dvclive", "--png", str(tmp_path / "track.png"), "--resamples", "1000",
                   "--permutations", "1000", cwd=repo)
    assert "epoch0: dvclive/per_query/epoch_0000.csv" in proc.stdout and "epoch1:" in proc.stdout
    assert (tmp_path / "track.png").stat().st_size > 0
    out = tmp_path / "compare.json"
    proc = recallk("compare", "lr-small", "lr-big", "--json", str(out), "--resamples", "1000", "--permutations",
                   "1000", cwd=repo)
    assert "A: lr-small (" in proc.stdout and "B: lr-big (" in proc.stdout
    result = json.loads(out.read_text())
    assert result["queries"] == 714  # the digits 6-9, leave-one-out
    assert {"recall@1", "map@r"} <= set(result["metrics"])
