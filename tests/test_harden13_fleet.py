"""Session 13's hardening of the fleet surfaces: what a demanding user found replaying
traces, drawing job mixes and writing a fleet run's outputs. One test (or a few) per defect."""

from __future__ import annotations

import shutil
from pathlib import Path

from cli_helpers import invoke, refused, write

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "scenarios" / "traces"


def _trace_scenario(folder: Path, trace: str, fmt: str) -> Path:
    return write(folder, {
        "name": "t", "hardware": "trn2u", "duration": "4d", "seed": 3,
        "cluster": {"ultraservers": 4, "fabric": {"instances_per_leaf": 16}},
        "workload": {"trace": trace, "format": fmt},
        "trace": {"bin": "1h", "levels": ["cluster"]}})


# 1. A PAI trace given as its folder: -o that folder --force deleted the trace ------------


def test_an_output_folder_that_is_a_trace_folder_is_refused_even_with_force(tmp_path: Path):
    """`workload.trace` may name PAI's folder of tables; `-o` that folder with `--force`
    replaced it (the job and task tables deleted: "replaced the earlier run"), where an
    output folder holding an input is refused even with --force."""
    data = tmp_path / "pai"
    data.mkdir()
    for name in ("pai_job_table.csv", "pai_task_table.csv"):
        shutil.copy(TRACES / name, data / name)
    (tmp_path / "s").mkdir()
    scenario = _trace_scenario(tmp_path / "s", str(data), "pai")
    result = invoke("run", scenario, "-o", data, "--force")
    refused(result, "an input of this command")
    assert sorted(p.name for p in data.iterdir()) == ["pai_job_table.csv", "pai_task_table.csv"]
