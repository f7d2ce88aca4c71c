"""Ray is the `ray` extra: a newcomer's `pip install -e ".[dev]"` has none, and the Ray tests
skip there. CI (.ci/run installs `.[dev,ray]`, CI=true) must run them: there a missing Ray is
an import error, a failed test, never a skip."""

from __future__ import annotations

import importlib
import os

import pytest


def import_ray():
    """The ray module; the calling test or module skips without it, except under CI."""
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        return importlib.import_module("ray")
    return pytest.importorskip("ray", reason="Ray is the `ray` extra: pip install -e '.[ray]'")
