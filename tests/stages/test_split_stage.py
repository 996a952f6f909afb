"""The split stage (stages/split.py) as a subprocess on bad data and bad params: exit 2, one clear message,
no outputs left behind (stale ones removed). The full hostile-input corpus is test_hostile_corpus.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import CATALOG, SPLIT, assert_no_outputs, edit_params, run_fails, set_dotted, set_params

pytestmark = pytest.mark.stage  # every test here runs stage scripts as subprocesses


def first_image(project: Path, label: str) -> Path:
    return sorted((project / "data" / "digits" / label).iterdir())[0]


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def manifest(project: Path, text: str) -> None:
    (project / "data" / "digits" / "m.csv").write_text(text)
    set_params(project, {"split.csv": "m.csv"})


# ---------------------------------------------------------------- data


def case_missing_root(p: Path) -> None:
    set_params(p, {"split.data_root": "data/nowhere"})


def case_empty_root(p: Path) -> None:
    (p / "data" / "empty").mkdir()
    set_params(p, {"split.data_root": "data/empty"})


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
    run_fails(project, "split", "error: ", *fragments)
    assert_no_outputs(project)


def test_truncated_image_is_named(project):
    bad = first_image(project, "5")
    truncate(bad)
    run_fails(project, "split", f"path '5/{bad.name}'")


# ---------------------------------------------------------------- params


@pytest.mark.parametrize("stage, change, fragments", [
    # typo in a split key
    ("split", lambda p: p["split"].update(sed=1),
     ["`split.sed` is not a known param; remove it or fix the name. Did you mean `seed`?"]),
    # typo in a top-level section, caught by any stage
    ("split", lambda p: p.update(scroe=p.pop("score")),
     ["`scroe` is not a known params section", "Did you mean `score`?"]),
    # fractions add up to 1.1
    ("split", lambda p: set_dotted(p, "split.fractions.val", 0.35),
     ["`split.fractions` train + val + gallery must sum to 1. Got 1.1 instead."]),
    # one fraction above 1
    ("split", lambda p: set_dotted(p, "split.fractions.train", 1.5),
     ["`split.fractions.train` must be a number between 0 and 1. Got 1.5 instead."]),
    # negative fraction
    ("split", lambda p: set_dotted(p, "split.fractions.gallery", -0.25),
     ["`split.fractions.gallery` must be a number between 0 and 1. Got -0.25 instead."]),
    # unknown strategy
    ("split", lambda p: set_dotted(p, "split.strategy", "per_clas"),
     ["`split.strategy` must be one of class_disjoint, per_class, given", "Did you mean `per_class`?"]),
    # two problems: both named in one message
    ("split", lambda p: p["split"].update(sed=1, strategi="given"),
     ["invalid params.yaml:", "`split.sed`", "Did you mean `seed`?", "`split.strategi`",
      "Did you mean `strategy`?"]),
])
def test_params_errors(project, stage, change, fragments):
    edit_params(project, change)
    run_fails(project, stage, *fragments)
    assert_no_outputs(project)


def test_fraction_sum_reported_together_with_other_errors(project):
    """README: unknown keys ... and fractions that do not sum to 1 are all reported together."""
    edit_params(project, lambda p: (p["split"].update(sed=1), p["split"]["fractions"].update(val=0.35)))
    run_fails(project, "split", "Did you mean `seed`?",
              "`split.fractions` train + val + gallery must sum to 1. Got 1.1 instead.")
    assert_no_outputs(project)


# ---------------------------------------------------------------- stale outputs


def test_failing_split_removes_stale_outputs(split_project):
    assert (split_project / CATALOG).is_file()
    assert (split_project / SPLIT).is_file()
    set_params(split_project, {"split.seed": -1})
    run_fails(split_project, "split", "`split.seed` must be an integer >= 0. Got -1 instead.")
    assert_no_outputs(split_project)
