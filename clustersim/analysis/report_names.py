"""The files `clustersim report` writes into RUN_DIR/report/, by name.

A report folder holding only these is a report the next `clustersim report` (or a run of the
same scenario into its folder) may replace; any other file there is the user's (a PNG of
their own included), and is never replaced without --force. Each writer names its file
through `report_file`, so a new plot cannot be written under a name missing here.
"""

from __future__ import annotations

__all__ = ["REPORT_FILES", "report_file"]

REPORT_FILES = frozenset({
    "report.md", "report.html",
    # training and the cluster (analysis/report.py)
    "utilisation.png", "jobs.png", "first_failure.png", "failures.png", "hours.png", "step.png",
    # serving (analysis/serving_report.py), the fleet (fleet_report.py), a fleet day (fleetday.py)
    "latency.png", "serving.png", "kv.png", "fleet.png", "day.png",
})


def report_file(name: str) -> str:
    """`name`, checked to be one of the report's own files (REPORT_FILES)."""
    if name not in REPORT_FILES:
        raise ValueError(f"{name}: not a file of the report (analysis/report_names.py)")
    return name
