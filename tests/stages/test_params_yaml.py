"""params.yaml: the stages read what DVC records. Values YAML 1.1 (PyYAML) and YAML 1.2 (DVC) read
differently, and repeated keys, are refused with the line and the fix."""

from __future__ import annotations

import pytest
import yaml

from helpers import ROOT
from recallk.errors import InputError
from stages.params import load_section

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
