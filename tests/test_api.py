"""The public API (recallk/__init__.py): ``__all__``, the lazy attribute table and the ``TYPE_CHECKING`` block
agree (evaluate() in recallk/evaluation.py: tests/test_evaluation.py)."""

from __future__ import annotations

import ast
import importlib
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
