"""End-to-end tests of the DVC pipeline: real ``dvc repro`` in temporary git repositories.

A session-scoped base repo (conftest ``base_repo``: the project's code, dvc.yaml, params.yaml and a
20-per-label digits subset at ``data/digits``) is committed, reproduced once and committed again;
each test works on its own copy (``repo``: ``.git``, the DVC cache and the embedding cache included),
so it pays only for the repros it needs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from helpers import (
    CATALOG,
    CURVE,
    EMBEDDINGS,
    IDS,
    METRICS,
    RAN_RE,
    ROOT,
    SPLIT,
    STAGES,
    commit,
    copy_pipeline,
    dvc,
    git,
    git_init,
    read_metrics,
    repro,
    run_module,
    save_image,
    set_params,
)

pytestmark = pytest.mark.pipeline

STAGE_OUTS = {"split": (CATALOG, SPLIT), "encode": (EMBEDDINGS, IDS), "score": (METRICS,),
              "index": ("metrics/index.json",)}


# ---------------------------------------------------------------------------------------------- helpers


def snapshot(repo: Path, rels) -> dict[str, tuple[bytes, int]]:
    """Bytes and mtime (ns) of each output path."""
    return {rel: ((repo / rel).read_bytes(), (repo / rel).stat().st_mtime_ns) for rel in rels}


def outs_of(*stages: str) -> list[str]:
    return [p for s in stages for p in STAGE_OUTS[s]]


def assert_untouched(repo: Path, before: dict[str, tuple[bytes, int]]) -> None:
    after = snapshot(repo, before)
    for rel, (data, mtime) in before.items():
        assert after[rel][0] == data, f"{rel} changed bytes although its stage was skipped"
        assert after[rel][1] == mtime, f"{rel} was rewritten (mtime changed) although its stage was skipped"



# ---------------------------------------------------------------------------------------------- 1-5: what re-runs


def test_no_change_runs_nothing(repo: Path) -> None:
    before = snapshot(repo, outs_of(*STAGES))
    ran, skipped, out = repro(repo)
    assert ran == set(), out
    assert skipped == set(STAGES), out
    assert_untouched(repo, before)
    assert git("status", "--porcelain", cwd=repo).stdout == ""


def test_score_ks_change_reruns_only_score(repo: Path) -> None:
    before = snapshot(repo, outs_of("split", "encode"))
    set_params(repo, {"score.ks": [1, 3]})
    ran, skipped, out = repro(repo)
    assert ran == {"score", "index"}, out  # and index, which reads score's outputs and score.ks
    assert skipped == {"split", "encode"}, out
    assert_untouched(repo, before)
    m = read_metrics(repo)
    assert "recall@3" in m and "recall@1" in m, m
    assert "recall@5" not in m and "recall@10" not in m, m


def test_split_seed_change_reruns_split_and_score_not_encode(repo: Path) -> None:
    catalog_before = (repo / CATALOG).read_bytes()
    split_before = (repo / SPLIT).read_bytes()
    enc_before = snapshot(repo, outs_of("encode"))
    set_params(repo, {"split.seed": 1})
    ran, skipped, out = repro(repo)
    assert ran == {"split", "score", "index"}, out
    assert skipped == {"encode"}, out
    assert (repo / CATALOG).read_bytes() == catalog_before, "the catalog must not depend on split params"
    assert (repo / SPLIT).read_bytes() != split_before, "seed 1 should give another split assignment"
    assert_untouched(repo, enc_before)


def test_backbone_change_reruns_encode_and_score_not_split(repo: Path) -> None:
    assert read_metrics(repo)["embedding_dim"] == 3 * 16 * 16
    split_before = snapshot(repo, outs_of("split"))
    set_params(repo, {"encode.pixels.resolution": 8})
    ran, skipped, out = repro(repo)
    assert "Stage 'encode' is cached" not in out, "DVC restored stale embeddings from its run-cache:\n" + out
    assert ran == {"encode", "score", "index"}, out
    assert skipped == {"split"}, out
    assert_untouched(repo, split_before)
    assert read_metrics(repo)["embedding_dim"] == 3 * 8 * 8


def test_new_image_reruns_split(repo: Path) -> None:
    catalog_before = (repo / CATALOG).read_text(encoding="utf-8")
    save_image(repo / "data" / "digits" / "3" / "9999.png", seed=7, size=(8, 8), mode="L")
    ran, _, out = repro(repo)
    assert "split" in ran, out
    catalog_after = (repo / CATALOG).read_text(encoding="utf-8")
    assert catalog_after != catalog_before
    assert len(catalog_after.splitlines()) == len(catalog_before.splitlines()) + 1
    assert "3/9999.png" in catalog_after



# ---------------------------------------------------------------------------------------------- 6-8: reproducibility


def test_fresh_clone_reproduces_byte_identical(base_repo: Path, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    git("clone", "-q", str(base_repo), str(clone), cwd=tmp_path)
    assert not (clone / ".dvc" / "cache").exists()
    assert not (clone / CATALOG).exists()
    # metrics/recall.json is git-tracked (cache: false), so score would be skipped as up to date;
    # delete it so every stage must regenerate its outputs in the clone; likewise the index stage's (its outs are
    # all in git).
    (clone / METRICS).unlink()
    (clone / "metrics" / "index.json").unlink()
    ran, _, out = repro(clone)
    assert ran == set(STAGES), out
    assert git("status", "--porcelain", cwd=clone).stdout == "", "dvc.lock / metrics did not regenerate identically"
    for rel in outs_of(*STAGES):
        assert (clone / rel).read_bytes() == (base_repo / rel).read_bytes(), rel


def test_split_stage_twice_from_scratch_is_byte_identical(repo: Path, base_repo: Path) -> None:
    results = []
    for _ in range(2):
        shutil.rmtree(repo / "data" / "prepared")
        proc = run_module("stages.split", cwd=repo)
        assert proc.returncode == 0, proc.stderr
        results.append(((repo / CATALOG).read_bytes(), (repo / SPLIT).read_bytes()))
    assert results[0] == results[1]
    # and identical to what `dvc repro` produced (and dvc.lock recorded) in the base repo
    assert results[0] == ((base_repo / CATALOG).read_bytes(), (base_repo / SPLIT).read_bytes())
    status = json.loads(dvc("status", "split", "--json", cwd=repo).stdout or "{}")
    assert status == {}, status


def test_metrics_diff_between_branches(repo: Path) -> None:
    # split.seed 2 moves other labels into val/gallery: recall@1 0.98 -> 1.0 on the 20-per-label subset.
    old = read_metrics(repo)
    git("checkout", "-q", "-b", "other-seed", cwd=repo)
    set_params(repo, {"split.seed": 2})
    ran, _, out = repro(repo)
    assert ran == {"split", "score", "index"}, out
    commit(repo, "split.seed 2")
    new = read_metrics(repo)
    assert new["recall@1"] != old["recall@1"], (old, new)

    proc = dvc("metrics", "diff", "main", "--json", cwd=repo)
    diff = json.loads(proc.stdout)
    assert set(diff) == {METRICS}, diff  # the means only: the counts and intervals are not declared metrics files
    # read_metrics checked that recall.json holds means only; the counts and intervals stay out of the diff
    assert not {"num_queries", "embedding_dim", "tie_sensitive@1", "recall@1_ci_low"} & set(diff[METRICS]), diff
    targeted = json.loads(dvc("metrics", "diff", "main", "--targets", "metrics/intervals.json", "--json",
                              cwd=repo).stdout)
    assert "recall@1_class_mean" in targeted["metrics/intervals.json"]  # still reachable by name
    entry = diff[METRICS]["recall@1"]
    assert entry["old"] == pytest.approx(old["recall@1"])
    assert entry["new"] == pytest.approx(new["recall@1"])
    assert entry["old"] != entry["new"]
    assert entry["diff"] == pytest.approx(new["recall@1"] - old["recall@1"])
    assert "embedding_dim" not in diff[METRICS], "unchanged metrics are hidden without --all"

    full = json.loads(dvc("metrics", "diff", "main", "HEAD", "--all", "--json", cwd=repo).stdout)
    assert full[METRICS]["recall@1"]["new"] == pytest.approx(new["recall@1"])
    counts = json.loads(dvc("metrics", "diff", "main", "HEAD", "--all", "--targets", "metrics/counts.json", "--json",
                            cwd=repo).stdout)["metrics/counts.json"]
    assert counts["embedding_dim"] == {"old": 768, "new": 768, "diff": 0}  # --all: unchanged values too

    md = dvc("metrics", "diff", "main", "--md", cwd=repo).stdout
    assert "recall@1" in md and METRICS in md


def test_committed_project_reproduces_byte_identical(tmp_path: Path) -> None:
    """``make check-repro`` as a test: the committed dvc.lock and metrics regenerate byte-identical."""
    proj = copy_pipeline(tmp_path / "proj", full_data=True, with_results=True)
    git_init(proj, "committed project")
    repro(proj)
    stale = [rel for rel in ("dvc.lock", METRICS) if (proj / rel).read_bytes() != (ROOT / rel).read_bytes()]
    assert not stale, (f"{stale} do not regenerate byte-identical; run `dvc repro` and commit them:\n"
                       + git("diff", "--", *stale, cwd=proj).stdout)



# ---------------------------------------------------------------------------------------------- 9: failure


def test_invalid_param_fails_cleanly_without_outputs(repo: Path) -> None:
    set_params(repo, {"score.ks": [0]})
    proc = dvc("repro", cwd=repo, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert set(RAN_RE.findall(out)) == {"score"}, out
    assert "`score.ks` must be positive integers" in out, out
    assert "Traceback" not in out, out
    assert not (repo / METRICS).exists(), "a failed score stage left metrics/recall.json behind"
    assert not list((repo / "metrics").glob(".recall.json.*.tmp")), "stray temp files in metrics/"



# ---------------------------------------------------------------------------------------------- 10: plots


def test_dvc_plots_show_the_recall_curve(repo: Path) -> None:
    proc = dvc("plots", "show", "--json", cwd=repo)
    assert CURVE in proc.stdout
    shown = json.loads(proc.stdout)
    assert not shown.get("errors"), shown
    (plot,) = shown["data"][CURVE]
    values = plot["content"]["data"]["values"]
    curve = pd.read_csv(repo / CURVE)
    assert [(int(v["k"]), float(v["recall"])) for v in values] == list(zip(curve["k"], curve["recall"]))
    assert plot["content"]["encoding"]["x"]["field"] == "k"
    html = dvc("plots", "show", "-o", "plots_out", cwd=repo)
    assert html.returncode == 0
    page = (repo / "plots_out" / "index.html").read_text(encoding="utf-8")
    assert "recall_curve" in page

