"""recallk report A B C: one offline page for many runs, in a real headless Chromium (the checks of test_html)."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
from test_html import (  # the Chromium checks of reports/index.html (skips without it)
    first_screen,
    on_first_screen,
    probe,
    problems,
    render,
)

from recallk.compare import multi_report


def run_folder(root, name, shift, seed, labels=("cat", "dog", "owl")):
    """A folder of score outputs: metrics/per_query.csv (hit@1/5/10, ap) and metrics/evaluated.json."""
    rng = np.random.default_rng(seed)
    n = 60
    quality = np.clip(rng.normal(0.5 + shift, 0.25, n), 0, 1)
    frame = pd.DataFrame({"image_id": [f"{labels[i % 3]}/{i:03d}.png" for i in range(n)],
                          "label": [labels[i % 3] for i in range(n)], "num_positives": "19", "num_retrievable": "59"})
    for k, bar in ((1, 0.5), (5, 0.3), (10, 0.2)):
        frame[f"hit@{k}"] = (quality > bar).astype(int).astype(str)
    frame["ap"] = quality.round(6).astype(str)
    folder = root / name
    (folder / "metrics").mkdir(parents=True)
    frame.to_csv(folder / "metrics/per_query.csv", index=False)
    (folder / "metrics/evaluated.json").write_text(json.dumps({"backbone": f"{name} <b>bold</b>", "id": name}))
    return str(folder)


def test_the_multi_run_report_is_offline_complete_and_renders(tmp_path, capsys):
    runs = [run_folder(tmp_path, f"epoch{i}", 0.1 * i, seed=i) for i in range(3)]
    out = tmp_path / "report.html"
    args = [*runs, "--ordered", "--out", str(out), "--permutations", "500", "--resamples", "300"]
    assert multi_report.main(args) == 0 and "3 systems, 4 metrics (single run)" in capsys.readouterr().out
    text = out.read_text(encoding="utf-8")
    assert not re.findall(r'(?:src|href)="([^"]*)"', text) and "url(" not in text  # nothing to fetch
    for section in ("recall@K curves", 'aria-label="recall@K curves"', "Leaderboard", "Trend over the ordered points",
                    "Per label: Δ on recall@1", "Provenance", "not told apart from it"):
        assert section in text, section
    assert "epoch0 &lt;b&gt;bold&lt;/b&gt;" in text  # provenance escaped
    summary = re.search(r'<h1>3 systems compared</h1><p class="summary">([^<]*) \(groups: randomized Tukey', text)
    assert summary and " best on " in summary.group(1), text[:600]  # the page opens with the summary paragraph
    assert text.index('class="summary"') < text.index("<h2>")
    assert text.count("<polyline") == 3 + 4  # three recall curves, four metrics in the trend
    # issue 38: coinciding curves stay visible (a dash pattern and a marker per system), empty columns are left out
    curves = text[text.index('aria-label="recall@K curves"'):text.index("</svg>")]
    assert curves.count("stroke-dasharray") >= 2 and "<rect" in curves and "<circle" in curves
    assert "<th>run SD</th>" not in text and "<th>Δ run SD</th>" not in text  # one run each: every cell empty
    assert probe(out, tmp_path) == {"failed": [], "errors": [], "fetched": []}
    proc, shot = render(out, tmp_path)
    assert problems(proc) == [], proc.stderr
    colours = shot.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot is blank"
    box, _ = first_screen(out, ".summary", tmp_path)
    assert on_first_screen(box), box
    assert multi_report.main(args) == 0 and out.read_text(encoding="utf-8") == text  # same inputs, same bytes


def test_repeated_runs_report_the_case_and_refuse_a_bad_label_metric(tmp_path, capsys):
    seeds = "+".join(run_folder(tmp_path, f"a{s}", 0.0, seed=s) for s in range(2))
    other = run_folder(tmp_path, "b", 0.1, seed=7)
    out = tmp_path / "r.html"
    assert multi_report.main([f"A={seeds}", other, "--out", str(out), "--permutations", "300",
                              "--resamples", "200"]) == 0
    text = out.read_text(encoding="utf-8")
    assert "repeated runs on the same queries" in text and text.count("<h3>A</h3>") == 1
    assert "<th>run SD</th>" in text  # A has two runs: its column stays
    code = multi_report.main([f"A={seeds}", other, "--out", str(tmp_path / "x.html"), "--label-metric", "ndcg"])
    assert code == 2 and "--label-metric names 'ndcg'" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()


def test_the_page_names_the_family_of_the_letters_and_of_the_adjusted_p(tmp_path, capsys):
    """Issue 38: the page's tables name both procedures (Tukey group, p Holm) and say where the two part ways: on
    recall@1, epoch1 shares no Tukey group with the best (epoch3) while its Holm-adjusted p against it is 0.0539."""
    runs = [f"epoch{i}=" + run_folder(tmp_path, f"epoch{i}", 0.1 * i, seed=i) for i in range(4)]
    out = tmp_path / "r.html"
    assert multi_report.main([*runs, "--out", str(out), "--permutations", "500", "--resamples", "300"]) == 0
    text = out.read_text(encoding="utf-8")
    assert "<th>Tukey group</th>" in text and "<th>p Holm</th>" in text and "<th>p adj</th>" not in text
    notes = re.findall(r"<p>(note: [^<]*)</p>", text)
    assert notes == ["note: epoch1 has no Tukey group in common with epoch3 (told apart over every pair) but p Holm "
                     "0.0539 &gt;= 0.05 (not told apart against epoch3 alone): two families, two questions "
                     "(docs/leaderboard.md)"]
    assert multi_report.main([*runs, "--ordered", "--out", str(out), "--permutations", "500",
                              "--resamples", "300"]) == 0
    ordered = out.read_text(encoding="utf-8")
    assert "<th>p Tukey</th>" in ordered and "note: " not in ordered  # track's one family: nothing to reconcile
