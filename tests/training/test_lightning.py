"""recallk.training.lightning.RetrievalCallback with a real Lightning Trainer on CPU: three epochs logged at step =
epoch (a CSVLogger and dvclive's DVCLiveLogger), the numbers of the evaluator itself, DDP on two gloo processes
giving byte-identical files to one process, and a rank that sends fewer samples stopping both ranks with one error."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from extras import extra
from helpers import tool_env

pl = extra("lightning.pytorch", "lightning")
extra("dvclive", "dvclive")

from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from recallk.errors import InputError  # noqa: E402
from recallk.training import Evaluator  # noqa: E402
from training import lightning_run  # noqa: E402

SCRIPT = Path(lightning_run.__file__)


def _steps(folder: Path, key: str) -> pd.DataFrame:
    return pd.read_csv(folder / "plots" / "metrics" / f"{key}.tsv", sep="\t")


def test_three_epochs_log_at_step_epoch_with_the_evaluators_numbers(tmp_path, monkeypatch):
    from dvclive.lightning import DVCLiveLogger

    monkeypatch.chdir(tmp_path)  # outside any git repo: dvclive looks for one from here

    loggers = [CSVLogger(tmp_path / "csv", name="", version=""), DVCLiveLogger(dir=str(tmp_path / "dvclive"))]
    model, callback = lightning_run.fit(None, epochs=3, logger=loggers)
    assert [r.epoch for r in callback.results] == [0, 1, 2]
    # the trained model's embeddings, scored by a fresh evaluator: the callback's last epoch, bit for bit
    x = lightning_run.digits()[0][lightning_run.TRAIN:lightning_run.TRAIN + lightning_run.VAL]
    direct = Evaluator(lightning_run.val_labels(), ks=(1, 5), metrics=["recall", "map@r"])(0, model(x).detach())
    assert callback.result.metrics == direct.metrics and callback.result.intervals == direct.intervals
    assert float(model.trainer.callback_metrics["map@r"]) == pytest.approx(direct.metrics["map@r"])
    # every logger got step = epoch (not the global step: 8 batches an epoch; not DVCLiveLogger's step + 1)
    csv = pd.read_csv(tmp_path / "csv" / "metrics.csv")
    assert csv.dropna(subset=["map@r"])["step"].tolist() == [0, 1, 2]
    dvclive = _steps(tmp_path / "dvclive", "map@r")
    assert dvclive["step"].tolist() == [0, 1, 2]
    assert dvclive["map@r"].tolist() == [r.metrics["map@r"] for r in callback.results]
    assert _steps(tmp_path / "dvclive", "map@r_ci_low")["map@r_ci_low"].iloc[-1] == direct.intervals["map@r"][0]


def test_a_validation_step_without_the_index_is_one_error():
    class NoIndex(lightning_run.Embedder):
        def validation_step(self, batch, batch_idx):
            return self(batch[1][0])

    evaluator = Evaluator(lightning_run.val_labels(), ks=(1,), metrics=["recall"])
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[lightning_run.RetrievalCallback(evaluator)])
    with pytest.raises(InputError, match=r"validation_step must return a dict with 'embeddings' and 'index'; it "
                                         r"returned 'Tensor' \(batch 0\)"):
        trainer.fit(NoIndex())


def _free_port() -> str:
    """A port no one listens on now: each DDP run rendezvous on its own (two runs on Lightning's default port, in
    two pytest workers at once, would meet each other)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _run(out: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    env = tool_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=_free_port())
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), *args], env=env, capture_output=True,
                          text=True, timeout=300)
    return proc, time.monotonic() - start


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_ddp_on_two_processes_gives_the_numbers_of_one(tmp_path):
    one, _ = _run(tmp_path / "one")
    two, _ = _run(tmp_path / "two", "--devices", "2")
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-3000:] + two.stderr[-3000:]
    assert "Starting with 2 processes" in two.stderr + two.stdout
    files = _files(tmp_path / "one")
    assert "per_query/epoch_0002.csv" in files and "plots/metrics/map@r.tsv" in files
    assert _files(tmp_path / "two") == files  # every value, interval and per-query row, byte for byte


def test_a_rank_that_sends_fewer_samples_stops_every_rank_with_one_error(tmp_path):
    proc, seconds = _run(tmp_path / "short", "--devices", "2", "--short-rank", "1")
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and errors[0] == errors[1]  # each rank raised the same InputError: none left waiting
    assert "cover 99 of the 101 validation rows (rank 0 sent 51, rank 1 sent 49; missing rows 1, 65)" in errors[0]
    assert "Traceback" not in proc.stderr and seconds < 200
    assert not (tmp_path / "short" / "per_query" / "epoch_0000.csv").exists()  # nothing scored on partial rows


def test_an_error_in_rank_zeros_scoring_reaches_every_rank(tmp_path):
    proc, seconds = _run(tmp_path / "nan", "--devices", "2", "--nan")
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and errors[0] == errors[1], proc.stderr[-3000:]  # rank 1 learnt of rank 0's error
    assert errors[0].startswith("error: `query_emb` has NaN or inf in ") and "at epoch 0" in errors[0]
    assert "Traceback" not in proc.stderr and seconds < 200
