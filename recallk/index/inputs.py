"""The two inputs of :func:`recallk.index.sweep.score_index` from a
:class:`~recallk.score.retrieval_data.RetrievalData`:
the problem as an index sees it (:func:`problem_of`) and, for the Python API, tests and benches, the exact run
computed in memory as the score stage writes it (:func:`exact_run`; the stage reads the score stage's files
instead, :func:`read_exact`, checked)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from recallk.checks import check_exclude_columns
from recallk.compare.sources import decode, read_table, record_lines
from recallk.errors import InputError, quote
from recallk.index.sweep import Exact, IndexProblem
from recallk.score.exclusion import exclusion_pairs
from recallk.score.metrics import rank
from recallk.score.ranking.problem import code_columns, own_rows
from recallk.score.registry import metric_keys
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import ScoreSettings
from recallk.score.similarity import l2_normalize
from recallk.score.suite import SplitSets, past_ties, tied_top_k
from recallk.score.tables import tie_end
from recallk.score.values import per_query
from recallk.score.whitening import pca_whitening
from recallk.tables_contract import metric_columns, per_query_column


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
    (full values, as its CSV holds them) and neighbours (top ``max(ks)``, past it while tied, and one more)."""
    ranking = rank(data, score)
    values = per_query(ranking, score)
    ids = data.query_ids if data.query_ids is not None else np.arange(data.n_queries)
    table = pd.DataFrame({"image_id": [str(i) for i in ids], "label": [str(v) for v in data.query_labels],
                          "num_positives": ranking.n_positives, "num_retrievable": ranking.n_retrievable})
    for key in metric_keys(score.metrics, score.ks):
        table[per_query_column(key)] = values[key]
    rows, scores = tied_top_k(data, score.depth, score.depth, score.max_memory_mb)
    rows = past_ties(rows, scores, score.depth)
    return Exact(table, rows, np.where(rows >= 0, scores, np.nan).astype(np.float32))


#: The fix every stale or damaged exact run names.
RESCORE = "re-run score (`dvc repro score`), then this stage"
#: The neighbours table's columns the index stage reads.
NEIGHBOR_COLUMNS = ("image_id", "rank", "gallery_id", "score")
#: How many failing rows a message names per rule.
MAX_ROWS = 5


def read_per_query(path: str, queries: Sequence[str], keys: Sequence[str]) -> pd.DataFrame:
    """The score stage's ``per_query.csv`` in the split's query order: task columns as integers, metric columns
    as float64 (the exact run's values the index stage pairs with).

    Parameters
    ----------
    path : str
        ``data/scores/per_query.csv``.
    queries : sequence of str
        The split's query image_ids, in its order.
    keys : sequence of str
        The metric keys the index stage pairs (:func:`recallk.score.registry.metric_keys`).

    Raises
    ------
    InputError
        Through ``recallk compare``'s contract (:func:`recallk.compare.sources.read_table`: the file, each bad
        column, its rule and CSV lines; a cut-short file named), a missing metric column, other queries.
    """
    per_query_csv = path
    table = read_table(file_bytes(per_query_csv), per_query_csv)
    missing = [per_query_column(k) for k in keys if per_query_column(k) not in table.columns]
    if missing:
        raise InputError(f"{per_query_csv} has no column {', '.join(missing)}, which score.ks and score.metrics ask "
                         f"for: it was scored under other settings; {RESCORE}.")
    table["image_id"] = table["image_id"].astype(str)
    if sorted(table["image_id"]) != sorted(map(str, queries)):
        other = sorted(set(table["image_id"]) ^ set(map(str, queries)))
        raise InputError(f"{per_query_csv} scores other queries than the split holds (e.g. {quote(other[0])}); "
                         f"{RESCORE}.")
    table = table.set_index("image_id").loc[[str(q) for q in queries]].reset_index()
    for column in ("num_positives", "num_retrievable"):
        table[column] = pd.to_numeric(table[column]).astype(np.int64)
    for column in metric_columns(table):
        table[column] = pd.to_numeric(table[column], errors="coerce").astype(np.float64)
    return table


def file_bytes(path: str) -> bytes:
    """The bytes of the score stage's table ``path``; an InputError when it is absent."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path} not found; run the score stage first (`dvc repro score`).") from None


def complete_text(path: str) -> str:
    """The text of the CSV ``path`` (UTF-8, :func:`recallk.compare.sources.decode`), refused when its last line
    lacks the newline every line the score stage writes ends with: the file was cut short."""
    text = decode(file_bytes(path), path)
    if text and not text.endswith("\n"):
        raise InputError(f"{path} is cut short at line {text.count(chr(10)) + 1} "
                         f"({quote(text.rsplit(chr(10), 1)[-1])}: no newline at its end, as the score stage ends "
                         f"every line); {RESCORE}.")
    return text


def read_neighbors(path: str, queries: Sequence[str], gallery: Sequence[str], retrievable: np.ndarray,
                   depth: int, evaluated: str) -> tuple[np.ndarray, np.ndarray]:
    """The neighbours table ``path`` as ``(n, width)`` gallery rows and float32 cosines (-1 / NaN pad), checked
    cell by cell and query by query: one InputError naming the file, the rule, and the first failing CSV lines.

    The rules: ``image_id`` a query of the split, ``gallery_id`` a gallery image, ``rank`` a whole number from 1,
    ``score`` a cosine (-1 to 1), ``evaluated`` (when present) the per-query table's id ``evaluated``; each
    query's ranks 1, 2, ... once each, its scores not increasing; at least ``min(depth + 1, retrievable)`` rows
    per query (``retrievable``: its ``num_retrievable``); and, unless it lists every retrievable item, a last
    row not tied with the ``depth``-th (a tie at the cut is written to its end and one past it).
    """
    text = complete_text(path)
    need = np.minimum(depth + 1, retrievable)
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
        lines = np.asarray(record_lines(text) if len(frame) else [], dtype=np.int64)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, csv.Error) as exc:
        raise InputError(f"{path} is not a readable CSV ({exc}); {RESCORE}.") from None
    missing = [c for c in NEIGHBOR_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(f"{path} lacks column(s) {', '.join(missing)} of the neighbours table; {RESCORE}.")
    q = frame["image_id"].map({str(v): i for i, v in enumerate(queries)})
    g = frame["gallery_id"].map({str(v): j for j, v in enumerate(gallery)})
    rank = pd.to_numeric(frame["rank"], errors="coerce")
    score = pd.to_numeric(frame["score"], errors="coerce").to_numpy(dtype=np.float64)
    cells = [("image_id", "a query image_id of the split", q.notna().to_numpy()),
             ("gallery_id", "a gallery image_id of the split", g.notna().to_numpy()),
             ("rank", "a whole number, 1 or more", (rank.notna() & (rank >= 1) & (rank % 1 == 0)).to_numpy()),
             ("score", "a cosine: a number from -1 to 1", np.abs(np.nan_to_num(score, nan=9.0)) <= 1.0 + 1e-6),
             ("evaluated", f"the per-query table's id {quote(evaluated)} (one score run writes both)",
              frame.get("evaluated", pd.Series(evaluated, index=frame.index)).eq(evaluated).to_numpy())]
    for column, rule, ok in cells:
        _refuse(path, frame, lines, column, rule, ~ok)
    qi, ri = q.to_numpy(dtype=np.int64), rank.to_numpy(dtype=np.int64) - 1
    order = np.lexsort((ri, qi))
    qi, ri, score, frame, lines = qi[order], ri[order], score[order], frame.iloc[order], lines[order]
    start = np.r_[True, qi[1:] != qi[:-1]]
    place = np.arange(len(qi)) - np.maximum.accumulate(np.where(start, np.arange(len(qi)), 0))
    _refuse(path, frame, lines, "rank", "1, 2, 3, ... per query, each once", ri != place)
    _refuse(path, frame, lines, "score", "a value no larger than the rank before's (the ranking's order)",
            ~start & (score > np.r_[np.inf, score[:-1]]))
    width = int(max(ri.max(initial=-1) + 1, need.max(initial=0), 1))
    rows = np.full((len(queries), width), -1, dtype=np.int64)
    scores = np.full((len(queries), width), np.nan, dtype=np.float32)
    rows[qi, ri], scores[qi, ri] = g.to_numpy()[order].astype(np.int64), score
    count = np.bincount(qi, minlength=len(queries))
    last_line = np.zeros(len(queries), dtype=np.int64)
    last_line[qi] = lines  # rank order: each query's last write is its last row
    short = count < need
    if short.any():
        i = int(np.flatnonzero(short)[0])
        rows_are = f"{count[i]} rows (the last on CSV line {last_line[i]})" if count[i] else "no row"
        raise InputError(f"{path} is cut short: query {quote(str(queries[i]))} has {rows_are}, and the score "
                         f"stage writes {need[i]} (its top max(ks) = {depth} and one more, or every item it may "
                         f"retrieve){f' ({int(short.sum()) - 1} more queries too)' if short.sum() > 1 else ''}; "
                         f"{RESCORE}.")
    ends = tie_end(1.0 - scores.astype(np.float64), min(depth, width))
    open_tie = (ends >= count) & (count > depth) & (count < retrievable)
    if open_tie.any():
        i = int(np.flatnonzero(open_tie)[0])
        raise InputError(f"{path} ends query {quote(str(queries[i]))} inside a tie: its last row (rank {count[i]}) is "
                         f"within 1e-6 of its rank {depth} (max(ks)), and the score stage writes a tie at the cut to "
                         f"its end and one row past it; the table is cut short or from an older version; {RESCORE}.")
    return rows, scores


def _refuse(path: str, frame: pd.DataFrame, lines: np.ndarray, column: str, rule: str, bad: np.ndarray) -> None:
    """An InputError naming ``path``, ``column``, its ``rule`` and the first rows ``bad`` marks, when any."""
    if not bad.any():
        return
    where = np.flatnonzero(bad)
    cells = ", ".join(f"CSV line {lines[i]} (query {quote(str(frame['image_id'].iloc[i]))}: "
                      f"{quote(str(frame[column].iloc[i]))})" for i in where[:MAX_ROWS])
    more = f" and {len(where) - MAX_ROWS} more" if len(where) > MAX_ROWS else ""
    raise InputError(f"{path} breaks the neighbours table's contract: column `{column}` must hold {rule}: "
                     f"{cells}{more}; {RESCORE}.")


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
