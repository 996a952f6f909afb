"""Stage scripts run as subprocesses on bad input: exit 2, one clear message, no outputs left behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from conftest import run_module

OUTPUTS = ("data/prepared/catalog.csv", "data/prepared/split.csv", "data/embeddings/embeddings.npy",
           "data/embeddings/ids.npy", "metrics/recall.json")


def edit_params(project: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = project / "params.yaml"
    params = yaml.safe_load(path.read_text())
    change(params)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def set_param(dotted: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(params: dict[str, Any]) -> None:
        *parents, leaf = dotted.split(".")
        node = params
        for key in parents:
            node = node[key]
        node[leaf] = value
    return change


def assert_user_error(proc, *fragments: str) -> None:
    """Exit code 2, every fragment in stderr, no traceback."""
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, f"{fragment!r} not in stderr:\n{proc.stderr}"


def assert_no_outputs(project: Path, outputs: tuple[str, ...] = OUTPUTS) -> None:
    left = [p for p in outputs if (project / p).exists()]
    assert not left, f"outputs left behind: {left}"
    assert not list(project.rglob("*.tmp")), "temporary files left behind"


def first_image(project: Path, label: str) -> Path:
    return sorted((project / "data" / "digits" / label).iterdir())[0]


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def manifest(project: Path, text: str) -> None:
    (project / "data" / "digits" / "m.csv").write_text(text)
    edit_params(project, set_param("split.csv", "m.csv"))


# ---------------------------------------------------------------- split stage: data


def case_missing_root(p: Path) -> None:
    edit_params(p, set_param("split.data_root", "data/nowhere"))


def case_empty_root(p: Path) -> None:
    (p / "data" / "empty").mkdir()
    edit_params(p, set_param("split.data_root", "data/empty"))


def case_non_image(p: Path) -> None:
    (p / "data" / "digits" / "3" / "notes.txt").write_text("not an image\n")


def case_truncated(p: Path) -> None:
    truncate(first_image(p, "5"))


def case_csv_without_label(p: Path) -> None:
    manifest(p, "path,group\n0/0000.png,g1\n1/0001.png,g2\n")


def case_duplicate_ids(p: Path) -> None:
    rows = [f"x{i},{img.parent.name}/{img.name},{img.parent.name}"
            for i, img in enumerate(sorted((p / "data" / "digits").glob("*/*.png")))]
    rows[1] = "x0" + rows[1][rows[1].index(","):]  # second row reuses the first id
    manifest(p, "image_id,path,label\n" + "\n".join(rows) + "\n")


@pytest.mark.parametrize("setup, fragments", [
    # data root does not exist
    (case_missing_root, ["data root 'data/nowhere' does not exist", "set `split.data_root` in params.yaml"]),
    # data root exists but holds nothing
    (case_empty_root, ["data root 'data/empty' holds no images", "put each label's images in a sub-folder"]),
    # a text file inside a label folder
    (case_non_image, ["image file must exist inside the data root and decode with Pillow",
                      "path '3/notes.txt'", "Pillow cannot decode it", "replace or remove the file"]),
    # a PNG cut in half
    (case_truncated, ["image file must exist inside the data root and decode with Pillow",
                      "image file is truncated", "replace or remove the file"]),
    # manifest lacks the label column
    (case_csv_without_label, ["lacks column(s) label", "it needs a header with path,label"]),
    # manifest repeats an image id (CSV lines 2 and 3)
    (case_duplicate_ids, ["image_id must be unique (give every row its own value): 2 row(s)",
                          "CSV line 2, path '0/", "CSV line 3, path '0/", "image_id 'x0'"]),
])
def test_split_rejects_bad_data(project, setup, fragments):
    setup(project)
    assert_user_error(run_module("stages.split", cwd=project), "error: ", *fragments)
    assert_no_outputs(project)


def test_truncated_image_is_named(project):
    bad = first_image(project, "5")
    truncate(bad)
    proc = run_module("stages.split", cwd=project)
    assert_user_error(proc, f"path '5/{bad.name}'")


# ---------------------------------------------------------------- params


@pytest.mark.parametrize("stage, change, fragments", [
    # typo in a split key
    ("stages.split", lambda p: p["split"].update(sed=1),
     ["`split.sed` is not a known param; remove it or fix the name. Did you mean `seed`?"]),
    # typo in a top-level section, caught by any stage
    ("stages.split", lambda p: p.update(scroe=p.pop("score")),
     ["`scroe` is not a known params section", "Did you mean `score`?"]),
    # fractions add up to 1.1
    ("stages.split", set_param("split.fractions.val", 0.35),
     ["`split.fractions` train + val + gallery must sum to 1. Got 1.1 instead."]),
    # one fraction above 1
    ("stages.split", set_param("split.fractions.train", 1.5),
     ["`split.fractions.train` must be a number between 0 and 1. Got 1.5 instead."]),
    # negative fraction
    ("stages.split", set_param("split.fractions.gallery", -0.25),
     ["`split.fractions.gallery` must be a number between 0 and 1. Got -0.25 instead."]),
    # unknown strategy
    ("stages.split", set_param("split.strategy", "per_clas"),
     ["`split.strategy` must be one of class_disjoint, per_class, given", "Did you mean `per_class`?"]),
    # two problems: both named in one message
    ("stages.split", lambda p: p["split"].update(sed=1, strategi="given"),
     ["invalid params.yaml:", "`split.sed`", "Did you mean `seed`?", "`split.strategi`",
      "Did you mean `strategy`?"]),
])
def test_params_errors(project, stage, change, fragments):
    edit_params(project, change)
    assert_user_error(run_module(stage, cwd=project), *fragments)
    assert_no_outputs(project)


def test_fraction_sum_reported_together_with_other_errors(project):
    """README: unknown keys ... and fractions that do not sum to 1 are all reported together."""
    edit_params(project, lambda p: (p["split"].update(sed=1), p["split"]["fractions"].update(val=0.35)))
    assert_user_error(run_module("stages.split", cwd=project), "Did you mean `seed`?",
                      "`split.fractions` train + val + gallery must sum to 1. Got 1.1 instead.")
    assert_no_outputs(project)


def test_unknown_key_in_another_section_is_reported(project):
    """params.py: every problem in the file (unknown keys anywhere, ...) is reported at once."""
    edit_params(project, lambda p: (p["split"].update(sed=1), p["score"].update(ks=[0])))
    assert_user_error(run_module("stages.score", cwd=project), "`split.sed`", "Did you mean `seed`?",
                      "`score.ks` must be positive integers. Got [0] instead.")
    assert_no_outputs(project)


@pytest.mark.parametrize("ks, shown", [
    ([0], "[0]"),        # zero
    ([-1], "[-1]"),      # negative
    ([1.5], "[1.5]"),    # not an integer
    ("5", "'5'"),        # a string, not a list
    ([], "[]"),          # empty list
    ([True], "[True]"),  # a bool is not an integer
])
def test_score_rejects_bad_ks(project, ks, shown):
    edit_params(project, set_param("score.ks", ks))
    proc = run_module("stages.score", cwd=project)
    assert_user_error(proc, f"`score.ks` must be positive integers. Got {shown} instead.")
    assert "not found" not in proc.stderr  # params are checked before inputs are read
    assert_no_outputs(project)


def test_score_rejects_repeated_ks(project):
    edit_params(project, set_param("score.ks", [1, 5, 1]))
    assert_user_error(run_module("stages.score", cwd=project), "`score.ks` must not repeat a value.")


# ---------------------------------------------------------------- encode


def test_unknown_backbone_lists_available_and_suggests(project):
    run_module("stages.split", cwd=project, check=True)
    edit_params(project, set_param("encode.backbone", "pixel"))
    proc = run_module("stages.encode", cwd=project)
    assert_user_error(proc, "unknown backbone 'pixel' in `encode.backbone`", "Did you mean `pixels`?",
                      "Available backbones: ", "pixels, precomputed")
    assert_no_outputs(project, OUTPUTS[2:])
    assert (project / "data/prepared/catalog.csv").is_file()  # the split outputs are untouched


# ---------------------------------------------------------------- stale outputs


def test_failing_split_removes_stale_outputs(project):
    run_module("stages.split", cwd=project, check=True)
    assert (project / "data/prepared/catalog.csv").is_file()
    assert (project / "data/prepared/split.csv").is_file()
    edit_params(project, set_param("split.seed", -1))
    proc = run_module("stages.split", cwd=project)
    assert_user_error(proc, "`split.seed` must be an integer >= 0. Got -1 instead.")
    assert_no_outputs(project)


def test_failing_score_removes_stale_metrics(project):
    for stage in ("stages.split", "stages.encode", "stages.score"):
        run_module(stage, cwd=project, check=True)
    assert (project / "metrics/recall.json").is_file()
    edit_params(project, set_param("score.ks", [0]))
    assert_user_error(run_module("stages.score", cwd=project), "`score.ks` must be positive integers.")
    assert not (project / "metrics/recall.json").exists()
    assert not list(project.rglob("*.tmp"))
