"""reports/ann_index.html in a real headless Chromium (the checks of tests/report/test_html.py): it renders,
fetches nothing, logs no error, is not blank."""

from __future__ import annotations

import shutil

import pytest

from extras import extra
from helpers import run_ok, set_params
from report.test_html import probe, problems, render

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
