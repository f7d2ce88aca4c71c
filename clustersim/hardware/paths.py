"""Dotted key paths (`instance.efa`, `jobs.0.name`): how nested mappings are named in
scenario overrides, catalog citations, the `hardware` listing and sweep tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["flatten"]


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of nested mappings by its dotted path, in mapping order.

    >>> flatten({"chip": {"hbm": 96, "tflops": {"bf16": 667}}, "name": "trn2"})
    {'chip.hbm': 96, 'chip.tflops.bf16': 667, 'name': 'trn2'}
    """
    if not isinstance(node, Mapping):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out
