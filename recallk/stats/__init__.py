"""Paired statistics and resampling, one low room that the score stage (intervals), the index stage (each
point against exact) and the compare commands all use: :mod:`~recallk.stats.resample` (bootstrap means and
intervals, the content order) and :mod:`~recallk.stats.inference` (paired bootstrap, sign-flip and McNemar
tests, Holm, power)."""
