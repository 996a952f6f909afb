"""The embedding check of ``score.embedding_copies.min_cosine``: queries with a near copy in the gallery.

After encode, a query whose retrievable gallery items include another image (another image_id)
at cosine >= ``min_cosine`` is *flagged*: the backbone sees a near copy of it, whatever the pixels
or the split stage's pHash said. From each query's exact top items (:func:`recallk.score.ranking.neighbors.top_k`:
the self-match and ``exclude_same`` items are never among them), the pairs above the threshold are
listed, and every metric is also reported over the unflagged queries alone
(``<key>_without_embedding_copies``), so the effect of the copies on the number is visible.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from recallk.score.retrieval_data import RetrievalData
from recallk.stats import mean

SUFFIX = "_without_embedding_copies"
#: The ``min_cosine`` docs/leakage.md suggests: near-exact copies only. Measured on the ``pixels`` backbone
#: (tests/data/test_false_alarms.py): planted copies (rescaled to 3/4, JPEG 70) reach 0.9992 and above, while
#: clean renderings of one symbol in other fonts and colours reach 0.9975; on real vendor emoji 0.99 flagged
#: 41 of 600 queries, none a copy.
SUGGESTED_MIN_COSINE = 0.999
COLUMNS = ["image_id", "label", "rank", "gallery_id", "gallery_label", "cosine"]


def flagged_pairs(cols: np.ndarray, scores: np.ndarray, data: RetrievalData, min_cosine: float) -> pd.DataFrame:
    """The (query, gallery item) pairs among each query's top items with cosine >= ``min_cosine``, in query
    order, then rank (``cols``/``scores``: :func:`~recallk.score.ranking.neighbors.top_k`'s output for
    ``data``, whose ids and labels the pairs name)."""
    queries, q_labels, gallery, g_labels = data.query_ids, data.query_labels, data.gallery_ids, data.gallery_labels
    hit = (cols >= 0) & (np.nan_to_num(scores, nan=-np.inf) >= np.float32(min_cosine))
    line, rank = np.nonzero(hit)
    g = cols[line, rank]
    return pd.DataFrame({"image_id": np.asarray(queries)[line], "label": np.asarray(q_labels)[line],
                         "rank": rank + 1, "gallery_id": np.asarray(gallery)[g],
                         "gallery_label": np.asarray(g_labels)[g],
                         "cosine": scores[line, rank].astype(np.float64)}, columns=COLUMNS)


def empty_pairs() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})


def without(values: dict[str, np.ndarray], flagged: np.ndarray, keys: Sequence[str]) -> dict[str, float | None]:
    """Each metric's mean over the queries that are not flagged (None when none is left)."""
    out: dict[str, float | None] = {}
    for key in keys:
        m = mean(np.asarray(values[key])[~flagged])
        out[f"{key}{SUFFIX}"] = None if math.isnan(m) else m
    return out
