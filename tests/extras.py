"""The optional extras in the tests (importable as ``extras``, beside ``helpers``): a test, or a whole file, that
needs one is skipped where it is not installed (``pytest.importorskip``), so the core tests run with the base
install and the test tools alone; ``make test`` installs every extra and sets ``RECALLK_REQUIRE_EXTRAS=1``, under
which a missing one fails instead."""

from __future__ import annotations

import importlib
import os
from typing import Any

import pytest

#: Set by ``make test`` (which installs every extra): a missing extra fails its tests instead of skipping them.
REQUIRE_EXTRAS = os.environ.get("RECALLK_REQUIRE_EXTRAS", "") not in ("", "0")


def extra(module: str, name: str) -> Any:
    """``module`` of the ``name`` extra (pyproject.toml) for a test, or the test (or, at module level, the
    file) is skipped (``pytest.importorskip``) where it is not installed. Under ``RECALLK_REQUIRE_EXTRAS=1``
    (``make test``) a missing extra is an ImportError instead: the full environment never skips."""
    __tracebackhide__ = True  # a skip names the test file's line, not this one
    if REQUIRE_EXTRAS:
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"needs the {name} extra (pip install -e '.[{name}]')")


def has_extra(module: str) -> bool:
    """Whether ``module`` imports (always True under ``RECALLK_REQUIRE_EXTRAS=1``, where its tests must run):
    for a parameter list that leaves out what cannot run here, e.g. the faiss backend."""
    if REQUIRE_EXTRAS:
        return True
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


#: Set where a CUDA GPU must be used (the device machine's check): a test that needs one fails without it.
REQUIRE_GPU = os.environ.get("RECALLK_REQUIRE_GPU", "") not in ("", "0")


def need_cuda(torch: Any) -> None:
    """Skip the calling test where torch sees no CUDA GPU (CI has none; the CPU paths are tested there), or fail it
    under ``RECALLK_REQUIRE_GPU=1``, which the device machine's run sets: a GPU path is never skipped there."""
    __tracebackhide__ = True
    if torch.cuda.is_available():
        return
    if REQUIRE_GPU:
        pytest.fail("RECALLK_REQUIRE_GPU=1 but torch sees no CUDA GPU")
    pytest.skip("needs a CUDA GPU (RECALLK_REQUIRE_GPU=1 on the device machine makes this a failure)")
