"""Paired comparison of two retrieval systems on the same queries (``recallk compare A B``).

:mod:`recallk.compare.paired` (aligning two per-query tables and
comparing every metric), :mod:`recallk.compare.sources` (files, folders, git revisions,
DVC experiments) and :mod:`recallk.compare.cli`; ``leaderboard``, ``track`` and ``report``
(:mod:`~recallk.compare.board_cli`, :mod:`~recallk.compare.multi_report`). The statistics they use live in
:mod:`recallk.stats`.
"""
