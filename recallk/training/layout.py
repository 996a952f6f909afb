"""Where the evaluator of a training loop writes, in a log folder (a ``dvclive.Live``'s ``dir``, or a folder of
DVCLive's layout written without dvclive), and how ``recallk track`` finds the epochs there.

::

    <folder>/metrics.json               the summary: the last epoch's values and its ``step`` (DVCLive's)
    <folder>/plots/metrics/<key>.tsv    one per metric and interval bound: ``step`` and the value (DVCLive's)
    <folder>/dvc.yaml                   declares both for DVC (written by dvclive, or by the evaluator)
    <folder>/per_query/epoch_NNNN.csv   each epoch's per-query table (the columns of metrics/per_query.csv)
    <folder>/per_query/evaluated.json   what was evaluated (settings, queries, subsample)

Only the standard library here: ``recallk track`` imports it.
"""

from __future__ import annotations

import re
from pathlib import Path

#: The per-query tables' folder inside a log folder.
TABLES = "per_query"
#: What was evaluated, beside the tables (``recallk compare`` and ``track`` read an ``evaluated.json`` beside a table).
EVALUATED = "evaluated.json"
#: One epoch's per-query table: ``epoch_0003.csv`` (at least 4 digits, so a shell glob sorts them in order).
TABLE_NAME = re.compile(r"^epoch_(\d+)\.csv$")


def table_name(epoch: int) -> str:
    """The file name of ``epoch``'s per-query table."""
    return f"epoch_{epoch:04d}.csv"


def run_epochs(spec: str) -> list[tuple[str, str]] | None:
    """The epochs of an evaluator's log folder ``spec`` (the folder, or its ``per_query`` folder), as
    ``(name, per-query CSV)`` in epoch order, named ``epoch<N>``; None when ``spec`` is not such a folder (a
    file, a score-output folder, a revision): ``recallk track dvclive`` reads every epoch, no export step."""
    path = Path(spec)
    if not path.is_dir():
        return None
    folder = path / TABLES if (path / TABLES).is_dir() else path
    found = [(int(m.group(1)), child) for child in folder.iterdir() if (m := TABLE_NAME.match(child.name))]
    if not found:
        return None
    return [(f"epoch{epoch}", str(child)) for epoch, child in sorted(found)]
