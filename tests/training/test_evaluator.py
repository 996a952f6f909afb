"""The training loop's evaluator (recallk/training/evaluator.py): the numbers of the engine, the decisions (a best
epoch only on a paired interval above zero, patience under both stop rules), the fixed subsample, and one clear
error for each bad setting or input."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from extras import extra, need_cuda
from helpers import ROOT
from recallk import retrieval_metrics
from recallk.errors import InputError
from recallk.score.settings import BootstrapSettings, ScoreSettings
from recallk.stats.inference import paired_bootstrap_ci
from recallk.training import Evaluator

RNG = np.random.default_rng(0)
LABELS = np.repeat(np.arange(12), 6)            # 72 items in 12 labels
CENTRES = RNG.normal(size=(12, 16))
NOISE = RNG.normal(size=(72, 16))


def epoch_emb(noise: float) -> np.ndarray:
    """The validation set's embeddings after an epoch: the less noise, the better the model."""
    return CENTRES[LABELS] + noise * NOISE


def split_sets() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Query rows and gallery rows of :data:`LABELS` (two items of each label are queries)."""
    queries = np.flatnonzero(np.arange(72) % 6 < 2)
    gallery = np.flatnonzero(np.arange(72) % 6 >= 2)
    return queries, gallery, LABELS[queries], LABELS[gallery]


def test_each_epoch_gives_the_engines_metrics():
    queries, gallery, ql, gl = split_sets()
    evaluator = Evaluator(ql, gl, ks=(1, 5))
    emb = epoch_emb(1.5)
    result = evaluator(0, emb[queries], emb[gallery])
    assert result.metrics == retrieval_metrics(emb[queries], emb[gallery], ql, gl, ks=(1, 5))
    assert list(result.metrics) == evaluator.keys == list(result.intervals)
    assert all(low <= result.metrics[k] <= high for k, (low, high) in result.intervals.items())
    assert result.num_queries == 24 and result.num_gallery == 48 and result.num_excluded_queries == 0
    assert len(result.table) == 24 and {"hit@1", "ap@r", "rr"} <= set(result.table.columns)
    assert result.monitor == evaluator.monitor == "map@r" and result.table_path is None


def test_leave_one_out_never_retrieves_the_query_itself():
    evaluator = Evaluator(LABELS, ks=(1,), metrics=["recall", "mrr"])
    emb = epoch_emb(1.0)
    ids = np.arange(72)
    result = evaluator(0, emb)
    assert result.metrics == retrieval_metrics(emb, emb, LABELS, LABELS, query_ids=ids, gallery_ids=ids, ks=(1,),
                                               metrics=["recall", "mrr"])
    assert result.monitor == "recall@1"  # no map@r measured: the first key
    assert evaluator.n_queries == evaluator.n_gallery == 72


def test_a_best_epoch_needs_a_paired_interval_above_zero():
    evaluator = Evaluator(LABELS, ks=(1, 5), patience=2)
    first = evaluator(0, epoch_emb(2.0))
    assert first.is_best and first.best_epoch == 0 and first.delta is None
    same = evaluator(1, epoch_emb(2.0) + 1e-9)  # no real change: Δ's interval holds 0
    assert not same.is_best and same.best_epoch == 0 and same.delta[1] <= 0 <= same.delta[2]
    assert same.epochs_without_progress == 1 and not same.should_stop
    better = evaluator(3, epoch_emb(0.6))  # a real improvement on the same queries
    assert better.is_best and better.best_epoch == 3 and better.delta[1] > 0
    assert better.delta[0] == pytest.approx(better.metrics["map@r"] - first.metrics["map@r"])
    assert better.best_metrics == better.metrics and better.epochs_without_progress == 0
    worse = evaluator(4, epoch_emb(1.0))
    assert not worse.is_best and worse.best_epoch == 3 and worse.best_metrics == better.metrics
    stop = evaluator(5, epoch_emb(0.6))  # as good as the best: no significant improvement for 2 evaluations
    assert stop.should_stop and evaluator.should_stop and evaluator.best_epoch == 3
    assert [r.epoch for r in evaluator.history] == [0, 1, 3, 4, 5] and evaluator.history[0].table is None


@pytest.mark.parametrize("unit", ["query", "label"])
def test_the_paired_interval_is_recallk_stats_on_the_same_queries(unit):
    settings = ScoreSettings(ks=(1,), bootstrap=BootstrapSettings(resamples=400, seed=5, unit=unit))
    evaluator = Evaluator(LABELS, settings=settings, monitor="mrr")
    a, b = evaluator(0, epoch_emb(2.0)), evaluator(1, epoch_emb(1.2))
    diff = (b.table.set_index("image_id")["rr"] - a.table.set_index("image_id")["rr"]).sort_index()  # id order
    groups = LABELS[diff.index.astype(int)].astype(str) if unit == "label" else None
    low, high = paired_bootstrap_ci(diff.to_numpy(), 400, 5, 0.95, groups)
    assert b.delta == (b.metrics["mrr"] - a.metrics["mrr"], low, high)


def test_the_plain_stop_rule_counts_any_rise_above_min_delta():
    evaluator = Evaluator(LABELS, ks=(1,), patience=1, stop_rule="plain", min_delta=0.0)
    evaluator(0, epoch_emb(2.0))
    tiny = evaluator(1, epoch_emb(1.98))  # a rise too small to tell apart: progress for plain, no new best
    assert tiny.metrics["map@r"] > evaluator.history[0].metrics["map@r"]
    assert not tiny.is_best and tiny.epochs_without_progress == 0 and not tiny.should_stop
    strict = Evaluator(LABELS, ks=(1,), patience=1, stop_rule="plain", min_delta=0.5)
    strict(0, epoch_emb(2.0))
    assert strict(1, epoch_emb(1.98)).should_stop


def test_the_plain_stop_rule_is_lightnings_early_stopping():
    """Rises smaller than min_delta add up, as in Lightning's EarlyStopping (the reference moves only on
    progress): its own _evaluate_stopping_criteria is the oracle of the wait count and the stop, step by step.
    The means are binary fractions, so float32 (Lightning) and float64 (ours) agree on every comparison."""
    torch = extra("torch", "torch")
    callbacks = extra("lightning.pytorch.callbacks", "lightning")
    means = [0.5, 0.5078125, 0.515625, 0.5234375, 0.53125, 0.5234375, 0.5390625, 0.546875, 0.5546875, 0.5]
    theirs = callbacks.EarlyStopping(monitor="map@r", min_delta=1 / 64, patience=2, mode="max")
    ours = Evaluator(LABELS, ks=(1,), patience=2, stop_rule="plain", min_delta=1 / 64)
    n = ours.n_queries
    waits = []
    for epoch, value in enumerate(means):
        stop, _ = theirs._evaluate_stopping_criteria(torch.tensor(value))
        ours._decide(epoch, {"map@r": value}, np.full(n, value))
        assert (ours._since_progress, ours.should_stop) == (theirs.wait_count, stop), epoch
        waits.append(theirs.wait_count)
    # the sub-min_delta rises of epochs 1-3 add up at epoch 3; epoch 6's rise equals min_delta: not progress
    assert waits == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2]


def test_the_subsample_is_fixed_seeded_and_paired():
    queries, gallery, ql, gl = split_sets()
    a = Evaluator(ql, gl, ks=(1,), subsample=10, seed=4)
    b = Evaluator(ql, gl, ks=(1,), subsample=10, seed=4)
    assert a.query_rows.tolist() == b.query_rows.tolist() and len(a.query_rows) == 10
    assert a.subsample_widening == pytest.approx(math.sqrt(24 / 10))
    assert repr(a) == ("Evaluator(10 of 24 queries, 48 gallery items, monitor='map@r', patience=None, "
                       "stop_rule='significant', log=None)")
    emb = epoch_emb(1.5)
    whole = a(0, emb[queries], emb[gallery])
    part = a(1, emb[queries][a.query_rows], emb[gallery])  # only the subsample's rows: the same queries
    rows = a.query_rows
    want = retrieval_metrics(emb[queries][rows], emb[gallery], ql[rows], gl, ks=(1,))
    assert whole.metrics == part.metrics == want and whole.num_queries == 10
    assert part.delta[0] == 0.0 and not part.is_best
    assert Evaluator(ql, gl, subsample=24).query_rows.tolist() == list(range(24))
    loo = Evaluator(LABELS, ks=(1,), subsample=20, seed=1)  # leave-one-out: the subsample against every item
    rows, ids = loo.query_rows, np.arange(72)
    assert loo(0, emb).metrics == retrieval_metrics(emb[rows], emb, LABELS[rows], LABELS, query_ids=rows,
                                                    gallery_ids=ids, ks=(1,))


@pytest.mark.parametrize("kwargs, message", [
    (dict(monitor="recall@20"), "`monitor` must be one of the evaluator's metrics: recall@1, recall@5, "
                                "recall@10, precision@1"),
    (dict(ks=(1, 5), metrics=["recall"], monitor="map@r"), "Got 'map@r' instead; add it to `metrics`"),
    (dict(patience=0), "`patience` must be an integer >= 1. Got 0 instead."),
    (dict(stop_rule="signif"), "`stop_rule` must be one of significant, plain. Got 'signif' instead."),
    (dict(min_delta=-0.1), "`min_delta` must be a number from 0 up to (not including) 1"),
    (dict(subsample=0), "`subsample` must be an integer >= 1. Got 0 instead."),
    (dict(subsample=100), "`subsample` must be at most the 72 queries. Got 100 instead"),
    (dict(ks=(0, 5)), "`ks` must be"),
    (dict(settings=ScoreSettings(bootstrap=BootstrapSettings(resamples=0))), "`settings.bootstrap.resamples` is 0"),
    (dict(log=3), "`log` must be a folder, a dvclive.Live, a recallk.training.LiveFiles or None. "
                    "Got 3 instead."),
    (dict(gallery_ids=np.arange(72)), "leave-one-out (no `gallery_labels`) takes the one set's ids as `query_ids`"),
    (dict(exclude=[(np.zeros(5), np.zeros(72))]), "exclude"),
])
def test_a_bad_setting_is_one_error_at_construction(kwargs, message):
    with pytest.raises(InputError) as caught:
        Evaluator(LABELS, **kwargs)
    assert message in str(caught.value)


@pytest.mark.parametrize("call, message", [
    (lambda ev, e: ev(0, e[:70]), "`query_emb` must have one row per item of the validation set, 72. Got 70 rows "
                                  "instead (epoch 0)"),
    (lambda ev, e: ev(0, np.where(np.arange(72)[:, None] == 5, np.nan, e)),
     "`query_emb` has NaN or inf in 1 row(s) at epoch 0, first rows [5]: the model's embeddings diverged"),
    (lambda ev, e: ev(0, e, e), "this evaluator is leave-one-out"),
    (lambda ev, e: ev(-1, e), "`epoch` must be a non-negative integer"),
    (lambda ev, e: ev(1.5, e), "`epoch` must be a non-negative integer"),
    (lambda ev, e: ev(0, e[0]), "`query_emb` must be a 2-D array"),
])
def test_bad_data_is_one_error_at_the_call(call, message):
    evaluator = Evaluator(LABELS, ks=(1,))
    with pytest.raises(InputError) as caught:
        call(evaluator, epoch_emb(1.0))
    assert message in str(caught.value)
    assert not evaluator.history  # nothing was recorded


def test_bad_counts_with_a_gallery_and_epochs_that_do_not_increase():
    queries, gallery, ql, gl = split_sets()
    evaluator = Evaluator(ql, gl, ks=(1,), subsample=8)
    emb = epoch_emb(1.0)
    with pytest.raises(InputError, match=r"`query_emb` must have one row per query, 24, or the subsample's 8 "
                                         r"\(`evaluator.query_rows`\)\. Got 9 rows"):
        evaluator(0, emb[:9], emb[gallery])
    with pytest.raises(InputError, match=r"`gallery_emb` must have one row per gallery item, 48. Got 47 rows"):
        evaluator(0, emb[queries], emb[gallery][:47])
    with pytest.raises(InputError, match=r"pass `gallery_emb` \(48 rows\)"):
        evaluator(0, emb[queries])
    with pytest.raises(InputError, match=r"`gallery_emb` has NaN or inf in 1 row\(s\) at epoch 0, first rows \[3\]"):
        evaluator(0, emb[queries], np.where(np.arange(48)[:, None] == 3, np.inf, emb[gallery]))
    evaluator(2, emb[queries], emb[gallery])
    with pytest.raises(InputError, match=r"`epoch` must increase from call to call.*the last was 2. Got 2 instead"):
        evaluator(2, emb[queries], emb[gallery])


def test_torch_tensors_are_taken_detached_on_their_device():
    torch = extra("torch", "torch")
    queries, gallery, ql, gl = split_sets()
    emb = epoch_emb(1.5)
    want = Evaluator(ql, gl, ks=(1, 5), subsample=12)(0, emb[queries], emb[gallery])
    tensor = torch.tensor(emb, requires_grad=True) * 1.0  # part of a graph
    for backend in ("numpy", "torch"):
        got = Evaluator(ql, gl, ks=(1, 5), subsample=12, backend=backend)(0, tensor[queries], tensor[gallery])
        assert got.metrics == want.metrics and got.intervals == want.intervals
    nan = tensor.detach().clone()
    nan[7] = float("nan")
    with pytest.raises(InputError, match=r"`query_emb` has NaN or inf in 1 row\(s\) at epoch 0, first rows \[7\]"):
        Evaluator(LABELS, ks=(1,))(0, nan)


def test_tensors_stay_on_the_gpu():
    torch = extra("torch", "torch")
    need_cuda(torch)
    emb = epoch_emb(1.5)
    want = Evaluator(LABELS, ks=(1, 5), subsample=30)(0, emb)
    on_gpu = torch.tensor(emb, device="cuda", requires_grad=True) * 1.0
    for backend in ("torch", "numpy"):  # ranked on the GPU, or copied to the host
        got = Evaluator(LABELS, ks=(1, 5), subsample=30, backend=backend)(0, on_gpu)
        assert got.metrics == want.metrics and got.intervals == want.intervals


#: The core with every extra made unimportable: the evaluator runs and writes DVCLive's files itself.
_WITHOUT_EXTRAS = """
import sys

class Blocked:  # as if not installed: `import torch` raises ImportError (scipy probes sys.modules, so no None there)
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "dvclive", "lightning", "pytorch_lightning", "transformers", "accelerate"):
            raise ImportError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Blocked())
import numpy as np
from recallk.training import Evaluator
labels = np.repeat(np.arange(4), 3)
emb = np.eye(4)[labels] + 0.1 * np.arange(12)[:, None]
result = Evaluator(labels, ks=[1], log=sys.argv[1])(0, emb)
print(result.metrics["recall@1"])
print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "dvclive", "lightning", "transformers")))
"""


def test_the_core_needs_no_extra(tmp_path):
    out = subprocess.run([sys.executable, "-c", _WITHOUT_EXTRAS, str(tmp_path / "log")], capture_output=True,
                         text=True, timeout=120, cwd=ROOT, check=True).stdout.splitlines()
    assert out == ["1.0", "[]"]
    assert (tmp_path / "log" / "metrics.json").is_file() and (tmp_path / "log" / "plots" / "metrics" /
                                                               "recall@1.tsv").is_file()
