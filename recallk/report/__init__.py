"""Rendering only: the report block (:mod:`~recallk.report.block`), provenance, the score stage's HTML page,
the failure contact sheet and what every page shares (:mod:`~recallk.report.page`). Nothing here computes a
metric: :func:`recallk.score.suite.score_split` does, and the stage hands its results to these modules."""
