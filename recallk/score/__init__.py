"""The metric library: one checked :class:`~recallk.score.retrieval_data.RetrievalData`, the exact ranking engine
(:mod:`~recallk.score.ranking`, its pass a :class:`~recallk.score.passes.Pass`), the metric registry
(:mod:`~recallk.score.registry`), per-query values and means (:mod:`~recallk.score.values`), the public
functions and :class:`~recallk.score.metrics.Scorer`, similarity, whitening, the embedding copy check, the
``score`` params (:mod:`~recallk.score.settings`) and the stage's computation (:mod:`~recallk.score.suite`,
:mod:`~recallk.score.tables`). The rendering of the stage's outputs lives in :mod:`recallk.report`."""
