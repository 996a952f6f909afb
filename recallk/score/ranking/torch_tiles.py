"""The device side of ``score.backend: torch``: float32 candidate tiles, the certified window, exact re-scores.

Everything here runs on one torch device (``cpu`` or ``cuda:N``) and holds no numpy but what the shared
:class:`~recallk.score.ranking.problem.Problem` hands it (the exclusions, as boolean tiles).

* :func:`matmul_bound`: the bound ``tol`` on ``|device score - exact similarity|`` of unit float32 rows,
  per precision. float32 (the default): Higham's bound for a dot product in any summation order,
  ``|fl(q.g) - q.g| <= gamma_d sum|q_i g_i|``, ``gamma_d = d u / (1 - d u)``, ``u = 2**-24`` (N. J. Higham,
  *Accuracy and Stability of Numerical Algorithms*, 2nd ed., 2002, section 3.1, eq. 3.5), with
  ``sum|q_i g_i| <= |q| |g| <= 1 + 2u``; plus ``2u`` for the exact value's own rounding to float32 and its
  float64 accumulation. TF32 / bfloat16 (``score.matmul``) first round every input to ``t`` mantissa
  bits (unit roundoff ``v = 2**-11`` / ``2**-8``): ``|q~.g~ - q.g| <= (2v + v**2) sum|q_i g_i|``, then the
  float32 accumulation as above, and (bfloat16 returns bfloat16) one more rounding of the result (``v``).
* :func:`candidates`: a block of queries against the gallery columns ``[c0, c1)``, tile by tile: the
  float32 product, the cells a query may not retrieve set to ``-inf`` (from ``Problem.excluded``, the
  engine's one exclusion rule), each tile's ``torch.topk`` of ``K`` cells per row, merged with the running
  ``K`` best once the tops held reach a tile's width (a few ``torch`` calls per tile: each call on a busy CPU,
  or a GPU launch, has its cost however small the tensor).
* :func:`exact_scores`: float64 sums of float32 products in a fixed order (a pairwise tree over the
  coordinates, one elementwise add at a time: the same bits on every device), rounded once to float32: the
  similarity of :func:`recallk.score.similarity.cosine_block`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from recallk.score.ranking.problem import Problem

#: ``score.matmul`` values: the inputs' mantissa unit roundoff of the candidate product.
PRECISIONS = {"float32": 2.0**-24, "tf32": 2.0**-11, "bfloat16": 2.0**-8}
#: float64 elements of one re-score chunk (its products: 8 bytes each).
_EXACT_ELEMENTS = 2**22
#: Cells of a block's exclusion mask made at once (1 byte each) rather than tile by tile.
_MASK_CELLS = 2**22


def matmul_bound(d: int, precision: str = "float32") -> float:
    """Bound on ``|candidate score - exact similarity|`` for unit rows of dimension ``d`` (see the module)."""
    u = 2.0**-24
    if precision == "float32":
        return d * u / (1 - d * u) * (1 + 2 * u) + 2 * u
    # Tensor cores may truncate instead of rounding to nearest, both the inputs' conversion and the float32
    # accumulation (Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ
    # Computer Science 7:e330, 2021): an error of up to one unit in the last place, twice round-to-nearest's.
    v, w = 2 * PRECISIONS[precision], 2 * u
    gamma = d * w / (1 - d * w)
    rounded = (2 * v + v * v) * (1 + 2 * u)  # the inputs converted to the narrow format
    accumulated = gamma * (1 + v) ** 2 * (1 + 2 * u)  # float32 accumulation of the converted products
    out = v * (1 + rounded + accumulated) if precision == "bfloat16" else 0.0  # bfloat16 result rounding
    return rounded + accumulated + out + 2 * u


@contextlib.contextmanager
def matmul_mode(torch, device, precision: str) -> Iterator[None]:
    """torch's global matmul switches for ``precision`` on ``device``, restored afterwards, so the bound holds
    whatever the caller set (``torch.set_float32_matmul_precision("medium")`` lets float32 products run in
    TF32 on CUDA and in bfloat16 through oneDNN on a CPU).

    CUDA: float32 turns TF32 off, ``tf32`` turns it on, and reduced-precision (bfloat16) split-K reductions are
    off. CPU: oneDNN's float32 matmuls are held to IEEE float32 (``torch.backends.mkldnn.matmul.fp32_precision
    = "ieee"``); bfloat16 candidates are bfloat16 tensors, whatever that switch says."""
    if device.type == "cuda":
        cuda = torch.backends.cuda.matmul
        saved = (cuda.allow_tf32, cuda.allow_bf16_reduced_precision_reduction)
        try:
            cuda.allow_tf32 = precision == "tf32"
            cuda.allow_bf16_reduced_precision_reduction = False
            yield
        finally:
            cuda.allow_tf32, cuda.allow_bf16_reduced_precision_reduction = saved
        return
    onednn = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    if device.type != "cpu" or onednn is None:
        yield
        return
    before = onednn.fp32_precision
    try:
        onednn.fp32_precision = "ieee"
        yield
    finally:
        onednn.fp32_precision = before


def unit_rows(torch, x, device, order: np.ndarray | None = None):
    """:func:`recallk.score.similarity.l2_normalize` on the device: float64 rows divided by their largest magnitude
    (:func:`~recallk.score.similarity.needs_peak`), then every row by its norm, in float64, rounded once to float32
    (a zero row stays zero). ``x``: a tensor (used
    where it lives, never copied to numpy) or an array; ``order``: the rows to take, in that order."""
    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))
    t = t.to(device)
    if order is not None:
        t = t[torch.as_tensor(order, device=device)]
    out = torch.empty(t.shape, dtype=torch.float32, device=device)
    step = max(1, _EXACT_ELEMENTS // max(1, t.shape[1]))
    tiny = torch.tensor(5e-324, dtype=torch.float64, device=device)
    scale = t.dtype.is_floating_point and t.dtype.itemsize >= 8  # needs_peak, for a torch dtype
    for s in range(0, t.shape[0], step):
        chunk = t[s:s + step].to(torch.float64)
        if scale:
            chunk = chunk / (torch.maximum(chunk.abs().amax(dim=1, keepdim=True), tiny) if chunk.shape[1] else tiny)
        norms = torch.sqrt(torch.einsum("ij,ij->i", chunk, chunk))
        out[s:s + step] = (chunk / torch.maximum(norms, tiny)[:, None]).to(torch.float32)
    return out


@dataclass(frozen=True)
class Keep:
    """What a candidate pass keeps (:func:`candidates`): ``k`` cells per query row, over tiles of ``width`` gallery
    columns, the products in ``precision`` (``score.matmul``)."""

    k: int
    width: int
    precision: str


def candidates(torch, p: Problem, q, g, rows: np.ndarray, span: tuple[int, int], keep: Keep) -> tuple:
    """The ``keep.k`` highest candidate scores of each query ``rows`` among gallery columns ``span`` = ``[c0, c1)``.

    Parameters
    ----------
    q : tensor
        (len(rows), d) float32 unit rows of the queries ``rows`` (positions in ``p``), on the device.
    g : tensor
        (c1 - c0, d) float32 unit rows of those gallery columns (sorted by label), on the device.
    keep : Keep
        Cells kept per row, gallery columns per tile, the products' precision.

    Returns
    -------
    (values, columns) : tensors
        (len(rows), min(k, c1 - c0)) float32 scores, highest first (``-inf``: a cell the query may not
        retrieve), and their gallery columns (int64, sorted positions).
    """
    (c0, c1), k, width, precision = span, keep.k, keep.width, keep.precision
    device = q.device
    narrow = {"bfloat16": torch.bfloat16}.get(precision)
    left = q.to(narrow) if narrow is not None else q
    vals = cols = None
    held, waiting = [], 0  # the tiles' tops not yet merged, and their columns
    own = p.self_col[rows]
    masked = bool(p.groups) or bool(np.any((own >= c0) & (own < c1)))
    # the exclusions of the whole range at once when small (a batch), else tile by tile
    whole = torch.from_numpy(p.excluded(rows, c0, c1)).to(device) \
        if masked and rows.size * (c1 - c0) <= _MASK_CELLS else None
    scratch = None  # one float32 tile reused (a fresh one per tile would fault its pages in every time)
    for t0 in range(c0, c1, width):
        t1 = min(t0 + width, c1)
        right = g[t0 - c0:t1 - c0]
        if narrow is not None:
            tile = (left @ right.to(narrow).T).to(torch.float32)
        else:
            if scratch is None or scratch.shape[1] != t1 - t0:
                scratch = torch.empty((q.shape[0], t1 - t0), dtype=torch.float32, device=device)
            tile = torch.mm(left, right.T, out=scratch)
        if whole is not None:
            tile.masked_fill_(whole[:, t0 - c0:t1 - c0], float("-inf"))
        elif masked and (p.groups or bool(np.any((own >= t0) & (own < t1)))):
            tile.masked_fill_(torch.from_numpy(p.excluded(rows, t0, t1)).to(device), float("-inf"))
        tv, tc = torch.topk(tile, min(k, t1 - t0), dim=1, sorted=False)
        held.append((tv, tc, t0))
        waiting += tv.shape[1]
        if waiting >= width or t1 == c1:  # the tiles' tops merged with the buffer, a tile's width at a time
            vals, cols = _merge_tops(torch, vals, cols, held, k)
            held, waiting = [], 0
    return vals, cols


def _merge_tops(torch, vals, cols, held: list[tuple], k: int) -> tuple:
    """The ``k`` highest of the buffer (``vals``, ``cols``; None at first) and the tiles' tops ``held``
    ((values, tile columns, first column) each), highest first: one ``torch.topk`` for them all."""
    before = [] if vals is None else [(vals, cols, 0)]  # the buffer's columns are numbered already
    tops = before + held
    merged_v, merged_c = torch.cat([v for v, _, _ in tops], dim=1), torch.cat([c for _, c, _ in tops], dim=1)
    # the tiles' columns are numbered within their tile: each top's first column added, one add for all
    shift = np.repeat([t0 for _, _, t0 in tops], [v.shape[1] for v, _, _ in tops])
    merged_c += torch.from_numpy(shift).to(merged_c.device)[None, :]
    new_v, at = torch.topk(merged_v, min(k, merged_v.shape[1]), dim=1, sorted=True)
    return new_v, torch.gather(merged_c, 1, at)


def merge(torch, parts: list[tuple], k: int) -> tuple:
    """The ``k`` highest of several (values, columns) results of :func:`candidates` (shards), highest first."""
    if len(parts) == 1:
        return parts[0]
    device = parts[0][0].device
    vals = torch.cat([v.to(device) for v, _ in parts], dim=1)
    cols = torch.cat([c.to(device) for _, c in parts], dim=1)
    vals, at = torch.topk(vals, min(k, vals.shape[1]), dim=1, sorted=True)
    return vals, torch.gather(cols, 1, at)


def floor_below(torch, x64):
    """float64 ``x64`` rounded down to float32 (so a float32 compare against it keeps every cell above)."""
    y = x64.to(torch.float32)
    return torch.where(y.to(torch.float64) > x64, torch.nextafter(y, torch.full_like(y, float("-inf"))), y)


def near_ties(torch, vals, slack: float):
    """Boolean like ``vals`` (rows of candidate scores, highest first): the cells within ``slack`` (``2 tol``) of
    a neighbour in their row, the only ones whose order may differ from their exact similarities' (as
    :meth:`recallk.score.ranking.top._Run.finish` decides: the gap of two float32 scores in float64)."""
    close = torch.zeros(vals.shape, dtype=torch.bool, device=vals.device)
    if vals.shape[1] > 1:
        gap = vals[:, :-1].to(torch.float64) - vals[:, 1:].to(torch.float64)  # -inf - -inf: NaN, never near
        near = gap <= slack
        close[:, :-1] |= near
        close[:, 1:] |= near
    return close


def exact_scores(torch, q, g, line, col):
    """Exact similarities of the pairs (query ``line[j]``, gallery column ``col[j]``) of unit float32 rows ``q``
    and ``g`` (tensors on one device): float64 sums of the float32 products by a fixed pairwise tree (coordinate
    pairs (0, 1), (2, 3), ... added, then pairs of those sums, ...; each add one elementwise IEEE operation, so
    the same bits on every device), rounded once to float32. Returns a float32 tensor like ``line``."""
    d = q.shape[1]
    out = torch.empty(line.shape[0], dtype=torch.float32, device=q.device)
    step = max(1, _EXACT_ELEMENTS // max(1, d))
    for s in range(0, line.shape[0], step):
        # each product of two float32 values is exact in float64
        x = q[line[s:s + step]].to(torch.float64) * g[col[s:s + step]].to(torch.float64)
        while x.shape[1] > 1:  # the fixed tree: an odd last column is carried up as it is
            half = x.shape[1] // 2
            pair = x[:, 0:2 * half:2] + x[:, 1:2 * half:2]
            x = torch.cat([pair, x[:, 2 * half:]], dim=1) if x.shape[1] % 2 else pair
        out[s:s + step] = x[:, 0].to(torch.float32) if d else 0.0
    return out
