"""``recallk datasets prepare ... --apply`` then real ``dvc repro``, in temporary git repositories: one
leave-one-out benchmark (CUB-200-2011), one re-ID benchmark (Market-1501) and one caption benchmark (Flickr30k's
Karpathy test), each a fixture tree in the official format (tests/dataset_fixtures.py). The metrics the pipeline
writes must be the references' (tests/reference_evals.py, or a brute-force ranking) on the pipeline's own
embeddings."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dataset_fixtures import write_cub, write_flickr30k, write_reid
from helpers import (
    CATALOG,
    EMBEDDINGS,
    IDS,
    PROJECT_FILES,
    ROOT,
    SPLIT,
    dvc,
    git,
    read_metrics,
    run,
    set_params,
)
from reference_evals import eval_market1501, pml_leave_one_out, similarity

pytestmark = pytest.mark.pipeline


def prepared_repo(dest: Path, name: str, write, params: dict | None = None) -> tuple[Path, str]:
    """The pipeline in a new git repo, a fixture release under data/<name>, prepared with --apply (``params``:
    more params set first)."""
    dest.mkdir(parents=True)
    for package in ("stages", "recallk"):
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for rel in PROJECT_FILES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    write(dest / "data" / name)
    set_params(dest, {"score.bootstrap.resamples": 10, "score.failures.queries": 2, **(params or {})})
    proc = run([sys.executable, "-m", "recallk.cli", "datasets", "prepare", name, f"data/{name}", "--apply"], cwd=dest)
    git("init", "-q", "-b", "main", cwd=dest)
    git("add", "-A", cwd=dest)
    git("commit", "-q", "-m", f"{name} prepared", cwd=dest)
    dvc("repro", cwd=dest)
    return dest, proc.stdout + proc.stderr


def pipeline_sets(repo: Path):
    """The queries and gallery as the score stage saw them, with their embeddings and catalog."""
    split = pd.read_csv(repo / SPLIT, dtype={"image_id": str})
    cat = pd.read_csv(repo / CATALOG, dtype=str, keep_default_na=False).set_index("image_id")
    emb, ids = np.load(repo / EMBEDDINGS), np.load(repo / IDS).astype(str)
    row = {i: n for n, i in enumerate(ids)}
    q = split.loc[split["query"], "image_id"].tolist()
    g = split.loc[split["gallery"], "image_id"].tolist()
    return q, g, cat, emb[[row[i] for i in q]], emb[[row[i] for i in g]]


def test_cub200_prepared_and_reproduced_gives_the_pml_numbers(tmp_path):
    repo, printed = prepared_repo(tmp_path / "repo", "cub200", write_cub)
    assert printed.count("counts differ from the official release") == 1 and "protocol: leave_one_out" in printed
    metrics = read_metrics(repo)
    q, g, cat, q_emb, _ = pipeline_sets(repo)
    assert q == g and len(q) == 9 and metrics["num_queries"] == 9  # classes 101-103, each image against the rest
    want = pml_leave_one_out(similarity(q_emb, q_emb), cat.loc[q, "label"].to_numpy())
    for key in ("precision@1", "r_precision", "map@r"):
        assert abs(metrics[key] - want[key]) <= 1e-12, key
    # the split records the protocol the manifest was prepared for, and the report names it
    provenance = json.loads((repo / "data/prepared/provenance.json").read_text(encoding="utf-8"))
    assert provenance["benchmark"] == {"name": "cub200-classes-101-200-loo",
                                       "sizes": {"queries": 9, "gallery": 9, "classes": 3}}
    shown = run([sys.executable, "-m", "stages.score", "--show"], cwd=repo).stdout
    assert re.search(r"\n  benchmark: +cub200-classes-101-200-loo \(9 queries, 9 gallery, 3 classes\)\n", shown)


def test_market1501_prepared_and_reproduced_gives_torchreid_numbers(tmp_path):
    repo, printed = prepared_repo(tmp_path / "repo", "market1501", write_reid)
    assert "exclude_same_all: [label, camera]" in printed and "junk: junk" in printed
    params = (repo / "params.yaml").read_text(encoding="utf-8")
    assert "strategy: given" in params and "csv: recallk_market1501.csv" in params
    metrics = read_metrics(repo)
    q, g, cat, q_emb, g_emb = pipeline_sets(repo)
    kept = cat.loc[g, "junk"].ne("True").to_numpy()  # torchreid's loader drops the -1 files
    pid, cam = cat["label"].astype(int), cat["camera"].astype(int)
    g_kept = np.array(g)[kept]
    cmc, m_ap, valid = eval_market1501(-similarity(q_emb, g_emb[kept]).astype(np.float64), pid[q].to_numpy(),
                                       pid[g_kept].to_numpy(), cam[q].to_numpy(), cam[g_kept].to_numpy(), 10)
    assert metrics["num_queries"] == valid == 5 and metrics["num_excluded_queries"] == 1
    for k in (1, 5, 10):
        assert abs(metrics[f"recall@{k}"] - cmc[k - 1]) <= 1e-12, k
    assert abs(metrics["map"] - m_ap) <= 1e-12
    evaluated = json.loads((repo / "metrics/evaluated.json").read_text(encoding="utf-8"))
    assert "exclude_same_all ['label', 'camera'], junk junk" in json.dumps(evaluated)


#: An image and a text tower for the caption benchmark (a callable backbone, encode.callable.text_function).
ENCODERS = """import zlib

import numpy as np


def image(images):
    return np.array([np.asarray(im, dtype=np.float32).mean(axis=(0, 1)) + 1 for im in images])


def text(captions):
    return np.array([[len(c), zlib.crc32(c.encode()) % 251 + 1, c.count("e") + 1] for c in captions],
                    dtype=np.float32)
"""


def _with_encoders(root: Path) -> dict[str, int]:
    (root.parent.parent / "encoders.py").write_text(ENCODERS, encoding="utf-8")  # the repo's root
    return write_flickr30k(root)


def test_flickr30k_prepared_and_reproduced_scores_the_karpathy_test_captions(tmp_path):
    repo, printed = prepared_repo(tmp_path / "repo", "flickr30k", _with_encoders, {
        "encode.backbone": "callable:encoders:image", "encode.callable.module_file": "encoders.py",
        "encode.callable.text_function": "text", "score.ks": [1, 2]})
    assert "# protocol flickr30k-karpathy-test (text_image): 3 images, 15 captions" in printed
    params = (repo / "params.yaml").read_text(encoding="utf-8")
    assert "protocol: text_image" in params and "captions: recallk_flickr30k_captions.csv" in params
    counts = json.loads((repo / "metrics/counts.json").read_text(encoding="utf-8"))
    assert counts["text_to_image"]["num_queries"] == 15 and counts["text_to_image"]["num_gallery"] == 3
    assert counts["image_to_text"]["num_queries"] == 3 and counts["image_to_text"]["num_gallery"] == 15
    # text -> image recall@K by brute force on the pipeline's own embeddings
    split = pd.read_csv(repo / SPLIT, dtype={"image_id": str})
    images = split.loc[split["gallery"], "image_id"].tolist()
    emb, ids = np.load(repo / EMBEDDINGS), np.load(repo / IDS).astype(str)
    row = {i: n for n, i in enumerate(ids)}
    texts = np.load(repo / "data/embeddings/text_embeddings.npy")
    text_ids = np.load(repo / "data/embeddings/text_ids.npy").astype(str)
    owner = np.array([images.index(t.split("#")[0]) for t in text_ids])
    sims = similarity(texts, emb[[row[i] for i in images]]).astype(np.float64)
    rank = 1 + (sims > sims[np.arange(len(owner)), owner][:, None]).sum(axis=1)  # no ties: distinct images
    recall = json.loads((repo / "metrics/recall.json").read_text(encoding="utf-8"))
    for k in (1, 2):
        assert abs(recall["text_to_image"][f"recall@{k}"] - float(np.mean(rank <= k))) <= 1e-12, k
