"""What goes wrong in a scenario file: issues (key path, value, what was expected) gathered
into one ScenarioError, rendered one line per issue with the file (and line) in front.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from clustersim.hardware.spec import KeyedError

__all__ = ["Issue", "ScenarioError", "ScenarioCheckError", "WorkloadError", "KeyedError",
           "short_repr", "path_text"]


@dataclass(frozen=True)
class Issue:
    """One problem: where (key path), what was there (value) and what was expected."""

    path: str
    message: str
    value: Any = None
    has_value: bool = False
    line: int | None = None

    def render(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line else source
        shown = f" = {short_repr(self.value)}" if self.has_value else ""
        if self.path:
            return f"{where}: {self.path}{shown}: {self.message}"
        if self.has_value:
            return f"{where}: {self.message}, got {short_repr(self.value)}"
        return f"{where}: {self.message}"


class ScenarioError(Exception):
    """A scenario that cannot be used, with every issue found."""

    def __init__(self, source: str, issues: Sequence[Issue]):
        self.source = source
        self.issues = list(issues)
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(issue.render(self.source) for issue in self.issues)


class ScenarioCheckError(Exception):
    """Raised inside validation for cross-field problems; carries exact key paths.

    Not a ValueError on purpose: pydantic passes it through instead of folding it into one
    root-level message, and the loader turns it into a ScenarioError.
    """

    def __init__(self, issues: Sequence[Issue]):
        self.issues = list(issues)
        super().__init__("; ".join(f"{i.path}: {i.message}" for i in self.issues))


class WorkloadError(ValueError):
    """A job file or trace that cannot be used, under the key that names it
    (`workload.trace`, `workload.file`, `workload.mapping.gpu`, ...): the loader reports
    `detail` at that key path."""

    def __init__(self, key: str, detail: str):
        super().__init__(f"{key} {detail}")
        self.key = key
        self.detail = detail


def short_repr(value: Any, limit: int = 80) -> str:
    """A value as the file would show it (YAML flow style), cut to `limit` characters."""
    text = repr(value) if isinstance(value, str) else yaml.safe_dump(
        value, default_flow_style=True, width=10_000, sort_keys=False
    ).strip().removesuffix("...").strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def path_text(loc: Iterable[Any]) -> str:
    """`("jobs", 0, "name")` -> `jobs.0.name`."""
    return ".".join(str(part) for part in loc)
