"""Rendering the score stage's outputs: the tables, the report block and provenance, the HTML page and
the failure contact sheet, and :func:`~recallk.report.suite.score_split`, which computes them all."""
