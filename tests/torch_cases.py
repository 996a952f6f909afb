"""The adversarial suite of the torch backend (tests/score/test_torch_backend.py, bench/gpu_score_check.py):
problems built so that float32 candidates are as wrong as they can be, each beside the numpy engine."""

from __future__ import annotations

import numpy as np

from recallk.score.passes import Pass
from recallk.score.ranking import rank_data
from recallk.score.ranking.torch_backend import TorchOptions, rank_data_torch
from recallk.score.retrieval_data import RetrievalData
from recallk.score.settings import ScoreSettings
from recallk.score.values import per_query

#: (block rows, tile columns, shards): every block and tile size of the proof (1, 7, 64, 4096) and every shard
#: count (1, 2, 7); the sizes of 1 are not paired (one row against one column at a time takes minutes).
LAYOUTS = [(1, 64, 1), (64, 1, 2), (7, 7, 7), (4096, 4096, 1)]
#: The passes beside their metrics: the score stage's (uncapped top-L), MRR's (exact first ranks), and the API's
#: capped ones.
PASSES = [(Pass.top(10), ("recall", "precision", "r_precision", "map@r", "mrr")),
          (Pass.first(), ("recall", "mrr")),
          (Pass.top(10, cap=10), ("recall", "precision", "r_precision", "map@r")),
          (Pass.first(5), ("recall",))]
KS = (1, 2, 5, 10)


def adversarial_case(kind: str, seed: int = 0, n: int = 24, m: int = 90, d: int = 16) -> dict:
    """One problem of the suite as RetrievalData keyword arguments (labels from 4 classes)."""
    rng = np.random.default_rng(seed)
    q, g = rng.normal(size=(n, d)), rng.normal(size=(m, d))
    ql, gl = rng.integers(0, 4, n), rng.integers(0, 4, m)
    q_ids = g_ids = None
    exclude = ()
    if kind == "duplicates":  # exact copies in the gallery, and queries equal to gallery rows: exact ties
        g[1::3] = g[0:-1:3][: len(g[1::3])]
        q[:10] = g[:10]
    elif kind == "quantised_8bit":  # embeddings rounded to 8 bits (int8 codes): many equal cosines
        q, g = np.round(np.clip(q, -3, 3) * 42), np.round(np.clip(g, -3, 3) * 42)
        g[::5] = g[0]
    elif kind == "all_equal":  # every row the same: every cell ties (every candidate buffer overflows)
        q, g = np.ones((n, d)), np.ones((m, d))
    elif kind == "ulp_ties":  # cosines to the query 1 ulp apart (float32), or equal
        base = np.float32(0.8)
        steps = rng.integers(-2, 3, m)
        g = np.zeros((m, d))
        g[:, 0] = [np.float32(base) + s * np.spacing(base) for s in steps]
        g[:, 1] = 0.6
        q = np.zeros((n, d))
        q[:, 0] = 1.0
        q[::3, 1] = 1e-7
    elif kind == "leave_one_out":  # the queries are the gallery, by id, with duplicates
        g[1::4] = g[0:-1:4][: len(g[1::4])]
        q, ql = g, gl
        q_ids = g_ids = list(range(m))
    elif kind == "exclude_same":  # same-camera items excluded (missing cameras never match), with ties
        g[1::3] = g[0:-1:3][: len(g[1::3])]
        cams = ["c0", "c1", "c2", None, ""]
        exclude = [([cams[i] for i in rng.integers(0, 5, n)], [cams[i] for i in rng.integers(0, 5, m)])]
    else:  # K at or above the gallery: 6 items, up to 4 retrievable (ids overlap)
        assert kind == "k_above_gallery"
        g, gl = g[:6], np.array([0, 1, 0, 2, 1, 0])
        g[3] = g[0]
        g_ids = list("abcdef")
        q_ids = ["a", "b"] + [f"q{i}" for i in range(n - 2)]
    return dict(query_emb=q, gallery_emb=g, query_labels=ql, gallery_labels=gl, query_ids=q_ids,
                gallery_ids=g_ids, exclude=exclude)


ADVERSARIAL = ["duplicates", "quantised_8bit", "all_equal", "ulp_ties", "leave_one_out", "exclude_same",
               "k_above_gallery"]


def differences(case: dict, layouts=LAYOUTS, passes=PASSES, device: str = "cpu",
                precision: str = "float32", as_tensors: bool = False) -> list[str]:
    """Where the torch backend's per-query metric values (their bytes) or first ranks (both tie rules, capped as
    the pass caps them) differ from the numpy engine's, one line each; empty when identical. ``as_tensors``: the
    embeddings handed over as tensors on ``device`` (on a GPU the data then holds stand-ins, the tensors are
    checked and normalised there: :func:`~recallk.score.ranking.torch_api.torch_data`)."""
    data, tensors = RetrievalData(**case), None
    if as_tensors:
        import torch

        from recallk.score.ranking.torch_api import torch_data

        moved = [torch.from_numpy(np.asarray(case[name])).to(device) for name in ("query_emb", "gallery_emb")]
        rest = {key: value for key, value in case.items() if key not in ("query_emb", "gallery_emb", "same_set")}
        given, tensors = torch_data(*moved, **rest)
    out = []
    for ranks, metrics in passes:
        settings = ScoreSettings(ks=KS if ranks.cap is None or ranks.cap >= max(KS) else (1, ranks.cap),
                                 metrics=metrics)
        want = rank_data(data, ranks, 512)
        expected = per_query(want, settings)
        cap = ranks.cap or np.iinfo(np.int64).max
        for rows, cols, shards in layouts:
            options = TorchOptions(device=device, shards=shards, block_rows=rows, tile_cols=cols, precision=precision)
            got = rank_data_torch(given if as_tensors else data, ranks, 512, options, tensors)
            values = per_query(got, settings)
            for key, value in expected.items():
                if value.tobytes() != values[key].tobytes():
                    out.append(f"{ranks} {rows}/{cols}/{shards}: {key}")
            for field in ("first_rank", "first_rank_opposite"):
                if not np.array_equal(np.minimum(getattr(want, field), cap), np.minimum(getattr(got, field), cap)):
                    out.append(f"{ranks} {rows}/{cols}/{shards}: {field}")
    return out
