"""README.md stays short and true: at most 200 lines, its report block is real output of
``python -m stages.score --show`` on the committed metrics, it maps every documentation page, and dated
measurements and metric formulas live where the docs say (docs/runs/, docs/metrics.md). Its links are checked
with the docs' in tests/test_doc_links.py."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import ROOT
from test_doc_links import links

README = ROOT / "README.md"
MAX_LINES = 200
#: The line right above the README's fenced report block.
REPORT_MARK = "<!-- report block: python -m stages.score --show -->"
#: The one place for dated measurements: their logs and whole outputs.
RUNS = ROOT / "docs" / "runs"
#: Every page that must stay free of dates: the README and every markdown page under docs/ (the user guide,
#: docs/datasets/, docs/internals/) but docs/runs/.
UNDATED_PAGES = [README, *sorted(page for page in (ROOT / "docs").rglob("*.md") if RUNS not in page.parents)]
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
#: A link's target, ``(...)`` right after ``]``: a dated file name in docs/runs/ is fine there.
LINK_TARGET = re.compile(r"\]\([^)\s]*\)")
#: Pieces of the metric formulas, written out in docs/metrics.md only.
FORMULAS = ("j / r_j", "1[r_1 ≤ K]", "min(K, M_q)")


def report_block(text: str) -> list[str]:
    """The lines of the fenced block right after :data:`REPORT_MARK`, trailing whitespace stripped."""
    lines = text.splitlines()
    assert lines.count(REPORT_MARK) == 1, f"README.md needs exactly one line {REPORT_MARK!r}"
    start = lines.index(REPORT_MARK) + 1
    assert start < len(lines) and lines[start].startswith("```"), f"a fenced block must follow {REPORT_MARK!r}"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("```")), None)
    assert end is not None, "the report block's fence is not closed"
    return [line.rstrip() for line in lines[start + 1:end]]


def is_contiguous_part(part: list[str], whole: list[str]) -> bool:
    return any(whole[i:i + len(part)] == part for i in range(len(whole) - len(part) + 1))


def test_report_block_helpers():
    text = f"x\n{REPORT_MARK}\n```\n[recall]  \n  recall@1: 1\n```\n"
    assert report_block(text) == ["[recall]", "  recall@1: 1"]
    assert is_contiguous_part(["b", "c"], ["a", "b", "c"]) and not is_contiguous_part(["a", "c"], ["a", "b", "c"])


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; at most {MAX_LINES}: move detail to docs/"


@pytest.mark.stage
def test_report_block_is_real_output():
    """The README's report block is a contiguous part (or the whole) of what `--show` prints now."""
    block = report_block(README.read_text(encoding="utf-8"))
    assert any(line.strip() for line in block), "the README's report block is empty"
    proc = subprocess.run([sys.executable, "-m", "stages.score", "--show"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"python -m stages.score --show exited {proc.returncode}:\n{proc.stderr}"
    shown = [line.rstrip() for line in proc.stdout.splitlines()]
    assert is_contiguous_part(block, shown), (
        "README.md's report block is not part of `python -m stages.score --show`'s output; paste the part anew.\n"
        "README:\n" + "\n".join(block) + "\n--show:\n" + "\n".join(shown))


def test_readme_maps_every_doc_page():
    """The README's map of the docs links every page of the user guide and of the internals."""
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(README.read_text(encoding="utf-8"))
              if not re.match(r"[a-z][a-z+.-]*:", target)}
    pages = [*sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "internals").glob("*.md"))]
    missing = [str(page.relative_to(ROOT)) for page in pages if page.resolve() not in linked]
    assert not missing, f"README.md does not link: {', '.join(missing)}"


def dated_lines(text: str) -> list[str]:
    """The lines of a markdown text holding a date, link targets left out."""
    return [line.strip() for line in text.splitlines() if DATE.search(LINK_TARGET.sub("]()", line))]


def test_dated_lines_ignore_link_targets_only():
    text = ("## The table after the third round (2026-12-02, idle)\n"
            "Whole output: [idle](../runs/score_table_2026-12-02_idle.txt), [log](../runs/log.md#table-2026-12-02).\n"
            "Rankings identical ([2026-12-03's output](../runs/torch_score_2026-12-03.txt))\n"
            "| a row (2026-12-03 11:37) | 1.28× |\n"
            "Measured on 2026-12-03 (x)\n")
    assert dated_lines(text) == ["## The table after the third round (2026-12-02, idle)",
                                 "Rankings identical ([2026-12-03's output](../runs/torch_score_2026-12-03.txt))",
                                 "| a row (2026-12-03 11:37) | 1.28× |", "Measured on 2026-12-03 (x)"]


def test_undated_pages_cover_the_internals():
    """The check reaches docs/internals/ (where benchmark narratives used to gather) and leaves docs/runs/ out."""
    pages = {page.relative_to(ROOT).as_posix() for page in UNDATED_PAGES}
    internals = {page.relative_to(ROOT).as_posix() for page in (ROOT / "docs" / "internals").glob("*.md")}
    assert {"README.md", "docs/internals/benchmarks.md", "docs/internals/gpu.md", "docs/internals/engine.md",
            "docs/metrics.md"} <= pages
    assert internals <= pages
    assert not [page for page in pages if page.startswith("docs/runs/")]


@pytest.mark.parametrize("page", UNDATED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dated_measurements_outside_docs_runs(page):
    """Dated measurements belong in docs/runs/; the other pages state where things stand without a date and link
    the dated evidence there (a date in a link's target is fine)."""
    dated = dated_lines(page.read_text(encoding="utf-8"))
    assert not dated, f"{page.relative_to(ROOT)}: dated lines (move them to docs/runs/): {dated[:3]}"


def test_metric_formulas_in_one_place():
    """README and the other pages link docs/metrics.md instead of restating a formula."""
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    restated = [f"{page.relative_to(ROOT)}: {piece}" for page in pages if page.name != "metrics.md"
                or page.parent != ROOT / "docs" for piece in FORMULAS if piece in page.read_text(encoding="utf-8")]
    assert not restated, "metric formulas outside docs/metrics.md: " + "; ".join(restated)
