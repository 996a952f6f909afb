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
from pathlib import Path
from typing import Callable, Optional, Sequence

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


def exact_float(value: float) -> str:
    """A float as the shortest text that reads back as the same float (``repr``), a whole number without its
    ``.0`` (as ``%.10g`` writes it, so a 0/1 column reads back as integers either way)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def csv_file(frame: pd.DataFrame, evaluated_id: str, exact: bool = False) -> Callable[[Path], None]:
    """A report table's writer: text that a spreadsheet would run as a formula is quoted
    (:func:`neutralise_formulas`), and a last column ``evaluated`` holds the id
    of what was evaluated (:func:`recallk.report.provenance.evaluation_id`, ``id`` in metrics/evaluated.json).
    Floats are written to 10 significant digits, or with ``exact`` as the shortest text that reads back as the same
    float (the full per-query table, whose means the index stage recomputes bit for bit)."""
    safe = neutralise_formulas(frame).assign(evaluated=evaluated_id)
    float_format = exact_float if exact else "%.10g"
    return lambda tmp: safe.to_csv(tmp, index=False, float_format=float_format, lineterminator="\n")


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
#: A text <-> image run's per-query table holds both directions' queries, told apart by this column
#: (:mod:`recallk.score.text_image`); its ``label`` is the image a query belongs to (the resampling cluster).
DIRECTION_COLUMN = "direction"
#: Its values, in the table's order.
DIRECTIONS = ("text_to_image", "image_to_text")
#: The name of every per-query metric column (:func:`per_query_column`).
METRIC_COLUMN = r"^(?:hit@[1-9][0-9]*|precision@[1-9][0-9]*|r_precision|ap@r|ap|rr)$"
#: The hit@K columns (each 0 or 1).
HIT_COLUMN = r"^hit@[1-9][0-9]*$"
#: The names of the model's row checks (in its messages).
POSITIVES_RULE, RETRIEVABLE_RULE = "metrics_iff_positives", "positives_are_retrievable"
#: The names of its checks across metric columns (issue 39), each applied only where its columns exist: hit@K never
#: falls as K grows, precision@1 = hit@1, rr = 1 exactly when hit@1 = 1.
HITS_RULE, PRECISION_RULE, RR_RULE = "hits_never_fall", "precision_at_1_is_hit_at_1", "rr_is_1_iff_hit_at_1"


def metric_columns(frame: pd.DataFrame) -> list:
    """The per-query metric columns of ``frame`` (:data:`METRIC_COLUMN`), in its order."""
    return [c for c in frame.columns if re.match(METRIC_COLUMN, str(c))]


def _valid(frame: pd.DataFrame, column: str) -> pd.Series:
    """``column``'s values where they meet their own column's rule (a hit 0 or 1, another metric from 0 to 1),
    else missing: a bad cell fails its own rule, not the rules across columns too."""
    values = pd.to_numeric(frame[column].astype(object), errors="coerce").astype(float)
    ok = values.isin([0.0, 1.0]) if re.match(HIT_COLUMN, str(column)) else values.between(0.0, 1.0)
    return values.where(ok)


def _hit_columns(frame: pd.DataFrame) -> list:
    """The hit@K columns of ``frame``, by K."""
    return sorted((c for c in frame.columns if re.match(HIT_COLUMN, str(c))), key=lambda c: int(c.split("@")[1]))


def falling_hits(frame: pd.DataFrame) -> pd.Series:
    """Per row, the first hit@K column that is 0 where a smaller K's hit is 1 (a hit at K is a hit at every
    larger K), or missing where the hits never fall."""
    out = pd.Series(pd.NA, index=frame.index, dtype=object)
    seen = pd.Series(False, index=frame.index)
    for column in _hit_columns(frame):
        values = _valid(frame, column)
        out = out.mask(out.isna() & seen & (values == 0), column)
        seen |= values == 1
    return out


def _agrees_with_hit_at_1(frame: pd.DataFrame, column: str,
                          agree: Callable[[pd.Series, pd.Series], pd.Series]) -> pd.Series:
    """Where ``agree(column's values, hit@1's values)`` holds, or either value is missing or bad, or either column
    absent: the rule applies only where both columns exist and both cells meet their own rules."""
    if column not in frame.columns or "hit@1" not in frame.columns:
        return pd.Series(True, index=frame.index)
    values, hits = _valid(frame, column), _valid(frame, "hit@1")
    return values.isna() | hits.isna() | agree(values, hits)


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
    """One row per query, as :func:`recallk.score.tables.per_query` writes it (the compact copy keeps the task
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
    hit: Series[float] = pa.Field(alias=HIT_COLUMN, regex=True, isin=[0.0, 1.0], nullable=True)

    @pa.dataframe_check(name=POSITIVES_RULE)
    @classmethod
    def metrics_iff_positives(cls, frame: pd.DataFrame) -> pd.Series:
        """A query with a positive has every metric; one without a positive has none."""
        present = frame[metric_columns(frame)].notna()
        positives = pd.to_numeric(frame["num_positives"], errors="coerce")
        ok = present.all(axis=1).where(positives > 0, ~present.any(axis=1))
        return ok | positives.isna()  # an unreadable count fails its own column's rule

    @pa.dataframe_check(name=RETRIEVABLE_RULE)
    @classmethod
    def positives_are_retrievable(cls, frame: pd.DataFrame) -> pd.Series:
        """A query's positives are among its retrievable gallery images."""
        positives = pd.to_numeric(frame["num_positives"], errors="coerce")
        retrievable = pd.to_numeric(frame["num_retrievable"], errors="coerce")
        return ~((positives > retrievable) & (retrievable >= 0))

    @pa.dataframe_check(name=HITS_RULE)
    @classmethod
    def hits_never_fall(cls, frame: pd.DataFrame) -> pd.Series:
        """A query hit at K is hit at every larger K: hit@K never falls as K grows."""
        return falling_hits(frame).isna()

    @pa.dataframe_check(name=PRECISION_RULE)
    @classmethod
    def precision_at_1_is_hit_at_1(cls, frame: pd.DataFrame) -> pd.Series:
        """The one item shown at K = 1 is a positive or not: precision@1 = hit@1."""
        return _agrees_with_hit_at_1(frame, "precision@1", lambda precision, hit: precision == hit)

    @pa.dataframe_check(name=RR_RULE)
    @classmethod
    def rr_is_1_iff_hit_at_1(cls, frame: pd.DataFrame) -> pd.Series:
        """rr = 1 / the first positive's rank is 1 exactly when the first item is a positive (hit@1 = 1)."""
        return _agrees_with_hit_at_1(frame, "rr", lambda rr, hit: (rr == 1) == (hit == 1))

    class Config:
        name = "per-query table"
        strict = False
        coerce = True


#: What each column must hold, for the message (by column; every metric column under METRIC_COLUMN).
_COLUMN_RULES = {"image_id": "a text id, each once", "label": "a label, never empty",
                 "num_positives": "a whole number, 0 or more", "num_retrievable": "a whole number, 0 or more",
                 "first_positive_rank": "a whole number, 1 or more, or empty",
                 "first_positive_rank_other_tie_rule": "a whole number, 1 or more, or empty",
                 METRIC_COLUMN: "a number from 0 to 1 (not nan or infinite), or empty for a query without a positive",
                 HIT_COLUMN: "0 or 1, or empty for a query without a positive",
                 POSITIVES_RULE: "a value for a query with a positive (num_positives > 0) and none without one",
                 RETRIEVABLE_RULE: "a count no larger than num_retrievable",
                 HITS_RULE: "1 wherever a smaller K's hit is 1 (a query hit at K is hit at every larger K: hit@K never "
                            "falls as K grows)",
                 PRECISION_RULE: "hit@1's value (the one item shown at K = 1 is a positive or not: "
                                 "precision@1 = hit@1)",
                 RR_RULE: "1 exactly where hit@1 is 1 (rr = 1 / the rank of the first positive)"}
#: The column each rule across columns is reported under (the hits' rule: the hit@K that falls).
_CROSS_COLUMN = {PRECISION_RULE: "precision@1", RR_RULE: "rr"}
#: How many failing rows to name per column.
_MAX_ROWS = 5


def check_per_query(frame: pd.DataFrame, source: str, lines: Sequence[int] | None = None) -> None:
    """Check ``frame`` against :class:`PerQueryTable` (lazily: every failure at once), as written (typed)
    or as read back from CSV (text, empty cells missing).

    Raises one InputError naming ``source`` and, per failing column, its rule and its first failing rows by
    CSV line and query id. ``lines`` are the rows' first CSV lines (a quoted cell may span lines); by default
    row ``i`` is line ``i + 2`` (the header is line 1). A metric cell that is not a number (``abc``, a cut
    ``0.9e``), ``nan`` or infinite fails its column's range rule, like ``7`` or ``-3``."""
    missing = [c for c in TASK_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(f"{source} lacks column(s) {', '.join(missing)} of the per-query table (found: "
                         f"{', '.join(quote(str(c)) for c in frame.columns)}); re-run the score stage that "
                         "wrote it (this version writes them all).")
    if not metric_columns(frame):
        raise InputError(f"{source} has no per-query metric column (hit@K, precision@K, r_precision, ap@r, ap, "
                         "rr); re-run the score stage that wrote it (this version writes every metric per query).")
    if frame.empty:
        raise InputError(f"{source} holds the header line only, no query row (the score stage writes one row per "
                         "query scored); it was cut or emptied. Re-run the score stage that wrote it (`dvc repro "
                         "score`), or name a table with its rows.")
    frame = frame.reset_index(drop=True)
    typed = frame.copy()
    for column in metric_columns(frame):
        # pandera names a regex column's failed coercion by its pattern: a cell that is no number, the text
        # ``nan`` or an infinity is +inf here instead, so the range check names its column and line; a missing
        # cell (empty in the CSV, NaN in the typed table the writer checks) stays missing
        values = pd.to_numeric(frame[column].astype(object), errors="coerce").astype(float)
        typed[column] = values.mask(frame[column].notna() & ~np.isfinite(values), np.inf)
    try:
        PerQueryTable.validate(typed, lazy=True)
    except pa.errors.SchemaErrors as exc:
        numbers = list(lines) if lines is not None else [i + 2 for i in range(len(frame))]
        raise InputError(_describe(exc.failure_cases, frame, source, numbers)) from None


def _failing_column(frame: pd.DataFrame, row: int) -> str:
    """The first metric column of ``row`` that breaks the positives rule."""
    with_positives = str(frame["num_positives"].iloc[row]).strip() not in ("0", "0.0")
    for column in metric_columns(frame):
        if pd.isna(frame[column].iloc[row]) == with_positives:
            return column
    return metric_columns(frame)[0]


def _cells(frame: pd.DataFrame, column: str, rule: str, row: int) -> str:
    """The cells of ``row`` a message quotes: ``column``'s, or for a rule across columns each of its columns'."""
    def cell(name: str) -> str:
        value = frame[name].iloc[row]
        return quote(str(value)) if pd.notna(value) else "empty"

    if rule == HITS_RULE:
        hits = _hit_columns(frame)
        smaller = next(c for c in hits[:hits.index(column)] if _valid(frame, c).iloc[row] == 1)
        shown = [smaller, column]
    elif rule in _CROSS_COLUMN:
        shown = ["hit@1", column]
    else:
        return cell(column)
    return ", ".join(f"{name} {cell(name)}" for name in shown)


def _describe(failures: pd.DataFrame, frame: pd.DataFrame, source: str, lines: list) -> str:
    """The message: per failing column (row rules under the column they name), its rule and first rows."""
    failing: dict[tuple[str, str], set] = {}
    for _, case in failures.iterrows():
        check, column, index = str(case["check"]), case["column"], case["index"]
        if pd.isna(index):
            continue
        row = int(index)
        if check == POSITIVES_RULE:
            key = (_failing_column(frame, row), POSITIVES_RULE)
        elif check == RETRIEVABLE_RULE:
            key = ("num_positives", RETRIEVABLE_RULE)
        elif check == HITS_RULE:
            key = (str(falling_hits(frame).iloc[row]), HITS_RULE)
        elif check in _CROSS_COLUMN:
            key = (_CROSS_COLUMN[check], check)
        else:
            pattern = next((p for p in (HIT_COLUMN, METRIC_COLUMN) if re.match(p, str(column))), column)
            key = (str(column), pattern)
        failing.setdefault(key, set()).add(row)
    out = [f"{source} breaks the per-query table's contract:"]
    for (column, rule), rows in failing.items():
        if rule == METRIC_COLUMN and (column, HIT_COLUMN) in failing:
            continue  # a bad hit@K cell: its own rule says it
        ordered = sorted(rows)
        where = ", ".join(f"CSV line {lines[i]} (query {quote(str(frame['image_id'].iloc[i]))}: "
                          f"{_cells(frame, column, rule, i)})" for i in ordered[:_MAX_ROWS])
        more = f" and {len(ordered) - _MAX_ROWS} more" if len(ordered) > _MAX_ROWS else ""
        out.append(f"  - column `{column}` must hold {_COLUMN_RULES.get(rule, 'its type')}: {where}{more}")
    if len(out) == 1:  # a failure with no row (a whole column of the wrong type)
        out += [f"  - column `{c}`: {_COLUMN_RULES.get(c, 'its type')}" for c in failures["column"].dropna().unique()]
    out.append("Re-run the score stage that wrote it (`dvc repro score`).")
    return "\n".join(out)
