"""Where the evaluator's numbers go: a real ``dvclive.Live`` (the ``dvclive`` extra), or the same files in
DVCLive's layout written without it, so ``dvc exp show`` and ``dvc plots show`` read them all the same.

Both sinks take one epoch at a time: every value is logged at ``step = epoch`` (one row per epoch in
``plots/metrics/<name>.tsv``, the summary ``metrics.json`` holding the last epoch's values and its
``step``). A value that is not finite is written as DVCLive writes it, as the text ``nan``.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from recallk.errors import InputError, quote
from recallk.training.layout import TABLES

#: DVCLive's file names, inside its folder (``Live.metrics_file``, ``Live.plots_dir`` / ``Metric.subfolder``).
SUMMARY, PLOTS = "metrics.json", "plots/metrics"
#: The dvc.yaml that declares the folder's metrics and plots to DVC (beside them, paths relative to it).
DVC_YAML = "dvc.yaml"
DVC_YAML_TEXT = f"metrics:\n- {SUMMARY}\nplots:\n- {PLOTS}:\n    x: step\n"


def _dvclive_value(value: Any) -> Any:
    """A value as ``Live.log_metric`` keeps it: a number, or ``"nan"``/``"inf"`` text when it is not finite."""
    value = float(value) if not isinstance(value, int) else value
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


class LiveFiles:
    """DVCLive's files in ``folder`` without dvclive: ``metrics.json``, ``plots/metrics/<name>.tsv`` (the bytes
    ``dvclive.Live`` writes: a ``step`` and a value column, tab-separated) and a ``dvc.yaml`` beside them that
    declares both, so DVC shows them. The earlier run's files there are removed first, as ``Live`` does: its
    ``plots/metrics`` and ``metrics.json``, nothing else."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.dir = str(folder)
        root = check_folder(folder)
        shutil.rmtree(root / PLOTS, ignore_errors=True)
        (root / SUMMARY).unlink(missing_ok=True)
        self.summary: dict[str, Any] = {}
        self._declared = False

    def log(self, step: int, values: dict[str, float], summary_only: dict[str, Any]) -> None:
        """One epoch: a row of each value's TSV at ``step``, then the summary with every value and ``step``."""
        for name, value in values.items():
            value = _dvclive_value(value)
            path = Path(self.dir, PLOTS, f"{name}.tsv")
            path.parent.mkdir(parents=True, exist_ok=True)
            existed = path.exists()
            with open(path, "a", encoding="utf-8", newline="") as handle:
                writer = csv.DictWriter(handle, ["step", os.path.basename(name)], delimiter="\t",
                                        lineterminator=os.linesep)
                if not existed:
                    writer.writeheader()
                writer.writerow({"step": step, os.path.basename(name): value})
            self.summary[name] = value
        self.summary.update({name: _dvclive_value(v) for name, v in summary_only.items()})
        self.summary["step"] = step
        with open(Path(self.dir, SUMMARY), "w", encoding="utf-8") as handle:
            json.dump(self.summary, handle, indent=4)
            handle.write("\n")
        if not self._declared:
            declare(self.dir)
            self._declared = True


def declare(folder: str | os.PathLike) -> None:
    """Write ``folder/dvc.yaml`` declaring the folder's summary as DVC metrics and its TSVs as plots (x: step)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    Path(folder, DVC_YAML).write_text(DVC_YAML_TEXT, encoding="utf-8")


class LiveLogger:
    """Logging through a real ``dvclive.Live`` (the user's, or one made for a folder): each epoch's values with
    ``live.step`` set to the epoch, then ``live.sync()`` (the summary, dvc.yaml, a report); the step the loop had
    set before is put back, so a loop that counts its own steps keeps counting."""

    def __init__(self, live: Any) -> None:
        self.live = live
        self.dir = str(live.dir)

    def log(self, step: int, values: dict[str, float], summary_only: dict[str, Any]) -> None:
        live = self.live
        before = live.step
        live.step = step
        try:
            for name, value in values.items():
                live.log_metric(name, _dvclive_value(value))
            for name, value in summary_only.items():
                live.log_metric(name, _dvclive_value(value), plot=False)
            live.sync()
        finally:
            live.step = before


def check_folder(folder: str | os.PathLike) -> Path:
    """``folder`` as a log folder: not a file, and not a folder holding a dvc.yaml of its own (a DVC project's root:
    DVCLive removes the ``dvc.yaml``, ``metrics.json`` and ``plots/metrics`` of its folder when it starts, so
    ``log="."`` there would delete the project's pipeline). The ``dvc.yaml`` this module writes may be there."""
    root = Path(folder)
    if root.exists() and not root.is_dir():
        raise InputError(f"`log` names {quote(str(folder))}, which is a file; name a folder (DVCLive's layout is "
                         "written there) or pass a dvclive.Live.")
    own = root / DVC_YAML
    if own.is_file() and own.read_text(encoding="utf-8", errors="replace") != DVC_YAML_TEXT:
        raise InputError(f"`log` names {quote(str(folder))}, which holds a dvc.yaml of its own ({quote(str(own))}): "
                         "DVCLive removes the dvc.yaml and metrics.json of its folder when it starts. Log to a "
                         "folder of its own, e.g. `log=\"dvclive\"`.")
    return root


def is_live(value: Any) -> bool:
    """Whether ``value`` is a ``dvclive.Live`` (checked without importing dvclive)."""
    return any(c.__module__.split(".")[0] == "dvclive" and c.__name__ == "Live" for c in type(value).__mro__)


def open_log(log: Any) -> LiveFiles | LiveLogger | None:
    """The sink of the evaluator's ``log`` argument: None (nothing written); a ``dvclive.Live`` (logged through it,
    the per-query tables in its ``dir``); a :class:`LiveFiles` (DVCLive's files without dvclive, even where it is
    installed); or a folder: a ``dvclive.Live`` there when dvclive is installed
    (``save_dvc_exp=False``; its own dvc.yaml writing off, the folder's dvc.yaml written here), else
    :class:`LiveFiles`, the same files."""
    if log is None or isinstance(log, LiveFiles):
        return log
    if is_live(log):
        return LiveLogger(log)
    if not isinstance(log, (str, os.PathLike)):
        raise InputError(f"`log` must be a folder, a dvclive.Live, a recallk.training.LiveFiles or None. Got "
                         f"{quote(log)} instead.")
    try:
        from dvclive import Live
    except ImportError:
        return LiveFiles(log)
    check_folder(log)
    logger = LiveLogger(Live(dir=str(log), save_dvc_exp=False, dvcyaml=False))
    declare(log)
    return logger


def clear_tables(folder: str) -> None:
    """Remove an earlier run's per-query tables from ``folder/per_query`` (a new run starts afresh, as DVCLive's
    files do)."""
    shutil.rmtree(Path(folder, TABLES), ignore_errors=True)
