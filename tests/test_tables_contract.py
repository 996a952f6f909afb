"""recallk.tables_contract: the per-query table's model (what the score stage writes is what ``recallk compare``
reads) and its column names; compare imports no rendering code. (The formula quoting of the report tables:
tests/stages/test_score_stage_reports.py.)"""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from helpers import ROOT
from recallk.errors import InputError
from recallk.tables_contract import TASK_COLUMNS, check_per_query, headline_key, per_query_column

KEYS = ["recall@1", "recall@10", "precision@5", "r_precision", "map@r", "map", "mrr"]


def written() -> pd.DataFrame:
    """A per-query table as recallk.score.tables.per_query builds it (typed; the second query has no positive)."""
    return pd.DataFrame({
        "image_id": ["q0", "q1"], "label": ["a", "b"], "num_positives": np.array([2, 0], dtype=np.int32),
        "num_retrievable": [9, 9], "first_positive_rank": pd.array([1, pd.NA], dtype="Int64"),
        "first_positive_rank_other_tie_rule": pd.array([2, pd.NA], dtype="Int64"),
        # hit@K is 0 or 1; q0 is hit at 1, so its rr is 1 (the rules across columns)
        **{per_query_column(k): [1.0 if k.startswith("recall") or k == "mrr" else 0.5, np.nan] for k in KEYS},
        "top1_id": ["g3", "g1"], "top1_label": ["a", "a"]})


def read_back(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` as recallk.compare.sources reads the CSV: every cell text, empty cells missing."""
    text = frame.to_csv(index=False, float_format="%.10g")
    return pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False).replace("", pd.NA)


def test_column_names_round_trip():
    assert [per_query_column(k) for k in KEYS] == ["hit@1", "hit@10", "precision@5", "r_precision", "ap@r", "ap",
                                                    "rr"]
    assert [headline_key(per_query_column(k)) for k in KEYS] == KEYS
    assert [headline_key(c) for c in TASK_COLUMNS + ("top1_id", "hit@x", "evaluated")] == [None] * 7


def test_the_written_table_and_its_csv_meet_the_model():
    check_per_query(written(), "written")
    check_per_query(read_back(written()).assign(evaluated="abc"), "read back")  # other columns pass
    check_per_query(read_back(written()[list(TASK_COLUMNS) + ["hit@1"]]), "compact")  # the copy kept in git


@pytest.mark.parametrize("column, value, rule", [
    ("num_positives", "two", "a whole number, 0 or more"),
    ("num_retrievable", "-1", "a whole number, 0 or more"),
    ("first_positive_rank", "0", "1 or more"),
    ("hit@1", "1.5", "0 or 1"),
    ("ap", "abc", "a number from 0 to 1"),
    ("image_id", "q1", "each once"),
    ("label", pd.NA, "never empty"),
])
def test_a_bad_cell_is_one_message_naming_the_file_the_column_and_the_line(column, value, rule):
    frame = read_back(written())
    frame.loc[0, column] = value
    with pytest.raises(InputError, match="per_query.csv breaks the per-query table's contract") as err:
        check_per_query(frame, "metrics/per_query.csv")
    assert f"column `{column}` must hold" in str(err.value) and rule in str(err.value)
    assert "CSV line 2" in str(err.value) and str(err.value).count("  - column") == 1


def test_missing_columns_are_named():
    with pytest.raises(InputError, match=r"old\.csv lacks column\(s\) num_retrievable of the per-query table"):
        check_per_query(read_back(written()).drop(columns=["num_retrievable"]), "old.csv")
    with pytest.raises(InputError, match=r"old\.csv has no per-query metric column"):
        check_per_query(read_back(written())[list(TASK_COLUMNS)], "old.csv")


def test_compare_imports_no_rendering_code():
    code = ("import sys, recallk.compare.cli; "
            "print(sorted(m for m in sys.modules if m.startswith('recallk.report')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def scored(**columns) -> pd.DataFrame:
    """A read-back table of three queries with a positive and the given metric columns (text cells)."""
    return pd.DataFrame({"image_id": ["q0", "q1", "q2"], "label": ["a", "a", "b"], "num_positives": ["2"] * 3,
                         "num_retrievable": ["9"] * 3, **columns})


CONSISTENT = {"hit@1": ["1", "0", "0"], "hit@5": ["1", "1", "0"], "hit@10": ["1", "1", "1"],
              "precision@1": ["1", "0", "0"], "rr": ["1", "0.25", "0.1"], "ap": ["0.9", "0.3", "0.1"]}


@pytest.mark.parametrize("changes, column, rule, cells", [
    # issue 39: hit@1 = 1 beside hit@5 = 0 was accepted
    ({"hit@5": ["0", "1", "0"]}, "hit@5", "hit@K never falls as K grows", "query 'q0': hit@1 '1', hit@5 '0'"),
    # a fall past a K in between (hit@5 = 1, hit@10 = 0), named at the larger K
    ({"hit@10": ["1", "0", "1"]}, "hit@10", "hit@K never falls as K grows", "query 'q1': hit@5 '1', hit@10 '0'"),
    # precision@1 is hit@1: a hit with no positive shown
    ({"precision@1": ["0", "0", "0"]}, "precision@1", "precision@1 = hit@1", "query 'q0': hit@1 '1', precision@1 '0'"),
    # ... and a positive shown without a hit
    ({"precision@1": ["1", "1", "0"]}, "precision@1", "precision@1 = hit@1", "query 'q1': hit@1 '0', precision@1 '1'"),
    # rr = 1 without a hit at 1
    ({"rr": ["1", "1", "0.1"]}, "rr", "1 exactly where hit@1 is 1", "query 'q1': hit@1 '0', rr '1'"),
    # a hit at 1 with rr below 1
    ({"rr": ["0.5", "0.25", "0.1"]}, "rr", "1 exactly where hit@1 is 1", "query 'q0': hit@1 '1', rr '0.5'"),
])
def test_rows_are_checked_across_columns(changes, column, rule, cells):
    with pytest.raises(InputError, match="per_query.csv breaks the per-query table's contract") as err:
        check_per_query(scored(**{**CONSISTENT, **changes}), "metrics/per_query.csv")
    message = str(err.value)
    assert f"column `{column}` must hold" in message and rule in message and cells in message, message
    assert message.count("  - column") == 1 and "Re-run the score stage" in message


@pytest.mark.parametrize("columns", [
    CONSISTENT,                                                               # every rule's columns present
    {"hit@5": ["1", "0", "0"], "hit@10": ["1", "1", "0"], "rr": ["0.5", "0", "1"]},  # no hit@1: only the hits' rule
    {"hit@1": ["1", "0", "0"], "rr": ["1", "0.5", "0.2"]},                    # no precision@1: no rule of it
    {"hit@5": ["1", "1", "0"], "precision@1": ["1", "0", "0"], "rr": ["0.5", "1", "1"]},  # no hit@1 to agree with
    {"hit@1": ["1", "0", "0"], "hit@10": ["1", "1", "0"]},                    # the compact copy of a tuned run
])
def test_each_rule_across_columns_applies_only_where_its_columns_exist(columns):
    check_per_query(scored(**columns), "metrics/per_query.csv")


def test_a_bad_cell_breaks_its_own_rule_not_the_rules_across_columns_too():
    with pytest.raises(InputError) as err:
        check_per_query(scored(**{**CONSISTENT, "hit@1": ["7", "0", "0"]}), "x.csv")
    assert str(err.value).count("  - column") == 1 and "column `hit@1` must hold 0 or 1" in str(err.value)


def test_a_header_only_table_is_named_as_such():
    empty = read_back(written()).iloc[:0]
    with pytest.raises(InputError, match=r"^old\.csv holds the header line only, no query row .* Re-run the score "):
        check_per_query(empty, "old.csv")
