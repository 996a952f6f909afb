"""The exclusion rules beyond one column, reduced to the engine's one form: (query values, gallery values) pairs.

Every consumer of the ranking (the engine's :class:`~recallk.score.ranking.problem.Problem`, whose
``excluded`` / ``mask_excluded`` / ``n_excluded`` every backend and the Ray tiles use, the neighbour
tables, the failure sheet) reads ``RetrievalData.exclude``: 1-D pairs, a gallery item excluded for a
query when it shares the query's value in any pair, missing values never matching. Two rules re-ID
protocols need are pairs of that form, so they hold for every backend at once:

* **Joint exclusion** (:func:`joint_values`): a pair of 2-D arrays, one column per catalog column,
  excludes an item that shares the query's value in *every* column (Market-1501's junk: the same person
  *and* the same camera); a row with a missing value in any column never matches. It is folded into a
  1-D pair of joint keys when :class:`~recallk.score.retrieval_data.RetrievalData` is built.
* **Junk for every query** (:func:`junk_pair`): gallery items flagged junk are hidden from every query:
  never retrieved, never a positive, so they change no metric (as if they were not in the gallery;
  Market-1501's ``-1`` files).

Distractors need no rule of their own: a gallery item whose label no query has is a negative for every
query (Market-1501's ``0000`` files, labelled ``0000``).
"""

from __future__ import annotations

import logging
import numbers
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from recallk.checks import check_exclude_columns, is_missing
from recallk.errors import InputError, quote
from recallk.score.labels import exclusion_by_value

if TYPE_CHECKING:
    import pandas as pd

    from recallk.score.settings import ScoreSettings

log = logging.getLogger(__name__)

#: The value every query and every junk gallery item share in the junk pair (its own pair: nothing else
#: is compared with it).
JUNK = "junk"
#: Flag texts read as true / false (case-insensitive) in a junk column.
TRUE_TEXTS = ("true", "1", "yes")
FALSE_TEXTS = ("false", "0", "no", "")


def joint_values(values: Any) -> np.ndarray:
    """One key per row of ``values`` (n, c): the row's values as text joined, None when any is missing.

    Two rows get equal keys exactly when they are equal column by column (compared as text: numbers were made
    alike first, by :func:`one_column_pairs`); the separator (U+001F) cannot split a value in two ways
    because every key has the same number of parts."""
    rows = np.asarray(values, dtype=object)
    out = np.empty(rows.shape[0], dtype=object)
    for i, row in enumerate(rows):
        out[i] = None if any(is_missing(v) for v in row) else "\x1f".join(str(v) for v in row)
    return out


def one_column_pairs(pairs: Sequence[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """``pairs`` compared by value, as the labels are (:func:`recallk.score.labels.exclusion_by_value`, column by
    column for a joint pair: ``1.0`` and ``1`` are one value; numbers against text an InputError), then each 2-D
    (joint) pair folded into its 1-D pair of joint keys (:func:`joint_values`)."""
    out = []
    for i, (q, g) in enumerate(pairs):
        if np.ndim(q) == 2:
            q, g = np.asarray(q, dtype=object), np.asarray(g, dtype=object)
            columns = [exclusion_by_value(q[:, j], g[:, j], f"`exclude[{i}]` (column {j})") for j in range(q.shape[1])]
            out.append((joint_values(np.column_stack([np.asarray(c[0], dtype=object) for c in columns])),
                        joint_values(np.column_stack([np.asarray(c[1], dtype=object) for c in columns]))))
        else:
            out.append(exclusion_by_value(q, g, f"`exclude[{i}]`"))
    return out


def junk_flags(values: Sequence[Any], name: str) -> np.ndarray:
    """A junk column read as booleans: bools, the numbers 0 and 1 by value (``1.0`` too, as labels compare), or
    the texts true/false, 1/0, yes/no (any case); missing or empty is false. Anything else raises an InputError
    naming the column ``name`` and the value."""
    out = np.zeros(len(values), dtype=bool)
    for i, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)):
            out[i] = bool(v)
        elif is_missing(v):
            continue
        elif isinstance(v, numbers.Real) and v in (0, 1):
            out[i] = v == 1
        elif str(v).strip().lower() in TRUE_TEXTS:
            out[i] = True
        elif str(v).strip().lower() not in FALSE_TEXTS:
            raise InputError(f"junk column `{name}` must hold true/false (or 1/0, yes/no, empty for false). "
                             f"Got {quote(v)} in row {i + 1} instead.")
    return out


def junk_pair(n_queries: int, gallery_junk: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    """The exclusion pair that hides the flagged gallery items from every one of ``n_queries`` queries.

    Parameters
    ----------
    n_queries : int
    gallery_junk : sequence of bool, length n_gallery
        True: junk for every query (never retrieved, never a positive).

    Returns
    -------
    (query values, gallery values)
        Every query's value is :data:`JUNK`; a junk item's too, every other item's None (never matches).
    """
    flags = np.asarray(gallery_junk, dtype=bool)
    return np.full(n_queries, JUNK, dtype=object), np.where(flags, JUNK, None).astype(object)


def exclusion_pairs(catalog: pd.DataFrame, queries: np.ndarray, gallery: np.ndarray, settings: ScoreSettings,
                    same_set: bool) -> list[tuple[Any, Any]]:
    """The ``exclude`` pairs of the score params: one per ``exclude_same`` column, one joint pair of the
    ``exclude_same_all`` columns, and the junk pair of the ``junk`` column (:mod:`recallk.score.exclusion`)."""
    columns = list(catalog.columns)
    pairs: list[tuple[Any, Any]] = [(catalog.loc[queries, c].to_numpy(), catalog.loc[gallery, c].to_numpy())
                                    for c in settings.exclude_same]
    joint = list(settings.exclude_same_all)
    if joint:
        plain_columns = [c for c in joint if c != "label"]
        check_exclude_columns(plain_columns, columns, name="score.exclude_same_all")
        pairs.append((catalog.loc[queries, joint].to_numpy(dtype=object),
                      catalog.loc[gallery, joint].to_numpy(dtype=object)))
    if settings.junk is not None:
        check_exclude_columns([settings.junk], columns, name="score.junk")
        if same_set:
            raise InputError("`score.junk` hides gallery items from every query, but under `split.protocol: "
                             "leave_one_out` every gallery item is also a query; drop the junk rows from the "
                             "manifest instead, or set `score.junk: null`.")
        flags = junk_flags(catalog.loc[gallery, settings.junk].to_numpy(dtype=object), settings.junk)
        if flags.any():
            pairs.append(junk_pair(len(queries), flags))
        log.info("score.junk %s: %d of %d gallery items are junk for every query", settings.junk,
                 int(flags.sum()), len(gallery))
    return pairs
