"""recallk.score.metrics.Scorer: settings given once (checked at construction), data at each call; the same
numbers as retrieval_metrics and retrieval_summary, call after call. And the one signature shape of the
public functions: the data arrays positional, the rest keyword-only, the same names in the same order."""

from __future__ import annotations

import inspect
import re

import pytest

import recallk
from ranking_cases import KINDS, KS, make_case
from recallk.errors import InputError
from recallk.score import metrics as metrics_module
from recallk.score.metrics import Scorer, retrieval_metrics, retrieval_summary
from recallk.score.passes import Pass
from recallk.score.settings import ScoreSettings


def _arrays(case):
    return (case["query_emb"], case["gallery_emb"], case["query_labels"], case["gallery_labels"])


def _data_kwargs(case):
    return {k: case[k] for k in ("query_ids", "gallery_ids", "exclude")}


@pytest.mark.filterwarnings("ignore:`query_emb` and `gallery_emb` hold the same rows")  # same_set_no_ids
@pytest.mark.parametrize("metrics", [None, ["recall"], ["recall", "precision", "map@r"], ["mrr", "map"]])
def test_a_scorer_gives_the_numbers_of_the_functions_call_after_call(metrics):
    scorer = Scorer(ks=KS, metrics=metrics)
    for kind in KINDS:  # one scorer, reused over problems of every kind and size
        case = make_case(kind, 1)
        got = scorer(*_arrays(case), **_data_kwargs(case))
        assert got == retrieval_metrics(*_arrays(case), **_data_kwargs(case), ks=KS, metrics=metrics), kind
        assert list(got) == scorer.keys
        summary = scorer.summary(*_arrays(case), **_data_kwargs(case))
        assert summary == retrieval_summary(*_arrays(case), **_data_kwargs(case), ks=KS,
                                            metrics=metrics if metrics is not None else list(recallk.METRICS))


def test_settings_are_checked_once_at_construction(monkeypatch):
    # by the params check's own route (settings.base.checked), once, and never again at a call
    calls = []
    real = metrics_module.checked
    monkeypatch.setattr(metrics_module, "checked", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    scorer = Scorer(ScoreSettings(ks=[5, 1], metrics=["recall", "mrr"], max_memory_mb=64))
    assert calls == [ScoreSettings]
    assert scorer.settings.ks == (5, 1) and scorer.settings.metrics == ("recall", "mrr")  # held as tuples
    assert scorer.ranks == Pass.first() and scorer.keys == ["recall@5", "recall@1", "mrr"]
    case = make_case("gaussian", 0)
    for _ in range(3):
        scorer(*_arrays(case))
    assert calls == [ScoreSettings]  # the calls check the data, never the settings again


@pytest.mark.parametrize("build, message", [
    (lambda: Scorer(ks=[0, 5]), "`ks` must be positive integers. Got [0, 5] instead."),
    (lambda: Scorer(ScoreSettings(ks=())), "`ks` must be positive integers. Got [] instead."),
    (lambda: Scorer(metrics=["recal"]), "Did you mean `recall`?"),
    (lambda: Scorer(max_memory_mb=0), "`max_memory_mb` must be a positive number. Got 0 instead."),
    (lambda: Scorer(backend="cupy"), "`backend` must be one of numpy, torch. Got 'cupy' instead."),
    (lambda: Scorer(backend="faiss"), "`backend` no longer takes `faiss`"),  # removed: the index stage's Flat
    (lambda: Scorer(backend="torch", device="tpu"), "`device` must be one of auto, cpu, cuda. Got 'tpu' instead."),
    (lambda: Scorer(ScoreSettings(engine="spark")), "`engine` must be one of local, ray. Got 'spark' instead."),
    (lambda: Scorer(ScoreSettings(shards=2)), "ScoreSettings sets `shards: 2` with `backend: numpy`"),  # across
    (lambda: Scorer(ScoreSettings(engine="ray", backend="torch", device="cuda")), "with `engine: ray`"),  # fields
])
def test_bad_settings_are_refused_at_construction(build, message):
    with pytest.raises(InputError, match=re.escape(message)):
        build()


def test_keywords_override_the_settings():
    base = ScoreSettings(ks=(1, 5), metrics=("recall",), max_memory_mb=64, backend="torch")
    scorer = Scorer(base, ks=[10], backend="numpy")
    assert scorer.settings == ScoreSettings(ks=(10,), metrics=("recall",), max_memory_mb=64.0, backend="numpy")
    assert Scorer(base).settings.ks == (1, 5)  # None keeps the settings' value


#: The one order of the keyword-only parameters of every public function (each takes the ones it needs).
KEYWORD_ORDER = ["query_ids", "gallery_ids", "exclude", "same_set", "ranks", "encoder_fn", "ks", "metrics",
                 "max_memory_mb", "backend", "device", "count_tiles"]
ARRAYS = ["query_emb", "gallery_emb", "query_labels", "gallery_labels"]


@pytest.mark.parametrize("function, positional", [
    (recallk.recall_at_k, ARRAYS), (recallk.retrieval_metrics, ARRAYS), (recallk.retrieval_summary, ARRAYS),
    (recallk.first_positive_ranks, ARRAYS), (recallk.rank_positives, ARRAYS),
    (Scorer.__call__, ["self", *ARRAYS]), (Scorer.summary, ["self", *ARRAYS]), (Scorer.rank, ["self", *ARRAYS]),
    (recallk.evaluate, ["query_images", "gallery_images", "query_labels", "gallery_labels"]),
])
def test_every_public_function_has_the_one_signature_shape(function, positional):
    params = list(inspect.signature(function).parameters.values())
    assert [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD] == positional
    keywords = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    assert len(params) == len(positional) + len(keywords)  # no *args, no **kwargs
    assert keywords == [name for name in KEYWORD_ORDER if name in keywords]  # the one order
    assert set(keywords) <= set(KEYWORD_ORDER)


def test_settings_are_refused_by_position():
    case = make_case("gaussian", 0)
    with pytest.raises(TypeError):
        retrieval_metrics(*_arrays(case), (1, 5))  # ks by position: the old signature's mistake made loud
