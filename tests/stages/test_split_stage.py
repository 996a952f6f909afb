"""The split stage (stages/split.py) on bad data and bad params: exit 2, one clear message, no outputs left behind
(stale ones removed); inputs that ended in a traceback or a misleading message, and the limits on ids and the data
root. Bad image files: test_split_stage_images.py; manifests and data shapes: test_split_stage_manifests.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import (
    CATALOG,
    SCORE_OUTPUTS,
    SPLIT,
    SPLIT_OUTPUTS,
    assert_no_outputs,
    assert_user_error,
    edit_params,
    plant_stale,
    read_csv,
    run_fails,
    run_in_process,
    run_ok,
    save_image,
    set_dotted,
    set_params,
    tiny_project,
)
from recallk.data import contract

pytestmark = pytest.mark.stage  # every test here runs the stages (in process, helpers.run_in_process, unless it says)


def first_image(project: Path, label: str) -> Path:
    return sorted((project / "data" / "digits" / label).iterdir())[0]


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def manifest(project: Path, text: str) -> None:
    (project / "data" / "digits" / "m.csv").write_text(text, encoding="utf-8")
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


# ---------------------------------------------------------------- tracebacks and misleading messages (issue 25)
# Moved from the hostile corpus (test_hostile_messages.py), on the tiny project (helpers.tiny_project): inputs
# that ended in a traceback (exit 1, or a silent exit 0), in a message that blamed the wrong thing, or in a
# wrong or dropped value with exit 0. Each failed before.


LABELS = ("a", "b", "c", "d")


def tiny(where: Path, labels: tuple[str, ...] = LABELS) -> Path:
    return tiny_project(where, labels)


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    return tiny(tmp_path)


def rows(labels: tuple[str, ...] = LABELS) -> str:
    return "".join(f"{label}/{i}.png,{label}\n" for label in labels for i in range(3))


def test_nul_byte_in_a_manifest_path_is_a_contract_failure(proj):
    """traceback: ``ValueError: embedded null byte`` from os.stat; now the path rule names the row."""
    manifest(proj, "path,label\n" + rows() + "a/\x000.png,a\n")
    run_fails(proj, "split", contract.PATH_RULE, "CSV line 14", r"'a/\x000.png'")
    assert_no_outputs(proj, SPLIT_OUTPUTS)


@pytest.mark.parametrize("header, shown", [
    ("path,label,label ", "'label' as 'label', 'label '"),  # traceback: collide once stripped (AttributeError)
    ("path,label,label", "'label' as 'label', 'label'"),    # silent: pandas renamed the second `label.1`
    (" path,path,label", "'path' as ' path', 'path'"),      # the same for any column
])
def test_manifest_header_naming_a_column_twice_is_refused(proj, header, shown):
    manifest(proj, header + "\n" + "".join(f"{label}/{i}.png,{label},x\n" for label in LABELS for i in range(3)))
    run_fails(proj, "split", "names a column more than once in its header", shown, "give every column its own name")


@pytest.mark.parametrize("where", ["file", "folder"])
def test_non_utf8_names_are_named_not_a_traceback(proj, where):
    """traceback: ``UnicodeEncodeError`` at the catalog CSV write; now every such name is listed."""
    root = os.fsencode(proj / "data" / "digits")
    target = root + (b"/a/\xff.png" if where == "file" else b"/\xfe/0.png")
    save_image(Path(os.fsdecode(target)), seed=9, size=(8, 8))
    run_fails(proj, "split", "has a name that is not UTF-8 text", r"b'\xff.png'" if where == "file" else r"b'\xfe'",
              "rename it")
    assert_no_outputs(proj, SPLIT_OUTPUTS)


def test_line_break_in_a_manifest_label_is_refused_like_a_label_folder(proj):
    """silent: a label ``"a\\nb"`` from a manifest was a fifth label (folder mode refused it): one rule now."""
    manifest(proj, "path,label\n" + rows().replace("a/0.png,a", 'a/0.png,"a\nb"'))
    run_fails(proj, "split", contract.LABEL_TEXT_RULE, "CSV line 2")


def test_label_rule_is_the_same_for_folders(tmp_path):
    """The one label rule, in folder mode (a label folder with a tab in its name)."""
    proj = tiny(tmp_path, labels=("a", "b\tc", "d"))
    run_fails(proj, "split", contract.LABEL_TEXT_RULE)


# ---------------------------------------------------------------- misleading messages


@pytest.mark.parametrize("make, said", [
    (lambda p: os.mkfifo(p), "is not a regular file (a FIFO, socket or device)"),  # was "file does not exist"
    (lambda p: p.mkdir(), "is a folder, not an image file"),                       # was "file does not exist"
])
def test_fifo_and_folder_say_what_they_are(proj, make, said):
    make(proj / "data" / "digits" / "a" / "odd.png")
    manifest(proj, "path,label\n" + rows() + "a/odd.png,a\n")
    proc = run_fails(proj, "split", "CSV line 14, path 'a/odd.png'", said)
    assert "does not exist" not in proc.stderr


def test_colon_in_a_label_folder_is_an_ordinary_character(tmp_path):
    """message: ``type:A/0.png`` was refused as an unsafe path; only drive letters and URL schemes are."""
    proj = tiny(tmp_path, labels=("type:A", "type:B", "c", "d"))
    run_ok(proj, "split", "encode", "score")
    assert {"type:A", "type:B"} <= set(read_csv(proj, CATALOG)["label"])


def test_a_too_long_output_name_is_not_blamed_on_disk_space(proj):
    """The real thing: an output name of 300 characters (ENAMETOOLONG at the temp file)."""
    proc = run_fails(proj, "split", "too long for the file system",
                     args=["--catalog", f"data/prepared/{'x' * 300}.csv"])
    assert "Free disk space" not in proc.stderr and "free disk space" not in proc.stderr


# ---------------------------------------------------------------- limits: long ids, a system folder (issue 25)
# Moved from the hostile corpus (test_hostile_limits.py): a 5,000-character id made ids.npy 64 MB, and
# `data_root: /` hashed and decoded every file of the machine; now both are refused first.


def test_a_very_long_image_id_is_refused(proj):
    """One 5,000-character id made ids.npy 64 MB for 16 images (fixed-width strings)."""
    long_id = "x" * 5_000
    text = "image_id,path,label\n" + "".join(
        f"{long_id if (label, i) == ('a', 0) else label + str(i)},{label}/{i}.png,{label}\n"
        for label in "abcd" for i in range(3))
    (proj / "data" / "digits" / "manifest.csv").write_text(text, encoding="utf-8")
    set_params(proj, {"split.csv": "manifest.csv"})
    proc = run_fails(proj, "split", contract.ID_LENGTH_RULE, "(5002 characters in all)")  # the repr, quotes included
    assert len(proc.stderr) < 5_000  # the id is quoted cut short


def test_an_id_at_the_length_limit_is_accepted(proj):
    text = "image_id,path,label\n" + "".join(
        f"{label}{i}{'y' * (contract.MAX_ID_LENGTH - 2)},{label}/{i}.png,{label}\n"
        for label in "abcd" for i in range(3))
    (proj / "data" / "digits" / "manifest.csv").write_text(text, encoding="utf-8")
    set_params(proj, {"split.csv": "manifest.csv"})
    run_ok(proj, "split")
    assert read_csv(proj, CATALOG)["image_id"].str.len().max() == contract.MAX_ID_LENGTH


def test_a_system_folder_is_refused_by_the_split_stage(proj):
    set_params(proj, {"split.data_root": "/"})
    run_fails(proj, "split", "data root '/' is a system folder", "`split.data_root`")


# ---------------------------------------------------------------- params of the wrong type or range, all at once
# Moved from the hostile-input corpus (test_hostile_manifests.py), on the tiny project.


@pytest.mark.parametrize("key, value, message", [
    ("split.seed", "x", "`split.seed` must be an integer >= 0. Got 'x' instead."),
    ("split.seed", True, "`split.seed` must be an integer >= 0. Got True instead."),
    ("split.fractions.train", "0.5", "`split.fractions.train` must be a number between 0 and 1. Got '0.5' instead."),
], ids=["seed_string", "seed_bool", "fraction_string"])
def test_params_wrong_type(proj, key, value, message):
    set_params(proj, {key: value})
    proc = run_in_process("split", cwd=proj)
    assert_user_error(proc, "invalid params.yaml", message)
    assert_no_outputs(proj)


def test_params_unknown_key_typo_gets_a_suggestion(proj):
    set_params(proj, {"split.sed": 3})
    proc = run_in_process("encode", cwd=proj)  # any stage sees a typo in any section
    assert_user_error(proc, "`split.sed` is not a known param", "Did you mean `seed`?", "Known keys: ")
    assert_no_outputs(proj)


def test_params_out_of_range_fraction(proj):
    set_params(proj, {"split.fractions.val": 2})
    proc = run_in_process("split", cwd=proj)
    assert_user_error(proc, "`split.fractions.val` must be a number between 0 and 1. Got 2 instead.")
    assert_no_outputs(proj)


def test_params_fractions_not_summing_to_1(proj):
    set_params(proj, {"split.fractions": {"train": 0.6, "val": 0.3, "gallery": 0.3}})
    proc = run_in_process("split", cwd=proj)
    assert_user_error(proc, "`split.fractions` train + val + gallery must sum to 1. Got 1.2 instead.")
    assert_no_outputs(proj)


def test_params_empty_ks(proj):
    set_params(proj, {"score.ks": []})
    plant_stale(proj, SCORE_OUTPUTS)
    proc = run_in_process("score", cwd=proj)
    assert_user_error(proc, "`score.ks` must be positive integers. Got [] instead.")
    assert "not found" not in proc.stderr  # params are judged before the inputs are looked for
    assert_no_outputs(proj, SCORE_OUTPUTS)


def test_params_several_errors_reported_together_before_any_work(proj):
    """One run names every params problem, before any data is read and with no output left."""
    (proj / "data" / "digits" / "a" / "0.png").write_bytes(b"")  # a data problem that must not be reached
    set_params(proj, {"split.seed": "x", "split.sed": 1, "split.fractions.train": 1.5,
                        "split.on_bad_image": "sometimes", "score.kss": [1]})
    plant_stale(proj, SPLIT_OUTPUTS)
    proc = run_in_process("split", cwd=proj)
    assert_user_error(proc, "invalid params.yaml",
                      "`split.seed` must be an integer >= 0. Got 'x' instead.",
                      "`split.sed` is not a known param", "Did you mean `seed`?",
                      "`split.fractions.train` must be a number between 0 and 1. Got 1.5 instead.",
                      "`split.on_bad_image`", "`score.kss` is not a known param", "Did you mean `ks`?")
