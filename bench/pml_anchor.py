"""pytorch-metric-learning's ``AccuracyCalculator`` as an anchor of ``bench/score_bench.py``, in its own child.

``AccuracyCalculator(k="max_bin_count")`` computes precision@1, R-precision and MAP@R
from the k nearest neighbours of each query (k = the largest label count, so every
query's R positives fit), found by its default ``FaissKNN`` (L2 on the rows given: unit
rows here, so the cosine order) in float32, with faiss's order among equal scores; the
leave-one-out case passes no reference, so each query's own row is left out. The
engine's suite gives the same three metrics exactly (precision@K at K = 1). Skipped,
with a note, when pytorch-metric-learning is not importable.
"""

from __future__ import annotations

import importlib.util

import numpy as np

#: AccuracyCalculator's names for the metrics, and the engine's.
KEYS = {"precision_at_1": "precision@1", "r_precision": "r_precision", "mean_average_precision_at_r": "map@r"}
SKIP_NOTE = "skipped: pytorch-metric-learning is not importable (pip install pytorch-metric-learning)"


def available() -> bool:
    """Whether the children can import pytorch-metric-learning (they share this interpreter and its path)."""
    return importlib.util.find_spec("pytorch_metric_learning") is not None


#: With k = None (the whole gallery ranked): full mean average precision too.
FULL_KEYS = {**KEYS, "mean_average_precision": "map"}


def calculator(full: bool = False):
    """The calculator of the three metrics, k = the largest label count; ``full``: k = None (every gallery
    item a neighbour) and full mAP as well."""
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    return AccuracyCalculator(include=tuple(FULL_KEYS if full else KEYS), k=None if full else "max_bin_count")


def pml_metrics(calc, q_unit: np.ndarray, g_unit: np.ndarray, ql: np.ndarray, gl: np.ndarray, loo: bool,
                full: bool = False) -> dict:
    """The metrics of unit rows, keyed as the engine keys them; ``loo``: the queries are the gallery."""
    import torch
    q, qlab = torch.from_numpy(q_unit), torch.from_numpy(ql)
    acc = calc.get_accuracy(q, qlab) if loo else \
        calc.get_accuracy(q, qlab, torch.from_numpy(g_unit), torch.from_numpy(gl), ref_includes_query=False)
    return {ours: float(acc[theirs]) for theirs, ours in (FULL_KEYS if full else KEYS).items()}


def fmt(info: dict) -> str:
    """The three metrics of a result, for a table row."""
    return f"P@1 {info['precision@1']:.4f} RP {info['r_precision']:.4f} MAP@R {info['map@r']:.4f}"


def compare(suite: dict, pml: dict, name: str = "engine suite", anchor: str = "pml",
            targets: tuple[float, float] | None = None, keys: dict = KEYS) -> list[str]:
    """Lines comparing an engine run with the anchor: time and memory ratios (against ``targets``, time and
    memory, if given) and whether the metrics agree."""
    lines = []

    def verdict(ratio: float, target: float | None) -> str:
        return "no target" if target is None else f"target <= {target:.2f}x: {'MET' if ratio <= target else 'MISSED'}"

    if "seconds" in suite and "seconds" in pml:
        ratio = suite["seconds"] / pml["seconds"]
        lines.append(f"  {name}/{anchor} = {ratio:5.2f}x time ({verdict(ratio, targets and targets[0])}; the same "
                     "metrics, exact vs float32 k-NN)")
    if suite.get("extra_bytes", 0) > 0 and pml.get("extra_bytes", 0) > 0:
        ratio = suite["extra_bytes"] / pml["extra_bytes"]
        lines.append(f"  {name}/{anchor} = {ratio:5.2f}x memory ({verdict(ratio, targets and targets[1])}; "
                     f"{suite['extra_bytes'] / 2**20:.0f} MB vs {pml['extra_bytes'] / 2**20:.0f} MB)")
    if "info" in suite and "info" in pml and all(k in suite["info"] for k in keys.values()):
        gap = max(abs(suite["info"][k] - pml["info"][k]) for k in keys.values())
        shown = " ".join(f"{k} {suite['info'][k]:.4f}/{pml['info'][k]:.4f}" for k in keys.values())
        lines.append(f"  {anchor} metrics agree with {name}: {'yes' if gap <= 1e-6 else 'no'} (largest difference "
                     f"{gap:.1e}; {name}/{anchor}: {shown})")
    return lines
