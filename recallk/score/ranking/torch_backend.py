"""``score.backend: torch``: the exact ranking with the candidate product on a torch device (CPU or CUDA).

The same :class:`~recallk.score.ranking.engine.Ranking` as the numpy engine, and so the same metrics byte
for byte, by the same two steps as its top-L pass (:mod:`~recallk.score.ranking.top`), on the device:

1. **Candidates.** Each block of queries is multiplied with the gallery tile by tile in float32 (TF32 or
   bfloat16 only with ``score.matmul``), the cells a query may not retrieve set to ``-inf`` by the
   engine's one exclusion rule (:meth:`~recallk.score.ranking.problem.Problem.excluded`: its own image,
   ``exclude_same`` and every rule added there), and a running ``torch.topk`` keeps ``K >= L + margin``
   cells per row (``L``: the ranks the pass needs). A candidate score is within ``tol`` of the exact
   similarity (:func:`~recallk.score.ranking.torch_tiles.matmul_bound`, Higham's ``gamma_d``), so with
   ``f_L`` the L-th highest candidate score, at least L cells have exact similarity ``>= f_L - tol`` and
   every cell whose score is below ``f_L - 2 tol`` has an exact similarity strictly below the exact L-th:
   it cannot be among the first L under any tie rule. The cells at or above ``f_L - 2 tol`` are the
   candidates. When the buffer's lowest score is still in that window (ties: all-equal rows, duplicates)
   some candidates may have been dropped: the row *overflows* and runs again with 4x the slots (at most
   the gallery, which never overflows).
2. **Order.** The candidates, highest score first, whose scores lie within ``2 tol`` of a neighbour's
   (:func:`~recallk.score.ranking.torch_tiles.near_ties`) are re-scored exactly (float64, a fixed
   pairwise-tree sum: :func:`~recallk.score.ranking.torch_tiles.exact_scores`); a candidate more than
   ``2 tol`` from both neighbours is ordered against every other by its score as by its exact similarity
   (the numpy engine's top-L rule). All are ranked by the engine's order keys
   (:func:`~recallk.score.ranking.direct.value_keys`: similarity, then gallery index).

Queries whose first positive lies beyond their first L (MRR, uncapped first ranks) run again with 4x the
depth until it is found; full ``map`` (every rank, ``Pass.every()``) is finished by the numpy engine.
``shards``: the gallery's sorted columns are cut into that many contiguous shards, each searched on its
own (on its own GPU when there are several) and merged per query; the candidates of any cut hold the
same certified set, so the result does not depend on it, nor on block or tile sizes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import numpy as np

from recallk.errors import MissingExtraError
from recallk.score.passes import Pass, Ranks
from recallk.score.ranking import torch_tiles as tt
from recallk.score.ranking.budget import Budget
from recallk.score.ranking.counting import HAND_OVER
from recallk.score.ranking.direct import BELOW, value_keys
from recallk.score.ranking.engine import Ranking, rank_data, rank_problem
from recallk.score.ranking.positives import positive_counts
from recallk.score.ranking.problem import Problem
from recallk.score.ranking.schedule import rows_to_csr, spans
from recallk.score.retrieval_data import RetrievalData

log = logging.getLogger(__name__)

#: The first depth of an uncapped first-positive pass (it grows 4x for the queries not found within it).
FIRST_DEPTH = 64
#: Gallery columns per tile, and most query rows per block, unless given.
TILE_COLS, BLOCK_ROWS = 4096, 4096
#: :meth:`_Runner._block` of rows all handed over: (rows, ranks per row, ranks, first, opposite, found), empty.
_NONE = (*(np.empty(0, dtype=np.int64) for _ in range(5)), np.empty(0, dtype=bool))


def import_torch():
    """torch, or :class:`~recallk.errors.MissingExtraError` naming the extra."""
    try:
        import torch
    except ImportError as exc:
        raise MissingExtraError("`backend: torch`", "torch", "torch", exc) from None
    return torch


@dataclass(frozen=True)
class TorchOptions:
    """How the torch backend runs (checked by :func:`~recallk.score.ranking.torch_device.resolve`).

    Attributes
    ----------
    device : str
        A resolved torch device (``cpu``, ``cuda``, ``cuda:1``).
    precision : str
        ``float32``, ``tf32`` or ``bfloat16`` (:data:`~recallk.score.ranking.torch_tiles.PRECISIONS`).
    shards : int
        Contiguous shards of the gallery, searched apart and merged.
    block_rows, tile_cols : int or None
        Query rows per block and gallery columns per tile (None: from the budget).
    ray : (address, num_cpus) or None
        ``score.engine: ray``: the shards are searched by Ray tasks on CPU torch
        (:mod:`~recallk.score.ranking.torch_ray`); None: on this machine's devices.
    """

    device: str = "cpu"
    precision: str = "float32"
    shards: int = 1
    block_rows: int | None = None
    tile_cols: int | None = None
    ray: tuple[str | None, int] | None = None


def rank_data_torch(data: RetrievalData, ranks: Pass, max_memory_mb: float, options: TorchOptions = TorchOptions(),
                    tensors: tuple | None = None) -> Ranking:
    """:func:`~recallk.score.ranking.engine.rank_data` on a torch device: the same :class:`Ranking` fields a
    metric reads (see the module), for the checked ``data``.

    Parameters
    ----------
    data : RetrievalData
        The problem. Its embeddings are read unless ``tensors`` is given.
    ranks : Pass
        ``Pass.first(cap)`` or ``Pass.top(depth, cap)`` run on the device; ``Pass.every()`` (full map) is the
        numpy engine's (its tiles on Ray tasks with ``options.ray``; the gallery is not sharded then).
    max_memory_mb : float
        The bound on the blocks' buffers (and the numpy engine's, for ``Pass.every()``).
    options : TorchOptions
        Device, precision, shards, block and tile sizes.
    tensors : (query, gallery) tensors, optional
        The caller's embeddings as they are (e.g. on a GPU), normalised there; ``data`` then holds
        stand-ins of their shape.

    Returns
    -------
    Ranking
    """
    torch = import_torch()
    if ranks.ranks is Ranks.EVERY:  # every rank: the numpy engine (host copies of device tensors)
        if tensors is not None:
            data = RetrievalData(tensors[0].detach().cpu().numpy(), tensors[1].detach().cpu().numpy(),
                                 data.query_labels, data.gallery_labels, query_ids=data.query_ids,
                                 gallery_ids=data.gallery_ids, exclude=data.exclude, same_set=data.same_set)
        count_tiles = None
        if options.ray is not None:  # score.engine: ray: the numpy engine's tiles on Ray tasks, as with backend numpy
            from recallk.score.ranking.ray_tiles import RayTiles

            count_tiles = RayTiles(address=options.ray[0], num_cpus=options.ray[1])
        log.debug("torch backend: every rank (full map) from the numpy engine%s", " on Ray" if count_tiles else "")
        return rank_data(data, ranks, max_memory_mb, count_tiles)
    started = time.perf_counter()
    budget = Budget(float(max_memory_mb))
    device = torch.device(options.device)
    p = Problem.build(data, unit_bytes=0 if tensors is not None else None)
    if tensors is None:
        q, g = torch.from_numpy(p.q).to(device), torch.from_numpy(p.gp).to(device)
    else:
        q, g = tt.unit_rows(torch, tensors[0], device), tt.unit_rows(torch, tensors[1], device, p.gindex)
    n, m = q.shape[0], g.shape[0]
    n_pos, n_ret = positive_counts(p, budget), m - p.n_excluded()
    run = _Runner(torch, p, q, g, budget, options, n_ret)
    cap = ranks.cap
    if ranks.ranks is Ranks.TOP:
        limit = np.minimum(np.maximum(n_pos, ranks.depth), n_ret)
    else:
        limit = np.minimum(cap if cap is not None else FIRST_DEPTH, n_ret)
    first, opposite = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    todo, depth, pieces = np.flatnonzero(n_pos > 0), limit.copy(), []
    with tt.matmul_mode(torch, device, options.precision):
        while todo.size:
            rows, n_ranks, flat, f, o, found = run.top(todo, depth[todo])
            if not pieces and ranks.ranks is Ranks.TOP:  # the first round: the ranks within each L
                pieces.append((rows, n_ranks, flat))
            first[rows[found]], opposite[rows[found]] = f[found], o[found]
            missed = rows[~found]
            if cap is not None:  # beyond L >= cap: the first rank reads cap; the opposite one is exact or >= L
                first[missed] = cap
                opposite[missed] = np.where(o[~found] >= 0, np.minimum(o[~found], cap), cap)
                break
            todo = missed  # deeper, until found (at most every retrievable item: always found)
            depth[todo] = np.minimum(4 * depth[todo], n_ret[todo])
    if run.handed:  # rows whose cells mostly tie (collapsed embeddings): the numpy engine's exact tiles
        handed = np.unique(np.concatenate(run.handed))
        exact = rank_problem(_host_problem(torch, p, q, g, handed, tensors is not None), budget, ranks)
        first[handed], opposite[handed] = exact.first_rank, exact.first_rank_opposite
        if ranks.ranks is Ranks.TOP:  # those whose first-round ranks the device did not give
            new = ~np.isin(handed, pieces[0][0]) if pieces else np.ones(handed.size, dtype=bool)
            sizes = np.diff(exact.offsets)
            pieces.append((handed[new], sizes[new], exact.ranks[spans(exact.offsets[:-1][new], sizes[new])]))
        log.debug("torch backend: %d queries handed to the numpy engine (more than %d candidates tied beyond L)",
                  handed.size, HAND_OVER)
    has = n_pos > 0
    if cap is not None:
        first[has], opposite[has] = np.minimum(first[has], cap), np.minimum(opposite[has], cap)
    log.debug("torch backend on %s (%s, %d shard(s)): %d queries x %d gallery items, %s, %d block(s), %.3f s%s",
              device, options.precision, options.shards, n, m, ranks, run.blocks, time.perf_counter() - started,
              "" if run.ray is None else
              f"; ray: {run.ray.tasks} tasks, worker peak {run.ray.peak_rss / 2**20:.0f} MiB, "
              f"{run.ray.peak_growth / 2**20:.0f} MiB above a task's start")
    if ranks.ranks is Ranks.TOP:
        offsets, outs = rows_to_csr(n, pieces)
        flat = outs[0] if outs else np.empty(0, dtype=np.int64)
        return Ranking(n_pos, n_ret, offsets, flat, opposite, True, cap, limit, first)
    return Ranking(n_pos, n_ret, np.r_[0, np.cumsum(has)], first[has], opposite, False, cap)


def _host_problem(torch, p: Problem, q, g, rows: np.ndarray, from_tensors: bool) -> Problem:
    """The problem of queries ``rows`` alone for the numpy engine: with the device's unit rows copied to the host
    when the caller's tensors were normalised there (``p`` then holds stand-ins)."""
    sub = p.queries(rows)
    if not from_tensors:
        return sub
    return replace(sub, q=q[torch.as_tensor(rows, device=q.device)].cpu().numpy(), gp=g.cpu().numpy())


class _Runner:
    """The candidate pass of one problem on one device: blocks of queries, shards of the gallery."""

    def __init__(self, torch, p: Problem, q, g, budget: Budget, options: TorchOptions, n_ret: np.ndarray) -> None:
        self.torch, self.p, self.q, self.g, self.options, self.n_ret = torch, p, q, g, options, n_ret
        self.m = g.shape[0]
        self.slack = 2 * tt.matmul_bound(q.shape[1], options.precision)
        self.width = max(1, min(options.tile_cols or TILE_COLS, self.m))
        self.bytes = budget.bytes
        cuts = np.linspace(0, self.m, max(1, min(options.shards, self.m)) + 1).astype(np.int64)
        gpus = torch.cuda.device_count() if q.device.type == "cuda" else 0
        # shard s on GPU s % gpus when there are several, else on the problem's device
        self.shards = [(int(a), int(b), torch.device("cuda", s % gpus) if gpus > 1 else q.device)
                       for s, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]
        self.blocks, self.ray = 0, None
        #: Row arrays handed to the numpy engine: their candidates overflowed with more than HAND_OVER slots beyond L.
        self.handed: list[np.ndarray] = []
        if options.ray is not None:  # the shards on Ray tasks: held in the object store, not here
            from recallk.score.ranking.torch_ray import RayShards

            self.ray = RayShards(*options.ray)
            self.ray.prepare(p, g.cpu().numpy(), [(a, b) for a, b, _ in self.shards])
            self.shard_g = []
        else:
            self.shard_g = [g[a:b].to(dev) for a, b, dev in self.shards]

    def slots(self, depth: int) -> int:
        """Buffer slots per row for a depth: L plus a margin for the cells within ``2 tol`` of the L-th (ties),
        ``max(16, L / 2)``, at most the gallery. ``torch.topk``'s cost grows with the slots; a row whose window
        holds more overflows and runs again with 4x the slots."""
        return int(min(depth + max(16, depth // 2), self.m))

    def block_rows(self, k: int) -> int:
        """Rows per block within the budget: the float32 tile (4 bytes a column), the tiles' tops held and the
        buffer (up to a tile's width plus 2 k slots, 12 bytes each), their merge (as many) and its result."""
        fit = int(self.bytes // (28 * self.width + 68 * k + 16 * self.q.shape[1]))
        return max(1, min(self.options.block_rows or BLOCK_ROWS, fit))

    def top(self, rows: np.ndarray, depth: np.ndarray) -> tuple:
        """Exact first ``depth[i]`` ranks of queries ``rows``: (rows, ranks per row, ranks, first, opposite,
        found), in the order of ``rows`` sorted by depth."""
        order = np.argsort(depth, kind="stable")
        rows, depth = rows[order], depth[order]
        parts, start = [], 0
        while start < rows.size:
            k = self.slots(int(depth[start:].min()))
            step = self.block_rows(self.slots(int(depth[min(start + self.block_rows(k), rows.size) - 1])))
            parts.append(self._block(rows[start:start + step], depth[start:start + step]))
            start += step
        cat = [np.concatenate([part[j] for part in parts]) for j in range(6)]
        return tuple(cat)

    def _block(self, rows: np.ndarray, depth: np.ndarray, k: int | None = None) -> tuple:
        """:meth:`top` of one block; rows whose buffer overflows run again with 4x the slots."""
        torch, p = self.torch, self.p
        self.blocks += 1
        k = self.slots(int(depth.max())) if k is None else k
        q = self.q[torch.as_tensor(rows, device=self.q.device)]
        if self.ray is not None:
            parts = [(torch.tensor(v, device=q.device), torch.tensor(c, device=q.device))  # copies: read-only
                     for v, c in self.ray(q.cpu().numpy(), rows, k, self.width, self.options.precision)]
        else:
            keep = tt.Keep(k, self.width, self.options.precision)
            parts = [tt.candidates(torch, p, q.to(dev), g, rows, (a, b), keep)
                     for (a, b, dev), g in zip(self.shards, self.shard_g)]
        vals, cols = tt.merge(torch, parts, k)
        at = torch.as_tensor(depth - 1, device=vals.device)
        theta = tt.floor_below(torch, vals.gather(1, at[:, None])[:, 0].to(torch.float64) - self.slack)
        kept = vals.shape[1]
        over = ((vals[:, -1] >= theta).cpu().numpy() & (self.n_ret[rows] > kept))
        if over.any():  # some candidates may have been dropped: those rows again with more slots
            crowded = over & (kept >= depth + HAND_OVER)  # that many ties would be re-scored one pair at a time
            if crowded.any():
                self.handed.append(rows[crowded])
                over &= ~crowded
            ok = np.flatnonzero(~over & ~crowded)
            done = [self._finish(rows[ok], depth[ok], vals[ok], cols[ok], theta[ok])] if ok.size else []
            if over.any():
                done.append(self._block(rows[over], depth[over], min(4 * k, self.m)))
            if not done:
                return _NONE
            return done[0] if len(done) == 1 else tuple(np.concatenate([a, b]) for a, b in zip(*done))
        return self._finish(rows, depth, vals, cols, theta)

    def _finish(self, rows: np.ndarray, depth: np.ndarray, vals, cols, theta) -> tuple:
        """Each row's candidates (scores ``>= theta``), the near-ties re-scored exactly, ranked by the engine's
        order keys, as :meth:`recallk.score.ranking.top._Run.finish` does."""
        torch, p, m = self.torch, self.p, self.m
        valid_t = vals >= theta[:, None]
        close = tt.near_ties(torch, vals, self.slack) & valid_t
        line, at = torch.nonzero(close, as_tuple=True)
        sims = torch.where(valid_t, vals, torch.zeros((), dtype=vals.dtype, device=vals.device))
        if line.numel():  # only scores within 2 tol of a neighbour's may be out of order: those exactly
            q_rows = torch.as_tensor(rows, device=self.q.device)[line.to(self.q.device)]
            exact = tt.exact_scores(torch, self.q, self.g, q_rows, cols[line, at].to(self.g.device))
            sims[line, at] = exact.to(vals.device)
        valid, sims, cols = valid_t.cpu().numpy(), sims.cpu().numpy(), cols.cpu().numpy()
        used = sims.shape[1]
        value = value_keys(sims, m)
        index = p.gindex[cols]
        positive = valid & (cols >= p.lo[rows][:, None]) & (cols < p.hi[rows][:, None])
        key = (value + (m - 1 - index)) * 2 + positive
        key[~valid] = BELOW
        key.sort(axis=1)
        flag = (key[:, ::-1] & 1).astype(bool)  # highest key (first rank) first; BELOW's low bit is 0
        top = flag & (np.arange(used)[None, :] < depth[:, None])
        line, rank = np.nonzero(top)
        n_ranks = np.bincount(line, minlength=rows.size)
        found = n_ranks > 0
        first = np.where(found, top.argmax(axis=1) if used else 0, -1)
        # opposite rule: ties go to the larger gallery index; the cells whose key beats every positive's
        other = np.where(valid, value + index, BELOW)
        best = np.where(positive, other, BELOW).max(axis=1, initial=BELOW)
        opposite = np.where(positive.any(axis=1), (other > best[:, None]).sum(axis=1), -1)
        return rows, n_ranks, rank.astype(np.int64), first, opposite, found
