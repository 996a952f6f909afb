"""Scoring an approximate index against the exact engine: the ``index`` stage's library.

:mod:`~recallk.index.kinds` builds and searches FAISS factory strings and hnswlib,
:mod:`~recallk.index.lists` turns an index's answers into ranked lists under the exact engine's
exclusion rules and computes every label metric from them, :mod:`~recallk.index.knn` the k-NN recall
under the two published definitions, :mod:`~recallk.index.sweep` runs the operating points and pairs
each with the exact run, :mod:`~recallk.index.page` draws the Pareto plot and the page.
"""
