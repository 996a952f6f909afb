"""The committed default dataset is scikit-learn's digits, pixel for pixel."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from helpers import DIGITS
from recallk.digits import digit_images, main, write_digits
from recallk.errors import InputError


def test_committed_digits_match_scikit_learn():
    pixels, labels = digit_images()
    files = sorted(DIGITS.glob("*/*.png"))
    assert len(files) == 1797 == len(labels)
    for path in files:
        index = int(path.stem)
        assert path.parent.name == str(labels[index])  # folder name is the label
        np.testing.assert_array_equal(np.asarray(Image.open(path)), pixels[index])


def test_write_digits_recreates_the_dataset(tmp_path):
    assert write_digits(tmp_path) == 1797
    for rel in ("0/0000.png", "7/0017.png", "8/1796.png"):
        np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / rel)), np.asarray(Image.open(DIGITS / rel)))
    assert sorted(p.name for p in tmp_path.iterdir()) == [str(d) for d in range(10)]


def test_write_digits_leaves_nothing_when_a_write_fails(tmp_path, monkeypatch):
    """A failure half-way (here the 900th image) leaves no image and no temp folder (only the empty root)."""
    calls = {"n": 0}
    save = Image.Image.save

    def failing(self, fp, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 900:
            raise OSError(28, "No space left on device")
        return save(self, fp, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", failing)
    with pytest.raises(InputError, match="could not write"):
        write_digits(tmp_path / "digits")
    assert [p for p in tmp_path.rglob("*") if p.is_file() or p.name.endswith(".tmp")] == []
    assert calls["n"] == 900  # it failed where it was told to, after 899 images were written to temp folders


def test_the_command_reports_a_failed_write_in_one_line(tmp_path, capsys):
    """``python -m recallk.digits ROOT`` where ROOT is a file: one error line naming it, exit 2, no traceback."""
    blocker = tmp_path / "digits"
    blocker.write_text("not a folder")
    assert main([str(blocker)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: could not write ") and str(blocker) in err and "Traceback" not in err
    assert blocker.read_text() == "not a folder"
