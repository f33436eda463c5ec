"""YAML reading that keeps line numbers, so errors can point at the offending line."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from raybatch.errors import Issue, SpaceError

_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def load_mapping(path: Path) -> tuple[dict[str, Any], Callable[[str], int | None]]:
    """Read a YAML mapping and a function giving the line of a dotted field path.

    Raises:
        SpaceError: The file cannot be read, is not valid YAML (the error names the line
            and column), or its top level is not a mapping.
    """
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpaceError([Issue("(file)", f"cannot read: {exc.strerror or exc}")], source) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = None if mark is None else mark.line + 1
        column = "" if mark is None else f" (column {mark.column + 1})"
        problem = exc.problem or str(exc)
        raise SpaceError([Issue("(yaml syntax)", f"{problem}{column}", line)], source) from None
    except yaml.YAMLError as exc:
        raise SpaceError([Issue("(yaml syntax)", str(exc))], source) from None
    duplicates = list(_duplicate_keys(node))
    if duplicates:
        raise SpaceError(duplicates, source)
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        raise SpaceError(
            [Issue("(document)", f"must be a mapping of fields, got {kind}", 1)], source
        )

    def locate(field: str) -> int | None:
        return _line_of(node, field)

    return data, locate


def _duplicate_keys(node: yaml.Node | None, prefix: str = "") -> Iterator[Issue]:
    """A key given twice in one mapping: YAML loaders keep the last one silently."""
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value)
            path = f"{prefix}.{name}" if prefix else name
            line = key.start_mark.line + 1
            if name in first:
                yield Issue(
                    path,
                    f"duplicate key: given on line {first[name]} and again on line {line}"
                    " (YAML would silently keep the last); keep one",
                    line,
                )
            else:
                first[name] = line
            yield from _duplicate_keys(value, path)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _duplicate_keys(item, f"{prefix}[{index}]")


def _line_of(node: yaml.Node | None, field: str) -> int | None:
    """1-based line of the deepest node along ``field`` that exists in the document."""
    if node is None:
        return None
    line: int | None = node.start_mark.line + 1
    for name, index in _PATH_PART.findall(field):
        # A mapping entry is reported at its key: a block value starts on the next line.
        found: tuple[yaml.Node, yaml.Node] | None = None
        if name and isinstance(node, yaml.MappingNode):
            found = next(((k, v) for k, v in node.value if k.value == name), None)
        elif index and isinstance(node, yaml.SequenceNode) and int(index) < len(node.value):
            item = node.value[int(index)]
            found = (item, item)
        if found is None:
            break
        marker, node = found
        line = marker.start_mark.line + 1
    return line
