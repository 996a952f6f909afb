"""Issue 39: outputs that cannot lie, in every command (compare, leaderboard, track, report). Two outputs naming
one file, or an output naming an input, are refused before anything is read or written (paths compared after
resolving symlinks and ``..``, existing files by inode); one cap and one message for --resamples and
--permutations."""

from __future__ import annotations

import os

import pytest

from recallk import cli
from recallk.errors import InputError
from recallk.stats import inference as stats

HEADER = "image_id,label,num_positives,num_retrievable,hit@1,ap"
A_ROWS = ["q0,a,2,9,1,0.5", "q1,a,2,9,0,0.25", "q2,b,1,9,1,1", "q3,b,1,9,0,0.2"]
B_ROWS = ["q0,a,2,9,1,0.6", "q1,a,2,9,1,0.5", "q2,b,1,9,0,0.1", "q3,b,1,9,0,0.3"]
FAST = ["--resamples", "20", "--permutations", "20"]


@pytest.fixture()
def runs(tmp_path, monkeypatch):
    """Two per-query CSVs and a folder of score outputs (its metrics/per_query.csv and evaluated.json), in a
    working directory of their own."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.csv").write_text("\n".join([HEADER, *A_ROWS]) + "\n")
    (tmp_path / "b.csv").write_text("\n".join([HEADER, *B_ROWS]) + "\n")
    (tmp_path / "run" / "metrics").mkdir(parents=True)
    (tmp_path / "run" / "metrics" / "per_query.csv").write_text("\n".join([HEADER, *B_ROWS]) + "\n")
    (tmp_path / "run" / "metrics" / "evaluated.json").write_text('{"id": "r1"}\n')
    os.symlink(tmp_path / "a.csv", tmp_path / "link.csv")
    os.link(tmp_path / "b.csv", tmp_path / "hard.csv")
    (tmp_path / "out").mkdir()
    os.symlink(tmp_path / "out", tmp_path / "out_link")
    return tmp_path


def snapshot(root) -> dict:
    """Every file under ``root`` and its bytes (links as their targets' bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("argv, message", [
    # compare: --json and --md on one file kept only one of the two
    (["compare", "a.csv", "b.csv", "--json", "out/r", "--md", "out/r"], "--json and --md both name the file 'out/r'"),
    # ... the same file through a symlinked folder and a `..`
    (["compare", "a.csv", "b.csv", "--json", "out/r.json", "--md", "out_link/../out_link/r.json"],
     "resolve to"),
    # compare: --json on the input table overwrote it
    (["compare", "a.csv", "b.csv", "--json", "a.csv"], "--json names 'a.csv', which is an input ('a.csv', read for A)"),
    # ... through a symlink to it
    (["compare", "a.csv", "b.csv", "--md", "link.csv"], "which is an input ('a.csv', read for A)"),
    # ... through a hard link to it (the same inode)
    (["compare", "a.csv", "b.csv", "--md", "hard.csv"], "which is an input ('b.csv', read for B)"),
    # ... a folder's per-query table, and the evaluated.json beside it
    (["compare", "a.csv", "run", "--json", "run/metrics/per_query.csv"], "read for B"),
    (["compare", "a.csv", "run", "--json", "run/metrics/evaluated.json"], "run/metrics/evaluated.json"),
    # leaderboard: the same two rules
    (["leaderboard", "a.csv", "b.csv", "--json", "out/x", "--md", "out/x"], "--json and --md both name"),
    (["leaderboard", "a.csv", "b.csv", "--json", "a.csv"], "which is an input ('a.csv', read for a.csv)"),
    # leaderboard: a run of a system given as NAME=RUN1+RUN2
    (["leaderboard", "A=a.csv+b.csv", "B=run", "--intersect", "--md", "b.csv"], "read for A"),
    # track: --png and --json on one file kept one of the two
    (["track", "a.csv", "b.csv", "--png", "out/t", "--json", "out/t"], "--json and --png both name"),
    # track: --png's default (track.png) named by --json too
    (["track", "a.csv", "b.csv", "--json", "track.png"], "--json and --png both name the file 'track.png'"),
    # track: the plot over an input
    (["track", "a.csv", "b.csv", "--png", "link.csv"], "--png names 'link.csv', which is an input"),
    # report: the page over an input
    (["report", "a.csv", "b.csv", "--out", "b.csv"], "--out names 'b.csv', which is an input"),
    # every command: an output naming a folder
    (["report", "a.csv", "b.csv", "--out", "out"], "--out names 'out', which is a folder"),
])
def test_outputs_that_would_overwrite_each_other_or_an_input_are_refused(runs, capsys, argv, message):
    before = snapshot(runs)
    code = cli.main([*argv, *FAST])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err and ("Give" in err or "takes a file name" in err), err  # the rule and the fix
    assert snapshot(runs) == before  # nothing written, no input touched


@pytest.mark.parametrize("command", ["compare", "leaderboard", "track", "report"])
@pytest.mark.parametrize("option, value", [
    ("--resamples", "1000000000"),   # 1e9 asked for 112 GiB in leaderboard and died
    ("--permutations", "1000001"),   # one above the cap
    ("--permutations", "0"),         # none: no p-value
    ("--resamples", "-5"),           # negative
])
def test_one_cap_and_one_message_for_resamples_and_permutations(runs, capsys, command, option, value):
    argv = [command, "a.csv", "b.csv", *FAST, option, value, "--json" if command != "report" else "--out", "out/x"]
    code = cli.main(argv)
    out, err = capsys.readouterr()
    want = f"error: `{option}` must be an integer from 1 to {stats.MAX_ASKED:,} "
    assert code == 2 and out == "" and err.startswith(want) and f"Got {int(value)} instead." in err, err
    assert not (runs / "out" / "x").exists()


@pytest.mark.parametrize("value, allowed", [
    (1, True),                        # the fewest
    (stats.MAX_ASKED, True),          # the cap itself
    (stats.MAX_ASKED + 1, False),     # one above
    (True, False),                    # a bool is not a count
    (2.5, False),                     # nor a fraction
])
def test_the_cap_rule(value, allowed):
    if allowed:
        stats.check_asked("--resamples", value)
    else:
        with pytest.raises(InputError, match=r"^`--resamples` must be an integer from 1 to 1,000,000 "):
            stats.check_asked("--resamples", value)
