"""The score stage under ``split.protocol: text_image`` (issue 41), in process on a tiny project: the split stage
writes the captions, the embeddings of both towers are written directly (seeded, text near its image). The metrics
files equal :func:`recallk.crossmodal_metrics` on the same arrays bit for bit, the intervals resample images
(:func:`~recallk.score.crossmodal.crossmodal_intervals`), the per-query tables carry both directions, and the
report block, ``--show`` and the page say what they hold."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from helpers import (
    EMBEDDINGS_DIR,
    PER_QUERY,
    SCORE_OUTPUTS,
    assert_no_outputs,
    read_bytes,
    run_fails,
    run_in_process,
    run_module,
    set_params,
    tiny_project,
)
from recallk.report.failure_sheet import CAPTION, FRAME, GAP, LEGEND, THUMB, text_tile
from recallk.score.crossmodal import crossmodal_intervals, crossmodal_per_query
from recallk.tables_contract import restore_formulas

pytestmark = pytest.mark.stage

#: An eval image left without a caption: an image -> text query with no positive (left out, counted).
UNCAPTIONED = "c/2.png"


def captions_csv(labels: str = "abcd", per_label: int = 3) -> str:
    """Two captions per image, none for :data:`UNCAPTIONED`; one caption with a formula-like start and a comma."""
    rows = ["image_id,caption"]
    for label in labels:
        for i in range(per_label):
            if f"{label}/{i}.png" != UNCAPTIONED:
                rows += [f"{label}/{i}.png,a {label} glyph number {i}", f'{label}/{i}.png,"={label}{i}, drawn small"']
    return "\n".join(rows) + "\n"


def write_embeddings(project: Path, seed: int = 0, noise: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """The encode stage's folder with both towers' embeddings (image rows in catalog order, caption rows in
    captions.csv order, each a noisy copy of its image's); returns (image, text) embeddings."""
    catalog = pd.read_csv(project / "data/prepared/catalog.csv", dtype=str)
    captions = pd.read_csv(project / "data/prepared/captions.csv", dtype=str, keep_default_na=False)
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(len(catalog), 8)).astype(np.float32)
    row = {image_id: n for n, image_id in enumerate(catalog["image_id"])}
    texts = (images[[row[i] for i in captions["image_id"]]]
             + rng.normal(scale=noise, size=(len(captions), 8))).astype(np.float32)
    folder = project / EMBEDDINGS_DIR
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    np.save(folder / "embeddings.npy", images)
    np.save(folder / "ids.npy", catalog["image_id"].to_numpy(str))
    np.save(folder / "text_embeddings.npy", texts)
    np.save(folder / "text_ids.npy", captions["caption_id"].to_numpy(str))
    (folder / "provenance.json").write_text(json.dumps({"backbone": "fake", "fingerprint": "0", "embedding_dim": 8}))
    return images, texts


def captioned_project(where: Path) -> Path:
    """A tiny project split under ``text_image`` with :func:`captions_csv`, its embeddings written, not scored."""
    project = tiny_project(where)
    (project / "data/digits/captions.csv").write_text(captions_csv(), encoding="utf-8")
    set_params(project, {"split.protocol": "text_image", "split.captions": "captions.csv",
                         "score.bootstrap.resamples": 50})
    proc = run_in_process("split", cwd=project)
    assert proc.returncode == 0, proc.stderr
    write_embeddings(project)
    return project


def eval_arrays(project: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, pd.DataFrame]:
    """What the stage scores, rebuilt from its input files: the eval images' and their captions' embeddings and
    each caption's image position (the peer's input), and the eval captions."""
    split = pd.read_csv(project / "data/prepared/split.csv", dtype=str)
    captions = pd.read_csv(project / "data/prepared/captions.csv", dtype=str, keep_default_na=False)
    folder = project / EMBEDDINGS_DIR
    images, ids = np.load(folder / "embeddings.npy"), np.load(folder / "ids.npy")
    texts, text_ids = np.load(folder / "text_embeddings.npy"), np.load(folder / "text_ids.npy")
    eval_ids = split.loc[split["query"].eq("True"), "image_id"].tolist()
    captions = captions[captions["image_id"].isin(eval_ids)].reset_index(drop=True)
    image_row, text_row = {i: n for n, i in enumerate(ids)}, {i: n for n, i in enumerate(text_ids)}
    position = {i: n for n, i in enumerate(eval_ids)}
    return (images[[image_row[i] for i in eval_ids]], texts[[text_row[c] for c in captions["caption_id"]]],
            np.array([position[i] for i in captions["image_id"]]), captions)


@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> tuple[Path, str]:
    project = captioned_project(tmp_path_factory.mktemp("crossmodal"))
    proc = run_in_process("score", cwd=project)
    assert proc.returncode == 0, proc.stderr
    return project, proc.stdout


def load(project: Path, name: str) -> dict:
    return json.loads((project / "metrics" / name).read_text(encoding="utf-8"))


def test_metrics_equal_the_engine_bit_for_bit(scored):
    project, _ = scored
    images, texts, caption_images, _ = eval_arrays(project)
    assert UNCAPTIONED in pd.read_csv(project / "data/prepared/split.csv").query("query")["image_id"].tolist()
    runs = crossmodal_per_query(images, texts, caption_images, ks=[1, 2])
    expected = runs.summary()
    recall, counts, intervals = load(project, "recall.json"), load(project, "counts.json"), load(project,
                                                                                                 "intervals.json")
    assert list(recall) == ["text_to_image", "image_to_text"]  # dvc shows text_to_image.recall@1, ...
    for direction, want in expected.items():
        assert recall[direction] == {k: v for k, v in want.items() if k.startswith("recall@")}
        means = {k: v for k, v in intervals[direction].items() if not k.endswith(("_ci_low", "_ci_high"))}
        assert means == {k: v for k, v in want.items() if not k.startswith("recall@") and k != "num_queries"}
        assert counts[direction]["num_queries"] == want["num_queries"]
        assert counts[direction]["tie_sensitive"] == int(runs.tie_sensitive[direction].sum())
    assert "map" in intervals["image_to_text"] and "map" not in intervals["text_to_image"]
    n_images, n_captions = len(images), len(texts)
    assert counts["text_to_image"] == {"num_queries": n_captions, "num_excluded_queries": 0, "num_gallery": n_images,
                                       "tie_sensitive": 0, "capped_ks": []}
    # the uncaptioned eval image is an image -> text query without a positive: left out and counted
    assert counts["image_to_text"]["num_excluded_queries"] == 1
    assert counts["image_to_text"]["num_queries"] == n_images - 1 and counts["embedding_dim"] == 8


def test_intervals_resample_images(scored):
    project, stdout = scored
    images, texts, caption_images, _ = eval_arrays(project)
    runs = crossmodal_per_query(images, texts, caption_images, ks=[1, 2])
    intervals = load(project, "intervals.json")
    assert intervals["interval_unit"] == "image"
    for direction, bounds in crossmodal_intervals(runs, 50, 0, 0.95).items():
        for key, (low, high) in bounds.items():
            assert (intervals[direction][f"{key}_ci_low"], intervals[direction][f"{key}_ci_high"]) == (low, high)
    # the output says what was resampled: the report block and the provenance's scoring line
    assert "intervals resample images (an image with all its captions" in stdout
    evaluated = load(project, "evaluated.json")
    assert "bootstrap resamples by image (with its captions)" in evaluated["scoring"]


def test_per_query_tables_carry_both_directions(scored):
    project, _ = scored
    images, texts, caption_images, captions = eval_arrays(project)
    runs = crossmodal_per_query(images, texts, caption_images, ks=[1, 2])
    full = pd.read_csv(project / PER_QUERY, dtype=str, keep_default_na=False)
    text_rows, image_rows = (full[full["direction"].eq(d)] for d in ("text_to_image", "image_to_text"))
    assert full["direction"].tolist() == ["text_to_image"] * len(texts) + ["image_to_text"] * len(images)
    # text -> image: one row per caption, its image the label (the resampling cluster), its caption text
    by_id = text_rows.set_index("image_id")
    assert sorted(by_id.index) == sorted(captions["caption_id"])
    assert by_id.loc[captions["caption_id"], "label"].tolist() == captions["image_id"].tolist()
    shown = restore_formulas(by_id[["caption"]])["caption"]  # formula-like text is quoted for spreadsheets
    assert shown.loc[captions["caption_id"]].tolist() == captions["caption"].tolist()
    order = [captions["caption_id"].tolist().index(i) for i in by_id.index]
    assert by_id["hit@1"].astype(float).tolist() == runs.values["text_to_image"]["recall@1"][order].tolist()
    assert by_id["rr"].astype(float).tolist() == runs.values["text_to_image"]["mrr"][order].tolist()  # exact
    assert (text_rows["ap"] == "").all() and (image_rows["caption"] == "").all()
    # image -> text: the uncaptioned image has no positive and no value
    lone = image_rows.set_index("image_id").loc[UNCAPTIONED]
    assert lone["num_positives"] == "0" and lone["hit@1"] == lone["first_positive_rank"] == ""
    compact = pd.read_csv(project / "metrics/per_query.csv", dtype=str, keep_default_na=False)
    assert list(compact.columns) == ["direction", "image_id", "label", "num_positives", "num_retrievable", "hit@1",
                                     "hit@2", "rr", "ap", "evaluated"]
    assert compact["image_id"].tolist() == full["image_id"].tolist()
    # a formula-like caption is quoted for spreadsheets, as every report table's text
    assert any(c.startswith("'=") for c in by_id["caption"])


def test_report_show_and_page(scored):
    project, stdout = scored
    for line in ("[text -> image]", "[image -> text]", "num queries:   10 captions", "num gallery:   10 captions",
                 "median_rank:", "mean_rank:", "map:"):
        assert line in stdout
    shown = run_module("stages.score", "--show", cwd=project)
    assert shown.returncode == 0 and shown.stdout.strip() == stdout.strip()
    page = (project / "reports/index.html").read_text(encoding="utf-8")
    _, _, _, captions = eval_arrays(project)
    assert "Text &#8596; image retrieval report" in page and "intervals resample images" in page
    assert "a b glyph number 0" in page  # the caption text of the hardest queries
    curve = pd.read_csv(project / "metrics/recall_curve.csv")
    assert list(curve.columns) == ["k", "recall", "recall_image_to_text", "evaluated"]
    assert curve["recall"].iloc[0] == pytest.approx(load(project, "recall.json")["text_to_image"]["recall@1"])


def test_outputs_are_byte_identical_on_a_rerun(scored, tmp_path):
    project, _ = scored
    again = shutil.copytree(project, tmp_path / "again")
    assert run_in_process("score", cwd=again).returncode == 0
    assert read_bytes(again, SCORE_OUTPUTS) == read_bytes(project, SCORE_OUTPUTS)


def test_missing_text_embeddings_and_unused_params_are_refused(scored, tmp_path):
    project = shutil.copytree(scored[0], tmp_path / "p")
    (project / EMBEDDINGS_DIR / "text_embeddings.npy").unlink()
    run_fails(project, "score", "text_embeddings.npy not found", "embeds text")
    assert_no_outputs(project, SCORE_OUTPUTS)
    write_embeddings(project)
    set_params(project, {"score.whiten": "pca"})
    run_fails(project, "score", "`score.whiten` is 'pca'", "text_image", "score.whiten: none")
    assert_no_outputs(project, SCORE_OUTPUTS)


def test_failure_gallery_draws_captions_as_text(scored):
    project, _ = scored
    sheet = Image.open(project / "plots/failures.png")
    _, texts, _, captions = eval_arrays(project)
    # both directions: 8 (score.failures.queries) caption rows, then the 5 captioned images' rows
    tile_h = THUMB + 2 * FRAME + CAPTION + GAP
    assert sheet.size[1] == LEGEND + (8 + 5) * tile_h + GAP
    # a caption query's tile is its text drawn on grey, the tile text_tile draws
    first = pd.read_csv(project / PER_QUERY, dtype=str, keep_default_na=False)
    t2i = first[first["direction"].eq("text_to_image")].assign(rank=lambda f: -f["first_positive_rank"].astype(int))
    worst = t2i.sort_values(["rank", "image_id"], kind="stable").iloc[0]
    text = dict(zip(captions["caption_id"], captions["caption"]))[worst["image_id"]]
    tile = sheet.crop((GAP + FRAME, LEGEND + GAP + FRAME, GAP + FRAME + THUMB, LEGEND + GAP + FRAME + THUMB))
    assert tile.tobytes() == text_tile(text).tobytes()


@pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
                    reason="headless Chromium is not installed")
def test_the_page_shows_captions_in_chromium(scored, tmp_path):
    """The page renders offline with the caption text of the hardest queries and the failure gallery loaded."""
    project, _ = scored
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    page = project / "reports/index.html"
    probed = tmp_path / "page.html"
    probed.write_text(page.read_text(encoding="utf-8").replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-background-networking", f"--user-data-dir={tmp_path / 'profile'}",
                           "--virtual-time-budget=10000", "--dump-dom", probed.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    dom = proc.stdout
    assert 'data-loaded="1"' in dom  # the failure gallery, an embedded PNG, decoded
    _, _, _, captions = eval_arrays(project)
    assert "a b glyph number 1" in dom and "Hardest captions" in dom and "[image -&gt; text]" not in dom
    assert "image -&gt; text" in dom and "text -&gt; image" in dom


#: Put first in <head>: marks <html data-loaded> with the number of images that decoded.
PROBE = """<script>
window.addEventListener("load", () => document.documentElement.setAttribute("data-loaded",
  String([...document.images].filter(i => i.complete && i.naturalWidth > 1).length)));
</script>"""


def test_a_long_caption_is_cut_with_an_ellipsis():
    from PIL import ImageChops

    long = text_tile("a very long caption " * 20)
    assert long.size == (THUMB, THUMB) and long.tobytes() == text_tile("a very long caption " * 20).tobytes()
    assert ImageChops.difference(long, text_tile("a very long caption")).getbbox() is not None
    assert text_tile("x" * 200).tobytes() != text_tile("").tobytes()  # one unbroken word is cut, not dropped


def test_the_block_without_intervals_says_so():
    from recallk.report.block import format_text_image_report

    counts = {"num_queries": 2, "num_excluded_queries": 0, "num_gallery": 2, "tie_sensitive": 0, "capped_ks": [2]}
    files = {"recall": {d: {"recall@1": 0.5, "recall@2": 1.0} for d in ("text_to_image", "image_to_text")},
             "counts": {"text_to_image": counts, "image_to_text": counts, "embedding_dim": 4},
             "intervals": {"interval_unit": "image", "text_to_image": {"mrr": 0.75, "mean_rank": 1.5,
                                                                       "median_rank": 1.0},
                           "image_to_text": {"mrr": 0.75, "map": 0.75, "mean_rank": 1.5, "median_rank": 1.0}}}
    text = format_text_image_report(files)
    assert "intervals: off" in text and "median_rank:  1\n" in text and "(K >= gallery" in text


def test_the_index_stage_refuses_a_text_image_run(scored, tmp_path):
    project = shutil.copytree(scored[0], tmp_path / "p")
    assert run_in_process("index", cwd=project).returncode == 0  # index.kinds: [] (the default): placeholders
    set_params(project, {"index.kinds": ["Flat"]})
    run_fails(project, "index", "split.protocol is text_image", "index.kinds: []")
