"""The public API (recallk/__init__.py): ``__all__``, the lazy attribute table and the ``TYPE_CHECKING`` block
agree (evaluate() in recallk/evaluation.py: tests/test_evaluation.py)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import recallk


def test_the_api_is_named_once_for_run_time_and_for_static_tools() -> None:
    """``__all__`` (written out for IDEs), the lazy table and the ``TYPE_CHECKING`` imports name the same API,
    and each name resolves to the object its module defines."""
    tree = ast.parse(Path(recallk.__file__).read_text(encoding="utf-8"))
    checked = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.If)
               for s in n.body if isinstance(s, ast.ImportFrom) for a in s.names}
    assert recallk.__all__ == sorted(recallk._API) == sorted(checked)
    for name, module in recallk._API.items():
        assert getattr(recallk, name) is getattr(importlib.import_module(module), name)


#: Run with torch made unimportable (as on a numpy-only install): the API and the numpy engine work, torch is
#: never imported, and ``backend="torch"`` is one clear error naming the extra.
_WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # `import torch` now raises ImportError, as when it is not installed
import numpy as np
import recallk
from recallk.errors import MissingExtraError
emb, labels, ids = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]]), [0, 0, 1, 1], [0, 1, 2, 3]
print(float(recallk.recall_at_k(emb, emb, labels, labels, query_ids=ids, gallery_ids=ids, ks=[1])["recall@1"]))
print(recallk.first_positive_ranks(emb, emb, labels, labels, query_ids=ids, gallery_ids=ids)[0].tolist())
try:
    recallk.recall_at_k(emb, emb, labels, labels, query_ids=ids, gallery_ids=ids, ks=[1], backend="torch")
except MissingExtraError as e:
    print("refused:", e)
print("torch imported:", any(sys.modules.get(m) is not None for m in sys.modules if m.split(".")[0] == "torch"))
"""


def test_the_numpy_engine_needs_no_torch() -> None:
    """A numpy-only install (the extras' tests skip there): torch blocked in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1], check=True).stdout.splitlines()
    assert out[0] == "1.0"  # each row's nearest other row shares its label
    assert out[1] == "[0, 0, 0, 0]"
    assert out[2].startswith("refused: `backend: torch` needs the torch extra: pip install")
    assert out[3] == "torch imported: False"
