"""The params tables of ``docs/params.md``, generated from the settings classes.

Each table lies between two markers (:data:`BEGIN`, :data:`END`) that name its section; the prose around
them is kept as written. ``python -m stages.params_doc`` rewrites the tables of the repository's
``docs/params.md`` in place, and a test fails while the committed tables differ from :func:`render`'s.
No stage imports this module.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from recallk.settings.base import default_of, fields
from stages.params import SECTIONS, section_class

BEGIN = ("<!-- the {section} table: generated from {module} "
         "(python -m stages.params_doc) -->")
END = "<!-- end of the {section} table -->"


def yaml_text(value: Any) -> str:
    """``value`` as params.yaml writes it (flow style): ``null``, ``true``, ``[1, 5, 10]``, ``data/digits``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(yaml_text(v) for v in value)}]"
    return str(value)


def table(cls: type) -> str:
    """The markdown table of a settings class: one row per param (dotted below its section), its
    default and its doc."""
    rows = ["| param | default | meaning |", "|---|---|---|"]
    rows += [f"| `{name}` | `{yaml_text(default_of(f))}` | {f.metadata['doc']} |" for name, f in fields(cls)]
    return "\n".join(rows)


def render(text: str) -> str:
    """``text`` (docs/params.md) with each section's table, between its markers, generated anew."""
    for section in SECTIONS:
        module = SECTIONS[section].split(":")[0].replace(".", "/") + ".py"
        begin, end = BEGIN.format(section=section, module=module), END.format(section=section)
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.DOTALL)
        if not pattern.search(text):
            raise ValueError(f"docs/params.md has no {begin!r} ... {end!r} block for the {section} table")
        block = f"{begin}\n{table(section_class(section))}\n{end}"
        text = pattern.sub(lambda _, block=block: block, text, count=1)
    return text


#: The repository's params page (the tables' home).
PARAMS_MD = Path(__file__).resolve().parents[1] / "docs" / "params.md"

if __name__ == "__main__":
    PARAMS_MD.write_text(render(PARAMS_MD.read_text(encoding="utf-8")), encoding="utf-8")
