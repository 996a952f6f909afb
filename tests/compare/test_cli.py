"""recallk compare's decisions: verdict lines, gates with and without margins, exit codes, rendering."""

from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pandas as pd
import pytest

from helpers import ROOT
from recallk.compare import cli, outputs, paired
from recallk.errors import InputError
from recallk.stats import inference as stats


def metric(delta: float, low: float, high: float, p_holm: float, mde: float = 0.01, adjusted=None,
           level: float = 0.995) -> dict:
    """A metric's result; ``adjusted``: the Holm-level interval of the verdicts (default: the table's)."""
    adj_low, adj_high = adjusted or (low, high)
    return {"delta": delta, "ci_low": low, "ci_high": high, "p_holm": p_holm, "mde": mde, "ci_holm_low": adj_low,
            "ci_holm_high": adj_high, "ci_holm_level": level}


@pytest.mark.parametrize("spec, m, outcome", [
    ("map@r", metric(-0.02, -0.03, -0.01, 0.001), "worse"),          # plain: significantly worse
    ("map@r", metric(-0.02, -0.05, 0.01, 0.30), "pass"),             # plain: worse but not significant passes
    ("map@r:0.005", metric(-0.02, -0.05, 0.01, 0.30), "inconclusive"),  # the margin catches it: cannot tell
    ("map@r:0.005", metric(0.001, -0.004, 0.006, 0.70), "pass"),     # lower end -0.004 above -0.005
    ("map@r:0.005", metric(-0.002, -0.004, -0.001, 0.01), "pass"),   # significantly worse, but within the margin
    ("map@r:0.005", metric(-0.02, -0.03, -0.01, 0.001), "worse"),    # the whole interval below -0.005
    ("map@r:0", metric(0.01, 0.002, 0.02, 0.01), "pass"),            # margin 0: superiority's lower end
])
def test_gate_outcomes(spec, m, outcome):
    assert cli.gate({"metrics": {"map@r": m}}, spec, 0.05)["outcome"] == outcome


@pytest.mark.parametrize("outcomes, code", [
    ([], 0),                                  # no gate
    (["pass", "pass"], 0),
    (["pass", "inconclusive"], 3),
    (["inconclusive", "worse"], 1),           # worse wins over inconclusive
])
def test_exit_codes(outcomes, code):
    assert cli.exit_code([{"outcome": o} for o in outcomes]) == code


@pytest.mark.parametrize("spec, message", [
    ("map@r:-0.1", "margin >= 0"),       # a negative margin
    # issue 39: a margin at or above the metrics' range (0 to 1) makes a gate that can never fail
    ("recall@1:5", "below 1 (e.g. map@r:0.005): every metric lies from 0 to 1"),
    ("recall@1:1", "a larger margin makes a gate that cannot fail"),     # Δ is never below -1
    ("map@r:inf", "METRIC:MARGIN"),      # infinite
    ("map@r:abc", "METRIC:MARGIN"),      # not a number
    ("map@r:nan", "METRIC:MARGIN"),      # not finite
    (":0.1", "METRIC:MARGIN"),           # no metric
])
def test_bad_gates_are_refused(spec, message):
    with pytest.raises(InputError, match=re.escape(message)):
        cli.parse_gate(spec)


def test_the_largest_margin_below_the_range_can_fail():
    """The widest margin allowed still fails a B that is worse by more: the gate can fail."""
    assert cli.gate({"metrics": {"recall@1": metric(-1.0, -1.0, -1.0, 0.0)}}, "recall@1:0.999", 0.05)["outcome"] == \
        "worse"


def test_a_gate_whose_margin_spans_the_range_is_an_input_error_before_anything_is_read(tmp_path, capsys):
    """Issue 39: `--fail-if-worse recall@1:5` passed a B 0.17 worse; now exit 2, one line, nothing written."""
    code = cli.main([str(tmp_path / "absent-a.csv"), str(tmp_path / "absent-b.csv"), "--fail-if-worse",
                     "recall@1:5", "--json", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and "'recall@1:5'" in err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("m, want", [
    (metric(0.041, 0.02, 0.06, 0.001, adjusted=(0.01, 0.07)),
     "B better on recall@1: +0.0410 [+0.0100, +0.0700] (99.5% interval, Holm-adjusted for 10 metrics), Holm p 0.0010"),
    (metric(-0.041, -0.06, -0.02, 0.001, adjusted=(-0.07, -0.01)),
     "B worse on recall@1: -0.0410 [-0.0700, -0.0100] (99.5% interval, Holm-adjusted for 10 metrics), Holm p 0.0010"),
    (metric(0.002, -0.008, 0.012, 0.6, 0.015, adjusted=(-0.01, 0.014)),
     "recall@1: no detectable difference: the 99.5% interval, Holm-adjusted for 10 metrics, allows -0.0100 to "
     "+0.0140 (Holm p 0.6000; detectable at 80% power: ±0.0150)"),
    # issue 38, ckpt4 vs ckpt5: the interval the verdict prints excludes 0 while Holm p is 0.061: not "no
    # detectable difference" beside an interval that excludes 0, but inconclusive, saying which says what
    (metric(0.008, 0.0024, 0.0139, 0.061, adjusted=(0.0003, 0.0161)),
     "recall@1: inconclusive: the 99.5% interval, Holm-adjusted for 10 metrics, [+0.0003, +0.0161], excludes 0 but "
     "Holm p 0.0610 >= 0.05 (the sign-flip test and the bootstrap disagree this close to the boundary; more "
     "queries would decide)"),
    (metric(0.008, 0.0024, 0.0139, 0.03, adjusted=(-0.0011, 0.0161)),
     "recall@1: inconclusive: Holm p 0.0300 < 0.05 but the 99.5% interval, Holm-adjusted for 10 metrics, "
     "[-0.0011, +0.0161], holds 0 (the sign-flip test and the bootstrap disagree this close to the boundary; more "
     "queries would decide)"),
    # no "-0.0000": a bound that rounds to zero prints as +0.0000
    (metric(-0.004, -0.0148, -0.00001, 0.2, adjusted=(-0.0148, -0.00001)),
     "recall@1: inconclusive: the 99.5% interval, Holm-adjusted for 10 metrics, [-0.0148, +0.0000], excludes 0 "
     "but Holm p 0.2000 >= 0.05 (the sign-flip test and the bootstrap disagree this close to the boundary; more "
     "queries would decide)"),
])
def test_verdict_lines(m, want):
    assert cli.verdict("recall@1", m, 0.05, 10) == want


def test_every_verdict_agrees_with_the_interval_and_the_p_it_prints():
    """On real comparisons: "better"/"worse" only when the printed (adjusted) interval excludes 0 and Holm p < alpha,
    "no detectable difference" only when it holds 0 and Holm p >= alpha; the interval is adjusted for the metrics
    (Holm's level of each: the smallest p at alpha / m)."""
    rng = np.random.default_rng(5)
    seen = set()
    for shift in (0.0, 0.01, 0.02, 0.03, 0.05):
        n = 150
        frame = pd.DataFrame({"image_id": [f"q{i}" for i in range(n)], "label": "x", "num_positives": "2",
                              "num_retrievable": "9", "hit@1": rng.integers(0, 2, n).astype(float),
                              "ap": rng.random(n)})
        other = frame.assign(ap=(frame["ap"] + rng.normal(shift, 0.08, n)).clip(0, 1),
                             **{"hit@1": np.where(rng.random(n) < 0.1, 1 - frame["hit@1"], frame["hit@1"])})
        result = paired.compare(frame, other, paired.CompareSettings(resamples=1000, permutations=1000))
        levels = sorted(m["ci_holm_level"] for m in result["metrics"].values())
        assert levels in ([0.95, 0.975], [0.975, 0.975])
        for name, m in result["metrics"].items():
            line = cli.verdict(name, m, 0.05, 2)
            assert cli._signed(m["ci_holm_low"]) in line and "Holm-adjusted for 2 metrics" in line, line
            excludes = m["ci_holm_low"] > 0 or m["ci_holm_high"] < 0
            if line.startswith(("B better", "B worse")):
                assert excludes and m["p_holm"] < 0.05
                seen.add("significant")
            else:
                assert ("no detectable difference" in line) == (not excludes and m["p_holm"] >= 0.05), line
                seen.add("not")
    assert seen == {"significant", "not"}


def test_holm_levels_step_down_and_ties_share_one():
    assert stats.holm_levels([0.01, 0.04, 0.03, 0.01], 0.05) == pytest.approx([0.0125, 0.05, 0.025, 0.0125])


def test_no_negative_zero_in_any_printed_number():
    from recallk.stats import fixed

    assert [fixed(-0.0), fixed(-1e-9, signed=True), fixed(1e-9, signed=True), fixed(-4e-5, 2)] == \
        ["0.0000", "+0.0000", "+0.0000", "0.00"]
    assert fixed(-0.00005, signed=True) == "-0.0001" and fixed(0.25) == "0.2500"
    m = {**metric(-0.00002, -0.0148, -0.00001, 0.3), "mean_a": 0.5, "mean_b": 0.49998, "p": 0.3, "p_mcnemar": None,
         "dz": -1e-9, "wins": 1, "ties": 5, "losses": 2}
    cells = cli.rows({"metrics": {"map": m}})[0]
    assert "-0.0000" not in " ".join(cells) and "-0.00" not in cells[8] and cells[4] == "[-0.0148, +0.0000]"


def test_no_difference_on_any_query_is_said_so_and_has_no_mde():
    m = {**metric(0.0, 0.0, 0.0, 1.0, 0.0), "wins": 0, "ties": 5, "losses": 0}
    assert cli.verdict("recall@5", m, 0.05) == "recall@5: the same on every query"


def write(path, hits: list[int], aps: list[float], labels: list[str]) -> str:
    n = len(hits)
    pd.DataFrame({"image_id": [f"q{i:03d}" for i in range(n)], "label": labels, "num_positives": "2",
                  "num_retrievable": "9", "hit@1": [float(h) for h in hits], "ap": aps}).to_csv(path, index=False)
    return str(path)


def test_cli_margins_exit_codes_and_rendering(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n = 60
    labels = [f"l{i % 6}" for i in range(n)]
    hits = rng.integers(0, 2, n).tolist()
    aps = rng.random(n).round(4).tolist()
    a = write(tmp_path / "a.csv", hits, aps, labels)
    b = write(tmp_path / "b.csv", hits, [x + 0.001 * (i % 3 - 1) for i, x in enumerate(aps)], labels)
    small = ["--resamples", "500", "--permutations", "500"]
    # B equals A on recall@1 (every difference 0): the margin passes; d_z of all-zero differences is 0
    assert cli.main([a, b, "--fail-if-worse", "recall@1:0.01", *small]) == 0
    # a margin far tighter than the noise of map: inconclusive, exit 3, said on stderr
    code = cli.main([a, b, "--fail-if-worse", "map:0.00001", "--by", "two-level", "--delta", "0.05",
                     "--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md"), *small])
    out, err = capsys.readouterr()
    assert code == 3 and "inconclusive: cannot tell whether B is worse by more than the margin 1e-05 on map" in err
    assert "resampling labels, then queries within labels (two-level)" in out and "queries for Δ=0.05" in out
    md = (tmp_path / "r.md").read_text()
    assert "querys" not in md and "- **inconclusive**" in md and "two-level" in md
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["gates"][0]["outcome"] == "inconclusive" and result["by"] == "two-level"
    assert result["draws"]["units"] == 6 and result["metrics"]["map"]["queries_needed"] >= 1
    assert cli.main([a, b, "--fail-if-worse", "map:-1", *small]) == 2  # bad margin: input error


def test_a_passing_gate_says_so_on_stdout_and_in_the_markdown(tmp_path, capsys):
    """Issue 38: a CI log shows that a passing gate ran, naming the metric, the margin and the bound."""
    labels = [f"l{i % 6}" for i in range(40)]
    hits = [i % 2 for i in range(40)]
    a = write(tmp_path / "a.csv", hits, [0.5] * 40, labels)
    b = write(tmp_path / "b.csv", hits, [0.5 + 0.01 * (i % 3 - 1) for i in range(40)], labels)
    code = cli.main([a, b, "--fail-if-worse", "recall@1:0.01", "--fail-if-worse", "map", "--md",
                     str(tmp_path / "c.md"), "--resamples", "300", "--permutations", "300"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    margin = ("pass: B is not worse by more than the margin 0.01 on recall@1: the interval's lower end +0.0000 is "
              "above the bound -0.0100 (the 95% interval of Δ, [+0.0000, +0.0000])")
    assert margin in out.splitlines()
    assert any(line.startswith("pass: B is not significantly worse on map (no margin: fails when Δ < 0 and Holm p "
                               "< 0.05): Δ ") for line in out.splitlines()), out
    md = (tmp_path / "c.md").read_text()
    assert "- **pass**: " + margin.removeprefix("pass: ") in md and md.count("- **pass**") == 2


def test_undefined_d_z_is_printed_as_undefined():
    a = pd.DataFrame({"image_id": ["q0", "q1", "q2"], "label": "x", "num_positives": "1", "num_retrievable": "5",
                      "hit@1": ["0.0", "0.0", "0.0"]})
    b = a.assign(**{"hit@1": ["1.0", "1.0", "1.0"]})  # every difference +1: no spread, d_z unbounded
    result = paired.compare(a, b, paired.CompareSettings(resamples=50, permutations=50))
    assert result["metrics"]["recall@1"]["dz"] is None
    assert cli.rows(result)[0][8] == "undefined"


def test_draws_are_capped_and_reported(caplog):
    n = 3000
    a = pd.DataFrame({"image_id": [f"q{i}" for i in range(n)], "label": "x", "num_positives": "1",
                      "num_retrievable": "5", "hit@1": (np.arange(n) % 2).astype(float)})
    b = a.assign(**{"hit@1": (np.arange(n) % 3 == 0).astype(float)})
    result = paired.compare(a, b, paired.CompareSettings(resamples=5000, permutations=5000, max_draws=3_000_000))
    assert result["draws"]["resamples"] == 1000 and result["draws"]["resamples_asked"] == 5000
    assert "capped from 5,000" in cli.draws_line(result) and "resamples capped at 1000 of 5000" in caplog.text


# ------------------------------------------------------------------------------ damaged tables (issue 25)
# Moved from the hostile corpus (test_hostile_trust.py). `recallk compare` runs in process (its `main`); a user
# error is exit code 2, one `error:` line that names the file, the CSV line, the query and the column, nothing on
# stdout and no file written. (Kills at every write and rename: tests/stages/test_kill_points.py.)


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
    # issue 39: a byte-order mark named as the problem, with the encoding it announces
    (table().encode("utf-16"), "is not UTF-8 text: it starts with the UTF-16 little-endian byte-order mark (FF FE)"),
    (table().encode("utf-16-be").join([b"\xfe\xff", b""]), "UTF-16 big-endian byte-order mark (FE FF)"),
    (table().encode("utf-32"), "UTF-32 little-endian byte-order mark (FF FE 00 00)"),  # not mistaken for UTF-16
    # two files joined, each with its mark: the second mark at the start of line 6
    ("\ufeff".encode() + table().encode() + "\ufeff".encode() + "q9,b,1,9,1,1,e1\n".encode(),
     "byte-order mark (U+FEFF, bytes EF BB BF) at line 6, character 1"),
    ("\ufeff\ufeff".encode() + table().encode(), "right after the one it starts with"),  # a mark written twice
    ("\ufeff".encode() + table().encode("utf-16-le"), "NUL byte"),       # UTF-16 behind a UTF-8 BOM
    (b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "is not UTF-8"),          # a binary file
    (HEADER + "\n", "holds the header line only, no query row"),      # issue 39: no row, named as such
    (table().encode().replace(b"e1\n", b"e\x001\n", 1), "NUL byte"),     # valid UTF-8 with a NUL
])
def test_a_table_that_is_not_the_writers_text_is_one_error(tmp_path, capsys, data, message):
    assert_one_error(*compare(tmp_path, capsys, data), "b.csv", message)


def test_one_utf8_byte_order_mark_at_the_start_is_read(tmp_path, capsys):
    code, out, err = compare(tmp_path, capsys, "\ufeff".encode() + table().encode())  # as Excel saves UTF-8 CSV
    assert code == 0 and err == "" and "3 queries compared" in out


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
