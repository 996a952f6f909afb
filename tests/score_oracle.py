"""The score oracle shared by the score-table tests (importable as ``score_oracle``, beside ``helpers``):
brute-force metrics one query at a time and the eval sets of a scored project (the settings of the
score-table projects that ``conftest.py`` builds are in ``helpers``: ``UNEVEN_PER_LABEL``, ``CAMERAS``)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import CATALOG, EMBEDDINGS, IDS, PER_QUERY, SPLIT
from recallk.score.metrics import metric_keys
from recallk.score.similarity import cosine_block, l2_normalize

#: The committed ``score.ks`` and metric keys (params.yaml).
KS = [1, 5, 10]
METRIC_KEYS = metric_keys(["recall", "precision", "r_precision", "map@r", "map", "mrr"], KS)


def read_per_query(project: Path) -> pd.DataFrame:
    return pd.read_csv(project / PER_QUERY, dtype={"image_id": str, "label": str})


def eval_sets(project: Path) -> dict:
    """Queries and gallery as the score stage sees them (split order), with their embeddings and catalog rows."""
    split = pd.read_csv(project / SPLIT, dtype={"image_id": str})
    cat = pd.read_csv(project / CATALOG, dtype=str, keep_default_na=False).set_index("image_id")
    emb = np.load(project / EMBEDDINGS)
    row = {i: n for n, i in enumerate(np.load(project / IDS).astype(str))}
    q = split.loc[split["query"], "image_id"].tolist()
    g = split.loc[split["gallery"], "image_id"].tolist()
    train = split.loc[split["split"].eq("train") & ~split["query"] & ~split["gallery"], "image_id"].tolist()
    return {"q": q, "g": g, "train": train, "cat": cat, "emb": emb, "row": row,
            "q_emb": emb[[row[i] for i in q]], "g_emb": emb[[row[i] for i in g]],
            "q_lab": cat.loc[q, "label"].to_numpy(), "g_lab": cat.loc[g, "label"].to_numpy()}


def oracle(q_emb, g_emb, q_lab, g_lab, q_ids, g_ids, ks, exclude=()):
    """Brute force, one query at a time, straight from the formulas in the recallk.score.metrics docstring.

    ``exclude``: (query values, gallery values) pairs; a shared non-missing value hides the item.
    Returns per-query arrays: n_pos, n_ret, first (1-based, 0 = none), first_opp, and values by metric key.
    """
    sims = cosine_block(l2_normalize(np.asarray(q_emb)), l2_normalize(np.asarray(g_emb)).T)
    q_lab, g_lab = np.asarray(q_lab, dtype=str), np.asarray(g_lab, dtype=str)
    g_ids = np.asarray(g_ids, dtype=object)
    n = len(q_ids)
    out = {"n_pos": np.zeros(n, int), "n_ret": np.zeros(n, int), "first": np.zeros(n, int),
           "first_opp": np.zeros(n, int)}
    values = {k: np.full(n, np.nan) for k in metric_keys(["recall", "precision", "r_precision", "map@r", "map",
                                                           "mrr"], ks)}
    for i in range(n):
        allowed = g_ids != q_ids[i]
        for qv, gv in exclude:
            v = qv[i]
            if v is not None and v == v and v != "":
                allowed &= np.asarray([w != v for w in gv])
        idx = np.flatnonzero(allowed)
        s = sims[i, idx]
        order = idx[np.lexsort((idx, -s))]            # descending similarity, smaller gallery index first
        order_opp = idx[np.lexsort((-idx, -s))]       # the other tie rule
        r = np.flatnonzero(g_lab[order] == q_lab[i]) + 1.0
        M, R = idx.size, r.size
        out["n_ret"][i], out["n_pos"][i] = M, R
        if R == 0:
            continue
        out["first"][i] = int(r[0])
        out["first_opp"][i] = int(np.flatnonzero(g_lab[order_opp] == q_lab[i])[0]) + 1
        j = np.arange(1, R + 1)
        for k in ks:
            values[f"recall@{k}"][i] = float(r[0] <= k)
            values[f"precision@{k}"][i] = np.count_nonzero(r <= k) / min(k, M)
        values["r_precision"][i] = np.count_nonzero(r <= R) / R
        values["map@r"][i] = math.fsum((j / r)[r <= R]) / R
        values["map"][i] = math.fsum(j / r) / R
        values["mrr"][i] = 1.0 / r[0]
    out["values"] = values
    return out


def fmean(values) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return math.fsum(kept) / len(kept)


def approx(x, rel=1e-9):
    return pytest.approx(x, rel=rel, abs=1e-12)
