"""recallk.encode.backbones.state_dicts, the weights loader (issue 25's hostile corpus): weights of another
dtype or holding NaN/inf loaded without a word (``silent``); the loader wrapped its own InputError a second
time and would bury a missing extra's install line, a garbage ``.pth`` ended in a KeyError traceback, and a
hostile pickle was told "download it again" (``message`` / ``traceback``). Each case failed before."""

from __future__ import annotations

import os
import pickle
import sys

import pytest

from extras import extra
from recallk.errors import InputError, MissingExtraError

extra("torch", "torch")  # without it, this file is skipped
import torch

from recallk.encode.backbones import state_dicts as sd
from torch_helpers import save_state_dict


def model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))


def weights(**change: torch.Tensor) -> dict[str, torch.Tensor]:
    return {**{k: v.clone() for k, v in model().state_dict().items()}, **change}


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
@pytest.mark.parametrize("change, said", [
    # an int8 export into a float model: loaded (cast) without a word
    ({"0.weight": torch.ones(2, 3, dtype=torch.int8)}, r"1 key\(s\) of another dtype: 0\.weight torch\.int8 "
                                                         r"\(model: torch\.float32\)"),
    ({"0.weight": torch.full((2, 3), float("nan"))}, r"1 key\(s\) holding NaN or inf: 0\.weight"),   # all NaN
    ({"0.bias": torch.tensor([1.0, float("inf")])}, r"1 key\(s\) holding NaN or inf: 0\.bias"),      # sibling: inf
    ({"1.running_var": torch.tensor([1.0, float("nan")])}, r"NaN or inf: 1\.running_var"),  # sibling: a buffer
    ({"1.num_batches_tracked": torch.tensor(1.5)}, r"another dtype: 1\.num_batches_tracked torch\.float32"),  # int
    ({"0.weight": torch.ones(2, 3, dtype=torch.bool)}, r"another dtype: 0\.weight torch\.bool"),  # sibling: bool
], ids=["int8", "nan", "inf", "nan-buffer", "float-for-int", "bool"])
def test_weights_of_another_dtype_or_not_finite_are_refused(tmp_path, suffix, change, said):
    path = save_state_dict(weights(**change), tmp_path / f"w{suffix}")
    with pytest.raises(InputError, match=rf"weights file '.*w\{suffix}' cannot be used \(.*{said}"):
        sd.strict_load(model(), sd.load_state_dict_file(path), f"weights file {str(path)!r}")


def test_a_float16_export_still_loads(tmp_path):
    # not refused: a half-precision export of float weights loads into the float32 model (values cast)
    state = {k: (v.half() if v.is_floating_point() else v) for k, v in weights().items()}
    net = model()
    sd.strict_load(net, sd.load_state_dict_file(save_state_dict(state, tmp_path / "w.safetensors")), "'w'")
    assert net[0].weight.dtype == torch.float32


def test_a_damaged_safetensors_is_one_message_not_two(tmp_path):
    path = save_state_dict(weights(), tmp_path / "w.safetensors")
    path.write_bytes(path.read_bytes()[:30])  # cut short
    with pytest.raises(InputError) as info:
        sd.load_state_dict_file(path)
    assert str(info.value).count("cannot read weights file") == 1  # was wrapped again: "(InputError: cannot ...)"
    assert "InputError" not in str(info.value)


def test_a_missing_safetensors_keeps_the_install_line(tmp_path, monkeypatch):
    path = save_state_dict(weights(), tmp_path / "w.safetensors")
    monkeypatch.setitem(sys.modules, "safetensors", None)  # `import safetensors` raises ImportError
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(MissingExtraError, match=r"^weights file .* needs the timm extra: pip install -c "
                                                r"constraints\.txt -e '\.\[timm\]'"):
        sd.load_state_dict_file(path)


class Hostile:
    def __reduce__(self):
        return (os.system, ("echo never run",))


def test_a_hostile_pickle_is_not_told_to_download_again(tmp_path):
    path = tmp_path / "w.pth"
    path.write_bytes(pickle.dumps({"w": Hostile()}, protocol=2))  # a legacy (non-zip) pickle asking for os.system
    with pytest.raises(InputError, match=r"asks for Python objects besides tensors .* built to run code") as info:
        sd.load_state_dict_file(path)
    assert "download it again" not in str(info.value).lower()
    assert "weights_only=False) unless you trust its source" in str(info.value)


def test_a_garbage_pth_is_a_message_not_a_key_error(tmp_path):
    path = tmp_path / "w.pth"
    path.write_bytes(b"hello world, not a checkpoint")  # sibling: KeyError traceback from torch's unpickler
    with pytest.raises(InputError, match=r"cannot read weights file '.*w\.pth'"):
        sd.load_state_dict_file(path)
