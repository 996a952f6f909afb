"""The contract of the tables the score stage writes and other code reads back, shared by both sides:
:mod:`recallk.report` writes them, ``recallk compare`` (:mod:`recallk.compare`) reads them, and neither
imports the other.

* the spreadsheet-formula quoting of every report CSV (:func:`neutralise_formulas`, undone by
  :func:`restore_formulas`);
* the per-query table (``data/scores/per_query.csv`` and its compact copy ``metrics/per_query.csv``):
  the names of its metric columns (:func:`per_query_column`, :func:`headline_key`), the columns that
  define each query's task (:data:`TASK_COLUMNS`), and its pandera model :class:`PerQueryTable`, checked
  lazily (every failure at once) when the table is written and when it is read (:func:`check_per_query`).
"""

from __future__ import annotations

import re
from typing import Optional

import numpy as np
import pandas as pd
import pandera.pandas as pa
from pandera.typing.pandas import Series

from recallk.errors import InputError, quote

# ---------------------------------------------------------------------------------- spreadsheet formulas

#: A text cell that a spreadsheet would run as a formula: it starts with ``=``, ``+``, ``-``, ``@``, a tab or
#: a carriage return (after any ``'``, so that the escape below can be undone exactly).
_FORMULA = re.compile(r"^'*[=+\-@\t\r]")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text == text.strip()


def _needs_quote(text: str) -> bool:
    return bool(_FORMULA.match(text)) and not _is_number(text)


def _text_columns(frame: pd.DataFrame) -> list:
    return [c for c in frame.columns if not (pd.api.types.is_numeric_dtype(frame[c])
                                             or pd.api.types.is_bool_dtype(frame[c]))]


def neutralise_formulas(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every text cell that a spreadsheet would run as a formula (``=cmd|...``, ``@SUM(..)``,
    ``+1+1``, ``-2+3``) prefixed with ``'``, which spreadsheets show as text (OWASP's advice on CSV
    injection). Numbers (``-1``, ``+2.5``) and other text are unchanged, and a value that begins with
    ``'`` before such a character gets one more ``'``, so :func:`restore_formulas` gives back the exact
    value. Applied to the score stage's report tables (labels, ids, top-1 labels)."""
    out = frame.copy()
    for column in _text_columns(out):
        out[column] = out[column].map(lambda v: f"'{v}" if isinstance(v, str) and _needs_quote(v) else v)
    return out


def restore_formulas(frame: pd.DataFrame) -> pd.DataFrame:
    """The inverse of :func:`neutralise_formulas` on a table read back as text (``recallk compare``)."""
    out = frame.copy()
    for column in _text_columns(out):
        out[column] = out[column].map(lambda v: v[1:] if isinstance(v, str) and v.startswith("'")
                                      and _needs_quote(v[1:]) else v)
    return out


# ---------------------------------------------------------------------------------- the per-query table

#: Per-query column of a headline metric whose per-query name differs (recall@K -> hit@K, see :func:`per_query_column`).
_PER_QUERY_NAMES = {"map@r": "ap@r", "map": "ap", "mrr": "rr"}
#: Columns identifying each query and its task, first in both per-query tables.
TASK_COLUMNS = ("image_id", "label", "num_positives", "num_retrievable")
#: The name of every per-query metric column (:func:`per_query_column`).
METRIC_COLUMN = r"^(?:hit@[1-9][0-9]*|precision@[1-9][0-9]*|r_precision|ap@r|ap|rr)$"


def per_query_column(key: str) -> str:
    """The per-query column of headline metric ``key``: ``recall@K`` -> ``hit@K``, ``map@r`` -> ``ap@r``,
    ``map`` -> ``ap``, ``mrr`` -> ``rr``; ``precision@K`` and ``r_precision`` keep their names."""
    if key.startswith("recall@"):
        return "hit@" + key.split("@", 1)[1]
    return _PER_QUERY_NAMES.get(key, key)


def headline_key(column: str) -> str | None:
    """The inverse of :func:`per_query_column`; None for a column that is not a per-query metric."""
    name, _, k = column.partition("@")
    if name in ("hit", "precision") and k.isdigit():
        return f"{'recall' if name == 'hit' else 'precision'}@{k}"
    inverse = {v: k for k, v in _PER_QUERY_NAMES.items()}
    return inverse.get(column, "r_precision" if column == "r_precision" else None)


class PerQueryTable(pa.DataFrameModel):
    """One row per query, as :func:`recallk.report.tables.per_query` writes it (the compact copy keeps the task
    and metric columns): ``image_id`` (unique), ``label``, ``num_positives`` and ``num_retrievable`` (whole
    numbers, 0 or more), the first positive's 1-based rank under both tie rules (empty without a positive),
    ``top1_id`` and ``top1_label``, and one column per metric (:data:`METRIC_COLUMN`: a value from 0 to 1,
    empty for a query without a positive). Other columns (``evaluated``) pass. Read back as text, the cells
    are coerced to these types for the check."""

    image_id: Series[str] = pa.Field(unique=True)
    label: Series[str]
    num_positives: Series[pd.Int64Dtype] = pa.Field(ge=0)
    num_retrievable: Series[pd.Int64Dtype] = pa.Field(ge=0)
    first_positive_rank: Optional[Series[pd.Int64Dtype]] = pa.Field(ge=1, nullable=True)
    first_positive_rank_other_tie_rule: Optional[Series[pd.Int64Dtype]] = pa.Field(ge=1, nullable=True)
    top1_id: Optional[Series[str]] = pa.Field(nullable=True)
    top1_label: Optional[Series[str]] = pa.Field(nullable=True)
    metric: Series[float] = pa.Field(alias=METRIC_COLUMN, regex=True, ge=0, le=1, nullable=True)

    class Config:
        name = "per-query table"
        strict = False
        coerce = True


#: What each column must hold, for the message (by column; every metric column under METRIC_COLUMN).
_COLUMN_RULES = {"image_id": "a text id, each once", "label": "a label, never empty",
                 "num_positives": "a whole number, 0 or more", "num_retrievable": "a whole number, 0 or more",
                 "first_positive_rank": "a whole number, 1 or more, or empty",
                 "first_positive_rank_other_tie_rule": "a whole number, 1 or more, or empty",
                 METRIC_COLUMN: "a number from 0 to 1, or empty for a query without a positive"}
#: How many failing rows to name per column.
_MAX_ROWS = 5


def check_per_query(frame: pd.DataFrame, source: str) -> None:
    """Check ``frame`` against :class:`PerQueryTable` (lazily: every failing column at once), as written (typed)
    or as read back from CSV (text, empty cells missing); raise one InputError naming ``source``, each failing
    column with its rule and its first failing CSV lines (the frame's rows in file order)."""
    missing = [c for c in TASK_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(f"{source} lacks column(s) {', '.join(missing)} of the per-query table (found: "
                         f"{', '.join(quote(str(c)) for c in frame.columns)}); re-run the score stage that "
                         "wrote it (this version writes them all).")
    if not any(re.match(METRIC_COLUMN, str(c)) for c in frame.columns):
        raise InputError(f"{source} has no per-query metric column (hit@K, precision@K, r_precision, ap@r, ap, "
                         "rr); re-run the score stage that wrote it (this version writes every metric per query).")
    frame = frame.reset_index(drop=True)
    typed = frame.copy()
    for column in (c for c in frame.columns if re.match(METRIC_COLUMN, str(c))):
        # pandera names a regex column's failed coercion by its pattern: a cell that is no number is +inf
        # here instead, so the range check names its column and line
        values = pd.to_numeric(frame[column], errors="coerce")
        typed[column] = values.where(values.notna() | frame[column].isna(), np.inf)
    try:
        PerQueryTable.validate(typed, lazy=True)
    except pa.errors.SchemaErrors as exc:
        raise InputError(_describe(exc.failure_cases, frame, source)) from None


def _describe(failures: pd.DataFrame, frame: pd.DataFrame, source: str) -> str:
    lines = [f"{source} breaks the per-query table's contract:"]
    for column, cases in failures.groupby("column", sort=False):
        rule = _COLUMN_RULES.get(METRIC_COLUMN if re.match(METRIC_COLUMN, str(column)) else column, "its type")
        rows = sorted({int(i) for i in cases["index"].dropna()})
        where = ", ".join(f"CSV line {i + 2} ({quote(frame[column].iloc[i])})" for i in rows[:_MAX_ROWS])
        more = f" and {len(rows) - _MAX_ROWS} more" if len(rows) > _MAX_ROWS else ""
        lines.append(f"  - column `{column}` must hold {rule}: {where or 'the column'}{more}")
    lines.append("Re-run the score stage that wrote it (`dvc repro score`).")
    return "\n".join(lines)
