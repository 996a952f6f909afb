"""Settings given once: one frozen dataclass per ``params.yaml`` section and sub-section.

Each field carries its default and its rule (:func:`recallk.settings.base.setting`), so the params
schema the stages check, the defaults and the table in ``docs/params.md`` all come from these classes.
Each section lives in its own module (:mod:`~recallk.settings.split`, :mod:`~recallk.settings.encode`,
:mod:`~recallk.settings.score`), so a DVC stage depends only on the settings it reads. This file imports
nothing, for the same reason.
"""

#: The sections of ``params.yaml``, in file order: each one's settings class, in ``recallk/settings/<section>.py``
#: (by name: :func:`recallk.settings.base.section_class` imports one when it is asked for).
SECTIONS = {"split": "SplitSettings", "encode": "EncodeSettings", "score": "ScoreSettings",
            "index": "IndexSettings"}
