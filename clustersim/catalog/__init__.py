"""Catalog data files (hardware, model and failure presets), read once and cached."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml

__all__ = ["read_catalog"]


@cache
def read_catalog(name: str) -> dict[str, Any]:
    """The parsed `catalog/<name>.yaml` shipped with the package (do not mutate it)."""
    text = resources.files(__name__).joinpath(f"{name}.yaml").read_text("utf-8")
    return yaml.safe_load(text)
