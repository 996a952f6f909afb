"""params.yaml checked against the settings classes: defaults, types, ranges, unknown keys, all errors at once."""

from __future__ import annotations

import copy

import pytest
import yaml

from helpers import ROOT, set_dotted
from recallk.errors import InputError
from recallk.settings.base import as_params, defaults, fields, from_mapping
from stages.params import SECTIONS, load_section, load_settings, section_class, validate_section

PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())


def with_change(path: str, value):
    return set_dotted(copy.deepcopy(PARAMS), path, value)


def test_committed_params_are_valid_and_complete():
    assert list(PARAMS) == list(SECTIONS)
    for section in SECTIONS:
        values = validate_section(PARAMS, section)
        assert values == PARAMS[section]  # every key is spelled out in params.yaml


@pytest.mark.parametrize("section", list(SECTIONS))
def test_committed_params_are_the_defaults_key_for_key(section):
    """params.yaml spells out every default of the settings classes, in their field order, and nothing else."""
    cls = section_class(section)
    assert defaults(cls) == PARAMS[section]

    def dotted(node, prefix=""):
        return [k for key, v in node.items()
                for k in (dotted(v, f"{prefix}{key}.") if isinstance(v, dict) else [f"{prefix}{key}"])]

    assert dotted(PARAMS[section]) == [name for name, _ in fields(cls)]


@pytest.mark.parametrize("section", list(SECTIONS))
def test_every_setting_has_a_rule_and_a_doc(section):
    for name, f in fields(section_class(section)):
        assert f.metadata["rule"] is not None, name
        assert f.metadata["doc"], name
        assert f.metadata["rule"](as_params(f.default)) is None, f"{section}.{name}: the default breaks its rule"


def test_load_settings_gives_the_settings_object(tmp_path):
    from recallk.data.settings import SplitSettings
    from recallk.score.settings import ScoreSettings

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(with_change("score.ks", [3, 7])), encoding="utf-8")
    settings = load_settings(ScoreSettings, path)
    assert settings == ScoreSettings(ks=(3, 7)) and settings.depth == 7
    assert settings.bootstrap.resamples == 1000 and as_params(settings) == load_section("score", path)
    assert load_settings(SplitSettings, path) == SplitSettings() == from_mapping(SplitSettings, PARAMS["split"])


def test_missing_keys_take_defaults():
    values = validate_section({"score": {"ks": [3]}}, "score")
    assert values == {"ks": [3], "metrics": ["recall", "precision", "r_precision", "map@r", "map", "mrr"],
                      "max_memory_mb": 512, "backend": "numpy", "engine": "local",
                      "device": "auto", "matmul": "float32", "shards": 1,
                      "ray": {"address": None, "num_cpus": 1}, "exclude_same": [], "exclude_same_all": [], "junk": None,
                      "whiten": "none",
                      "bootstrap": {"resamples": 1000, "confidence": 0.95, "seed": 0, "unit": "query"},
                      "failures": {"queries": 8, "k": 5}, "embedding_copies": {"min_cosine": None}}


@pytest.mark.parametrize("path, value, section, match", [
    ("score.ks", [0, 5], "score", r"`score.ks` must be positive integers. Got \[0, 5\] instead."),
    ("score.ks", [-1], "score", r"`score.ks` must be positive integers"),          # negative
    ("score.ks", [1.5], "score", r"`score.ks` must be positive integers"),         # not an integer
    ("score.ks", [True], "score", r"`score.ks` must be positive integers"),        # bool is not a K
    ("score.ks", [], "score", r"`score.ks` must be positive integers. Got \[\]"),  # empty
    ("score.ks", 5, "score", r"`score.ks` must be positive integers. Got 5"),      # scalar, not a list
    ("score.ks", [5, 5], "score", r"`score.ks` must not repeat a value"),
    ("score.max_memory_mb", 0, "score", r"`score.max_memory_mb` must be a positive number"),
    ("split.seed", "zero", "split", r"`split.seed` must be an integer >= 0. Got 'zero'"),
    ("split.strategy", "per_clas", "split", r"`split.strategy` must be one of .* Did you mean `per_class`\?"),
    ("split.protocol", "loo", "split", r"`split.protocol` must be one of query_gallery, leave_one_out"),
    ("split.fractions.val", 1.5, "split", r"`split.fractions.val` must be a number between 0 and 1"),
    ("split.fractions.train", 0.6, "split", r"train \+ val \+ gallery must sum to 1. Got 1.1 instead."),
    # the torch backend's params with another backend: ignored, so refused
    ("score.shards", 4, "score", r"`score` sets `shards: 4` with `backend: numpy`, but only `backend: torch` reads it"),
    ("score.matmul", "bfloat16", "score", r"`score` sets `matmul: bfloat16` with.*set `backend: torch`"),
    ("score.device", "cuda", "score", r"`score` sets `device: cuda` with `backend: numpy`"),
    ("split.data_root", "", "split", r"`split.data_root` must be a non-empty path string"),
    ("encode.batch_size", 0, "encode", r"`encode.batch_size` must be an integer between 1 and 65536"),
    ("encode.pixels.resolution", "16", "encode", r"`encode.pixels.resolution` must be an integer"),
    ("split.sed", 1, "split", r"`split.sed` is not a known param.*Did you mean `seed`\?"),  # typo
    ("scroe.ks", [1], "score", r"`scroe` is not a known params section.*Did you mean `score`\?"),
])
def test_bad_params(path, value, section, match):
    with pytest.raises(InputError, match=match):
        validate_section(with_change(path, value), section)


def test_every_error_is_reported_at_once():
    params = with_change("split.seed", -1)
    params["split"]["strategy"] = "random"
    params["split"]["colour"] = "red"
    with pytest.raises(InputError) as info:
        validate_section(params, "split")
    message = str(info.value)
    for fragment in ("`split.seed`", "`split.strategy`", "`split.colour`"):
        assert fragment in message


@pytest.mark.parametrize("text, match", [
    ("split: [", r"not valid YAML"),                    # syntax error
    ("- 1\n- 2\n", r"must be a mapping"),               # not a mapping
    ("score: 3\n", r"`score` must be a mapping"),       # section not a mapping
])
def test_bad_params_file(tmp_path, text, match):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=match):
        load_section("score", path)


def test_missing_params_file(tmp_path):
    with pytest.raises(InputError, match="params.yaml not found"):
        load_section("score", tmp_path / "params.yaml")


def test_docs_params_tables_are_the_generated_ones():
    """docs/params.md's tables come from the settings classes (default and doc of each field): a stale row,
    a missing param or an edited default shows here. Fix: `python -m stages.params_doc`."""
    from stages.params_doc import render, table

    text = (ROOT / "docs" / "params.md").read_text(encoding="utf-8")
    assert render(text) == text, "docs/params.md's tables are stale: run `python -m stages.params_doc`"
    for section in SECTIONS:
        assert table(section_class(section)) in text
    stale = text.replace("| `seed` | `0` |", "| `seed` | `1` |", 1)
    assert stale != text and render(stale) == text  # a hand edit inside a table is undone


def test_docs_tables_show_each_default_as_params_yaml_writes_it():
    from recallk.score.settings import ScoreSettings
    from stages.params_doc import table

    rows = table(ScoreSettings).splitlines()
    assert "| `ks` | `[1, 5, 10]` |" in rows[2] and any(r.startswith("| `embedding_copies.min_cosine` | `null` |")
                                                       for r in rows)
