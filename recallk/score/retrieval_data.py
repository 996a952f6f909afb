"""One retrieval problem's data, checked once: :class:`RetrievalData`.

Every scoring path takes one (the public functions and :class:`~recallk.score.metrics.Scorer` build
it from their arguments, :func:`recallk.score.suite.score_split` from the split), and the engine's
:class:`~recallk.score.ranking.problem.Problem` is built from it.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from recallk.checks import check_exclude_pairs, check_inputs, integer_ids, same_values
from recallk.errors import InputError
from recallk.score.exclusion import one_column_pairs
from recallk.score.labels import by_value, ids_by_value


def user_stacklevel() -> int:
    """The ``stacklevel`` of :func:`warnings.warn` that names the first caller outside this package,
    however deep inside it the warning is raised (a public function, a :class:`Scorer`, a dataclass)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "recallk":
        frame, level = frame.f_back, level + 1
    return level


def ids_match(query_ids: Sequence[Any], gallery_ids: Sequence[Any]) -> bool:
    """The same ids, row for row, compared as text (integer arrays as numbers: the same answer)."""
    if integer_ids(query_ids, gallery_ids):
        return query_ids.shape == gallery_ids.shape and bool(np.array_equal(query_ids, gallery_ids))
    return [str(i) for i in query_ids] == [str(i) for i in gallery_ids]


@dataclass(frozen=True, eq=False)
class RetrievalData:
    """Queries to rank against a gallery: embeddings, labels, ids and exclusions, checked once when built.

    Parameters
    ----------
    query_emb : array-like of shape (n_queries, d)
    gallery_emb : array-like of shape (n_gallery, d)
        Real, finite numbers, any scale (rows are L2-normalised; a zero row has similarity 0 to
        everything); a torch tensor is detached and copied to the CPU. Held as numpy arrays.
    query_labels : sequence of length n_queries
    gallery_labels : sequence of length n_gallery
        A gallery item is a positive of the queries of its label. Numbers compare by value (``1.0`` is ``1``;
        held as int64, or float64 when a label is not whole), text as text; numbers on one side and text on the
        other are an error, and so is a query side with no label in the gallery
        (:func:`recallk.score.labels.by_value`). No value may be missing (None, NaN, "").
    query_ids, gallery_ids : sequences of length n_queries and n_gallery, optional
        Both or neither. A gallery item with the query's own id (numbers on both sides by value, else as text)
        is its own image:
        never retrieved and never a positive. Gallery ids are unique.
    exclude : sequence of (query values, gallery values) pairs
        1-D sequences with one value per query and one per gallery item: a gallery item that shares the
        query's value in any pair is not retrievable (e.g. the same camera); missing values never match.
        A pair of 2-D arrays (one row per item, the same columns on both sides) is a joint exclusion: an
        item is excluded when it shares the query's value in every column (re-ID junk: the same person and
        camera), and a row with a missing value never matches. Junk for every query is the pair of
        :func:`~recallk.score.exclusion.junk_pair`. Held as a tuple of 1-D pairs (joint pairs folded into
        joint keys, :mod:`recallk.score.exclusion`).
    same_set : bool or None
        Leave-one-out: the queries *are* the gallery, row for row, with the same ids and exclusion values,
        as the caller knows it (the score stage, from the split protocol); the engine then multiplies only
        the tiles on and above the diagonal. ``True`` needs equal ids on both sides and embeddings of one
        shape. ``None`` (the API): the engine detects it from the arrays.

    Raises
    ------
    InputError
        Any of the above broken, named by argument (``"`gallery_emb` is empty; ..."``); numeric labels against
        text labels; no query label in the gallery.

    Warns
    -----
    UserWarning
        The same rows on both sides with no ids and ``same_set`` None: every query retrieves itself.
    """

    query_emb: np.ndarray
    gallery_emb: np.ndarray
    query_labels: Sequence[Any]
    gallery_labels: Sequence[Any]
    query_ids: Sequence[Any] | None = None
    gallery_ids: Sequence[Any] | None = None
    exclude: Sequence[tuple[Any, Any]] = ()
    same_set: bool | None = None

    def __post_init__(self) -> None:
        q, g = check_inputs(self.query_emb, self.gallery_emb, self.query_labels, self.gallery_labels,
                            self.query_ids, self.gallery_ids)
        pairs = one_column_pairs(check_exclude_pairs(self.exclude, q.shape[0], g.shape[0]))
        if self.same_set and any(not np.array_equal(np.asarray(qv, dtype=object).astype(str),
                                                    np.asarray(gv, dtype=object).astype(str)) for qv, gv in pairs):
            raise InputError("`same_set=True` needs the same exclusion values on both sides (each query is its "
                             "gallery row); junk for every query hides gallery items only, so under leave-one-out "
                             "drop those items from the data instead.")
        query_labels, gallery_labels = by_value(self.query_labels, self.gallery_labels)
        if self.query_ids is not None:
            query_ids, gallery_ids = ids_by_value(self.query_ids, self.gallery_ids)
            object.__setattr__(self, "query_ids", query_ids)  # numbers by value, like the labels
            object.__setattr__(self, "gallery_ids", gallery_ids)
        if self.same_set and not (self.query_ids is not None and ids_match(self.query_ids, self.gallery_ids)
                                  and q.shape == g.shape):
            raise InputError("`same_set=True` needs the queries to be the gallery row for row: the same ids "
                             "(`query_ids` equal to `gallery_ids`) and embeddings of the same shape.")
        if self.same_set is None and self.query_ids is None and (q is g or same_values(q, g)):
            warnings.warn("`query_emb` and `gallery_emb` hold the same rows and no ids were passed, so every query "
                          "retrieves itself (recall@1 is 1.0); pass `query_ids` and `gallery_ids` (e.g. "
                          "np.arange(n) for both) to exclude each query's own row.", UserWarning,
                          stacklevel=user_stacklevel())
        object.__setattr__(self, "query_emb", q)  # frozen: the checked arrays replace what was given
        object.__setattr__(self, "gallery_emb", g)
        object.__setattr__(self, "query_labels", query_labels)  # numbers by value (int64 or float64 arrays)
        object.__setattr__(self, "gallery_labels", gallery_labels)
        object.__setattr__(self, "exclude", tuple(tuple(pair) for pair in pairs))

    @property
    def n_queries(self) -> int:
        return self.query_emb.shape[0]

    @property
    def n_gallery(self) -> int:
        return self.gallery_emb.shape[0]
