"""The raw file: YAML read strictly (a key written twice is an error) and `--set PATH=VALUE`
overrides applied to the raw mapping before anything is resolved or validated.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from clustersim.scenario.errors import Issue, ScenarioError, short_repr

__all__ = ["OverrideError", "parse_override", "apply_override", "read_yaml_file"]


class OverrideError(ValueError):
    """A `--set` that cannot be applied; `path` is the key path it reached."""

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(message)


def parse_override(text: str) -> tuple[str, Any]:
    """`jobs.0.checkpoint.interval=30min` -> ("jobs.0.checkpoint.interval", "30min").

    The value is read as YAML, so `2` is a number, `[a, b]` a list and `null` clears a key.
    """
    path, sep, value_text = text.partition("=")
    if not sep or not path.strip():
        raise OverrideError("", "expected PATH=VALUE, e.g. jobs.0.checkpoint.interval=30min")
    try:
        value = yaml.safe_load(value_text) if value_text.strip() else ""
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or str(error)
        raise OverrideError(path.strip(), f"cannot read the value as YAML: {problem}") from None
    return path.strip(), value


def apply_override(raw: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path (list indices as numbers) in a raw scenario mapping, in place.

    A catalog name met on the way (`hardware: trn2`, `model: llama3-8b`) becomes `{base: name}`
    so that `--set hardware.chip.hbm=64GiB` derives from it.
    """
    parts = path.split(".")
    node: Any = raw
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        here = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            if not re.fullmatch(r"\d+", part) or int(part) >= len(node):
                raise OverrideError(
                    here, f"no list item {part!r}; the list has {len(node)} (indices from 0)"
                )
            key: Any = int(part)
        elif isinstance(node, dict):
            key = part
        else:
            raise OverrideError(
                ".".join(parts[:depth]), f"is the value {short_repr(node)}, not a mapping or list"
            )
        if last:
            node[key] = value
            return
        child = node[key] if (isinstance(node, list) or key in node) else None
        if isinstance(child, str) and part in ("hardware", "model"):
            child = {"base": child}
        elif child is None:
            child = {}
        node[key] = child
        node = child


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key written twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"the key {key!r} appears twice (first on line {seen[key] + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_yaml_file(path: Path) -> Any:
    """A YAML file's content; a missing or unreadable file, a directory, a syntax error or a
    key written twice is a ScenarioError naming the file (and line)."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(source, [Issue("", "no such file")]) from None
    except IsADirectoryError:
        raise ScenarioError(source, [Issue("", "is a directory, expected a YAML file")]) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ScenarioError(source, [Issue("", f"cannot read: {error}")]) from None
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        problem = getattr(error, "problem", None) or str(error)
        line = mark.line + 1 if mark is not None else None
        column = f", column {mark.column + 1}" if mark is not None else ""
        raise ScenarioError(
            source, [Issue("", f"YAML syntax error{column}: {problem}", line=line)]
        ) from None
    return raw
