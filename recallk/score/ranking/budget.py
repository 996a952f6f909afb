"""``max_memory_mb``: every rule that turns the memory bound into rows, cells or tiles, in one place."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

_MIB = 2**20


@dataclass(frozen=True)
class Budget:
    """The memory bound of one ranking, and what it allows each part of the engine.

    The budget first pays for what a ranking holds throughout (the unit copies of
    queries and gallery when they fit :attr:`UNIT_SHARE`, the positive lists and their
    counters); the tiles get what is left (:meth:`tiles`), shared among the cores. Every size is at least one row or
    :attr:`MIN_PAIRS` cells, whatever the budget.

    Parameters
    ----------
    max_memory_mb : float
        The bound, in MiB.
    """

    max_memory_mb: float

    #: Complete ranking, per exact tile cell and thread: the float64 product, its float32 rounding (sorted in
    #: place), the leave-one-out transposed copy and (with exclusion columns) the exclusion masks' booleans.
    EXACT_BYTES_PER_PAIR: ClassVar[int] = 20
    #: Fast path, per tile cell and thread: the float32 tile and (at most) two boolean compare scratches.
    TILE_BYTES_PER_PAIR: ClassVar[int] = 6
    #: Positive lists and counters, per (query, positive) pair of the complete ranking (per query on the fast
    #: path): similarity (4 B), column (8 B) and five int64 counters.
    POSITIVE_BYTES: ClassVar[int] = 52
    #: The positives' product of one large label, per cell: the float64 product, its float32 rounding, the
    #: sort's order and the boolean masks.
    LABEL_BYTES_PER_CELL: ClassVar[int] = 24
    #: Stacked products of small labels' positives (:mod:`~recallk.score.ranking.positives`), per cell of a stack:
    #: its float32 score and boolean masks ...
    STACK_BYTES_PER_CELL: ClassVar[int] = 8
    #: ... per gathered unit row and dimension: its float32 value, and the float64 scratch that normalises it
    #: when the set is not held ...
    STACK_BYTES_PER_VALUE: ClassVar[int] = 12
    #: ... and the share of the budget one stack may take (the tiles have not started yet).
    STACK_SHARE: ClassVar[float] = 1 / 16
    #: faiss backend, per searched cell: a float32 score and an int64 gallery index.
    SEARCH_BYTES_PER_CELL: ClassVar[int] = 12
    #: Neighbours (recallk.score.ranking.neighbors), per block cell: the float32 product, its partitioned copy and
    #: the candidate mask.
    NEIGHBOR_BYTES_PER_CELL: ClassVar[int] = 9
    #: Smallest block or tile, whatever the budget (48 KiB of scratch): below it Python overhead dominates.
    MIN_PAIRS: ClassVar[int] = 4096
    #: Share of the budget that the unit copies of queries and gallery may take; a set whose copy does not fit
    #: is normalised tile by tile when read (:class:`~recallk.score.ranking.problem.UnitRows`).
    UNIT_SHARE: ClassVar[float] = 0.25
    #: Share of the budget that one chunk of queries' positive lists and counters may take.
    LIST_SHARE: ClassVar[float] = 0.25
    #: Share of what is left for the tiles once the lists are held (the rest: BLAS, temporaries) ...
    TILE_SHARE: ClassVar[float] = 0.8
    #: ... and the tiles' floor, as a share of the whole budget.
    TILE_FLOOR: ClassVar[float] = 0.25
    #: Share of each core's tile budget for the copies of a tile's rows and columns (float64 for an exact tile,
    #: float32 unit rows for a fast one).
    VECTOR_SHARE: ClassVar[float] = 0.25
    #: Direct path: most query x gallery cells of a problem ranked from one exact product, without tiles or
    #: threads (:mod:`~recallk.score.ranking.direct`); larger problems take the tiles. Measured on 2 cores
    #: (d = 64 to 512, BLAS on one thread): the direct path costs 0.7 to 1.1 times the tiles at 2**17 cells,
    #: up to 1.6 times at 2**18 and 1.1 to 2.1 times at 2**19 (docs/internals/engine.md).
    DIRECT_CELLS: ClassVar[int] = 2**17
    #: Direct path, per cell: the float64 product and its float32 rounding, then the int64 order keys, their
    #: opposite-rule copy and the boolean masks.
    DIRECT_BYTES_PER_CELL: ClassVar[int] = 24

    #: Top-L pass (:mod:`~recallk.score.ranking.top`), per tile cell and thread: the float32 tile and its
    #: boolean compare.
    TOP_BYTES_PER_PAIR: ClassVar[int] = 5
    #: Top-L pass, per candidate slot of a row (``2 L`` plus a tile's width): the float32 score and int64
    #: column held, their copies while a row is pruned, the order keys, sort and masks when a run finishes.
    TOP_BYTES_PER_SLOT: ClassVar[int] = 40
    #: Top-L pass: most rows of one run (a tile of 512 x 2,048 float32 cells, 4 MiB, stays in the cache).
    TOP_MAX_ROWS: ClassVar[int] = 512
    #: Top-L pass: deepest L served, as a share of the gallery; deeper queries (few, large labels) take the
    #: complete ranking. Measured (2,000 x 20,000 x 256-d, clustered, 2 cores): the pass costs 0.41x the
    #: complete ranking at L = 0.5% of the gallery, 0.71x at 2.5%, 1.0x at 5% and 1.2x at 10%.
    TOP_DEPTH_SHARE: ClassVar[float] = 0.05

    @property
    def bytes(self) -> float:
        """The bound in bytes."""
        return self.max_memory_mb * _MIB

    def unit_bytes(self) -> float:
        """Most bytes of unit copies held throughout (:attr:`UNIT_SHARE` of the budget)."""
        return self.bytes * self.UNIT_SHARE

    def label_rows(self, width: int) -> int:
        """Rows of one large label's positives product, ``width`` columns wide (at least one)."""
        return max(1, int(self.bytes // (self.LABEL_BYTES_PER_CELL * width)))

    def stacked_labels(self, q_side: int, g_side: int, dim: int, most_cells: int, most_rows: int,
                       workers: int = 1) -> int:
        """Labels in one stacked product of small labels' positives, each padded to ``q_side`` queries x
        ``g_side`` gallery items: at most ``most_cells`` cells and ``most_rows`` gathered rows, one stack per
        thread of ``workers`` within :attr:`STACK_SHARE` of the budget; at least one."""
        per_label = self.STACK_BYTES_PER_VALUE * dim * (q_side + g_side) + self.STACK_BYTES_PER_CELL * q_side * g_side
        room = int(self.bytes * self.STACK_SHARE / workers // per_label)
        return max(1, min(most_cells // (q_side * g_side), most_rows // (q_side + g_side), room))

    def chunk_positives(self) -> int:
        """Most positives in one chunk of queries of the complete ranking: their lists and counters
        take :attr:`LIST_SHARE` of the budget (at least one)."""
        return max(1, int(self.bytes * self.LIST_SHARE // self.POSITIVE_BYTES))

    def tiles(self, unit_bytes: int, n_entries: int) -> Budget:
        """The tiles' budget once the unit copies (``unit_bytes``) and ``n_entries`` positive lists' entries
        are held: :attr:`TILE_SHARE` of what is left, never below :attr:`TILE_FLOOR` of the whole."""
        held = unit_bytes + self.POSITIVE_BYTES * n_entries
        mb = self.max_memory_mb
        return Budget(max(mb * self.TILE_FLOOR, self.TILE_SHARE * (mb - held / _MIB)))

    def fast_tile_cells(self, workers: int, most: int) -> int:
        """Cells of one fast tile: each of ``workers`` threads holds one (:attr:`TILE_BYTES_PER_PAIR`
        per cell) in what its share leaves after :attr:`VECTOR_SHARE`; at most ``most``, at least
        :attr:`MIN_PAIRS`."""
        per_core = self.bytes / workers
        return max(self.MIN_PAIRS, min(most, int(per_core * (1 - self.VECTOR_SHARE) // self.TILE_BYTES_PER_PAIR)))

    def fast_tile_side(self, workers: int, dim: int) -> int:
        """Most rows or columns of one fast tile: their float32 unit rows (two sides of ``dim`` values, read
        for the tile when the set is not held) take :attr:`VECTOR_SHARE` of each thread's share."""
        return self._side(workers, 4 * dim)

    def exact_tile_cells(self, workers: int, most: int) -> int:
        """Cells of one exact tile: each of ``workers`` threads holds one (:attr:`EXACT_BYTES_PER_PAIR`
        per cell) in what its share leaves after :attr:`VECTOR_SHARE`; at most ``most``, at least
        :attr:`MIN_PAIRS`."""
        per_core = self.bytes / workers
        return max(self.MIN_PAIRS, min(most, int(per_core * (1 - self.VECTOR_SHARE) // self.EXACT_BYTES_PER_PAIR)))

    def exact_tile_side(self, workers: int, dim: int) -> int:
        """Most rows or columns of one exact tile: their float64 copies (two sides of ``dim`` values) take
        :attr:`VECTOR_SHARE` of each of ``workers`` threads' share; at least the side of :attr:`MIN_PAIRS`."""
        return self._side(workers, 8 * dim)

    def _side(self, workers: int, row_bytes: int) -> int:
        """Rows or columns whose copies (two sides of ``row_bytes`` each) fit :attr:`VECTOR_SHARE` of each of
        ``workers`` threads' share; at least the side of :attr:`MIN_PAIRS`."""
        per_core = self.bytes / workers
        return max(math.isqrt(self.MIN_PAIRS), int(per_core * self.VECTOR_SHARE // (2 * row_bytes)))

    def top_rows(self, per_core: float, width: int, depth: int, most: int | None = None) -> int:
        """Rows of one run of the top-L pass whose deepest query has L = ``depth``: its tile (``width`` columns,
        :attr:`TOP_BYTES_PER_PAIR` per cell, for at most :attr:`TOP_MAX_ROWS` rows at a time) and candidate
        buffers (``2 depth + width`` slots, :attr:`TOP_BYTES_PER_SLOT` each) fit ``per_core`` bytes less
        :attr:`VECTOR_SHARE`; 1 to ``most`` (default :attr:`TOP_MAX_ROWS`)."""
        most = self.TOP_MAX_ROWS if most is None else most
        room, tile = per_core * (1 - self.VECTOR_SHARE), width * self.TOP_BYTES_PER_PAIR  # per row of the tile
        buffers = (2 * depth + width) * self.TOP_BYTES_PER_SLOT  # per row of the run
        rows = int(room // (buffers + tile))
        if rows > self.TOP_MAX_ROWS:  # the tile stops growing at TOP_MAX_ROWS rows; the buffers do not
            rows = int((room - self.TOP_MAX_ROWS * tile) // buffers)
        return max(1, min(most, rows))

    def top_depth(self, per_core: float, width: int, gallery_size: int) -> int:
        """Deepest L the top-L pass serves: at most :attr:`TOP_DEPTH_SHARE` of the gallery (at least 1), and
        one row's buffers within ``per_core`` bytes less :attr:`VECTOR_SHARE` (:meth:`top_rows`)."""
        slots = per_core * (1 - self.VECTOR_SHARE) - width * self.TOP_BYTES_PER_PAIR
        fits = int((slots / self.TOP_BYTES_PER_SLOT - width) // 2)
        return min(max(1, int(gallery_size * self.TOP_DEPTH_SHARE)), fits)

    def direct(self, n_query: int, n_gallery: int, unit_bytes: int) -> bool:
        """Whether ``n_query`` x ``n_gallery`` takes the direct path: at most :attr:`DIRECT_CELLS` cells, and the
        unit copies (``unit_bytes``), their float64 copies (twice as many bytes) and
        :attr:`DIRECT_BYTES_PER_CELL` per cell fit the budget."""
        cells = n_query * n_gallery
        return cells <= self.DIRECT_CELLS and 3 * unit_bytes + self.DIRECT_BYTES_PER_CELL * cells <= self.bytes

    def search_rows(self, gallery_size: int) -> int:
        """Queries per faiss search of the whole gallery (:attr:`SEARCH_BYTES_PER_CELL` per cell; at least one)."""
        return max(1, int(self.bytes // (self.SEARCH_BYTES_PER_CELL * gallery_size)))

    def neighbor_rows(self, held_bytes: int, gallery_size: int) -> int:
        """Queries per block of the neighbour search once ``held_bytes`` (unit copies, results) are held:
        the :meth:`tiles` share at :attr:`NEIGHBOR_BYTES_PER_CELL` per cell (at least one)."""
        work = self.tiles(held_bytes, 0)
        return max(1, int(work.bytes // (self.NEIGHBOR_BYTES_PER_CELL * gallery_size)))
