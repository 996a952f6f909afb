"""params.yaml (stages/params_yaml.py): the stages read what DVC records. Values YAML 1.1 (PyYAML) and YAML 1.2
(DVC) read differently, and repeated keys, are refused with the line and the fix; a file past the bounds (depth,
aliases, size, unknown keys) is one short message."""

from __future__ import annotations

import tracemalloc

import pytest
import yaml

from helpers import ROOT, run_fails, tiny_project
from recallk.errors import InputError
from stages.params import load_section
from stages.params_yaml import MAX_BYTES, MAX_DEPTH, MAX_NODES, MAX_PROBLEMS

#: The line of `score:` in the project's params.yaml.
SCORE_LINE = (ROOT / "params.yaml").read_text().splitlines().index("score:") + 1


def params_text(**replace: str) -> str:
    """The committed params.yaml with whole lines replaced: ``params_text(**{"  seed: 0": "  seed: 010"})``."""
    text = (ROOT / "params.yaml").read_text(encoding="utf-8")
    for old, new in replace.items():
        assert old + "\n" in text, old
        text = text.replace(old + "\n", new + "\n", 1)
    return text


def test_committed_params_read_the_same_as_with_pyyaml():
    expected = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    for section in ("split", "encode", "score"):
        assert load_section(section, ROOT / "params.yaml") == expected[section]


@pytest.mark.parametrize("line, written, name, fix", [
    ("  seed: 0", "  seed: 010", "`split.seed` (line 7)", "write 10 or 8"),               # YAML 1.1 octal
    ("  seed: 0", "  seed: 0o10", "`split.seed` (line 7)", 'write 8 or "0o10"'),          # YAML 1.2 octal
    ("  on_bad_image: error", "  on_bad_image: off", "`split.on_bad_image`", 'write "off" or false'),
    ("  on_bad_image: error", "  on_bad_image: yes", "`split.on_bad_image`", 'write "yes" or true'),
    ("    resolution: 16", "    resolution: 1:04", "`encode.pixels.resolution`", 'write "1:04" or 64'),  # sexagesimal
    ("  max_memory_mb: 512", "  max_memory_mb: 5e2", "`score.max_memory_mb`", 'write 500.0 or "5e2"'),
    ("  ks: [1, 5, 10]", "  ks: [1, 5, 010]", "`score.ks[2]`", "write 10 or 8"),
])
def test_params_that_yaml_1_1_reads_differently_are_refused(tmp_path, line, written, name, fix):
    """`seed: 010` ran with seed 8 (PyYAML, YAML 1.1) while dvc.lock recorded 10 (DVC, YAML 1.2)."""
    path = tmp_path / "params.yaml"
    path.write_text(params_text(**{line: written}), encoding="utf-8")
    for section in ("split", "encode", "score"):  # every stage refuses it, not only the owner of the key
        with pytest.raises(InputError) as info:
            load_section(section, path)
        message = str(info.value)
        assert name in message and fix in message and "dvc.lock" in message


@pytest.mark.parametrize("line, twice, name", [
    ("  seed: 0", "  seed: 0\n  seed: 3", "`split.seed` is given twice (lines 7 and 8)"),
    # the second `split` takes the line of `score:` in the project's params.yaml
    ("score:", "split: {}\nscore:", f"`split` is given twice (lines 1 and {SCORE_LINE})"),
    ("    train: 0.5", "    train: 0.5\n    train: 0.7", "`split.fractions.train` is given twice"),
])
def test_params_with_a_repeated_key_are_refused(tmp_path, line, twice, name):
    """The stages kept the last value (PyYAML); DVC refuses the file."""
    path = tmp_path / "params.yaml"
    path.write_text(params_text(**{line: twice}), encoding="utf-8")
    with pytest.raises(InputError, match="keep one of them") as info:
        load_section("split", path)
    assert name in str(info.value)


def test_params_values_are_read_as_dvc_reads_them(tmp_path):
    """Quoted text stays text, and a value both YAML versions agree on is taken as it is."""
    path = tmp_path / "params.yaml"
    path.write_text(params_text(**{"  on_bad_image: error": '  on_bad_image: "skip"', "  seed: 0": "  seed: 0x10"}))
    values = load_section("split", path)
    assert (values["on_bad_image"], values["seed"]) == ("skip", 16)


# ================================================================ bounds: one short message (issue 25)
# Moved from the hostile corpus (test_hostile_params.py). Deep nesting (once a RecursionError with 207 KB of
# stderr), alias bombs, unknown sections and keys walked before their refusal and a huge file (minutes and
# gigabytes spent before the refusal), a sum printed with too few digits ("must sum to 1. Got 1"): each is one
# short message now, from the keys and the bounds alone.


BASE = (ROOT / "params.yaml").read_text(encoding="utf-8")


def alias_bomb(levels: int, width: int = 9, indent: str = "") -> str:
    """``a: &a [9 strings]``, then each level an anchor of ``width`` aliases of the previous one: under 1 KB,
    ``width ** levels`` strings once expanded."""
    names = "abcdefghij"
    lines = [f"a: &a [{', '.join(['lol'] * width)}]"]
    for prev, name in zip(names, names[1:levels + 1]):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * width)}]")
    return "".join(indent + line + "\n" for line in lines)


def refused(tmp_path, text: str, section: str = "split") -> str:
    """The message of loading ``text`` as params.yaml (it must be refused), checked to be short."""
    path = tmp_path / "params.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_section(section, path)
    message = str(info.value)
    assert len(message) < 4000, f"{len(message)} characters"
    return message


@pytest.mark.parametrize("value", [
    "[" * 5000 + "]" * 5000,  # 5,000 nested flow lists (the reported RecursionError)
    "[" * 5000,               # unclosed: the depth is refused before the syntax error
    "{a: " * 5000 + "1" + "}" * 5000,  # nested flow mappings
])
def test_deep_nesting_is_one_message_not_a_recursion_error(tmp_path, value):
    message = refused(tmp_path, BASE.replace("  seed: 0\n", f"  seed: {value}\n"))
    assert f"more than {MAX_DEPTH} deep (line 7)" in message


def test_deep_block_nesting_is_refused_too(tmp_path):
    block = "".join("  " * (i + 1) + f"k{i}:\n" for i in range(60)) + "  " * 61 + "1\n"
    assert f"more than {MAX_DEPTH} deep" in refused(tmp_path, BASE + "deep:\n" + block)


@pytest.mark.parametrize("where", ["known key", "unknown section"])
def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path, where):
    """9**6 values from 600 bytes (the reported bomb had 7 levels: 200 s and 1.1 GB before its message)."""
    bomb = alias_bomb(6, indent="" if where == "known key" else "  ")
    assert len(bomb) < 1000
    text = (bomb + BASE.replace("  ks: [1, 5, 10]\n", "  ks: *g\n") if where == "known key"
            else BASE + "lol:\n" + bomb)
    tracemalloc.start()
    try:
        message = refused(tmp_path, text, "score")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "YAML aliases (`*name`) expand to" in message
    assert f"at most {MAX_NODES:,} values" in message and "write the values out" in message
    assert peak < 50 * 2 ** 20, f"{peak / 2 ** 20:.0f} MiB held"  # the expanded lists were never built


def test_a_self_referring_anchor_is_refused(tmp_path):
    assert "refers to itself" in refused(tmp_path, BASE + "x: &x [1, *x]\n")


def test_aliases_within_the_bound_are_read(tmp_path):
    """Anchors are YAML: a small reuse is not refused."""
    path = tmp_path / "params.yaml"
    path.write_text(BASE.replace("  ks: [1, 5, 10]\n", "  ks: &k [1, 5, 10]\n")
                    .replace("    seed: 0\n    unit: query\n", "    seed: 0\n    unit: query\n# reuse: *k\n"))
    assert load_section("score", path)["ks"] == [1, 5, 10]


def test_an_unknown_section_is_refused_without_reading_what_it_holds(tmp_path):
    """The old reader walked the unknown section first and reported its YAML 1.1 value instead."""
    message = refused(tmp_path, BASE + "extra:\n  seed: 010\n  on: yes\n")
    assert "`extra` is not a known params section" in message
    assert "010" not in message and "YAML 1.1" not in message


@pytest.mark.parametrize("count", [MAX_PROBLEMS + 1, 3000])
def test_many_unknown_keys_are_listed_up_to_the_limit(tmp_path, count):
    keys = "".join(f"  nokey{i}: 010\n" for i in range(count))
    message = refused(tmp_path, BASE.replace("split:\n", "split:\n" + keys))
    assert message.count("is not a known param") == MAX_PROBLEMS
    assert f"... and {count - MAX_PROBLEMS:,} more unknown keys" in message
    assert "`split.nokey0`" in message and "YAML 1.1" not in message  # values under unknown keys unread


def test_unknown_keys_are_reported_with_the_known_values_problems(tmp_path):
    """One message still holds both (the README's promise), the unknown key's value unread."""
    text = BASE.replace("  seed: 0\n", "  seed: -1\n  sed: 010\n", 1)
    message = refused(tmp_path, text)
    assert "`split.sed` is not a known param" in message and "`split.seed` must be an integer" in message
    assert "YAML 1.1" not in message


def test_an_unknown_key_in_a_sub_section_is_named(tmp_path):
    message = refused(tmp_path, BASE.replace("    max_distance: 10\n", "    max_distance: 10\n    max_dist: 3\n"))
    assert "`split.near_duplicates.max_dist` is not a known param" in message and "Did you mean" in message


def test_a_huge_params_file_is_refused_unread(tmp_path):
    """300,000 unknown keys took 201 s; a file over the size bound is refused from its size."""
    keys = "".join(f"  k{i}: 1\n" for i in range(MAX_BYTES // 8))
    message = refused(tmp_path, BASE.replace("split:\n", "split:\n" + keys))
    assert f"at most {MAX_BYTES:,} bytes" in message


@pytest.mark.parametrize("fractions, shown", [
    ((0.5, 0.25, 0.2500001), "Got 1.0000001 instead"),  # was "Got 1"
    ((0.5, 0.25, 0.24999), "Got 0.99999 instead. (0.5 + 0.25 + 0.24999)"),  # 6 digits suffice here
    ((0.3, 0.3, 0.3), "Got 0.9 instead"),  # the float sum 0.8999999999999999, at 6 digits
])
def test_fractions_sum_is_printed_with_enough_digits(tmp_path, fractions, shown):
    text = BASE.replace("    train: 0.5\n    val: 0.25\n    gallery: 0.25\n",
                        "".join(f"    {k}: {v}\n" for k, v in zip(("train", "val", "gallery"), fractions)))
    assert shown in refused(tmp_path, text)


@pytest.mark.stage
def test_the_split_stage_says_one_line_about_5000_brackets(tmp_path):
    proj = tiny_project(tmp_path)
    text = (proj / "params.yaml").read_text()
    (proj / "params.yaml").write_text(text.replace("  seed: 0\n", "  seed: " + "[" * 5000 + "\n"))
    proc = run_fails(proj, "split", "nests lists or mappings", f"more than {MAX_DEPTH} deep")
    assert len(proc.stderr) < 1000


# ------------------------------------------------------------------------------ null for a path DVC tracks


def tracked_keys() -> list[str]:
    """Every param dvc.yaml interpolates whole into a stage's ``deps`` (``- ${encode.precomputed.path}``)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    return sorted({dep[2:-1] for stage in stages.values() for dep in stage.get("deps", [])
                   if isinstance(dep, str) and dep.startswith("${") and dep.endswith("}")})


@pytest.mark.parametrize("value", [None, ""])
def test_null_for_a_path_dvc_tracks_says_what_to_write_instead(tmp_path, value):
    """`dvc exp run -S encode.precomputed.path=null` (or `=""`) stops DVC itself before any stage runs (an
    AssertionError in its dependency loader: treeverse/dvc#8036), so no project code can answer it there; the
    same value in params.yaml, read by a stage run by hand, is refused naming the key and what to write."""
    keys = [k for k in tracked_keys() if k.startswith("encode.")]
    assert "encode.precomputed.path" in keys and len(keys) == 8, keys  # 8 with the captions' encode.precomputed.text
    for key in keys:
        params = yaml.safe_load(BASE)
        _, sub, name = key.split(".")
        params["encode"][sub][name] = value
        message = refused(tmp_path, yaml.safe_dump(params, sort_keys=False), "encode")
        assert f"`{key}`" in message and "-S <this key>=recallk/encode/no_file.txt" in message, message
        assert "treeverse/dvc#8036" in message, message
