"""Views of a step and of a run for a browser: a step's timeline as a Chrome trace event file
(`analysis.step_timeline`) and a run's report as one self-contained HTML file
(`analysis.html_report`), each written whole or not at all, an existing file replaced only
with `force`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clustersim.runner.outputs import atomic_output_file

__all__ = ["step_timeline", "write_step_timeline", "write_html_report"]


def step_timeline(scenario: Any, topology: Any = None) -> dict[str, Any]:
    """One step of each of the scenario's jobs as a Chrome trace (a JSON-ready dict), on the
    cluster's first instances as `clustersim step` times it."""
    from clustersim.analysis.step_timeline import step_trace
    from clustersim.runner.api import topology_for
    from clustersim.training.step import StepModel

    model = StepModel(topology or topology_for(scenario))
    return step_trace(model, list(scenario.jobs))


def write_step_timeline(scenario: Any, path: str | Path, force: bool = False,
                        topology: Any = None) -> Path:
    """`step_timeline` written to `path` (refused if it exists, unless `force`)."""
    import json

    with atomic_output_file(path, force, "the step timeline") as (temporary, commit):
        trace = step_timeline(scenario, topology)
        with open(temporary, "w", encoding="utf-8") as out:
            json.dump(trace, out, allow_nan=False, separators=(",", ":"))
        commit()
    return Path(path)


def write_html_report(run_dir: str | Path, path: str | Path, force: bool = False) -> Path:
    """The run's report as one self-contained interactive HTML file at `path` (refused if
    it exists, unless `force`)."""
    from clustersim.analysis.html_report import html_report

    with atomic_output_file(path, force, "the HTML report") as (temporary, commit):
        Path(temporary).write_text(html_report(run_dir), encoding="utf-8")
        commit()
    return Path(path)
