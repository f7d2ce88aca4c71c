"""A small sweep for the sweep and output tests: a 4-instance trn2 job under heavy failures."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml


def sweep_base(duration: str = "5d") -> dict:
    """The base scenario: one 8B job with hourly checkpoints, llama3 failures x 50."""
    return copy.deepcopy({
        "name": "sweepbase", "hardware": "trn2", "duration": duration,
        "cluster": {"instances": 4, "spares": 1},
        "jobs": [{"name": "train", "model": "llama3-8b", "seq_len": 4096, "global_batch": 64,
                  "parallelism": {"tp": 8, "pp": 1, "dp": 32, "zero": 1,
                                  "sequence_parallel": True},
                  "recompute": "selective",
                  "checkpoint": {"interval": "1h", "write": "1min", "restore": "2min"}}],
        "failures": {"preset": "llama3", "scale": 50},
        "trace": {"enabled": False},
    })


def write_sweep(tmp_path: Path, base: dict | None = None, **sweep) -> Path:
    """base.yaml (the base scenario) and sweep.yaml (over it, with `sweep`'s keys) in
    tmp_path; returns the sweep file."""
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base or sweep_base()))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"scenario": "base.yaml", **sweep}))
    return path
