"""Paired comparison of two retrieval systems on the same queries (``recallk compare A B``).

:mod:`recallk.compare.stats` (paired bootstrap, sign-flip randomization, exact McNemar,
Holm, Cohen's d_z), :mod:`recallk.compare.paired` (aligning two per-query tables and
comparing every metric), :mod:`recallk.compare.sources` (files, folders, git revisions,
DVC experiments) and :mod:`recallk.compare.cli`.
"""
