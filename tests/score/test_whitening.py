"""recallk.score.whitening through recallk.score.suite (in process): ``score.whiten: pca`` is fitted on the
train images only and applied to the queries and gallery."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import CATALOG, EMBEDDINGS, IDS, SPLIT
from recallk.errors import InputError
from recallk.score import suite
from recallk.score.settings import ScoreSettings
from recallk.score.similarity import l2_normalize
from recallk.score.suite import score_split
from recallk.settings.base import from_mapping
from score_oracle import KS, METRIC_KEYS, approx, eval_sets, fmean, oracle
from stages.params import load_section
from stages.score_inputs import load_inputs


def _score_in_process(project: Path, **overrides):
    params = load_section("score", project / "params.yaml")
    params.update(overrides)
    inputs = load_inputs(str(project / CATALOG), str(project / SPLIT), str(project / EMBEDDINGS), str(project / IDS),
                         train=params["whiten"] == "pca")
    return score_split(inputs.sets, inputs.catalog, from_mapping(ScoreSettings, params))


@pytest.fixture
def pca_spy(monkeypatch):
    calls = []
    real = suite.pca_whitening

    def spy(train, *sets):
        result = real(train, *sets)
        calls.append({"train": np.array(train, copy=True), "sets": [np.array(x, copy=True) for x in sets],
                      "result": [np.array(x, copy=True) for x in result]})
        return result

    monkeypatch.setattr(suite, "pca_whitening", spy)
    return calls


def _row_set(arr: np.ndarray) -> list[bytes]:
    return sorted(r.tobytes() for r in np.ascontiguousarray(arr))


def test_whitening_is_fitted_on_train_images_only(uneven, pca_spy):
    s = eval_sets(uneven)
    out, tables = _score_in_process(uneven, whiten="pca")
    assert len(pca_spy) == 1
    call = pca_spy[0]
    train_rows = s["emb"][[s["row"][i] for i in s["train"]]]
    assert len(s["train"]) >= 2 and not set(s["train"]) & (set(s["q"]) | set(s["g"]))
    assert call["train"].shape == train_rows.shape
    assert _row_set(call["train"]) == _row_set(train_rows)
    eval_rows = set(_row_set(np.concatenate([s["q_emb"], s["g_emb"]])))
    assert not eval_rows & set(_row_set(call["train"])), "an eval embedding entered the whitening fit"
    assert [x.tolist() for x in call["sets"]] == [s["q_emb"].tolist(), s["g_emb"].tolist()]

    # an independent fit on the train rows gives the transform the stage applied
    from sklearn.decomposition import PCA

    unit = l2_normalize(train_rows).astype(np.float64)
    var = PCA(whiten=True, svd_solver="full").fit(unit).explained_variance_
    keep = int(np.count_nonzero(var > var.max() * 1e-10))
    pca = PCA(n_components=keep, whiten=True, svd_solver="full").fit(unit)
    q_w, g_w = call["result"]
    np.testing.assert_allclose(q_w, pca.transform(l2_normalize(s["q_emb"]).astype(np.float64)), atol=1e-4)
    np.testing.assert_allclose(g_w, pca.transform(l2_normalize(s["g_emb"]).astype(np.float64)), atol=1e-4)
    assert out["embedding_dim"] == keep <= len(s["train"]) - 1

    # and the metrics are those of the whitened embeddings
    want = oracle(q_w, g_w, s["q_lab"], s["g_lab"], s["q"], s["g"], KS)
    for key in METRIC_KEYS:
        assert out[key] == approx(fmean(want["values"][key]), rel=1e-12), key
    plain, _ = _score_in_process(uneven, whiten="none")
    assert len(pca_spy) == 1, "whiten: none must not whiten"
    assert [k for k in METRIC_KEYS if plain[k] != out[k]], "whitening should change the metrics"


def test_eval_embeddings_do_not_change_the_whitening(uneven, pca_spy):
    s = eval_sets(uneven)
    _score_in_process(uneven, whiten="pca")
    emb = s["emb"].copy()
    rng = np.random.default_rng(0)
    changed_q, changed_g = s["q"][0], s["g"][-1]
    for image in (changed_q, changed_g):
        emb[s["row"][image]] = rng.random(emb.shape[1]).astype(emb.dtype) * 5
    np.save(uneven / EMBEDDINGS, emb)
    _score_in_process(uneven, whiten="pca")
    (q0, g0), (q1, g1) = pca_spy[0]["result"], pca_spy[1]["result"]
    assert np.array_equal(pca_spy[0]["train"], pca_spy[1]["train"])
    assert np.array_equal(q0[1:], q1[1:]) and np.array_equal(g0[:-1], g1[:-1])
    assert not np.array_equal(q0[0], q1[0]) and not np.array_equal(g0[-1], g1[-1])

    # whereas one changed train embedding changes the transform of every eval image
    emb[s["row"][s["train"][0]]] = rng.random(emb.shape[1]).astype(emb.dtype)
    np.save(uneven / EMBEDDINGS, emb)
    _score_in_process(uneven, whiten="pca")
    q2 = pca_spy[2]["result"][0]
    assert q2.shape != q1.shape or not np.allclose(q1[1:], q2[1:])


def test_whitening_needs_two_train_images(uneven):
    split = pd.read_csv(uneven / SPLIT, dtype=str, keep_default_na=False)
    first_train = split.index[split["split"].eq("train")][0]
    split[~split["split"].eq("train") | (split.index == first_train)].to_csv(uneven / SPLIT, index=False)
    with pytest.raises(InputError, match=r"`score.whiten: pca` fits on the train split, which has 1 image"):
        _score_in_process(uneven, whiten="pca")

