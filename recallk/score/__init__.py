"""Scoring: similarity, the exact ranking engine, metrics, tables, whitening and the report."""
