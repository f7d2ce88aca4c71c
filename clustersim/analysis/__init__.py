"""Traces and analysis: the trace schema and recorders, reading runs back into pandas, the report.

`load_run`, `compare` and `Run` are re-exported lazily: the timeline imports the trace schema
from this package, and it should not pay for pandas on the way.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Run", "load_run", "compare"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from clustersim.analysis import runs

        return getattr(runs, name)
    raise AttributeError(f"module 'clustersim.analysis' has no attribute {name!r}")
