"""recallk leaderboard / track: hand-checked tables, the three repeated-run cases, the CLI's outputs and errors."""

from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from recallk.compare import board_cli, family, leaderboard, paired, sources, systems
from recallk.errors import InputError
from recallk.stats import inference as stats

FAST = leaderboard.BoardSettings(resamples=400, permutations=2000)


def table(hits, aps, ids=None, labels=None) -> pd.DataFrame:
    """A per-query table as the score stage writes it (hit@1 and ap)."""
    n = len(hits)
    return pd.DataFrame({"image_id": ids or [f"q{i:02d}" for i in range(n)], "label": labels or list("ab") * (n // 2),
                         "num_positives": ["2"] * n, "num_retrievable": ["9"] * n,
                         "hit@1": [str(float(h)) for h in hits], "ap": [str(x) for x in aps]})


def board_of(*systems_runs, names=None, intersect=False) -> systems.Panel:
    """A panel of systems, each a table (one run) or a list of tables (its runs)."""
    names = names or [f"S{i}" for i in range(len(systems_runs))]
    systems_runs = [[runs] if isinstance(runs, pd.DataFrame) else runs for runs in systems_runs]
    return systems.panel([(name, list(runs), [f"{name}:{r}" for r in range(len(runs))])
                          for name, runs in zip(names, systems_runs)], intersect=intersect)


RNG = np.random.default_rng(0)
STRONG = table([1] * 18 + [0] * 2, RNG.uniform(0.6, 1.0, 20))
MIDDLE = table([1] * 10 + [0] * 10, RNG.uniform(0.3, 0.7, 20))
WEAK = table([1] * 9 + [0] * 11, RNG.uniform(0.3, 0.7, 20))


def test_hand_checked_leaderboard():
    result = leaderboard.leaderboard(board_of(MIDDLE, STRONG, WEAK), FAST)
    r1 = result["metrics"]["recall@1"]
    assert [row["system"] for row in r1["rows"]] == ["S1", "S0", "S2"] and r1["reference"] == "S1"
    assert [row["mean"] for row in r1["rows"]] == pytest.approx([0.9, 0.5, 0.45])
    vs = paired.compare(STRONG, MIDDLE, paired.CompareSettings(resamples=400, permutations=2000))["metrics"]
    s0 = r1["rows"][1]
    assert s0["delta"] == pytest.approx(vs["recall@1"]["delta"]) and s0["p"] == vs["recall@1"]["p"]  # as compare
    assert s0["delta_low"] <= s0["delta"] <= s0["delta_high"] < 0
    family = [row for entry in result["metrics"].values() for row in entry["rows"] if "p" in row]
    assert len(family) == 4 and [row["p_adjusted"] for row in family] == pytest.approx(
        stats.holm([row["p"] for row in family]))  # one Holm family over both metrics
    assert [row["group"] for row in r1["rows"]] == ["a", "b", "b"]  # 0.5 and 0.45 are not told apart
    assert [(p["a"], p["b"]) for p in r1["pairs"]] == [("S0", "S1"), ("S0", "S2"), ("S1", "S2")]  # command order
    assert r1["pairs"][0]["diff"] == pytest.approx(0.4) and "p_adjusted" in r1["pairs"][0]
    assert "p_adjusted" not in r1["pairs"][1]  # S0 vs S2 involves no reference: its adjusted p is Tukey's
    assert all(p["p_tukey"] < 0.05 for p in (r1["pairs"][0], r1["pairs"][2])) and r1["pairs"][1]["p_tukey"] > 0.05


def test_a_baseline_and_bh():
    settings = leaderboard.BoardSettings(baseline="S2", adjust="bh", resamples=400, permutations=2000)
    result = leaderboard.leaderboard(board_of(MIDDLE, STRONG, WEAK), settings)
    rows = result["metrics"]["recall@1"]["rows"]
    assert result["metrics"]["recall@1"]["reference"] == "S2" and "delta" not in rows[2]
    assert [row["delta"] for row in rows[:2]] == pytest.approx([0.45, 0.05])
    with pytest.raises(InputError, match="--baseline names 'nope', which is not one of the systems: S0, S1, S2"):
        leaderboard.leaderboard(board_of(MIDDLE, STRONG, WEAK), leaderboard.BoardSettings(baseline="nope"))


def test_repeated_runs_on_the_same_queries_are_averaged_per_query():
    run_a = table([1, 0, 1, 0] * 5, [0.5] * 20)
    run_b = table([1, 1, 0, 0] * 5, [0.7] * 20)
    board = board_of([run_a, run_b], [WEAK])
    assert board.case == "same queries" and board.units == "queries"
    assert np.array_equal(board.values["recall@1"][:, 0], np.array([1, 0.5, 0.5, 0] * 5))
    assert board.run_sd("map")[0] == pytest.approx(np.std([0.5, 0.7], ddof=1)) and board.run_sd("map")[1] is None
    row = leaderboard.leaderboard(board, FAST)["metrics"]["map"]["rows"]
    assert {r["system"]: r["runs"] for r in row} == {"S0": 2, "S1": 1}
    assert all(r.get("delta_run_sd") is None for r in row)  # 2 runs against 1: no run pairing


def test_repeated_runs_on_different_queries_are_paired_by_run():
    def runs(shift):
        return [table([1] * (10 + shift + r) + [0] * (10 - shift - r), [0.5 + 0.01 * (shift + r)] * 20,
                      ids=[f"seed{r}-{i}" for i in range(20)]) for r in range(3)]
    board = board_of(runs(0), runs(2))
    assert board.case == "different queries" and board.units == "runs" and board.labels is None
    assert np.allclose(board.values["recall@1"], [[0.5, 0.6], [0.55, 0.65], [0.6, 0.7]])
    assert board.run_sd("recall@1") == pytest.approx([0.05, 0.05])
    row = leaderboard.leaderboard(board, FAST)["metrics"]["recall@1"]["rows"][1]
    assert row["p_exact"] and row["p"] == pytest.approx(0.25)  # 3 runs: 8 sign patterns, 2 as extreme
    assert row["delta_run_sd"] == pytest.approx(0.0, abs=1e-12)  # Δ is 0.1 in every run
    with pytest.raises(InputError, match="--by label needs the same queries in every run"):
        leaderboard.leaderboard(board, leaderboard.BoardSettings(by="label"))


@pytest.mark.parametrize("runs, message", [
    ([[MIDDLE]], "at least two systems; got 1"),                                               # one system
    ([[MIDDLE], [table([1] * 20, [0.5] * 20, ids=[f"x{i}" for i in range(20)])]],
     "S0 scored 20; S1 scored 20: 20 not in those \\(e.g. x0, x1, x10\\); 20 of those missing \\(e.g. q00, q01, "
     "q02\\)\\. .*\\(one run each\\)\\. No query is shared by every run, so --intersect cannot help"),  # other split
    ([[MIDDLE, MIDDLE], [MIDDLE.iloc[2:]]], "S0 run 1 and S0 run 2 scored 20; S1 scored 18: 2 of those missing "
     "\\(e.g. q00, q01\\)\\. .*\\(runs per system here: \\[1, 2\\]\\)\\. Pass --intersect to keep the 18 queries"),
    ([[MIDDLE], [MIDDLE.assign(num_retrievable="8")]], "differ in `num_retrievable`"),           # another gallery
])
def test_runs_that_fit_no_case_are_refused(runs, message):
    with pytest.raises(InputError, match=message):
        board_of(*runs)


def test_a_leaderboard_error_names_the_odd_system_and_its_queries():
    """Issue 38 (`recallk leaderboard HEAD --experiments '*'`): the error names the system whose queries differ from
    the rest, with counts and a few ids, and suggests --intersect only when some query is shared by every run."""
    odd = table([1] * 20, [0.5] * 20, ids=[f"q{i:02d}" for i in range(5, 25)])
    with pytest.raises(InputError) as caught:
        board_of(MIDDLE, STRONG, odd, WEAK, names=["HEAD", "effnet", "seed3", "pixels"])
    message = str(caught.value)
    assert message.startswith("the runs scored different queries: HEAD, effnet and pixels scored 20; seed3 scored "
                              "20: 5 not in those (e.g. q20, q21, q22); 5 of those missing (e.g. q00, q01, q02).")
    assert message.endswith("Pass --intersect to keep the 15 queries every run shares.")
    elsewhere = table([1] * 20, [0.5] * 20, ids=[f"x{i:02d}" for i in range(20)])
    for intersect in (False, True):  # nothing shared: --intersect is not suggested, and cannot help
        with pytest.raises(InputError, match="seed3 scored 20: 20 not in those.*--intersect cannot help") as caught:
            board_of(MIDDLE, STRONG, elsewhere, names=["HEAD", "effnet", "seed3"], intersect=intersect)
        assert "Pass --intersect" not in str(caught.value)


def test_intersect_keeps_the_queries_every_run_shares():
    board = board_of([MIDDLE], [MIDDLE.iloc[3:]], intersect=True)
    assert board.queries == 17 and board.case == "single run"


@pytest.mark.parametrize("arg, want", [
    ("HEAD", ("HEAD", ("HEAD",))),                        # one run, named as given
    ("seed0+seed1", ("seed0+seed1", ("seed0", "seed1"))),  # two runs
    ("big=s0+s1+s2", ("big", ("s0", "s1", "s2"))),         # named
])
def test_system_arguments(arg, want):
    spec = systems.parse_system(arg)
    assert (spec.name, spec.runs) == want


def write(folder, name, frame):
    path = folder / name
    frame.to_csv(path, index=False)
    return str(path)


def test_the_command_writes_text_json_and_markdown(tmp_path, capsys):
    paths = [write(tmp_path, f"{n}.csv", t) for n, t in (("mid", MIDDLE), ("strong", STRONG), ("weak", WEAK))]
    code = board_cli.main([*paths, "--json", str(tmp_path / "b.json"), "--md", str(tmp_path / "b.md"),
                           "--permutations", "500", "--resamples", "300", "--metric", "recall@1"])
    out = capsys.readouterr().out
    assert code == 0 and "case: one run per system" in out and "reference" in out
    result = json.loads((tmp_path / "b.json").read_text())
    assert list(result["metrics"]) == ["recall@1"]
    assert [(p["a"], p["b"]) for p in result["metrics"]["recall@1"]["pairs"]][0] == (paths[0], paths[1])
    assert "| 1 | " + paths[1] in (tmp_path / "b.md").read_text()


@pytest.mark.parametrize("extra_args, message", [
    (["--metric", "ndcg"], "--metric names 'ndcg'"),                                   # unknown metric
    (["--json", "/no/such/folder/x.json"], "folder '/no/such/folder' does not exist"),  # nowhere to write
    (["--md", "/no/such/x.md", "--json", "OUT.json"], "folder '/no/such' does not exist"),  # nothing written
    (["--alpha", "2"], "`alpha` must be strictly between 0 and 1. Got 2.0 instead"),    # bad level
    (["--experiments", "nothing-*"], "no DVC experiment"),                              # no match
])
def test_command_errors_exit_2_with_one_line(tmp_path, capsys, extra_args, message):
    paths = [write(tmp_path, f"{n}.csv", t) for n, t in (("mid", MIDDLE), ("strong", STRONG))]
    extra_args = [a.replace("OUT", str(tmp_path / "out")) for a in extra_args]
    code = board_cli.main([*paths, "--repo", str(tmp_path), *extra_args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out.json").exists()


def test_track_marks_the_best_and_what_cannot_be_told_from_it(tmp_path, capsys):
    epochs = [write(tmp_path, f"epoch{i}.csv", t) for i, t in enumerate((WEAK, MIDDLE, STRONG))]
    args = [*epochs, "--png", str(tmp_path / "t.png"), "--json", str(tmp_path / "t.json"), "--permutations",
            "1000", "--resamples", "300"]
    assert board_cli.track_main(args) == 0
    entry = json.loads((tmp_path / "t.json").read_text())["metrics"]["recall@1"]
    assert entry["best"] == epochs[2] and entry["indistinguishable"] == [epochs[2]]
    assert [p["system"] for p in entry["series"]] == epochs  # the given order, not the ranking
    assert "delta_prev" not in entry["series"][0]
    assert entry["series"][2]["delta_prev"]["delta"] == pytest.approx(0.4)
    assert "indistinguishable from it" in capsys.readouterr().out
    first = (tmp_path / "t.png").read_bytes()
    with Image.open(tmp_path / "t.png") as image:
        assert image.size == (900, 480) and len(image.convert("RGB").getcolors(1 << 16)) > 20
    board_cli.track_main(args)
    assert (tmp_path / "t.png").read_bytes() == first  # same inputs, same bytes


def test_every_experiment_of_a_repository_by_pattern(tmp_path, capsys):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    (tmp_path / "metrics").mkdir()
    commits = {}
    for name, frame in (("lr-small", WEAK), ("lr-big", STRONG), ("other", MIDDLE)):
        frame.to_csv(tmp_path / "metrics/per_query.csv", index=False)
        git("add", "metrics")
        git("commit", "-qm", name)
        commits[name] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True,
                                       text=True).stdout.strip()
        git("update-ref", f"refs/exps/ab/{'c' * 38}/{name}", commits[name])  # where DVC keeps an experiment
    assert systems.experiment_names(tmp_path, "lr-*") == ["lr-big", "lr-small"]
    code = board_cli.main(["--experiments", "lr-*", "--repo", str(tmp_path), "--permutations", "300",
                           "--resamples", "200", "--metric", "recall@1"])
    out = capsys.readouterr().out
    assert code == 0 and "lr-big: lr-big (" in out and "lr-small" in out
    assert re.search(r"\bother\b(?! system)", out) is None  # the experiment "other" is not matched


def test_failed_queued_experiments_are_named_not_skipped_silently(tmp_path, capsys):
    """`dvc exp run --run-all` exits 0 when a queued experiment fails (DVC keeps it in its failed stash,
    refs/exps/celery/failed, one reflog entry "commit: dvc-exp:<rev>:<baseline>:<name>" each): --experiments warns
    of the failed ones it matches, naming one failed by name says it failed, and the stash is no experiment."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    (tmp_path / "metrics").mkdir()
    for name, frame in (("ckpt1", WEAK), ("ckpt2", STRONG)):
        frame.to_csv(tmp_path / "metrics/per_query.csv", index=False)
        git("add", "metrics")
        git("commit", "-qm", name)
        git("update-ref", f"refs/exps/ab/{'c' * 38}/{name}", git("rev-parse", "HEAD"))
    head = git("rev-parse", "HEAD")
    for name in ("ckpt3", "ckpt2", "other"):  # ckpt2 failed once, then ran again and succeeded
        git("update-ref", "--create-reflog", "-m", f"commit: dvc-exp:{head}:{head}:{name}", "refs/exps/celery/failed",
            head)
    assert systems.failed_experiment_names(tmp_path, "ckpt*") == ["ckpt3"]
    assert sources.resolve_revision("failed", tmp_path) is None  # the stash's ref is not an experiment
    code = board_cli.main(["--experiments", "ckpt*", "--repo", str(tmp_path), "--permutations", "300",
                           "--resamples", "200", "--metric", "recall@1"])
    captured = capsys.readouterr()
    assert code == 0 and "ckpt1" in captured.out and "ckpt2" in captured.out
    assert captured.err.count("warning:") == 1
    assert "1 queued DVC experiment(s) matching 'ckpt*' failed and are not on the board: ckpt3" in captured.err
    assert "`dvc queue logs ckpt3`" in captured.err
    with pytest.raises(InputError, match=r"'ckpt3' is a queued DVC experiment that failed .*dvc queue logs ckpt3"):
        sources.load("ckpt3", tmp_path)


@pytest.mark.parametrize("command", ["leaderboard", "track"])
def test_json_is_strict_with_null_for_nan(tmp_path, monkeypatch, command):
    """A value that is not a finite number is written as null (as `recallk compare --json`), never NaN."""
    real = getattr(leaderboard, command)

    def with_nan(*args, **kwargs):
        result = real(*args, **kwargs)
        result["metrics"]["recall@1"]["rows"][0]["mean"] = float("nan")
        result["metrics"]["recall@1"]["rows"][1]["ci_low"] = float("-inf")
        return result

    monkeypatch.setattr(leaderboard, command, with_nan)
    paths = [write(tmp_path, f"{n}.csv", t) for n, t in (("mid", MIDDLE), ("strong", STRONG))]
    args = [*paths, "--json", str(tmp_path / "b.json"), "--permutations", "200", "--resamples", "100",
            "--metric", "recall@1", *(["--png", str(tmp_path / "t.png")] if command == "track" else [])]
    assert board_cli.run(command, args) == 0
    text = (tmp_path / "b.json").read_text()

    def refuse(constant):
        raise AssertionError(f"non-strict JSON constant {constant}")

    rows = json.loads(text, parse_constant=refuse)["metrics"]["recall@1"]["rows"]
    assert rows[0]["mean"] is None and rows[1]["ci_low"] is None and rows[1]["mean"] is not None


@pytest.fixture
def recallk_logger():
    """Restore the ``recallk`` logger after a console command configured it (recallk.cli.show_progress_lines)."""
    import logging

    logger = logging.getLogger("recallk")
    handlers, level = list(logger.handlers), logger.level
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)


def test_a_long_board_shows_its_progress_in_the_console_command(tmp_path, capsys, monkeypatch, recallk_logger):
    """Off a terminal (pytest captures stderr), `recallk track` logs progress lines on stderr (every 30 s; here
    every update), and the ticks add up to the announced total: the Tukey draws, the resamples and sign flips
    of the board, then of every step."""
    from recallk import cli
    from recallk.progress import Progress

    bars = []

    class EveryUpdate(Progress):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "interval": 0.0})
            bars.append(self)

    monkeypatch.setattr(leaderboard, "Progress", EveryUpdate)
    epochs = [write(tmp_path, f"epoch{i}.csv", t) for i, t in enumerate((WEAK, MIDDLE, STRONG))]
    assert cli.main(["track", *epochs, "--png", str(tmp_path / "t.png"), "--permutations", "300",
                     "--resamples", "200"]) == 0
    err = capsys.readouterr().err
    (bar,) = bars
    assert bar.total == 2 * 300 + 200 + 2 * 2 * (200 + 300) and bar.done == bar.total  # 2 metrics x 2 steps
    lines = [line for line in err.splitlines() if line.startswith("INFO recallk.compare.leaderboard: track: ")]
    assert lines and all(" draws (" in line and "s left" in line for line in lines), err


def checkpoints() -> systems.Panel:
    """Five checkpoints of 60 queries closing in on the last (issue 38's shape): on map, e2 shares the group of the
    best (Tukey) while its Holm-adjusted sign-flip p against the best is 0.004."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.8, 60)
    runs = []
    for shift in (0.0, 0.05, 0.08, 0.10, 0.11):
        ap = np.clip(base + shift + rng.normal(0, 0.04, 60), 0, 1).round(4)
        runs.append(table((rng.random(60) < 0.4 + shift * 2).astype(int), ap))
    return board_of(*runs, names=[f"e{i}" for i in range(5)])


def test_track_groups_indistinguishable_and_vs_best_come_from_one_family():
    board = checkpoints()
    rows = leaderboard.leaderboard(board, FAST)["metrics"]["map"]["rows"]
    e2 = next(row for row in rows if row["system"] == "e2")
    assert e2["group"] == rows[0]["group"] == "a" and e2["p_adjusted"] < 0.05  # two families part ways here
    result = leaderboard.track(board, FAST)
    assert result["vs_reference"] == "tukey"
    for metric, entry in result["metrics"].items():
        best = set(next(p for p in entry["series"] if p["system"] == entry["best"])["group"])
        tukey = {frozenset((p["a"], p["b"])): p["p_tukey"] for p in entry["pairs"]}
        for point in entry["series"]:
            shares = bool(set(point["group"]) & best)
            assert (point["system"] in entry["indistinguishable"]) == shares, (metric, point)
            if point["system"] != entry["best"]:
                vs = point["vs_best"]
                assert vs["p_adjusted"] == tukey[frozenset((point["system"], entry["best"]))]
                assert (vs["p_adjusted"] >= FAST.alpha) == shares == (vs["delta_low"] <= 0 <= vs["delta_high"])
    assert "e2" in result["metrics"]["map"]["indistinguishable"]
    steps = [point["delta_prev"] for point in result["metrics"]["map"]["series"][1:]]  # one family, the steps:
    levels = stats.holm_levels([step["p"] for step in steps], FAST.alpha)  # their intervals adjusted as their p
    assert [step["level"] for step in steps] == pytest.approx([1 - level for level in levels])
    assert max(step["level"] for step in steps) == pytest.approx(1 - FAST.alpha / 4)


def test_tukey_half_width_is_the_critical_range_of_the_pairs_p():
    values = np.random.default_rng(3).normal(0, 0.3, size=(40, 4)) + np.array([0, 0.1, 0.3, 0.6])
    tukey = family.randomized_tukey_hsd(values, 2000, 0)
    half = family.tukey_half_width(tukey, 0.05)
    assert 0 < half < np.abs(tukey["diff"]).max()
    significant = tukey["p"] < 0.05
    assert np.array_equal(significant, np.abs(tukey["diff"]) > half)
    assert family.tukey_half_width(tukey, 1 / 4000) == np.inf  # no p can be that small with 2000 draws


def entry(best, groups, apart=()):
    """A metric's result as summary() reads it: rows with their letters, pairs with whether they are told apart."""
    names = list(groups)
    return {"best": best, "rows": [{"system": n, "group": g} for n, g in groups.items()],
            "pairs": [{"a": a, "b": b, "significant": (a, b) in apart or (b, a) in apart}
                      for i, a in enumerate(names) for b in names[i + 1:]]}


@pytest.mark.parametrize("metrics, want", [
    ({f"m{i}": entry("effnet", {"effnet": "a", "pixels": "b", "pixels8": "b"},
                     [("effnet", "pixels"), ("effnet", "pixels8")]) for i in range(10)},
     "effnet best on all 10 metrics, told apart from every other system on each; pixels and pixels8 not told apart "
     "on any metric (groups: randomized Tukey HSD, α = 0.05)."),
    ({"recall@1": entry("S1", {"S1": "a", "S0": "ab", "S2": "b"}, [("S1", "S2")]),
      "map": entry("S0", {"S0": "a", "S1": "b", "S2": "b"}, [("S0", "S1"), ("S0", "S2")])},
     "S1 best on 1 of 2 metrics, S0 on 1 (map); the best told apart from every other system on 1 of them; every two "
     "systems told apart on at least one metric (groups: randomized Tukey HSD, α = 0.05)."),
    ({"recall@1": entry("S1", {"S1": "a", "S0": "a"})},
     "S1 best on recall@1, not told apart from S0 (groups: randomized Tukey HSD, α = 0.05)."),
    ({"recall@1": entry("S1", {"S1": "a", "S0": "b", "S2": "b", "S3": "c"},
                        [("S1", "S0"), ("S1", "S2"), ("S1", "S3"), ("S0", "S3"), ("S2", "S3")])},
     "S1 best on recall@1, told apart from every other system; S0 and S2 not told apart (groups"),
    ({f"m{i}": entry("A", {"A": "a", "B": "ab", "C": "b", "D": "ab"}, [("A", "C")] if i < 3 else [])
      for i in range(12)},
     "A best on all 12 metrics, on each sharing its group with another system; 5 pairs not told apart on any metric: "
     "A / B, A / D, B / C, B / D and 1 more (groups"),
])
def test_the_summary_paragraph(metrics, want):
    text = board_cli.summary({"metrics": metrics, "alpha": 0.05})
    assert text.startswith(want) or text == want, text


def test_leaderboard_text_and_markdown_open_with_the_summary(tmp_path, capsys):
    paths = [write(tmp_path, f"{n}.csv", t) for n, t in (("mid", MIDDLE), ("strong", STRONG), ("weak", WEAK))]
    assert board_cli.main([*paths, "--md", str(tmp_path / "b.md"), "--permutations", "500", "--resamples", "300"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"{paths[1]} best on both metrics, told apart from every other system on each; ")
    assert (tmp_path / "b.md").read_text().splitlines()[0] == first


def test_a_header_only_table_is_named_in_the_leaderboards_error(tmp_path, capsys):
    """Issue 39: the error said `hdr.csv scored 0` queries (a split mismatch); it names the empty table."""
    paths = [write(tmp_path, "mid.csv", MIDDLE), write(tmp_path, "hdr.csv", MIDDLE.iloc[:0])]
    code = board_cli.main([*paths, "--permutations", "200", "--resamples", "100"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {paths[1]} holds the header line only, no query row"), err


@pytest.mark.parametrize("adjust, column, e2_map", [
    ("holm", "p Holm", "0.0040"),   # the default family of Δ vs the reference
    ("bh", "p BH", "0.0013"),       # the false-discovery-rate family
])
def test_the_leaderboard_names_the_family_of_its_letters_and_of_its_adjusted_p(adjust, column, e2_map):
    """Issue 38: the plain leaderboard showed group letters (Tukey HSD, every pair) beside a "p adj" (Holm over the
    comparisons with the reference): each column now names its procedure, and every system where the two say
    different things gets a note naming which says what."""
    board = checkpoints()
    result = leaderboard.leaderboard(board, leaderboard.BoardSettings(adjust=adjust, resamples=400, permutations=2000))
    text, md = board_cli.text_report(result), board_cli.markdown(result)
    for output in (text, md):
        assert "Tukey group" in output and column in output and not re.search(r"\bp adj\b", output)
    for metric, entry in result["metrics"].items():
        ref = set(next(r["group"] for r in entry["rows"] if r["system"] == entry["reference"]))
        notes = board_cli.family_notes(entry, result)
        split = [r["system"] for r in entry["rows"]
                 if "p_adjusted" in r and bool(set(r["group"]) & ref) == (r["p_adjusted"] < 0.05)]
        assert [n.split()[1] for n in notes] == split, metric  # a note for each system the two families split
        assert all(n in text and n in md for n in notes)
    assert board_cli.family_notes(result["metrics"]["map"], result)[0].startswith(
        f"note: e2 shares a Tukey group with e4 (not told apart over every pair) but {column} {e2_map} < 0.05 "
        "(told apart against e4 alone)")


def test_track_names_its_one_family_and_needs_no_note():
    result = leaderboard.track(checkpoints(), FAST)
    text = board_cli.text_report(result)
    assert "p Tukey" in text and "Tukey group" in text and "p Holm" not in text.split("series")[0]
    assert not any(board_cli.family_notes(entry, result) for entry in result["metrics"].values())
    assert "note:" not in text
