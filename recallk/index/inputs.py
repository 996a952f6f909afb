"""The two inputs of :func:`recallk.index.sweep.score_index` from a
:class:`~recallk.score.retrieval_data.RetrievalData`:
the problem as an index sees it (:func:`problem_of`) and, for the Python API, tests and benches, the exact run
computed in memory as the score stage writes it (:func:`exact_run`; the stage reads the score stage's files
instead, :func:`exact_from_tables`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from recallk.checks import check_exclude_columns
from recallk.errors import InputError
from recallk.index.sweep import Exact, IndexProblem
from recallk.score.exclusion import exclusion_pairs
from recallk.score.metrics import rank
from recallk.score.ranking.neighbors import top_k
from recallk.score.ranking.problem import code_columns, own_rows
from recallk.score.registry import metric_keys
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import ScoreSettings
from recallk.score.similarity import l2_normalize
from recallk.score.suite import SplitSets
from recallk.score.values import per_query
from recallk.score.whitening import pca_whitening
from recallk.tables_contract import per_query_column


def problem_of(data: RetrievalData, train: np.ndarray | None = None) -> IndexProblem:
    """The unit rows, label codes, own rows and exclusion codes of ``data`` (``train``: raw training rows)."""
    q_codes, g_codes = code_columns(np.asarray(data.query_labels), np.asarray(data.gallery_labels))
    own = (own_rows(np.asarray(data.query_ids), np.asarray(data.gallery_ids)) if data.query_ids is not None
           else np.full(data.n_queries, -1, dtype=np.int64))
    exclude = [tuple(code_columns(qv, gv, missing=True)) for qv, gv in data.exclude]
    dim = data.gallery_emb.shape[1]
    rows = l2_normalize(train) if train is not None and len(train) else np.empty((0, dim), dtype=np.float32)
    return IndexProblem(l2_normalize(data.query_emb), l2_normalize(data.gallery_emb), rows, q_codes, g_codes, own,
                        exclude)


def exact_run(data: RetrievalData, score: ScoreSettings) -> Exact:
    """The exact run of ``data`` under ``score`` (its metrics at its ks), as the score stage's per-query table
    (full values, as its CSV holds them) and top ``max(ks)`` neighbours."""
    ranking = rank(data, score)
    values = per_query(ranking, score)
    ids = data.query_ids if data.query_ids is not None else np.arange(data.n_queries)
    table = pd.DataFrame({"image_id": [str(i) for i in ids], "label": [str(v) for v in data.query_labels],
                          "num_positives": ranking.n_positives, "num_retrievable": ranking.n_retrievable})
    for key in metric_keys(score.metrics, score.ks):
        table[per_query_column(key)] = values[key]
    rows, scores = top_k(data, score.depth, score.max_memory_mb)
    return Exact(table, rows, scores)


def exact_from_tables(per_query_table: pd.DataFrame, neighbors: pd.DataFrame, queries: Sequence[str],
                      gallery: Sequence[str], depth: int, source: str) -> Exact:
    """The exact run from the score stage's ``per_query.csv`` and ``neighbors.csv`` (read as text), aligned to
    ``queries`` and ``gallery`` (image_ids in the split's order); InputError when they do not match them."""
    table = per_query_table.copy()
    table["image_id"] = table["image_id"].astype(str)
    if sorted(table["image_id"]) != sorted(map(str, queries)):
        raise InputError(f"{source} scores other queries than the split holds; re-run score (`dvc repro score`).")
    table = table.set_index("image_id").loc[[str(q) for q in queries]].reset_index()
    for column in ("num_positives", "num_retrievable"):
        table[column] = pd.to_numeric(table[column]).astype(np.int64)
    row_of_query = {str(q): i for i, q in enumerate(queries)}
    row_of_item = {str(g): j for j, g in enumerate(gallery)}
    rows = np.full((len(queries), depth), -1, dtype=np.int64)
    scores = np.full((len(queries), depth), np.nan, dtype=np.float32)
    try:
        q = neighbors["image_id"].astype(str).map(row_of_query).to_numpy()
        g = neighbors["gallery_id"].astype(str).map(row_of_item).to_numpy()
        r = pd.to_numeric(neighbors["rank"]).to_numpy(dtype=np.int64) - 1
    except (KeyError, ValueError) as exc:
        raise InputError(f"the score stage's neighbours table is not readable ({exc}); re-run score.") from None
    ok = ~(pd.isna(q) | pd.isna(g)) & (r >= 0) & (r < depth)
    if not ok.all():
        raise InputError("the score stage's neighbours table names images the split does not hold; re-run score "
                         "(`dvc repro score`).")
    rows[q.astype(np.int64), r] = g.astype(np.int64)
    scores[q.astype(np.int64), r] = pd.to_numeric(neighbors["score"]).to_numpy(dtype=np.float32)
    return Exact(table, rows, scores)


def problem_from_split(sets: SplitSets, catalog: pd.DataFrame, score: ScoreSettings) -> IndexProblem:
    """The problem of a split's queries and gallery as the score stage scores them (the same whitening, ids and
    exclusion rules: ``score.exclude_same``, ``exclude_same_all`` and ``junk``), with the train split's rows for
    training (empty when it has none)."""
    check_exclude_columns(score.exclude_same, list(catalog.columns), name="score.exclude_same")
    queries, gallery, train = sets.queries, sets.gallery, sets.train
    q, g = sets.embeddings(queries), sets.embeddings(gallery)
    t = sets.embeddings(train) if train.size else np.empty((0, q.shape[1]), dtype=q.dtype)
    if score.whiten == "pca":  # as the score stage: fitted on the train split (which it checked has 2 or more)
        q, g, t = pca_whitening(t, q, g, t)
    labels = catalog["label"]
    exclude = exclusion_pairs(catalog, queries, gallery, score, sets.same_set)
    data = RetrievalData(q, g, labels[queries].to_numpy(), labels[gallery].to_numpy(), query_ids=queries,
                         gallery_ids=gallery, exclude=exclude, same_set=sets.same_set)
    return problem_of(data, t)
