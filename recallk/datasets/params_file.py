"""Writing the protocol's params into a params.yaml with ruamel's round trip: comments, key order and the
other values stay as they were; only the keys given change."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any

from recallk.errors import InputError, clip, quote


def apply_params(params: dict[str, dict[str, Any]], path: str | os.PathLike = "params.yaml") -> None:
    """Set each ``params[section][key]`` in the params file ``path`` (written atomically), keeping its comments.

    Lists are written in flow style (``[label, camera]``), as params.yaml writes them. Raises an InputError
    when the file is missing, is not YAML, or lacks a section."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedSeq
    from ruamel.yaml.error import YAMLError

    path = Path(path)
    if not path.is_file():
        raise InputError(f"--apply: {quote(str(path))} not found; run in the project's folder or pass --params.")
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    try:
        data = yaml.load(path.read_text(encoding="utf-8"))
    except (YAMLError, UnicodeDecodeError) as exc:
        raise InputError(f"--apply: {quote(str(path))} is not readable YAML ({clip(str(exc))}).") from None
    for section, values in params.items():
        if not isinstance(data, dict) or not isinstance(data.get(section), dict):
            raise InputError(f"--apply: {quote(str(path))} has no `{section}` section; add one (or copy the "
                             "project's params.yaml) and run again.")
        for key, value in values.items():
            if isinstance(value, list):
                seq = CommentedSeq(value)
                seq.fa.set_flow_style()
                value = seq
            data[section][key] = value
    text = io.StringIO()
    yaml.dump(data, text)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text.getvalue())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
