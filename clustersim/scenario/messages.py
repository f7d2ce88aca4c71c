"""Pydantic's validation errors turned into Issues a user can act on: the key path as written
(aliases, list indices), the value, and a plain message; union alternatives joined with 'or'
and the same problem of many generated jobs said once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from clustersim.hardware.spec import Spec
from clustersim.scenario.errors import Issue, KeyedError, path_text
from clustersim.scenario.models import Scenario

__all__ = ["pydantic_issues", "collapse_generated"]


def _allowed_keys(model: type[Spec], loc: Sequence[Any]) -> list[str] | None:
    """Keys the spec at `loc` (a path of field aliases and list indices) accepts."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, Spec)):
            return None
        field = next(
            (f for name, f in current.model_fields.items() if (f.alias or name) == part), None
        )
        if field is None:
            return None
        current = _spec_in(field.annotation)
    if isinstance(current, type) and issubclass(current, Spec):
        return [f.alias or name for name, f in current.model_fields.items()]
    return None


def _spec_in(annotation: Any) -> Any:
    """The Spec class inside an annotation such as `list[JobSpec]` or `CheckpointSpec | None`."""
    if isinstance(annotation, type) and issubclass(annotation, Spec):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _spec_in(arg)
        if found is not None:
            return found
    return None


_MESSAGES = {
    "missing": "required key is missing",
    "int_type": "expected a whole number",
    "int_parsing": "expected a whole number",
    "int_from_float": "expected a whole number",
    # a float beyond any integer (1e30): pydantic's "Unable to parse input string"
    "int_parsing_size": "too large; expected a whole number within the key's limit "
                        "(docs/limits.md)",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false (a YAML boolean, unquoted)",
    "bool_parsing": "expected true or false (a YAML boolean, unquoted)",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "tuple_type": "expected a list",
}


def pydantic_issues(error: ValidationError, root: type[Spec] | None = None) -> list[Issue]:
    """One Issue per key path that failed validation; an unknown key lists the keys `root`
    (default: Scenario) accepts there."""
    issues = []
    mapped: list[Issue] = []  # a list expected, a mapping given (below)
    named: list[Issue] = []  # a name expected, a mapping given (below)
    for detail in error.errors(include_url=False):
        loc = [part for part in detail["loc"] if not _is_union_tag(part)]
        kind = detail["type"]
        value = detail.get("input")
        keyed = (detail.get("ctx") or {}).get("error")
        if isinstance(keyed, KeyedError):  # a spec's check naming a key below it
            issues.append(Issue(path_text([*loc, *keyed.key.split(".")]), keyed.message,
                                keyed.value, True))
            continue
        if kind == "extra_forbidden":
            allowed = _allowed_keys(root or Scenario, loc[:-1])
            hint = f"; expected one of {', '.join(allowed)}" if allowed else ""
            issues.append(Issue(path_text(loc), f"unknown key{hint}"))
            continue
        if kind in _MESSAGES:
            message = _MESSAGES[kind]
        else:
            message = detail["msg"].removeprefix("Value error, ")
            message = message.replace("Input should be", "expected").replace(
                "String should match pattern", "expected letters, digits, '.', '_' or '-', "
                "matching"
            )
        if kind in ("less_than_equal", "too_long") or (
                kind == "greater_than_equal" and not message.endswith(" 0")):
            message += " (docs/limits.md)"
        if loc and loc[-1] == "[key]":  # a mapping's key (parallelism: {cp: 2} in serve)
            issues.append(Issue(path_text(loc[:-1]), f"unknown key; {message}"))
        elif kind == "missing":
            issues.append(Issue(path_text(loc), message))
        elif kind == "list_type" and isinstance(value, Mapping):
            # the list branch of a union (`instances: [1, 2] | {min, max}`) given a mapping:
            # said only if the mapping's own branch found nothing to say
            mapped.append(Issue(path_text(loc), message, value, False))
        elif kind == "literal_error" and isinstance(value, Mapping):
            # a name branch (`precision: fp8 | {weights, ...}`) given a mapping: said only if
            # the mapping's branch found nothing to say below it
            named.append(Issue(path_text(loc), message, value, False))
        else:
            shown = not isinstance(value, Mapping)
            issues.append(Issue(path_text(loc), message, value, shown))
    issues += [m for m in mapped
               if not any(i.path == m.path or i.path.startswith(m.path + ".")
                          for i in issues)]
    issues += [n for n in named if not any(i.path.startswith(n.path + ".") for i in issues)]
    return _deduplicate(issues)


def _is_union_tag(part: Any) -> bool:
    """Pydantic names union members in error locations (`float`, `literal['auto']`)."""
    return isinstance(part, str) and (
        part in {"float", "int", "str", "function-after[positive(), float]"}
        or part.startswith(("literal[", "function-", "lax-", "constrained-", "list[",
                            "dict["))
    )


def _deduplicate(issues: list[Issue]) -> list[Issue]:
    """One line per key path: the alternatives of a union are joined with 'or'."""
    merged: dict[str, Issue] = {}
    for issue in issues:
        earlier = merged.get(issue.path)
        if earlier is None:
            merged[issue.path] = issue
        elif issue.message not in earlier.message:
            merged[issue.path] = Issue(
                issue.path, f"{earlier.message}; or {issue.message}", earlier.value,
                earlier.has_value, earlier.line,
            )
    return list(merged.values())


# The keys of a generated job that come from its trace row (the rest from its template).
_ROW_KEYS = ("name", "submit", "run_for", "instances", "team", "priority", "steps")


def _where_generated(issue: Issue, first: int, origins: Sequence[Any] | None) -> Issue:
    """An issue of a generated job named where the user wrote it: a trace row's column
    (file, row, column) or the template's `job` key, not the generated `jobs.N` key."""
    match = re.match(r"jobs\.(\d+)(.*)", issue.path)
    if match is None or origins is None:
        return issue
    index = int(match.group(1)) - first
    if not 0 <= index < len(origins):
        return issue
    template, row, columns = origins[index]
    rest = match.group(2)
    key = rest.lstrip(".").split(".")[0]
    if row is not None and key in _ROW_KEYS:
        column = columns.get(key, key)
        path = f"{row}, column {column}"
    elif isinstance(template, str):  # no template given: the default (docs/traces-in.md)
        path = f"workload: the default template's job{rest}"
    else:
        path = f"workload.templates.{template}.job{rest}"
    return Issue(path, issue.message, issue.value, issue.has_value, issue.line)


def collapse_generated(issues: list[Issue], first: int | None,
                       origins: Sequence[Any] | None = None) -> list[Issue]:
    """One line per problem of the jobs a workload generated, with how many it hit, named
    where the user wrote it (`origins`: per generated job, its template's index, its trace
    row or None, and the row's column names by job key)."""
    if first is None:
        return issues
    out: list[tuple[Issue, tuple[str, str] | None]] = []
    seen: dict[tuple[str, str], int] = {}
    for issue in issues:
        match = re.match(r"jobs\.(\d+)(.*)", issue.path)
        if match is None or int(match.group(1)) < first:
            out.append((issue, None))
            continue
        shown = _where_generated(issue, first, origins)
        # A template's problem is one problem however many jobs it hit; a row's is its own.
        key = (shown.path if shown is not issue else match.group(2), issue.message)
        if key not in seen:
            seen[key] = 0
            out.append((shown, key))
        seen[key] += 1
    return [issue if key is None or seen[key] == 1 else
            Issue(issue.path, f"{issue.message} (and {seen[key] - 1} more jobs the workload "
                  "generated)", issue.value, issue.has_value, issue.line)
            for issue, key in out]
