"""reports/ann_index.html in a real headless Chromium (the checks of tests/report/test_html.py): it renders,
fetches nothing, logs no error, is not blank; and (issue 38) it leads with the verdict, on the first screen."""

from __future__ import annotations

import shutil

import pytest

from extras import extra
from helpers import run_ok, set_params
from recallk.index import page as index_page
from report.test_html import first_screen, on_first_screen, probe, problems, render

pytestmark = pytest.mark.stage


def test_the_index_page_renders_in_chromium(scored_project, tmp_path) -> None:
    extra("faiss", "faiss")
    set_params(scored_project, {"index.kinds": ["Flat", "HNSW8"], "index.sweep.efSearch": [8, 64]})
    run_ok(scored_project, "index")
    page = shutil.copy(scored_project / "reports/ann_index.html", tmp_path / "ann_index.html")
    assert probe(page, tmp_path) == {"failed": [], "errors": [], "fetched": []}
    proc, shot = render(page, tmp_path)
    assert problems(proc) == [], proc.stderr
    colours = shot.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot is blank"
    box, _ = first_screen(page, "#verdict", tmp_path)
    assert on_first_screen(box), box


def point(name: str, kind: str, qps: float, delta: float, good: bool, unreported: tuple = ()) -> dict:
    """A scored point as :func:`recallk.index.sweep.score_index` gives it (two metrics, less the ``unreported``)."""
    out = {"point": name, "kind": kind, "trained_on": "-", "queries_per_second": qps,
           "queries_per_second_one_thread": qps / 4, "build_seconds": 0.5, "memory_bytes": 3 * 2**20,
           "short_lists": 0, "knn_recall@10_ann_benchmarks": 0.9, "knn_recall@10_big_ann_benchmarks": 0.9,
           "non_inferior": good, "depth": 10, "unreported_metrics": list(unreported)}
    for key, value in (("recall@1", 0.9), ("map", 0.5)):
        if key in unreported:
            continue
        out |= {key: value + delta, f"delta_{key}": delta, f"delta_{key}_ci_low": delta - 0.01,
                f"delta_{key}_ci_high": delta + 0.01}
    return out


POINTS = [point("Flat", "Flat", 100.0, 0.0, True), point("HNSW8 efSearch=8", "HNSW8", 900.0, -0.2, False, ("map",)),
          point("HNSW8 efSearch=64", "HNSW8", 400.0, -0.001, True)]


def test_the_verdict_leads_the_terminal_table_and_the_page(tmp_path) -> None:
    chosen = "HNSW8 efSearch=64"
    text = index_page.terminal_table(POINTS, ["recall@1", "map"], 0.01, chosen)
    assert text.splitlines()[0].split() == ["point", "recall@1:", "Δ", "[interval]", "queries/s", "non-inferior"]
    assert text.splitlines()[-1] == "cheapest non-inferior point: HNSW8 efSearch=64 (400 queries/s)"  # a rate, whole
    assert "* HNSW8 efSearch=64" in text and "0.9000: +0.0000 [-0.0100, +0.0100]" in text
    assert index_page.terminal_table(POINTS, ["recall@1"], 0.01, None).endswith(
        "none is non-inferior within index.margin 0.01")
    plot = index_page.pareto_png(POINTS, {"recall@1": 0.9}, ["recall@1"], chosen)
    assert plot.tobytes() != index_page.pareto_png(POINTS, {"recall@1": 0.9}, ["recall@1"]).tobytes()  # ringed
    html = index_page.page({"margin": 0.01, "cheapest_non_inferior": chosen}, POINTS, ["recall@1", "map"], plot)
    heads = html[html.index("<thead>"):html.index("</thead>")]
    assert heads.index("non-inferior") < heads.index(">point<") < heads.index("recall@1 Δ")
    for human in ("queries/s", "build s", "memory MiB", "k-NN recall@10 (big-ann-benchmarks)",
                  "map Δ vs exact [interval] (not reported for some points)"):
        assert human in heads, human
    assert "memory_bytes" not in html and "knn_recall@" not in heads
    assert "<td>400</td><td>100</td><td>0.50</td><td>3.00</td>" in html  # rates whole, seconds and MiB to 2 places
    assert '<tr class="chosen"><td>yes</td><td>HNSW8 efSearch=64</td>' in html
    assert ("Each index list is cut at depth 10: map is not reported for the points whose lists cannot give it "
            "exactly") in html
    assert html.count(index_page.UNREPORTED) == 1  # HNSW8 efSearch=8's map cell
    map_plot = index_page.pareto_png(POINTS, {"recall@1": 0.9, "map": 0.5}, ["recall@1", "map"], chosen)
    assert map_plot.width == 2 * plot.width  # a point without map is left off that panel
    assert html.index('id="verdict"') < html.index("<table>")
    page = tmp_path / "ann_index.html"
    page.write_text(html, encoding="utf-8")
    box, shot = first_screen(page, "#verdict", tmp_path)
    assert on_first_screen(box), box
    assert len(shot.getcolors(maxcolors=1 << 20) or []) > 20
