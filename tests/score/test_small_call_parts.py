"""The training-loop call's cheap parts give what their general forms give: label codes through the text
table, integer ids looked up as numbers, one-chunk unit rows, ``same_values``, ``summarize``'s means-only
recall, the labels' shared value through a table, the settings' copy and the memoized keys and pass."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest

from recallk.checks import distinct_ids, same_values
from recallk.score.labels import _share_a_value
from recallk.score.metrics import summarize
from recallk.score.passes import Pass
from recallk.score.ranking import rank_positives
from recallk.score.ranking.problem import code_columns, own_rows
from recallk.score.retrieval_data import ids_match
from recallk.score.settings import ScoreSettings
from recallk.score.similarity import l2_normalize
from recallk.settings.base import _replaced


def _text_codes(*columns):
    """The definition: distinct values numbered in the order of their text (np.unique of the strings)."""
    text = np.concatenate([np.asarray(c).astype(str) for c in columns])
    codes = np.unique(text, return_inverse=True)[1].reshape(-1)
    return np.split(codes, np.cumsum([len(c) for c in columns])[:-1])


@pytest.mark.parametrize("dtype, low, high", [
    (np.int64, 0, 16),          # a training loop's class indices (two digits: text order differs from numeric)
    (np.int64, 0, 10),          # one digit: text order is numeric order
    (np.int64, 0, 2**16),       # the table's last size
    (np.int64, 2**16, 2**17),   # above the table: the sorting path
    (np.int64, -50, 50),        # negative values: the sorting path
    (np.int32, -3, 100),        # negative int32 read as unsigned is above the table
    (np.int16, -3, 100),        # int16: its negative values are checked by a minimum
    (np.int8, -3, 100),         # int8 likewise
    (np.uint8, 0, 256),         # unsigned, every byte value
    (np.uint64, 0, 1000),       # unsigned 64-bit below the table
])
def test_integer_codes_number_values_in_text_order(dtype, low, high):
    rng = np.random.default_rng([low + 100, high])
    for n, m in ((64, 64), (1, 300), (500, 1)):
        q, g = rng.integers(low, high, n).astype(dtype), rng.integers(low, high, m).astype(dtype)
        got, expected = code_columns(q, g), _text_codes(q, g)
        for a, b in zip(got, expected):
            assert a.dtype == np.int64 and np.array_equal(a, b)


@pytest.mark.parametrize("q_dtype, g_dtype", [
    (np.int64, np.int64),     # np.arange ids, the same-rows warning's advice
    (np.int32, np.int64),     # signed of two widths
    (np.uint16, np.uint64),   # unsigned of two widths
    (np.int64, np.uint32),    # signed against unsigned: compared as text
    (np.int64, str),          # numbers against their texts: compared as text
])
def test_integer_ids_are_looked_up_as_their_texts(q_dtype, g_dtype):
    rng = np.random.default_rng(11)
    for n, m in ((64, 64), (5, 200), (30, 1)):
        q_ids, g_ids = rng.permutation(n + 40)[:n].astype(q_dtype), rng.permutation(m + 40)[:m].astype(g_dtype)
        where = {str(g): j for j, g in enumerate(g_ids)}  # the definition: the gallery row of the same text
        assert np.array_equal(own_rows(q_ids, g_ids), [where.get(str(q), -1) for q in q_ids])
        assert ids_match(q_ids, q_ids.copy())
        assert ids_match(q_ids, g_ids) is ([str(i) for i in q_ids] == [str(i) for i in g_ids])
        assert distinct_ids(g_ids) and not distinct_ids(np.r_[g_ids, g_ids[:1]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64])  # floats and integers
def test_one_chunk_unit_rows_match_the_chunked_ones(dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((1100, 12)) * 10.0 ** rng.integers(-3, 4, (1100, 1))).astype(dtype)
    x[5] = 0  # a zero row stays zero
    whole = l2_normalize(x)  # three chunks of 512 rows
    rows = rng.permutation(1100)[:300]
    assert whole.dtype == np.float32
    assert np.array_equal(l2_normalize(x[:512]).view(np.uint32), whole[:512].view(np.uint32))
    assert np.array_equal(l2_normalize(x, rows).view(np.uint32), whole[rows].view(np.uint32))
    assert not l2_normalize(x[5:6]).any()


@pytest.mark.parametrize("a, b", [
    (np.ones((3, 2)), np.ones((3, 2))),                                 # equal
    (np.ones((3, 2)), np.ones((2, 3))),                                 # other shape
    (np.array([[1.0, 2.0]]), np.array([[1.0, 3.0]])),                   # differ after the first value
    (np.array([[2.0, 2.0]]), np.array([[1.0, 2.0]])),                   # differ at the first value
    (np.array([[np.nan]]), np.array([[np.nan]])),                       # NaN is not equal to itself
    (np.array([[0.1]], dtype=np.float32), np.array([[0.1]])),           # float32 0.1 is not float64 0.1
    (np.array([[1]], dtype=np.int64), np.array([[1.0]])),               # 1 and 1.0 are equal
    (np.empty((0, 4)), np.empty((0, 4))),                               # empty
])
def test_same_values_is_array_equal(a, b):
    assert same_values(a, b) is bool(np.array_equal(a, b))


@pytest.mark.filterwarnings("error")  # no warning but the one expected
@pytest.mark.parametrize("kind", ["first", "complete", "capped", "all_excluded"])  # the rankings recall reads
def test_means_only_recall_is_summarize_recall(kind):
    rng = np.random.default_rng(7)
    q, g = rng.standard_normal((40, 8)), rng.standard_normal((50, 8))
    ql, gl = rng.integers(0, 6, 40), rng.integers(0, 6, 50)
    exclude = [(ql, gl)] if kind == "all_excluded" else ()  # every positive excluded: no query has one
    ks = [1, 3, 10]
    ranking = rank_positives(q, g, ql, gl, exclude=exclude, ranks=Pass.every() if kind == "complete" else
                             Pass.first(cap=10 if kind == "capped" else None))
    settings = ScoreSettings(ks=ks, metrics=("recall",))
    expect = (lambda: pytest.warns(RuntimeWarning, match="excluded")) if kind == "all_excluded" \
        else contextlib.nullcontext
    with expect():
        fast, values = summarize(ranking, settings, all_excluded="nan", means_only=True)
    with expect():
        full, _ = summarize(ranking, settings, all_excluded="nan")
    assert values is None
    assert repr({k: fast[k] for k in fast}) == repr({k: full[k] for k in fast})  # values and types
    assert not any(k.startswith("tie_sensitive@") for k in fast)



@pytest.mark.parametrize("low, high", [(0, 16), (0, 2**16), (2**16 - 8, 2**16 + 8), (-5, 5), (-2**40, 2**40)])
def test_the_labels_shared_value_is_intersect1d(low, high):
    # the table of the labels' bits (a training loop's class indices) and np.intersect1d give the same answer
    rng = np.random.default_rng([low % 97, high % 89])
    for n, m in ((64, 64), (1, 50), (30, 1)):
        for _ in range(20):
            q, g = rng.integers(low, high, n), rng.integers(low, high, m)
            assert _share_a_value(q, g) is (np.intersect1d(q, g).size > 0)
    assert _share_a_value(np.array([0]), np.array([0])) and not _share_a_value(np.array([1]), np.array([2]))


def test_score_settings_copy_is_dataclasses_replace():
    # with_values copies a section's fields without calling __init__ again: the same object dataclasses.replace makes
    defaults = ScoreSettings()
    for given in ({}, {"ks": (1, 5)}, {"ks": (3,), "metrics": ("recall", "mrr"), "max_memory_mb": 64.0}):
        got, expected = _replaced(defaults, given), dataclasses.replace(defaults, **given)
        assert type(got) is ScoreSettings and got == expected and hash(got) == hash(expected)
        assert vars(got) == vars(expected) and got is not defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.ks = (2,)


def test_keys_and_pass_are_metric_keys_and_the_capped_pass(monkeypatch):
    # the memoized derivation gives what metric_keys and serving_pass give, for the table as it is now
    from recallk.score import registry
    from recallk.score.registry import keys_and_pass, metric_keys, serving_pass

    for metrics in (("recall",), ("recall", "mrr"), ("precision", "map@r"), ("map",), tuple(registry.METRICS)):
        for ks in ((1, 5, 10), (3,), (10, 1)):
            for _ in range(2):  # computed, then from the cache
                keys, ranks = keys_and_pass(metrics, ks)
                assert keys == metric_keys(metrics, ks) and ranks == serving_pass(metrics, max(ks), capped=True)
    keys.append("changed")  # a fresh list each call
    assert "changed" not in keys_and_pass(metrics, ks)[0]
    renamed = tuple(dataclasses.replace(m, name="hit") if m.name == "recall" else m for m in registry.TABLE)
    monkeypatch.setattr(registry, "TABLE", renamed)  # another table: entries of its own
    assert keys_and_pass(("hit",), (1, 5))[0] == ["hit@1", "hit@5"]
