"""Hostile-input corpus, round 2 (issue 25): damaged per-query tables and files beside them for
``recallk compare``, labels that cannot match in the API, a tampered catalog in the score stage, and the
failure sheet read without colour. (Kills at every write and rename: tests/stages/test_kill_points.py.)

``recallk compare`` runs in process (its ``main``); a user error is exit code 2, one ``error:`` line that
names the file, the CSV line, the query and the column, nothing on stdout and no file written.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from PIL import Image

from helpers import (
    CATALOG,
    ENCODE_OUTPUTS,
    ROOT,
    SCORE_OUTPUTS,
    assert_no_outputs,
    assert_user_error,
    run_module,
)
from recallk import recall_at_k
from recallk.compare import cli, outputs
from recallk.report import failure_sheet
from recallk.score.metrics import retrieval_summary

HEADER = "image_id,label,num_positives,num_retrievable,hit@1,ap,evaluated"
ROWS = ["q0,a,2,9,1,0.5,e1", "q1,a,2,9,0,0.25,e1", "q2,b,1,9,1,1,e1", "q3,c,0,9,,,e1"]  # q3: no positive


def table(rows=ROWS, header=HEADER) -> str:
    return header + "\n" + "".join(r + "\n" for r in rows)


def with_cell(row: int, column: str, value: str) -> str:
    """The table with one cell replaced (``row`` 0 is CSV line 2)."""
    rows = [r.split(",") for r in ROWS]
    rows[row][HEADER.split(",").index(column)] = value
    return table([",".join(r) for r in rows])


def compare(tmp_path, capsys, b: str | bytes, *extra: str) -> tuple[int, str, str]:
    (tmp_path / "a.csv").write_text(table())
    path = tmp_path / "b.csv"
    path.write_bytes(b if isinstance(b, bytes) else b.encode())
    code = cli.main([str(tmp_path / "a.csv"), str(path), "--resamples", "20", "--permutations", "20", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2 and out == "", (code, out, err)
    assert err.count("error: ") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in:\n{err}"


# ------------------------------------------------------------------------------ compare: damaged cells


@pytest.mark.parametrize("row, column, value, rule", [
    (0, "hit@1", "nan", "0 or 1"),             # one nan silently dropped the query from both sides
    (0, "ap", "NaN", "not nan or infinite"),
    (1, "ap", "", "a value for a query with a positive"),    # an empty cell of a query with positives
    (1, "hit@1", "", "a value for a query with a positive"),
    (0, "ap", "abc", "not nan or infinite"),   # not a number
    (0, "ap", "0.5e", "not nan or infinite"),  # a number cut short
    (0, "hit@1", "7", "0 or 1"),               # hit@1 = 7 made B's recall@1 1.0
    (0, "hit@1", "0.5", "0 or 1"),             # a hit is 0 or 1
    (0, "ap", "-3", "from 0 to 1"),            # ap = -3
    (0, "ap", "inf", "not nan or infinite"),   # inf gave p = 0
    (0, "ap", "-inf", "not nan or infinite"),
    (0, "ap", "1e308", "from 0 to 1"),         # two 1e308 cells crashed fsum
    (0, "ap", "1e309", "not nan or infinite"),  # overflows to inf when parsed
    (3, "hit@1", "1", "none without one"),     # a query without a positive must have no metric
    (0, "num_positives", "12", "no larger than num_retrievable"),
])
def test_a_damaged_cell_is_one_error_naming_file_line_query_and_column(tmp_path, capsys, row, column, value, rule):
    code, out, err = compare(tmp_path, capsys, with_cell(row, column, value))
    named = "num_positives" if column == "num_positives" else column
    assert_one_error(code, out, err, "b.csv", f"column `{named}`", rule, f"CSV line {row + 2}",
                     f"query 'q{row}'")


def test_two_overflowing_cells_in_both_sides_are_an_error_not_a_crash(tmp_path, capsys):
    code, out, err = compare(tmp_path, capsys, table([r.replace("0.25", "1e308") for r in ROWS]).replace(
        "0.5", "1e308"))
    assert_one_error(code, out, err, "b.csv", "column `ap`", "CSV line 2", "CSV line 3")


def test_a_quoted_line_break_keeps_the_line_numbers_true(tmp_path, capsys):
    rows = ['q0,"a\nb",2,9,1,0.5,e1', "q1,a,2,9,1,-3,e1"]  # q0's label spans lines 2 and 3
    code, out, err = compare(tmp_path, capsys, table(rows), "--intersect")
    assert_one_error(code, out, err, "CSV line 4 (query 'q1'")


@pytest.mark.parametrize("data, message", [
    (table().encode()[:-7], "is cut short"),                             # truncated mid-row
    (table().encode()[: len(HEADER) + 8], "is cut short"),               # truncated in the first row
    (table().encode("utf-16"), "is not UTF-8"),                          # another encoding (its BOM)
    ("\ufeff".encode() + table().encode("utf-16-le"), "NUL byte"),       # UTF-16 behind a UTF-8 BOM
    (b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "is not UTF-8"),          # a binary file
    (table().encode().replace(b"e1\n", b"e\x001\n", 1), "NUL byte"),     # valid UTF-8 with a NUL
])
def test_a_table_that_is_not_the_writers_text_is_one_error(tmp_path, capsys, data, message):
    assert_one_error(*compare(tmp_path, capsys, data), "b.csv", message)


# ------------------------------------------------------------------------------ compare: files beside it


@pytest.mark.parametrize("content, message", [
    (b'{"id": "abc", "backbone": ', "is not readable JSON"),   # cut short
    (b"[1, 2]", "holds a JSON list"),                          # not the object the score stage writes
    (b"\xff\xfe{}", "is not UTF-8"),
    (b"[" * 100_000, "nests too deeply"),
])
def test_a_damaged_evaluated_json_is_one_error_before_anything_is_printed(tmp_path, capsys, content, message):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "per_query.csv").write_text(table())
    (folder / "evaluated.json").write_bytes(content)
    (tmp_path / "a.csv").write_text(table())
    code = cli.main([str(tmp_path / "a.csv"), str(folder), "--resamples", "20", "--permutations", "20",
                     "--json", str(tmp_path / "r.json")])
    assert_one_error(code, *capsys.readouterr(), "evaluated.json", message)
    assert not (tmp_path / "r.json").exists()


def test_json_and_md_into_a_missing_folder_are_written_whole(tmp_path, capsys):
    code, out, err = compare(tmp_path, capsys, table(), "--json", str(tmp_path / "new" / "deep" / "r.json"),
                             "--md", str(tmp_path / "new" / "r.md"))
    assert code == 0 and "Traceback" not in err, err
    result = json.loads((tmp_path / "new" / "deep" / "r.json").read_text())
    assert result["queries"] == 3 and (tmp_path / "new" / "r.md").read_text().startswith("**A**")
    assert not list(tmp_path.rglob("*.tmp"))


def test_json_naming_a_folder_is_an_error(tmp_path, capsys):
    assert_one_error(*compare(tmp_path, capsys, table(), "--json", str(tmp_path)), "is a folder")


def test_the_json_is_strict():
    assert outputs.strict({"a": [float("nan"), 1.5, float("inf")], "b": (float("-inf"), "x")}) == \
        {"a": [None, 1.5, None], "b": [None, "x"]}


def test_gitignore_covers_the_temp_files_of_a_killed_write():
    for name in ("metrics/.recall.json.k2j_x9ab.tmp", "plots/.failures.png.abcdefgh.tmp", ".dvc.yaml.12345678.tmp",
                 "metrics/.index.ab12cd34.tmp/points.csv"):  # a file in the index stage's temp folder
        assert subprocess.run(["git", "check-ignore", "-q", "--no-index", name], cwd=ROOT).returncode == 0, name


# ------------------------------------------------------------------------------ labels in the API


Q, G = [[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]  # the query's label is the gallery's first (and top) item's


@pytest.mark.parametrize("query_labels, gallery_labels", [
    ([1], np.array([1.0, 2.0])),  # float gallery labels, int query labels (pytorch-metric-learning's own tests)
    (np.array([1.0]), [1, 2]),    # and the other way round
    (np.array([1], dtype=np.uint8), np.array([1, 2], dtype=np.int64)),  # integer widths and signs
    ([True], [1, 0]),             # True is 1
    ([0.5], [0.5, 1.5]),          # fractions compare by value too
    (np.array(["1"]), ["1", "2"]),  # text compares as text
])
def test_labels_compare_by_value(query_labels, gallery_labels):
    assert recall_at_k(Q, G, query_labels, gallery_labels, ks=[1]) == {"recall@1": 1.0}


@pytest.mark.parametrize("query_labels, gallery_labels, match", [
    ([1], ["1", "2"], "`query_labels` are numbers and `gallery_labels` are text"),  # kinds that never match
    (np.array(["1"]), np.array([1, 2]), "`gallery_labels` are numbers and `query_labels` are text"),
    ([7], [1.0, 2.0], "no query label occurs in `gallery_labels`"),  # no shared value: an error, not NaN
    (["x"], ["a", "b"], "no query label occurs in `gallery_labels`"),
])
def test_labels_that_cannot_match_are_an_error(query_labels, gallery_labels, match):
    with pytest.raises(ValueError, match=match):
        recall_at_k(Q, G, query_labels, gallery_labels, ks=[1])


# ------------------------------------------------------------------------------ the failure sheet


def test_the_failure_sheet_reads_without_colour():
    row = {"query": ("q/7.png", "cat"), "retrieved": [("g1", "cat", 0.9, True), ("g2", "dog\u202egpj", 0.8, False)],
           "first": ("g1", 1, 0.9)}
    assert [lines for _, lines in failure_sheet.captions(row)] == [
        ("q q/7.png", "cat"), ("+ cat", "0.900"), ("x dog?gpj", "0.800"), ("#1 cat", "0.900")]  # bidi shown as ?
    sheet = failure_sheet.draw([row], lambda image_id: Image.new("RGB", (10, 20), "white"))
    legend = np.asarray(sheet.crop((0, 0, sheet.size[0], failure_sheet.LEGEND)).convert("L"))
    assert (legend < 128).sum() > 500  # the legend's text is drawn above the rows


# ------------------------------------------------------------------------------ a tampered catalog


def test_a_tampered_catalog_never_makes_encode_or_score_read_outside_the_data_or_draw_a_changed_file(
        scored_project, tmp_path):
    proj = scored_project  # split, encode and score done (a stage project: marked stage)
    original = (proj / CATALOG).read_text()
    first = original.splitlines()[1].split(",")  # image_id,path,label,sha256,...
    outside = proj.parent / "outside.png"
    outside.write_bytes((proj / first[1]).read_bytes())  # the same bytes: its sha256 matches the catalog's
    images = sorted((proj / "data" / "digits").rglob("*.png"))
    for image in images:  # every file swapped with other pixels of the same size
        Image.new("RGB", Image.open(image).size, (0, 255, 0)).save(image)
    assert_user_error(run_module("stages.score", cwd=proj), "changed since split", "sha256")
    assert_no_outputs(proj, SCORE_OUTPUTS)
    # score, then encode (which read the outside file before: it had no path rule): each refuses before it
    # opens an image
    for module, written in (("stages.score", SCORE_OUTPUTS), ("stages.encode", ENCODE_OUTPUTS)):
        for path in (str(outside),                                            # an absolute path outside
                     f"{first[1].rsplit('/', 2)[0]}/../../../outside.png"):  # a '..' path out of the data root
            (proj / CATALOG).write_text(original.replace(f",{first[1]},", f",{path},", 1))
            assert_user_error(run_module(module, cwd=proj), "catalog.csv", "line 2", "not inside the data root",
                              path)
            assert_no_outputs(proj, written)


@pytest.mark.parametrize("query_ids", [
    np.array([0.0, 1.0, 2.0]),  # float query ids against int gallery ids: the query's own image is still found
    [0.0, 1.0, 2.0],
    [0, 1, 2],                  # the same ids typed alike (the reference)
])
def test_numeric_ids_compare_by_value(query_ids):
    g = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])  # q0's only label-0 item is itself: it must be excluded
    got = retrieval_summary(g, g, [0, 1, 1], [0, 1, 1], ks=[1], query_ids=query_ids, gallery_ids=[0, 1, 2])
    assert (got["num_queries"], got["num_excluded_queries"]) == (2, 1)


def test_gallery_ids_equal_by_value_are_a_repeat():
    with pytest.raises(ValueError, match="`gallery_ids` must be unique"):
        recall_at_k(Q, G, [1], [1, 2], ks=[1], query_ids=[5], gallery_ids=[1, 1.0])


# ------------------------------------------------------------------------------ exclusion values in the API


QX, GX = [[1.0, 0.0]], [[1.0, 0.0], [0.8, 0.6], [0.6, 0.8]]  # the query's gallery items in rank order
GX_LABELS = [1, 2, 1]  # the top item and the third share the query's label


@pytest.mark.parametrize("query_values, gallery_values", [
    ([1.0], [1, 2, 2]),                         # float query values, int gallery values: item 0 is excluded
    (np.array([1]), np.array([1.0, 2.0, 2.0])),  # and the other way round
    (np.array([1], dtype=np.uint8), np.array([1, 2, 2], dtype=np.int64)),  # integer widths and signs
    ([True], [1, 0, 0]),                        # True is 1
    ([0.5], [0.5, 1.5, np.nan]),                # fractions by value; NaN is missing, never a match
    (np.array([[1.0, 0.0]]), np.array([[1, 0], [2, 0], [2, 0]])),  # a joint exclusion, column by column
    (["1"], ["1", "2", "2"]),                   # text compares as text (the reference)
])
def test_exclusion_values_compare_by_value(query_values, gallery_values):
    got = recall_at_k(QX, GX, [1], GX_LABELS, ks=[1], exclude=[(query_values, gallery_values)])
    assert got == {"recall@1": 0.0}  # the top item is excluded: the first positive left is at rank 3
    assert recall_at_k(QX, GX, [1], GX_LABELS, ks=[1]) == {"recall@1": 1.0}  # without the exclusion


def test_missing_exclusion_values_never_match():
    assert recall_at_k(QX, GX, [1], GX_LABELS, ks=[1], exclude=[([np.nan], [np.nan, 2.0, 2.0])]) == {"recall@1": 1.0}
    assert recall_at_k(QX, GX, [1], GX_LABELS, ks=[1], exclude=[([None], ["", 2, 2])]) == {"recall@1": 1.0}


@pytest.mark.parametrize("query_values, gallery_values, match", [
    ([1], ["1", "2", "2"], r"query values of `exclude\[0\]` are numbers and the gallery values of `exclude\[0\]` are"),
    (["1"], [1.0, 2.0, np.nan], r"gallery values of `exclude\[0\]` are numbers and the query values of `exclude\[0\]`"),
    ([[1, "x"]], [[1, "x"], [2, "x"], [2, "y"]], None),  # a column of each kind: fine, each compares alike
    ([[1.0, 0]], [["1", 0], ["2", 0], ["2", 0]], r"`exclude\[0\]` \(column 0\)"),
])
def test_exclusion_values_that_cannot_match_are_an_error(query_values, gallery_values, match):
    def run():
        return recall_at_k(QX, GX, [1], GX_LABELS, ks=[1], exclude=[(np.array(query_values, dtype=object),
                                                                   np.array(gallery_values, dtype=object))])
    if match is None:
        assert run() == {"recall@1": 0.0}
    else:
        with pytest.raises(ValueError, match=match):
            run()
