"""encode.device / encode.dtype / encode.reproducible: resolution rules, torch's switches, fingerprint fields."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from extras import extra
from recallk.encode import device as dev
from recallk.errors import InputError

CPU_ONLY = dev.Machine(cuda_available=False, torch="2.14.1+cpu", cuda=None)
CUDA_BUILD_NO_GPU = dev.Machine(cuda_available=False, torch="2.14.1+cu130", cuda="13.0")
GPU = dev.Machine(cuda_available=True, torch="2.14.1+cu130", cuda="13.0", cudnn=92400, gpu="NVIDIA H200")


@pytest.mark.parametrize("request_, found, expected", [
    ("auto", CPU_ONLY, "cpu"),  # no CUDA: auto falls back to the CPU
    ("auto", CUDA_BUILD_NO_GPU, "cpu"),  # a CUDA build without a GPU is still a CPU machine
    ("auto", GPU, "cuda"),  # a GPU is used when there is one
    ("cpu", GPU, "cpu"),  # cpu is honoured on a GPU machine
    ("cuda", GPU, "cuda"),
])
def test_device_resolution(request_, found, expected):
    assert dev.resolve(request_, "float32", True, found=found).device == expected


@pytest.mark.parametrize("found, fragment", [
    (CPU_ONLY, "a CPU-only build"),  # names the torch build the user has
    (CUDA_BUILD_NO_GPU, "a CUDA 13.0 build"),
])
def test_cuda_without_a_gpu_is_one_clear_error(found, fragment):
    with pytest.raises(InputError, match=rf"`encode.device: cuda` but torch 2\.14\.1.*{fragment}.*sees no CUDA "
                                         r"device; set `encode.device: auto` or `cpu`"):
        dev.resolve("cuda", "float32", True, found=found)


@pytest.mark.parametrize("request_", ["cpu", "auto"])  # explicit cpu, and auto on a machine without CUDA
def test_float16_on_cpu_is_refused(request_):
    with pytest.raises(InputError, match=rf"`encode.dtype: float16` needs a GPU but `encode.device: {request_}`"):
        dev.resolve(request_, "float16", True, found=CPU_ONLY)


@pytest.mark.parametrize("request_, dtype, found", [
    ("cpu", "bfloat16", CPU_ONLY),  # bfloat16 has CPU kernels
    ("cuda", "float16", GPU),
    ("auto", "float16", GPU),
])
def test_dtypes_allowed(request_, dtype, found):
    assert dev.resolve(request_, dtype, False, found=found).dtype == dtype


@pytest.mark.parametrize("request_, dtype, fragment", [
    ("gpu", "float32", r"`encode.device` must be one of auto, cpu, cuda. Got 'gpu' instead."),
    ("cpu", "fp16", r"`encode.dtype` must be one of float32, float16, bfloat16. Got 'fp16' instead."),
])
def test_unknown_values(request_, dtype, fragment):
    with pytest.raises(InputError, match=fragment):
        dev.resolve(request_, dtype, True, found=GPU)


@pytest.fixture
def torch():
    """The torch module: the tests that take it are skipped without the torch extra."""
    return extra("torch", "torch")


def test_machine_reads_torch(torch, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    found = dev.machine()
    assert found == dev.Machine(cuda_available=False, torch=torch.__version__, cuda=torch.version.cuda)
    assert dev.resolve("auto", found=found).device == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Fake GPU")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91000)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    found = dev.machine()
    assert (found.cuda_available, found.gpu, found.cudnn) == (True, "Fake GPU", 91000)
    assert dev.resolve("auto", found=found).device == "cuda"


def test_cpu_fingerprint_fields_do_not_depend_on_batch_size():
    cpu = dev.resolve("cpu", found=GPU)
    one = dev.runtime_options(cpu, GPU, batch_size=1, flags={"tf32_cudnn": True})
    assert one == dev.runtime_options(cpu, GPU, batch_size=64, flags={"tf32_cudnn": False})
    assert one == {"device": "cpu", "dtype": "float32", "torch": "2.14.1+cu130", "intra_op_threads": 1}


def test_cuda_fingerprint_fields():
    cuda = dev.resolve("cuda", "bfloat16", True, found=GPU)
    flags = {"tf32_matmul": False, "deterministic_algorithms": True}
    fields = dev.runtime_options(cuda, GPU, batch_size=7, flags=flags)
    assert fields == {"device": "cuda", "dtype": "bfloat16", "torch": "2.14.1+cu130", "batch_size": 7, "cuda": "13.0",
                      "cudnn": 92400, "gpu": "NVIDIA H200", "reproducible": True,
                      "flags": {"deterministic_algorithms": True, "tf32_matmul": False}}
    # every field that changes GPU results changes the fields (and so the cache key)
    assert dev.runtime_options(cuda, GPU, batch_size=64, flags=flags) != fields
    assert dev.runtime_options(cuda, GPU, batch_size=7, flags={**flags, "tf32_matmul": True}) != fields
    other = dev.Machine(cuda_available=True, torch="2.14.1+cu130", cuda="13.0", cudnn=91000, gpu="NVIDIA H200")
    assert dev.runtime_options(cuda, other, batch_size=7, flags=flags) != fields


@pytest.fixture
def torch_switches(torch):
    """Restore torch's global switches after a test that sets them."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[1], saved[2]
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[3], saved[4]


def test_reproducible_mode_sets_torch_switches(torch, torch_switches, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.backends.cudnn.benchmark = True
    before = dev.current_flags()
    dev.apply_flags(dev.Runtime("cpu", "float32", True))  # CPU: nothing to set
    assert dev.current_flags() == before
    dev.apply_flags(dev.Runtime("cuda", "float32", False))  # not reproducible: torch's settings are left alone
    assert dev.current_flags() == before
    dev.apply_flags(dev.Runtime("cuda", "float32", True))
    flags = dev.current_flags()
    assert flags["deterministic_algorithms"] and flags["cudnn_deterministic"] and not flags["cudnn_benchmark"]
    assert flags["tf32_matmul"] is False and flags["tf32_cudnn"] is False  # TF32 off, read back through torch
    assert flags["fp32_precision_matmul"] == "ieee"  # torch's newer API reads the matmul switch the same way
    assert flags["cublas_workspace"] == dev.CUBLAS_WORKSPACE


# --- through the registry and the params --------------------------------------------------------------------

def test_cpu_cache_key_is_shared_across_batch_sizes_and_kept_from_before(torch, monkeypatch):
    from recallk.encode.registry import get_backbone

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # auto resolves to cpu
    keys = {get_backbone("efficientnet_lite0", runtime=dev.Request(device=d, batch_size=b)).fingerprint
            for d, b in [("cpu", 1), ("cpu", 64), ("auto", 7)]}
    assert keys == {get_backbone("efficientnet_lite0").fingerprint}  # no request: the same CPU float32 key


def test_bfloat16_on_cpu_runs_and_has_its_own_key(torch):
    from recallk.encode.registry import get_backbone

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (64, 80, 3), dtype=np.uint8)) for _ in range(2)]
    full = get_backbone("efficientnet_lite0", runtime=dev.Request(device="cpu"))
    half = get_backbone("efficientnet_lite0", runtime=dev.Request(device="cpu", dtype="bfloat16"))
    assert half.fingerprint != full.fingerprint
    a, b = full.encode(images), half.encode(images)
    assert b.dtype == np.float32 and b.shape == a.shape == (2, 1280)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert (cos > 0.99).all() and not np.array_equal(a, b)  # bfloat16's ~3 significant digits


@pytest.mark.parametrize("key, value, fragment", [
    ("device", "gpu", r"`encode.device` must be one of"),  # a typo of cuda
    ("dtype", "half", r"`encode.dtype` must be one of"),
    ("reproducible", "yes", r"`encode.reproducible` must be true or false"),
])
def test_params_are_checked(key, value, fragment):
    from stages.params import validate_section

    with pytest.raises(InputError, match=fragment):
        validate_section({"encode": {key: value}}, "encode")
    assert validate_section({"encode": {}}, "encode")[key] == {"device": "auto", "dtype": "float32",
                                                               "reproducible": True}[key]


def test_cuda_branch_encodes_whole_batches(torch, monkeypatch):
    """The CUDA branch of image_encoder (one forward per batch, outputs back as float32 rows), with the
    host-to-device copy redirected to the CPU, as this machine has no GPU: bench/gpu_check.py is the real check."""
    from recallk.encode.backbones import torch_common as tc

    to = torch.Tensor.to

    def to_cpu(self, *args, **kwargs):
        if kwargs.get("device") == "cuda":
            kwargs["device"] = "cpu"
        return to(self, *args, **kwargs)

    calls = []
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 5)).eval()

    def forward(x):
        calls.append(len(x))
        return net(x)

    def transform(img):
        return torch.from_numpy(np.asarray(img.resize((8, 8)), dtype=np.float32).transpose(2, 0, 1).copy())

    images = [Image.new("RGB", (10, 10), (20 * i, 5, 7)) for i in range(5)]
    want = tc.image_encoder(transform, net, 5)(images)  # the CPU: per image
    monkeypatch.setattr(torch.Tensor, "to", to_cpu)
    encode = tc.image_encoder(transform, forward, 5, placement=tc.Placement(dev.Runtime("cuda", "float32", True), {}))
    got = encode(images)
    assert calls == [5] and got.shape == (5, 5) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # batched: equal to float tolerance only
    assert encode([]).shape == (0, 5)
