"""The settings machinery (:mod:`recallk.settings.base`): one frozen dataclass per ``params.yaml`` section
and sub-section, each field with its default and its rule.

Each section's class lives in its stage's wing (:mod:`recallk.data.settings`, :mod:`recallk.encode.settings`,
:mod:`recallk.score.settings`, :mod:`recallk.index.settings`), so a DVC stage depends only on the settings it
reads; the stage plumbing (:mod:`stages.params`) names the sections. This package imports no wing.
"""
