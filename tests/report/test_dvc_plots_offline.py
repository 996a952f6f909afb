"""plots/offline/template.html, the offline ``--html-template`` of ``dvc plots show`` and ``dvc plots diff``: it holds
the vendored vega, vega-lite and vega-embed builds (checked against plots/offline/vendor.json, licenses kept),
and a page DVC fills from it draws its curves in a real headless Chromium that can reach no host. DVC's own page,
checked the same way, is blank: the check can fail."""

from __future__ import annotations

import hashlib
import html
import json
import re
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT, commit, dvc, git_init
from report.test_html import CHROMIUM, FLAGS, PROBE

OFFLINE = ROOT / "plots" / "offline"
TEMPLATE = OFFLINE / "template.html"
#: No host resolves and every proxied request goes to a closed port: a page that needs the network fails here.
NO_NETWORK = ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9"]
SCRIPT = re.compile(r'<script data-package="([^"]+)" data-version="([^"]+)">\n(.*?)\n</script>', re.S)


def test_the_template_holds_the_vendored_builds_and_their_licenses():
    text = TEMPLATE.read_text(encoding="utf-8")
    manifest = json.loads((OFFLINE / "vendor.json").read_text(encoding="utf-8"))
    inline = {name: (version, code) for name, version, code in SCRIPT.findall(text)}
    assert list(inline) == list(manifest) == ["vega", "vega-lite", "vega-embed"]  # load order: each needs the former
    for name, entry in manifest.items():
        version, code = inline[name]
        assert version == entry["version"] and hashlib.sha256(code.encode("utf-8")).hexdigest() == entry["sha256"]
        assert entry["npm_integrity"].startswith("sha512-") and entry["license"] == "BSD-3-Clause"
        license_text = (OFFLINE / "vendor" / name / "LICENSE").read_text(encoding="utf-8")
        assert "Redistribution and use in source and binary forms" in license_text
    assert [v.split(".")[0] for v, _ in inline.values()] == ["6", "6", "7"]
    # DVC fills {plot_divs} and {refresh_tag}; without {scripts} it adds no CDN <script> tag
    assert "{plot_divs}" in text and "{refresh_tag}" in text and "{scripts}" not in text
    assert not re.search(r'<script[^>]* src=', text) and "sourceMappingURL" not in text


def _dvc_page(tmp_path: Path, *args: str) -> Path:
    """A repo whose loss curve changed between two commits; ``dvc plots diff HEAD~1`` against the workspace with
    ``args``; the page it wrote."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "dvc.yaml").write_text("plots:\n  - loss.csv:\n      x: epoch\n      y: loss\n", encoding="utf-8")
    (repo / "loss.csv").write_text("epoch,loss\n0,1.0\n1,0.6\n2,0.5\n", encoding="utf-8")
    git_init(repo)
    dvc("init", "-q", cwd=repo)
    commit(repo, "dvc")
    (repo / "loss.csv").write_text("epoch,loss\n0,0.9\n1,0.4\n2,0.2\n", encoding="utf-8")
    dvc("plots", "diff", "HEAD", "-o", "out", *args, cwd=repo)
    return repo / "out" / "index.html"


def _offline_dom(page: Path, tmp_path: Path) -> tuple[dict, str]:
    """Load a probed copy of ``page`` (tests/report/test_html.py's probe) in Chromium with no network: what it saw
    (failed loads, script errors, fetched resources) and the DOM after the scripts ran."""
    probed = page.with_name(".probed-" + page.name)
    probed.write_text(page.read_text(encoding="utf-8").replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    proc = subprocess.run([CHROMIUM, *FLAGS, *NO_NETWORK, f"--user-data-dir={tmp_path / 'profile'}",
                           "--virtual-time-budget=10000", "--dump-dom", probed.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    match = re.search(r'data-probe="([^"]*)"', proc.stdout)
    assert proc.returncode == 0 and match, proc.stderr
    return json.loads(html.unescape(match.group(1))), proc.stdout


def _curves(dom: str) -> list[str]:
    """The drawn line paths (vega's SVG: ``<g class="mark-line role-mark ...">`` holding ``<path d="M...">``)."""
    groups = re.findall(r'<g class="mark-line role-mark[^"]*"[^>]*>(.*?)</g>', dom, re.S)
    return [d for group in groups for d in re.findall(r'<path[^>]* d="(M[^"]+)"', group)]


@pytest.mark.pipeline
def test_dvc_plots_diff_renders_offline_with_the_template(tmp_path):
    page = _dvc_page(tmp_path, "--html-template", str(TEMPLATE))
    assert "cdn.jsdelivr" not in page.read_text(encoding="utf-8")
    seen, dom = _offline_dom(page, tmp_path)
    assert seen == {"failed": [], "errors": [], "fetched": []}
    assert 'class="plot-error"' not in dom and 'class="marks"' in dom
    assert len(_curves(dom)) >= 2  # one line per revision (HEAD and the workspace)
    assert ">HEAD<" in dom and ">workspace<" in dom  # the legend names both


def test_a_plot_that_fails_says_so(tmp_path):
    """DVC's divs call ``vegaEmbed`` without a catch; the template shows the error instead of a blank space."""
    page = tmp_path / "index.html"
    div = '<div id="bad"><script>vegaEmbed("#bad", {"mark": "no-such-mark", "data": {"values": []}});</script></div>'
    page.write_text(TEMPLATE.read_text(encoding="utf-8").replace("{plot_divs}", div).replace("{refresh_tag}", ""),
                    encoding="utf-8")
    _, dom = _offline_dom(page, tmp_path)
    assert re.search(r'<p class="plot-error">A plot failed to render: [^<]+</p>', dom), dom[-2000:]


@pytest.mark.pipeline
def test_the_config_option_makes_it_the_default(tmp_path):
    """``dvc config plots.html_template`` (relative to .dvc/) makes plain ``dvc plots show`` use it."""
    repo = _dvc_page(tmp_path, "--html-template", str(TEMPLATE)).parent.parent
    dvc("config", "plots.html_template", str(TEMPLATE), cwd=repo)
    dvc("plots", "show", "-o", "shown", cwd=repo)
    seen, dom = _offline_dom(repo / "shown" / "index.html", tmp_path)
    assert seen == {"failed": [], "errors": [], "fetched": []} and _curves(dom)


@pytest.mark.pipeline
def test_dvc_default_page_is_blank_offline(tmp_path):
    """The failure this template fixes, seen by the same check: DVC's page loads vega from a CDN and draws nothing."""
    page = _dvc_page(tmp_path)
    seen, dom = _offline_dom(page, tmp_path)
    assert any("cdn.jsdelivr.net/npm/vega" in src for src in seen["failed"]), seen
    assert _curves(dom) == [] and 'class="marks"' not in dom
