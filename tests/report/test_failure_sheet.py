"""The failure gallery: which queries, what each tile shows, byte-identical on re-run, and the stage's PNG."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from helpers import run_in_process
from recallk.report import failure_sheet
from recallk.score import suite


@pytest.mark.parametrize("rows, want", [
    # lowest ap@r first; equal ap@r: the deeper first positive first; then image_id
    ({"a": (0.5, 1), "b": (0.2, 1), "c": (0.2, 4), "d": (0.9, 1)}, ["c", "b", "a"]),
    # a query without a positive (no rank) never appears
    ({"a": (None, None), "b": (0.1, 2), "c": (0.1, 2)}, ["b", "c"]),
])
def test_worst_queries(rows, want):
    frame = pd.DataFrame({"image_id": list(rows), "label": "x",
                          "ap@r": [v[0] for v in rows.values()],
                          "first_positive_rank": pd.array([v[1] for v in rows.values()], dtype="Int64")})
    assert suite.worst_queries(frame, 3)["image_id"].tolist() == want


def _solid(colour):
    return lambda image_id: Image.new("RGB", (10, 20), colour)


def test_tiles_are_framed_by_what_they_are_and_drawing_is_deterministic():
    rows = [{"query": ("q1", "cat"), "retrieved": [("g1", "cat", 0.9, True), ("g2", "dog", 0.8, False)],
             "first": ("g1", 1, 0.9)}]
    sheet = failure_sheet.draw(rows, _solid((200, 200, 200)))
    step = failure_sheet.THUMB + 2 * failure_sheet.FRAME + failure_sheet.GAP
    top = failure_sheet.LEGEND + failure_sheet.GAP + 1  # inside each tile's frame, above the thumbnail
    frames = [sheet.getpixel((failure_sheet.GAP + x * step + 1, top)) for x in range(4)]
    assert frames == [failure_sheet.COLOURS[k] for k in ("query", "hit", "miss", "first")]
    assert sheet.size[1] == failure_sheet.LEGEND + step + failure_sheet.CAPTION + failure_sheet.GAP
    assert sheet.size[0] >= 4 * step + failure_sheet.GAP  # at least the tiles; wider when the legend is
    again = failure_sheet.draw(rows, _solid((200, 200, 200)))
    assert again.tobytes() == sheet.tobytes()


def _stage(project, **failures):
    """Score ``project`` (a copy of the session's split and encoded project) again with ``score.failures``
    changed."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["score"]["failures"].update(failures)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = run_in_process("score", cwd=project)
    assert proc.returncode == 0, proc.stderr
    return Image.open(project / "plots/failures.png"), (project / "plots/failures.png").read_bytes()


def test_the_score_stage_draws_the_worst_queries_byte_identically(scored_project):
    project = scored_project
    image, first = _stage(project, queries=3, k=4)
    step = failure_sheet.THUMB + 2 * failure_sheet.FRAME + failure_sheet.GAP
    # 3 rows of 1 + 4 + 1 tiles
    assert image.size == (max(6 * step + failure_sheet.GAP, image.size[0]),
                          failure_sheet.LEGEND + 3 * (step + failure_sheet.CAPTION) + failure_sheet.GAP)
    proc = run_in_process("score", cwd=project)
    assert proc.returncode == 0
    assert hashlib.sha256((project / "plots/failures.png").read_bytes()).digest() == hashlib.sha256(first).digest()


def test_zero_queries_turns_the_gallery_off(scored_project):
    image, _ = _stage(scored_project, queries=0)
    assert image.size == (1, 1)


# ---------------------------------------------------------------- read without colour (issue 25)
# Moved from the hostile corpus (test_hostile_trust.py): a bidi override in a label is shown as ?, and the legend
# names the frames in text.


def test_the_failure_sheet_reads_without_colour():
    row = {"query": ("q/7.png", "cat"), "retrieved": [("g1", "cat", 0.9, True), ("g2", "dog\u202egpj", 0.8, False)],
           "first": ("g1", 1, 0.9)}
    assert [lines for _, lines in failure_sheet.captions(row)] == [
        ("q q/7.png", "cat"), ("+ cat", "0.900"), ("x dog?gpj", "0.800"), ("#1 cat", "0.900")]  # bidi shown as ?
    sheet = failure_sheet.draw([row], lambda image_id: Image.new("RGB", (10, 20), "white"))
    legend = np.asarray(sheet.crop((0, 0, sheet.size[0], failure_sheet.LEGEND)).convert("L"))
    assert (legend < 128).sum() > 500  # the legend's text is drawn above the rows


def test_a_long_caption_keeps_its_start_and_end():
    """Issue 38: a caption too wide for its tile is elided in the middle, not cut at 12 characters."""
    length = failure_sheet.ImageFont.load_default().getlength
    width = failure_sheet.THUMB + 2 * failure_sheet.FRAME - 2
    assert failure_sheet.fit("+ cat", width, length) == "+ cat"
    shown = failure_sheet.fit("q images/cat/00123.png", width, length)
    assert shown.startswith("q ") and shown.endswith("00123.png") and ".." in shown and length(shown) <= width
    assert failure_sheet.fit("q images/cat/00123.png", width, length) == shown  # deterministic
