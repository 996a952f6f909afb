"""Rebuild ``plots/offline/template.html``, the offline ``--html-template`` of ``dvc plots show`` and ``diff``,
from the npm packages of vega, vega-lite and vega-embed.

DVC's own page loads those three scripts from a CDN (dvc_render's ``VegaRenderer.SCRIPTS``, put where a template
says ``{scripts}``); offline the page is blank and says nothing. This template has no ``{scripts}`` placeholder, so
DVC adds no CDN tag, and holds the three minified builds inline (DVC reads the one template file and writes one
page, so the scripts cannot sit beside it). Each package's LICENSE is kept in ``plots/offline/vendor/<package>/``
and ``plots/offline/vendor.json`` records each file's version, npm integrity and SHA-256 (tests/training/
test_offline_plots.py checks the inline scripts against it and renders a page in headless Chromium offline).

    python plots/offline/vendor.py                      # npm pack vega@6 vega-lite@6 vega-embed@7, then rebuild
    python plots/offline/vendor.py --from DIR           # rebuild from the .tgz files `npm pack` left in DIR
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template.html"
MANIFEST = HERE / "vendor.json"
#: The packages in load order (vega-lite needs vega; vega-embed needs both), the npm spec and the built file.
PACKAGES = (("vega", "vega@6", "build/vega.min.js"),
            ("vega-lite", "vega-lite@6", "build/vega-lite.min.js"),
            ("vega-embed", "vega-embed@7", "build/vega-embed.min.js"))
#: A source map comment would make a browser's developer tools fetch a file that is not there.
SOURCE_MAP = re.compile(r"\n?//# sourceMappingURL=\S*\s*$")

PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
{refresh_tag}
<title>DVC plots</title>
<!-- recallk's offline template for `dvc plots show/diff --html-template plots/offline/template.html`: vega, vega-lite
and vega-embed are inline below (BSD-3-Clause; their licenses are in plots/offline/vendor/), so the page fetches
nothing. Rebuilt by plots/offline/vendor.py; do not edit the scripts by hand. -->
<style>
body { font-family: system-ui, sans-serif; margin: 16px; }
table { border-spacing: 15px; }
.plot-error { color: #b00020; white-space: pre-wrap; }
</style>
SCRIPTS
<script>
// DVC's plot divs call vegaEmbed(...) without a catch: show a failed plot's error instead of a blank space.
window.addEventListener("unhandledrejection", function (event) {
  var note = document.createElement("p");
  note.className = "plot-error";
  note.textContent = "A plot failed to render: " + (event.reason && event.reason.message || event.reason);
  document.body.insertBefore(note, document.body.firstChild);
});
</script>
</head>
<body>
{plot_divs}
</body>
</html>
"""


def script_tag(name: str, version: str, code: str) -> str:
    """One inline script, named by package and version."""
    if "</script" in code.lower():
        raise SystemExit(f"error: {name}'s build holds '</script' and cannot be inlined; keep the previous version.")
    return f'<script data-package="{html.escape(name)}" data-version="{html.escape(version)}">\n{code}\n</script>'


def read_package(tgz: Path, built: str) -> tuple[dict, str, str]:
    """``(package.json, built file's text, LICENSE text)`` of an npm tarball."""
    with tarfile.open(tgz) as tar:
        def text(member: str) -> str:
            return tar.extractfile(f"package/{member}").read().decode("utf-8")
        return json.loads(text("package.json")), text(built), text("LICENSE")


def npm_pack(folder: Path) -> None:
    """``npm pack`` the packages into ``folder``."""
    proc = subprocess.run(["npm", "pack", *(spec for _, spec, _ in PACKAGES)], cwd=folder, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: npm pack failed (is the npm registry reachable?):\n{proc.stderr.strip()}")


def integrity(tgz: Path) -> str:
    """npm's ``integrity`` of a tarball (Subresource Integrity: sha512, base64), as `npm view <pkg> dist` shows."""
    return "sha512-" + base64.b64encode(hashlib.sha512(tgz.read_bytes()).digest()).decode("ascii")


def build(folder: Path) -> None:
    scripts, manifest = [], {}
    for name, _, built in PACKAGES:
        tarballs = sorted(folder.glob(f"{name}-[0-9]*.tgz"))
        if len(tarballs) != 1:
            raise SystemExit(f"error: expected one {name}-<version>.tgz in {folder}, found {len(tarballs)}.")
        package, code, license_text = read_package(tarballs[0], built)
        code = SOURCE_MAP.sub("", code)
        scripts.append(script_tag(name, package["version"], code))
        (HERE / "vendor" / name).mkdir(parents=True, exist_ok=True)
        (HERE / "vendor" / name / "LICENSE").write_text(license_text, encoding="utf-8")
        manifest[name] = {"version": package["version"], "license": package["license"], "file": built,
                          "npm_integrity": integrity(tarballs[0]),
                          "sha256": hashlib.sha256(code.encode("utf-8")).hexdigest()}
    TEMPLATE.write_text(PAGE.replace("SCRIPTS", "\n".join(scripts)), encoding="utf-8")
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {TEMPLATE} ({TEMPLATE.stat().st_size:,} bytes): "
          + ", ".join(f"{n} {m['version']}" for n, m in manifest.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="folder", type=Path, help="a folder of `npm pack` tarballs (default: npm pack)")
    args = parser.parse_args(argv)
    if args.folder is not None:
        build(args.folder)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        npm_pack(Path(tmp))
        build(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
