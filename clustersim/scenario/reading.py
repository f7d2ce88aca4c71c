"""The raw file: YAML read strictly (a key written twice is an error) and `--set PATH=VALUE`
overrides applied to the raw mapping before anything is resolved or validated.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from clustersim.hardware import limits
from clustersim.scenario.errors import Issue, ScenarioError, short_repr

__all__ = ["OverrideError", "parse_override", "apply_override", "read_yaml_file",
           "load_yaml_text", "regular_file_problem", "read_bounded", "TooLarge",
           "YamlTooLarge"]


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
        value = load_yaml_text(value_text) if value_text.strip() else ""
    except YamlTooLarge as error:
        raise OverrideError(path.strip(), f"cannot read the value: {error}") from None
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
            following = parts[depth + 1]
            if re.fullmatch(r"\d+", following):  # an index into a list the file does not have
                raise OverrideError(here, f"no list item {following!r}: the file has no list "
                                    f"here; expected the whole list, e.g. --set '{here}=[...]'")
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


def regular_file_problem(path: Path, max_bytes: int, expected: str = "a YAML file"
                         ) -> str | None:
    """Why `path` cannot be read as an input file (missing, a directory, a named pipe or a
    device such as /dev/zero, larger than `max_bytes`), or None. Checked before opening it:
    opening a named pipe waits for a writer, and a device never ends."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return "no such file"
    except OSError as error:
        return f"cannot read: {error.strerror}"
    if stat.S_ISDIR(status.st_mode):
        return f"is a directory, expected {expected}"
    if not stat.S_ISREG(status.st_mode):
        return ("is not a regular file (a named pipe, a device or a socket); expected "
                f"{expected}")
    if status.st_size > max_bytes:
        return (f"is {status.st_size:,} bytes; expected at most {max_bytes:,} "
                "(docs/limits.md)")
    return None


class TooLarge(ValueError):
    """A file read with `read_bounded` is larger than its bound."""


def read_bounded(path: Path, max_bytes: int) -> bytes:
    """The bytes of `path`, reading at most `max_bytes` + 1 of them: a file whose size the
    file system does not tell (a /proc file, possibly behind a symbolic link, says 0 bytes
    and may never end) is refused as soon as it passes the bound (TooLarge), instead of
    growing in memory. OSError if it cannot be read."""
    with open(path, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TooLarge(f"is more than {max_bytes:,} bytes; expected at most {max_bytes:,} "
                       "(docs/limits.md)")
    return data


def read_yaml_file(path: Path) -> Any:
    """A YAML file's content; a missing or unreadable file, a directory, a named pipe or
    device, a file over the size limit, a syntax error, a key written twice, nesting too
    deep or aliases that expand too far is a ScenarioError naming the file (and line)."""
    source = str(path)
    problem = regular_file_problem(path, limits.MAX_YAML_BYTES)
    if problem is not None:
        raise ScenarioError(source, [Issue("", problem)])
    try:
        with open(path, "rb") as handle:
            data = handle.read(limits.MAX_YAML_BYTES + 1)
        if len(data) > limits.MAX_YAML_BYTES:
            raise ScenarioError(source, [Issue("", f"is more than {limits.MAX_YAML_BYTES:,} "
                                                   "bytes (docs/limits.md)")])
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ScenarioError(source, [Issue("", f"cannot read: {error}")]) from None
    try:
        return load_yaml_text(text)
    except YamlTooLarge as error:
        raise ScenarioError(source, [Issue("", str(error), line=error.line)]) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        problem = getattr(error, "problem", None) or str(error)
        line = mark.line + 1 if mark is not None else None
        column = f", column {mark.column + 1}" if mark is not None else ""
        raise ScenarioError(
            source, [Issue("", f"YAML syntax error{column}: {problem}", line=line)]
        ) from None


class YamlTooLarge(ValueError):
    """YAML nested too deeply, expanding to too many values, or with a number too long."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


def load_yaml_text(text: str) -> Any:
    """YAML read strictly and within bounds: at most limits.MAX_YAML_DEPTH levels of nesting
    and limits.MAX_YAML_NODES values once aliases are expanded (an alias bomb is refused
    before it is built), numbers of at most 4,300 digits."""
    loader = _StrictLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlTooLarge(f"nested more than {limits.MAX_YAML_DEPTH} levels deep "
                               "(docs/limits.md)") from None
        if node is None:
            return None
        _check_size(node)
        try:
            return loader.construct_document(node)
        except ValueError as error:  # int() of a number past Python's 4,300 digits
            raise YamlTooLarge(f"a value cannot be read: {error}") from None
    finally:
        loader.dispose()  # type: ignore[no-untyped-call]


def _check_size(root: yaml.Node) -> None:
    """Refuse a document deeper than the limit, or larger than the limit once its aliases
    (shared nodes) are expanded; counted without expanding them."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, children_done = stack.pop()
        if depth > limits.MAX_YAML_DEPTH:
            raise YamlTooLarge(f"nested more than {limits.MAX_YAML_DEPTH} levels deep "
                               "(docs/limits.md)", node.start_mark.line + 1)
        children = _children(node)
        if children_done or not children:
            size = 1 + sum(sizes[id(child)] for child in children)
            if size > limits.MAX_YAML_NODES:
                raise YamlTooLarge(f"expands to more than {limits.MAX_YAML_NODES:,} values "
                                   "(aliases included; docs/limits.md)",
                                   node.start_mark.line + 1)
            sizes[id(node)] = size
            continue
        if id(node) in sizes:
            continue
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in children if id(child) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []
