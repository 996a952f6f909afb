"""reports/index.html in a real headless Chromium: it renders, fetches nothing, logs no error, is not blank."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from helpers import copy_tree, run_in_process

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: Flags of a quiet headless start on a closed network (no background fetches of Google's hosts).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0"]
#: What Chromium logs for a console error (console messages are logged as INFO:CONSOLE).
PROBLEMS = re.compile(r"CONSOLE.*(Uncaught|[Ee]rror)")
#: Put first in <head> of a copy of the page: records every failed load and every script error, and
#: every resource fetched from anything but a data: URI, in <html data-probe=...> for --dump-dom.
PROBE = """<script>
const probe = {failed: [], errors: [], fetched: []};
window.addEventListener("error", e => {
  if (e.target && e.target !== window) probe.failed.push(e.target.src || e.target.href || e.target.tagName);
  else probe.errors.push(String(e.message));
}, true);
window.addEventListener("load", () => {
  for (const img of document.images)
    if (!(img.complete && img.naturalWidth > 0)) probe.failed.push(img.src.slice(0, 80));
  probe.fetched = performance.getEntriesByType("resource").map(r => r.name).filter(n => !n.startsWith("data:"));
  document.documentElement.setAttribute("data-probe", JSON.stringify(probe));
});
</script>"""

if CHROMIUM is None and not os.environ.get("CI"):  # CI installs Debian's chromium (.ci/run): there it must run
    pytest.skip("headless Chromium is not installed (apt-get install chromium)", allow_module_level=True)


def render(page: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Image.Image]:
    shot = tmp_path / "shot.png"
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,2000",
                           f"--screenshot={shot}", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr
    return proc, Image.open(shot).convert("RGB")


#: The first screen of issue 38's checks: what a reader sees without scrolling.
SCREEN = (1280, 800)
#: Put first in <head>: records the page-relative box of ``SELECTOR`` in <html data-box=...> for --dump-dom.
BOX = """<script>
window.addEventListener("load", () => {
  const el = document.querySelector(SELECTOR);
  const r = el ? el.getBoundingClientRect() : null;
  document.documentElement.setAttribute("data-box", JSON.stringify(
    r ? {left: r.left + scrollX, top: r.top + scrollY, width: r.width, height: r.height} : null));
});
</script>"""


def first_screen(page: Path, selector: str, tmp_path: Path) -> tuple[dict | None, Image.Image]:
    """Issue 38's check: the box of ``selector`` on ``page`` laid out at :data:`SCREEN` (None when absent) and a
    screenshot of that first screen (``<page>.png`` beside ``tmp_path``'s profile, the proof)."""
    width, height = SCREEN
    boxed = page.with_name(".boxed-" + page.name)
    script = BOX.replace("SELECTOR", json.dumps(selector))
    boxed.write_text(page.read_text(encoding="utf-8").replace("<head>", "<head>" + script, 1), encoding="utf-8")
    try:
        proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'box-profile'}",
                               f"--window-size={width},{height}", "--virtual-time-budget=10000", "--dump-dom",
                               boxed.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    finally:
        boxed.unlink()
    match = re.search(r'data-box="([^"]*)"', proc.stdout)
    assert proc.returncode == 0 and match, proc.stderr
    shot = tmp_path / f"{page.stem}-first-screen.png"
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'shot-profile'}",
                           f"--window-size={width},{height}", f"--screenshot={shot}", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr
    return json.loads(html.unescape(match.group(1))), Image.open(shot).convert("RGB")


def on_first_screen(box: dict | None) -> bool:
    """The box's top-left corner lies within :data:`SCREEN`."""
    return box is not None and 0 <= box["left"] < SCREEN[0] and 0 <= box["top"] < SCREEN[1]


def problems(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if PROBLEMS.search(line)]


def probe(page: Path, tmp_path: Path) -> dict:
    """Load a probed copy of ``page`` (same folder, so relative links resolve alike) and return what it saw."""
    probed = page.with_name(".probed-" + page.name)
    probed.write_text(page.read_text(encoding="utf-8").replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    try:
        proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'probe-profile'}",
                               "--virtual-time-budget=10000", "--dump-dom", probed.resolve().as_uri()],
                              capture_output=True, text=True, timeout=120)
    finally:
        probed.unlink()
    match = re.search(r'data-probe="([^"]*)"', proc.stdout)
    assert proc.returncode == 0 and match, proc.stderr
    return json.loads(html.unescape(match.group(1)))


@pytest.fixture
def report(scored_base) -> Path:
    """The page of the session's scored project (read only)."""
    return scored_base / "reports" / "index.html"


def test_the_report_is_self_contained(report):
    text = report.read_text(encoding="utf-8")
    refs = re.findall(r'(?:src|href)="([^"]*)"', text) + re.findall(r"url\(([^)]*)\)", text)
    assert refs and all(r.startswith("data:image/png;base64,") for r in refs), refs  # only the embedded gallery
    for section in ("What was evaluated", "pixels (fingerprint", "class_disjoint, query_gallery", "recall@1",
                    "<svg", "Per class", "failure gallery"):
        assert section in text, section


def test_the_report_renders_in_chromium_without_errors(report, tmp_path):
    assert probe(report, tmp_path) == {"failed": [], "errors": [], "fetched": []}
    proc, shot = render(report, tmp_path)
    assert problems(proc) == [], proc.stderr
    colours = shot.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot is blank"


def test_the_summary_opens_the_report(report, tmp_path):
    """Issue 38: the summary paragraph is on the first screen, before the failure gallery and the per-class table."""
    text = report.read_text(encoding="utf-8")
    assert text.index('id="summary"') < text.index("<h2>") < text.index("Failure gallery") < text.index("Per class")
    box, shot = first_screen(report, "#summary", tmp_path)
    assert on_first_screen(box), box
    assert shot.size == SCREEN and len(shot.getcolors(maxcolors=1 << 20) or []) > 20


def test_a_broken_page_is_caught(tmp_path):
    """The checks above can fail: a missing image and a script error are both reported."""
    page = tmp_path / "broken.html"
    page.write_text('<html><head></head><body><img src="missing.png"><script>undefined_call()</script></body></html>')
    seen = probe(page, tmp_path)
    assert seen["failed"] and seen["failed"][0].endswith("missing.png") and "undefined_call" in seen["errors"][0]
    proc, _ = render(page, tmp_path)
    assert any("undefined_call" in line for line in problems(proc)), proc.stderr


def test_the_report_is_byte_identical_on_re_run(report, tmp_path):
    project = copy_tree(report.parent.parent, tmp_path / "proj")
    proc = run_in_process("score", cwd=project)
    assert proc.returncode == 0 and (project / "reports/index.html").read_bytes() == report.read_bytes()


def test_a_capped_k_is_marked_on_the_page():
    # K at or above every query's gallery (capped_ks in counts.json) measures nothing: the page says so, as the block
    import pandas as pd

    from recallk.report import html as report_html
    from recallk.report.block import CAPPED_MARK

    metrics = {"recall@1": 0.5, "recall@500": 1.0, "map@r": 0.4, "capped_ks": [500]}
    curve = pd.DataFrame({"k": [1, 2], "recall": [0.5, 1.0], "ci_low": [0.4, 0.9], "ci_high": [0.6, 1.0]})
    per_class = pd.DataFrame({"label": ["a"], "num_queries": [2], "recall@1": [0.5], "recall@500": [1.0],
                              "map@r": [0.4]})
    page = report_html.page(metrics, ["recall@1", "recall@500", "map@r"], {"backbone": "pixels"}, curve,
                            per_class, None)
    assert html.escape(f"recall@500 {CAPPED_MARK}") in page
    assert html.escape(f"recall@1 {CAPPED_MARK}") not in page and html.escape(f"map@r {CAPPED_MARK}") not in page

