"""recallk.score.suite: ``score.exclude_same`` (same-camera gallery items hidden), through the score stage
and the API, against the brute-force oracle (``helpers.oracle``)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import CAMERAS, read_metrics, run_ok, set_params
from recallk.score.metrics import retrieval_metrics
from score_oracle import KS, METRIC_KEYS, approx, eval_sets, fmean, oracle, read_per_query


@pytest.mark.parametrize("protocol", ["query_gallery", "leave_one_out"])
def test_exclude_same_camera(camera, protocol):
    proj = camera
    set_params(proj, {"split.protocol": protocol})
    if protocol != "query_gallery":
        run_ok(proj, "split")          # the catalog (and so the embeddings) do not depend on split params
    run_ok(proj, "score")
    plain = read_metrics(proj)
    plain_pq = read_per_query(proj)
    set_params(proj, {"score.exclude_same": ["camera"]})
    run_ok(proj, "score")
    excl = read_metrics(proj)
    pq = read_per_query(proj).set_index("image_id")

    s = eval_sets(proj)
    cam = s["cat"]["camera"]
    assert set(cam) == set(CAMERAS)
    gallery = set(s["g"])
    for qid in s["q"]:
        hidden = {g for g in gallery if cam[g] == cam[qid]} | ({qid} & gallery)
        assert pq.loc[qid, "num_retrievable"] == len(gallery) - len(hidden), qid
        assert pq.loc[qid, "num_positives"] == sum(
            1 for g in gallery - hidden if s["cat"].loc[g, "label"] == s["cat"].loc[qid, "label"]), qid
    assert (plain_pq["num_retrievable"] == len(gallery) - (protocol == "leave_one_out")).all()

    want = oracle(s["q_emb"], s["g_emb"], s["q_lab"], s["g_lab"], s["q"], s["g"], KS,
                  exclude=[(cam[s["q"]].to_numpy(), cam[s["g"]].to_numpy())])
    assert pq.loc[s["q"], "first_positive_rank"].fillna(0).astype(int).tolist() == want["first"].tolist()
    for key in METRIC_KEYS:
        assert excl[key] == approx(fmean(want["values"][key]), rel=1e-12), key
    assert excl["num_gallery"] == plain["num_gallery"] == len(gallery)
    assert [k for k in METRIC_KEYS if excl[k] != plain[k]], "excluding same-camera items must change the metrics"



def test_exclude_missing_values_never_match():
    rng = np.random.default_rng(5)
    q, g = rng.normal(size=(6, 4)), rng.normal(size=(9, 4))
    ql, gl = ["a", "b", "a", "b", "a", "b"], ["a", "b", "a", "b", "a", "b", "a", "b", "a"]
    qc = np.array(["x", None, "", "y", np.nan, "x"], dtype=object)
    gc = np.array(["x", None, "", "y", np.nan, "x", "", None, "y"], dtype=object)
    got = retrieval_metrics(q, g, ql, gl, ks=KS, exclude=[(qc, gc)])
    want = oracle(q, g, ql, gl, [f"q{i}" for i in range(6)], [f"g{i}" for i in range(9)], KS, exclude=[(qc, gc)])
    assert got == {k: approx(fmean(v), rel=1e-12) for k, v in want["values"].items()}

