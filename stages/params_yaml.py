"""How DVC reads ``params.yaml``, and the check that every other YAML reader reads it alike.

:func:`read_params` reads the file as DVC does (ruamel.yaml, YAML 1.2), so a stage runs with the values
dvc.lock records; a repeated key (DVC refuses it) and a value that a YAML 1.1 reader such as PyYAML reads
otherwise (``010``, ``yes``/``off``, ``1:30``, ``1e3``) are refused, naming the key and how to write it.

Before anything walks the document, its cost is bounded: a file over :data:`MAX_BYTES`, nesting deeper
than :data:`MAX_DEPTH`, and anchors and aliases (``&a``/``*a``) that expand to more than :data:`MAX_NODES`
values or refer to themselves are refused, each in one short message, whatever the text's size; and the
caller's ``check_keys`` (unknown sections and keys, :func:`stages.params.unknown_keys`) sees only the
keys, never the values under them, and may prune them from the document before it is walked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import yaml
from ruamel.yaml import YAML
from ruamel.yaml import YAMLError as RuamelYAMLError

from recallk.errors import InputError, clip, quote


def _dvc_reading(text: str) -> Any:
    """``text`` as DVC reads params.yaml (``dvc/utils/serialize/_yaml.py``: ruamel.yaml ``typ="safe"``,
    YAML 1.2): the values dvc.lock records, so the values the stages must run with."""
    return YAML(typ="safe").load(text)


def _spell(value: Any) -> str:
    """How to write ``value`` so that YAML 1.1 and 1.2 read it alike."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, (int, float)):
        return repr(value).replace("inf", ".inf").replace("nan", ".nan")
    return json.dumps(str(value), ensure_ascii=False)  # a double-quoted YAML string


def _plain_scalars(node: yaml.Node) -> Iterator[yaml.ScalarNode]:
    """Every plain (unquoted, not block) scalar of the document: the ones a YAML version resolves."""
    if isinstance(node, yaml.ScalarNode):
        if not node.style:
            yield node
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _plain_scalars(item)
    elif isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            yield from _plain_scalars(key_node)
            yield from _plain_scalars(value_node)


def _readings(texts: Iterable[str]) -> dict[str, tuple[Any, Any]]:
    """``text -> (DVC's YAML 1.2 reading, PyYAML's YAML 1.1 reading)`` of plain scalars, read as one
    block sequence per reader (one at a time where that cannot be done, or fails)."""
    texts = list(dict.fromkeys(texts))
    single = [t for t in texts if "\n" in t]
    batch = [t for t in texts if "\n" not in t]
    document = "".join(f"- {t}\n" for t in batch)
    try:
        both = list(zip(_dvc_reading(document), yaml.safe_load(document))) if batch else []
    except (yaml.YAMLError, RuamelYAMLError, TypeError):
        both = []
    if len(both) != len(batch):
        both, single = [], texts
    out = dict(zip(batch, both))
    for text in single:
        try:
            out[text] = (_dvc_reading(text), yaml.safe_load(text))
        except (yaml.YAMLError, RuamelYAMLError):
            pass
    return out


def _reading_problems(node: yaml.Node, name: str, readings: dict[str, tuple[Any, Any]], problems: list[str]) -> None:
    """Walk the document: repeated keys, and plain scalars that YAML 1.1 and YAML 1.2 read differently
    (``010``, ``yes``/``no``/``on``/``off``, ``1:30``, ``1e3``, ``0o10``, ...), each named by its dotted key."""
    if isinstance(node, yaml.ScalarNode):
        v12, v11 = readings.get(node.value, (None, None)) if not node.style else (None, None)
        if (type(v12), repr(v12)) != (type(v11), repr(v11)):
            problems.append(f"`{clip(name)}` (line {node.start_mark.line + 1}) is written {clip(node.value)}, "
                            f"which DVC (YAML 1.2, the value dvc.lock records) reads as {quote(v12)} but a YAML 1.1 "
                            f"reader such as PyYAML as {quote(v11)}; write {clip(_spell(v12))} or "
                            f"{clip(_spell(v11))}, whichever you mean.")
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _reading_problems(item, f"{name}[{i}]", readings, problems)
    elif isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            plain_key = isinstance(key_node, yaml.ScalarNode) and not key_node.style and key_node.value in readings
            key = str(readings[key_node.value][0] if plain_key else getattr(key_node, "value", key_node))
            child = f"{name}.{key}" if name else key
            line = key_node.start_mark.line + 1
            if child in seen:
                problems.append(f"`{clip(child)}` is given twice (lines {seen[child]} and {line}); DVC refuses a "
                                "repeated key and a YAML 1.1 reader keeps the last one: keep one of them.")
            seen.setdefault(child, line)
            _reading_problems(key_node, f"{child} (the key)", readings, problems)
            _reading_problems(value_node, child, readings, problems)


#: How many reading problems a params.yaml message lists before summarising the rest.
MAX_PROBLEMS = 20
#: The largest params file read, in bytes (the project's is under 2 KB): a bigger one is refused unread.
MAX_BYTES = 128 * 1024
#: The deepest nesting of mappings and lists (the project's params nest 3 deep).
MAX_DEPTH = 32
#: The most values (mappings, lists and scalars) the document may hold once every alias is expanded.
MAX_NODES = 100_000


class _Bounded(yaml.SafeLoader):
    """PyYAML's safe composer, refusing nesting deeper than :data:`MAX_DEPTH` as it meets it (the
    composer recurses once per level: 5,000 ``[`` were a RecursionError)."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise InputError(f"{self.name} nests lists or mappings more than {MAX_DEPTH} deep (line "
                                 f"{mark.line + 1}); params are at most a few levels deep: fix the brackets "
                                 "or indentation.")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def expanded_size(root: yaml.Node) -> tuple[int, int, yaml.Node | None]:
    """``(values, depth, cycle)`` of the document once every alias is expanded, in time linear in its
    distinct nodes (an alias is the same node object; a 9-way, 7-level alias bomb under 1 KB stands for
    9**7 values); ``cycle`` is a node that contains itself (``&a [*a]``), else None. Iterative: no
    recursion however the aliases chain."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key, kids = id(node), _children(node)
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            continue
        if key in size:
            continue
        on_path.add(key)
        stack.append((node, True))
        for kid in kids:
            if id(kid) in on_path:
                return 0, 0, kid
            if id(kid) not in size:
                stack.append((kid, False))
    return size[id(root)], depth[id(root)], None


def compose(path: Path, text: str) -> yaml.Node | None:
    """The document's node graph (PyYAML), its size, depth and alias expansion bounded (module doc)."""
    loader = _Bounded(text)
    loader.name = str(path)
    try:
        document = loader.get_single_node()
    finally:
        loader.dispose()
    if document is None:
        return None
    values, depth, cycle = expanded_size(document)
    if cycle is not None:
        raise InputError(f"{path}: the YAML anchor at line {cycle.start_mark.line + 1} refers to itself "
                         "through an alias (`&a [*a]`), so its value never ends: write the value out.")
    if values > MAX_NODES or depth > MAX_DEPTH:
        raise InputError(f"{path}: its YAML aliases (`*name`) expand to {values:,} values nested {depth} deep "
                         f"(at most {MAX_NODES:,} values and {MAX_DEPTH} levels are read); params hold a few "
                         "hundred: write the values out instead of repeating anchors.")
    return document


def read_params(path: Path, check_keys: Callable[[yaml.Node], None] | None = None) -> Any:
    """The params file as DVC reads it; an InputError lists every repeated key and every value
    that a YAML 1.1 reader would read differently, so that the values a stage runs with are
    always the ones dvc.lock records, whatever YAML tool wrote or reads the file.

    The document is bounded first (:func:`compose`), then ``check_keys(document)`` may refuse it or
    prune it (unknown sections and keys) before any value is walked."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise InputError(f"{path} is {size:,} bytes; a params file is a few KB (at most {MAX_BYTES:,} bytes "
                             "are read): remove what is not a param.")
        text = path.read_text(encoding="utf-8")
        document = compose(path, text)
        if document is not None and check_keys is not None:
            check_keys(document)
        problems: list[str] = []
        if document is not None:
            _reading_problems(document, "", _readings(n.value for n in _plain_scalars(document)), problems)
        if problems:
            more = [f"... and {len(problems) - MAX_PROBLEMS} more"] if len(problems) > MAX_PROBLEMS else []
            raise InputError(f"invalid {path} (DVC reads it as YAML 1.2 and refuses repeated keys; the stages run "
                             "with what DVC records):\n  - " + "\n  - ".join(problems[:MAX_PROBLEMS] + more))
        return _dvc_reading(text)
    except (yaml.YAMLError, RuamelYAMLError) as exc:
        raise InputError(f"{path} is not valid YAML ({exc}); fix the syntax.") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8.") from None
