"""The layer every torch backbone shares (recallk.encode.backbones.torch_common): weights sources, reading,
strict loading, the per-image loop, the runtime fingerprint; and the params that name weights."""

from __future__ import annotations

import pytest

from extras import extra
from recallk.encode.base import NO_FILE
from recallk.errors import InputError
from stages.params import validate_section

extra("torch", "torch")  # without it, this file is skipped
import torch
from torchvision import transforms

from recallk.encode.backbones import state_dicts as sd
from recallk.encode.backbones import torch_common as tc
from torch_helpers import save_state_dict


def test_resolve_weights_file_folder_and_none(tmp_path):
    assert tc.resolve_weights(None, param="p", config_name="config.json") is None
    assert tc.resolve_weights(NO_FILE, param="p", config_name="config.json") is None  # the placeholder
    file = save_state_dict({"w": torch.ones(2)}, tmp_path / "w.pt")
    assert tc.resolve_weights(str(file), param="p", config_name="config.json") == tc.WeightsSource(file=file)
    folder = tmp_path / "f"
    save_state_dict({"w": torch.ones(2)}, folder / "pytorch_model.bin")
    save_state_dict({"w": torch.ones(2)}, folder / "model.safetensors")  # preferred over the .bin
    (folder / "config.json").write_text("{}")
    for value in (str(folder), f"local-dir:{folder}"):
        got = tc.resolve_weights(value, param="p", config_name="config.json")
        assert got == tc.WeightsSource(file=folder / "model.safetensors", folder=folder, config=folder / "config.json")
    with pytest.raises(InputError, match=r"`p: local-dir:nothere` names no folder"):
        tc.resolve_weights("local-dir:nothere", param="p", config_name="config.json")


def test_folder_fingerprint_covers_its_config(tmp_path):
    folder = tmp_path / "f"
    save_state_dict({"w": torch.ones(2)}, folder / "model.safetensors")
    (folder / "config.json").write_text('{"mean": 0.5}')
    first = tc.resolve_weights(str(folder), param="p", config_name="config.json").fingerprint()
    (folder / "config.json").write_text('{"mean": 0.4}')
    second = tc.resolve_weights(str(folder), param="p", config_name="config.json").fingerprint()
    assert first["weights_sha256"] == second["weights_sha256"] and first["config_sha256"] != second["config_sha256"]


def test_training_checkpoint_gives_its_state_dict(tmp_path):
    path = tmp_path / "ckpt.pth"
    torch.save({"state_dict": {"w": torch.arange(3.0)}, "epoch": 7}, path)
    assert torch.equal(sd.load_state_dict_file(path)["w"], torch.arange(3.0))
    torch.save([torch.ones(1)], tmp_path / "list.pth")
    with pytest.raises(InputError, match=r"'.*list\.pth' is not a state dict"):
        sd.load_state_dict_file(tmp_path / "list.pth")


def test_strict_load_lists_are_bounded():
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(12)])
    with pytest.raises(InputError, match=r"'x' does not fit the model \(24 missing key\(s\): 0\.weight, 0\.bias, .*"
                                         r"\.\.\. and 16 more; 1 unexpected key\(s\): other\)"):
        sd.strict_load(model, {"other": torch.ones(1)}, "'x'")
    state = {k: v + 1 for k, v in model.state_dict().items()}
    sd.strict_load(model, state, "'x'")  # exact: loads
    assert torch.equal(model[0].weight, state["0.weight"])


@pytest.mark.parametrize("workers", [1, 3])  # the thread count changes nothing
def test_per_image_rows_follow_the_items(workers):
    layer, threads = torch.nn.Linear(4, 3), torch.get_num_threads()
    items = [torch.randn(1, 4) for _ in range(5)]
    rows = tc.per_image(layer, items, dim=3, workers=workers)
    assert rows.shape == (5, 3) and not rows.requires_grad
    for i, x in enumerate(items):
        with torch.no_grad():
            torch.testing.assert_close(rows[i], layer(x)[0], rtol=0, atol=1e-6)
    assert tc.per_image(layer, [], dim=3).shape == (0, 3)
    assert torch.get_num_threads() == threads  # one intra-op thread while it ran, restored after


@pytest.mark.parametrize("transform, side", [
    (transforms.Compose([transforms.Resize(168), transforms.CenterCrop(160)]), 168),  # shorter side
    (transforms.Compose([transforms.Resize((40, 60)), transforms.ToTensor()]), 60),  # squash: both sides >= 60
    (transforms.Compose([transforms.CenterCrop(10), transforms.Resize(20)]), None),  # crop first: full decode
    (transforms.Compose([transforms.Resize(20, max_size=30)]), 20),  # int size, max_size only shrinks the longer
    (lambda img: img, None),  # not a Compose
])
def test_resize_side(transform, side):
    assert tc.resize_side(transform) == side


def test_runtime_fingerprint_fields():
    fp = tc.runtime_fingerprint("torchvision")
    assert fp["torch"] == torch.__version__ and set(fp) >= {"torchvision", "device", "dtype", "intra_op_threads"}
    assert (fp["device"], fp["dtype"]) == ("cpu", "float32")


@pytest.mark.parametrize("key, value, match", [
    ("timm", {"weights": None}, r"`encode\.timm\.weights` must be a path: .*DVC cannot track null"),  # null
    # DVC would look for a file named "local-dir:w": the folder itself is the value
    ("timm", {"weights": "local-dir:w"}, r"`encode\.timm\.weights` is a path DVC tracks.*write the folder itself, 'w'"),
    ("open_clip", {"weights": NO_FILE, "tag": 3}, r"`encode\.open_clip\.tag` must be a non-empty string"),
])
def test_weights_params(key, value, match):
    with pytest.raises(InputError, match=match):
        validate_section({"encode": {key: value}}, "encode")
    defaults = validate_section({"encode": {}}, "encode")
    assert defaults["timm"] == {"weights": NO_FILE} and defaults["open_clip"] == {"weights": NO_FILE, "tag": None}
