"""Writing the protocol's params into a params.yaml in place: only the value text of each key given changes
(a key the section lacks is added at its end); every other byte (comments, order, other values, a ``null``
spelled out, a byte-order mark) stays as it was. A params file that is a link is edited through it."""

from __future__ import annotations

import copy
import io
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from recallk.atomic import write_all
from recallk.errors import InputError, clip, quote

#: The UTF-8 byte-order mark, kept on a params file that starts with one.
BOM = "\ufeff"


def _flow(value: Any) -> str:
    """``value`` as YAML on one line: lists in flow style (``[label, camera]``, as params.yaml writes them),
    ``null``, strings quoted only where YAML needs it."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = True
    yaml.width = 1 << 20
    out = io.StringIO()
    yaml.dump([value], out)
    return out.getvalue().strip()[1:-1]


def _load(text: str, path: Path) -> tuple[Any, Any]:
    """The params as plain data and as a node tree (marks: where each value's text starts and ends)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        return YAML(typ="safe", pure=True).load(text), YAML().compose(text)
    except YAMLError as exc:
        raise InputError(f"--apply: {quote(str(path))} is not readable YAML ({clip(str(exc))}).") from None


def _end(text: str, key: Any, node: Any) -> int:
    """Where the text of the value ``node`` of ``key`` ends: an empty value (``key:``, a null) right after the
    key's colon, a block collection at its last value (the end marks of both are the next token, after any
    comment lines between)."""
    items = node.value if isinstance(node.value, list) else []
    if items and not node.flow_style:
        last = items[-1]
        return _end(text, *last) if isinstance(last, tuple) else _end(text, None, last)
    if key is not None and node.value == "" and node.start_mark.index == node.end_mark.index:
        return text.index(":", key.end_mark.index) + 1  # `key:` with nothing after it (a null)
    return node.end_mark.index


def _edit(text: str, root: Any, section: str, values: dict[str, Any]) -> str:
    """``text`` with each key of ``section`` set to its value: the value's text replaced in place (an empty
    value gets one after its key's colon), or a line ``  key: value`` added after the section's last entry."""
    key, node = next((k, v) for k, v in root.value if k.value == section)
    pairs = {k.value: (k, v) for k, v in node.value}
    edits, added = [], []
    for name, value in values.items():
        if name not in pairs:
            indent = node.value[0][0].start_mark.column if node.value else 2
            added.append(f"{' ' * indent}{name}: {_flow(value)}")
            continue
        end, (k, v) = _end(text, *pairs[name]), pairs[name]
        if v.start_mark.index < end and (isinstance(v.value, str) or v.flow_style):
            edits.append((v.start_mark.index, end, _flow(value)))
        else:  # an empty value, or a block collection (its lines from the key's colon on): the value after the colon
            colon = text.index(":", k.end_mark.index) + 1
            edits.append((colon, end, f" {_flow(value)}"))
    if added:
        newline = "\r\n" if "\r\n" in text else "\n"
        at = text.find("\n", _end(text, key, node)) + 1 or len(text)
        edits.append((at, at, ("" if text[:at].endswith("\n") or not at else newline)
                      + "".join(line + newline for line in added)))
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def edited_params(params: dict[str, dict[str, Any]], path: str | os.PathLike) -> tuple[Path, str]:
    """The file to write (``path``, its target when a link) and its new text with ``params`` set; an
    InputError when the file is missing, is not UTF-8 YAML, or lacks a section."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--apply: {quote(str(path))} not found (or not a file); run in the project's folder or "
                         "pass --params.")
    try:
        raw = path.read_bytes().decode("utf-8")  # as it is: "\r\n" line ends stay
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--apply: {quote(str(path))} is not readable UTF-8 text ({clip(str(exc))}).") from None
    bom, text = (BOM, raw[1:]) if raw.startswith(BOM) else ("", raw)
    data, tree = _load(text, path)
    for section in params:
        if not isinstance(data, dict) or not isinstance(data.get(section), dict):
            raise InputError(f"--apply: {quote(str(path))} has no `{section}` section; add one (or copy the "
                             "project's params.yaml) and run again.")
    want = copy.deepcopy(data)
    for section, values in params.items():
        want[section].update(values)
        text = _edit(text, tree, section, values)
        try:
            data, tree = _load(text, path)
        except InputError:
            data = None
            break
    if data != want:  # a layout the in-place edit cannot handle (a flow-style section, an alias): never guess
        raise InputError(f"--apply: cannot edit {quote(str(path))} in place (a flow-style section or an alias?); "
                         "set the printed params there by hand.")
    return Path(os.path.realpath(path)), bom + text


def params_write(params: dict[str, dict[str, Any]], path: str | os.PathLike) -> tuple[Path, Callable[[Path], None]]:
    """The :func:`recallk.atomic.write_all` entry that sets ``params`` in the params file ``path``: its target
    (through a link) and a writer of the new text keeping the file's mode. The file is checked now (missing,
    not YAML, a section missing), before anything is written."""
    target, text = edited_params(params, path)

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        shutil.copymode(target, tmp)
    return target, write


def apply_params(params: dict[str, dict[str, Any]], path: str | os.PathLike = "params.yaml") -> None:
    """Set each ``params[section][key]`` in the params file ``path`` (written atomically, through a link to
    its target), leaving every other byte as it was.

    Lists are written in flow style (``[label, camera]``), as params.yaml writes them. Raises an InputError
    when the file is missing, is not YAML, or lacks a section."""
    write_all([params_write(params, path)])
