"""The index stage checks its inputs against each other (issue 39): an exact run of other embeddings is refused
with both ids and the fix, and the score stage's tables go through their contracts (the per-query table through
the one `recallk compare` applies), each fault one `error:` naming the file, the line or query, the column and
the rule, with no output left behind; after `dvc repro score` the stage runs and `Flat` pairs to Δ = 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from extras import extra
from helpers import OUTS, assert_no_outputs, assert_user_error, run_in_process, run_ok, set_params
from stages import index as index_stage

pytestmark = pytest.mark.stage

PER_QUERY, NEIGHBORS = "data/scores/per_query.csv", "data/scores/neighbors.csv"
OUTPUTS = OUTS["index"] + tuple(index_stage.MEASURED.values())


def edit_cell(column: str, line: int, value: str) -> Callable[[str], str]:
    """Set the cell of ``column`` on CSV ``line`` (1-based; the header is line 1) to ``value``."""
    def edit(text: str) -> str:
        lines = text.split("\n")
        at = lines[0].split(",").index(column)
        cells = lines[line - 1].split(",")
        cells[at] = value
        lines[line - 1] = ",".join(cells)
        return "\n".join(lines)
    return edit


def copy_cell(column: str, source: int, line: int) -> Callable[[str], str]:
    """Copy ``column``'s cell on CSV line ``source`` to line ``line``."""
    def edit(text: str) -> str:
        lines = text.split("\n")
        return edit_cell(column, line, lines[source - 1].split(",")[lines[0].split(",").index(column)])(text)
    return edit


def drop_lines(n: int) -> Callable[[str], str]:
    """The text without its last ``n`` lines (each still ending with its newline): cut at a line's end."""
    return lambda text: "".join(text.splitlines(keepends=True)[:-n])


@pytest.mark.parametrize("file, damage, fragments", [
    # a NaN hit cell (a traceback before): compare's contract names the column, the rule and the line
    (PER_QUERY, edit_cell("hit@1", 3, "nan"), ["per_query.csv breaks the per-query table's contract",
                                               "column `hit@1` must hold 0 or 1", "CSV line 3"]),
    # cut in the middle of a line: the file and its last line named
    (PER_QUERY, lambda t: t[:-9], ["per_query.csv is cut short"]),
    (NEIGHBORS, lambda t: t[:-9], ["neighbors.csv is cut short at line", "no newline at its end"]),
    # cut at the end of a line (a message naming no line before): the query whose rows stop short
    (NEIGHBORS, drop_lines(4), ["neighbors.csv is cut short: query", "rows (the last on CSV line",
                                "and the score stage writes"]),
    # a cell that is no cosine, a repeated rank, a row of another score run, a gallery id the split lacks
    (NEIGHBORS, edit_cell("score", 4, "abc"), ["column `score` must hold a cosine", "CSV line 4"]),
    (NEIGHBORS, edit_cell("rank", 3, "1"), ["column `rank` must hold 1, 2, 3, ... per query, each once"]),
    (NEIGHBORS, edit_cell("evaluated", 5, "0123456789ab"), ["column `evaluated` must hold the per-query table's id",
                                                             "CSV line 5"]),
    (NEIGHBORS, edit_cell("gallery_id", 2, "nowhere.png"), ["column `gallery_id` must hold a gallery image_id",
                                                            "CSV line 2"]),
    # the first query's last row (rank 11, line 12) tied with its rank 10: the tie may run on past the table
    (NEIGHBORS, copy_cell("score", 11, 12), ["neighbors.csv ends query", "inside a tie: its last row (rank 11)"]),
])
def test_a_damaged_exact_table_is_one_clear_error(scored_project: Path, file, damage, fragments) -> None:
    set_params(scored_project, {"index.kinds": ["Flat"]})
    path = scored_project / file
    path.write_text(damage(path.read_text(encoding="utf-8")), encoding="utf-8", newline="")
    proc = run_in_process("index", cwd=scored_project)
    assert_user_error(proc, *fragments, "dvc repro score")
    assert_no_outputs(scored_project, OUTPUTS)


def test_after_a_re_encode_the_stale_exact_run_is_refused_until_score_runs(scored_project: Path) -> None:
    extra("faiss", "faiss")
    # 1 x 1 pixel: other embeddings, and the most tie-heavy gallery (a grey digit is one direction: every cosine 1)
    set_params(scored_project, {"index.kinds": ["Flat"], "encode.pixels.resolution": 1})
    run_ok(scored_project, "encode")  # data/scores still holds the old exact run
    evaluated = json.loads((scored_project / "metrics/evaluated.json").read_text(encoding="utf-8"))["id"]
    fingerprint = json.loads((scored_project / "data/embeddings/provenance.json").read_text(encoding="utf-8"))
    proc = run_in_process("index", cwd=scored_project)
    assert_user_error(proc, "per_query.csv is a stale exact run", f"it evaluated {evaluated}",
                      f"fingerprint {fingerprint['fingerprint']}", "re-run score (`dvc repro score`)")
    assert_no_outputs(scored_project, OUTPUTS)
    run_ok(scored_project, "score", "index")  # what `dvc repro` runs
    flat = json.loads((scored_project / "metrics/index.json").read_text(encoding="utf-8"))["points"]["Flat"]
    deltas = {k: v for k, v in flat.items() if k.startswith("delta_")}
    assert deltas and set(deltas.values()) == {0.0}
    assert flat["knn_recall@10_ann_benchmarks"] == flat["knn_recall@10_big_ann_benchmarks"] == 1.0
    assert flat["knn_tied_queries@10"] > 0 and flat["tie_extended_queries"] > 0  # ties at the cut, searched past
