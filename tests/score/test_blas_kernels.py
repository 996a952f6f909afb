"""The same metrics and rankings, byte for byte, under every OpenBLAS kernel the machine can run.

numpy's OpenBLAS picks its kernel for the CPU at import (``OPENBLAS_CORETYPE`` overrides it): an AMD EPYC
may get Haswell's, an Intel Xeon SkylakeX's, an older machine Sandybridge's (no FMA). Their float32
products differ in the last bits, and so would any engine that ranks by them; this one ranks by exact
similarities, the float32 scores only choosing candidates within a certified margin. Each kernel runs in
its own process (tests/score/blas_kernel_child.py): 8-bit quantised leave-one-out embeddings, duplicated
gallery rows and near-ties, at the default and a tight memory bound, K beyond the gallery.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from threadpoolctl import threadpool_info

from extras import has_extra

CHILD = Path(__file__).with_name("blas_kernel_child.py")
#: Kernels every x86-64 CPU with AVX2 runs (Prescott: SSE3 only, reported as Katmai), and SkylakeX's where the
#: CPU has AVX-512.
KERNELS = ["Prescott", "Sandybridge", "Haswell"]


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def _openblas() -> bool:
    return any(i["internal_api"] == "openblas" for i in threadpool_info() if i["user_api"] == "blas")


pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or not _openblas() or "avx2" not in _cpu_flags(),
    reason="the kernels are OpenBLAS's x86-64 ones: numpy here has another BLAS or CPU")


def _run(kernel: str, faiss: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "GOTO"))}
    env.update(OPENBLAS_CORETYPE=kernel, PYTHONWARNINGS="ignore")
    out = subprocess.run([sys.executable, str(CHILD)] + (["--faiss"] if faiss else []), env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("faiss", [False, pytest.param(True, marks=pytest.mark.skipif(
    not has_extra("faiss"), reason="needs the faiss extra (pip install -e '.[faiss]')"))])
def test_metrics_and_rankings_are_the_same_bytes_under_every_kernel(faiss):
    kernels = KERNELS + (["SkylakeX"] if "avx512f" in _cpu_flags() else [])
    runs = {kernel: _run(kernel, faiss) for kernel in kernels}
    # numpy's OpenBLAS, and FAISS's own, each switched kernel with every run (0.3.15 calls Prescott what
    # 0.3.31 calls Katmai)
    reported = {kernel: {path: arch for _, arch, path in run["blas"]} for kernel, run in runs.items()}
    libraries = set(reported[kernels[0]])
    assert len(libraries) == 1 + faiss and all(set(r) == libraries for r in reported.values()), reported
    for library in libraries:
        assert len({r[library] for r in reported.values()}) == len(kernels), f"not every kernel switched: {reported}"
    products = {run["products"] for run in runs.values()}
    assert len(products) > 1, "every kernel gave the same float32 products: the test would prove nothing"
    digests = {kernel: run["digests"] for kernel, run in runs.items()}
    first = digests[kernels[0]]
    assert len(first) == 6 + 3 * faiss
    for kernel in kernels[1:]:
        assert digests[kernel] == first, f"{kernel} ranks differently from {kernels[0]}"
