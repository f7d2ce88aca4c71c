"""The report's fleet plots, from `job_summary.parquet`: queue wait and slowdown by job size
and by team, and each team's share of the chip-time held (`fleet.png`). Queue waits are over
the jobs that started, as summary.json's (docs/fleet.md): a job never started has only a
censored wait (the horizon less its submission), counted apart in its bin's label."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from clustersim.analysis.report_names import report_file
from clustersim.analysis.runs import Run  # noqa: E402

__all__ = ["fleet_plots", "size_bins", "started_waits", "FLEET_COLUMNS"]

FLEET_COLUMNS = ["instances", "team", "queue_wait_s", "slowdown", "held_chip_s", "start_s"]


def size_bins(instances: pd.Series) -> pd.Series:
    """Each job's size class: instances rounded down to a power of two (1, 2-3, 4-7, ...)."""
    return (2 ** np.floor(np.log2(instances.clip(lower=1)))).astype(int)


def started_waits(jobs: pd.DataFrame, by: str, keys: list, labels: list[str],
                  newline: str) -> tuple[pd.Series, pd.Series, list[str]]:
    """(median, 95th percentile) of the queue waits of `jobs` that started, per value of
    column `by` in `keys` order (NaN where none started), and `labels` each with its count
    of jobs never started on a second line (`newline`) where there are any."""
    started = jobs["start_s"].notna()
    waits = jobs[started].groupby(by)["queue_wait_s"]
    never = jobs.loc[~started, by].value_counts()
    named = [f"{label}{newline}({int(never[key]):,} never started)" if never.get(key, 0)
             else label for key, label in zip(keys, labels, strict=True)]
    return (waits.median().reindex(keys), waits.quantile(0.95).reindex(keys), named)


def _bars(ax: plt.Axes, labels: list[str], median: np.ndarray, p95: np.ndarray,
          ylabel: str) -> None:
    x = np.arange(len(labels))
    ax.bar(x - 0.2, median, 0.4, label="median", color="#1565c0")
    ax.bar(x + 0.2, p95, 0.4, label="95th percentile", color="#ef6c00")
    ax.set_xticks(x, labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)


def fleet_plots(run: Run, folder: Path) -> dict[str, Path]:
    """`fleet.png` when the run has more than one job (none otherwise)."""
    table_path = run.path / "job_summary.parquet"
    if not table_path.exists():
        return {}
    jobs = pd.read_parquet(table_path, columns=FLEET_COLUMNS)
    if len(jobs) < 2:
        return {}
    jobs["size"] = size_bins(jobs["instances"])
    teams = sorted(jobs["team"].unique())
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    by_size = jobs.groupby("size")
    keys = list(by_size.groups)
    sizes = [str(s) if s == 1 else f"{s}-{2 * s - 1}" for s in keys]
    median, p95, labels = started_waits(jobs, "size", keys, sizes, "\n")
    _bars(axes[0, 0], labels, median.to_numpy() / 3600, p95.to_numpy() / 3600,
          "queue wait of started jobs (h)")
    axes[0, 0].set_title("Queue wait by job size (instances)")
    slow = by_size["slowdown"]
    _bars(axes[0, 1], sizes, slow.median().to_numpy(), slow.quantile(0.95).to_numpy(),
          "slowdown (x alone)")
    axes[0, 1].set_title("Slowdown by job size (instances)")
    by_team = jobs.groupby("team")
    median, p95, labels = started_waits(jobs, "team", teams, teams, "\n")
    _bars(axes[1, 0], labels, median.to_numpy() / 3600, p95.to_numpy() / 3600,
          "queue wait of started jobs (h)")
    twin = axes[1, 0].twinx()
    twin.plot(np.arange(len(teams)), by_team["slowdown"].mean().reindex(teams).to_numpy(),
              "o", color="#c62828", label="mean slowdown")
    twin.set_ylabel("mean slowdown (x alone)")
    twin.legend(fontsize=8, loc="upper center")
    axes[1, 0].set_title("Queue wait and slowdown by team")
    held = by_team["held_chip_s"].sum().reindex(teams)
    total = float(held.sum())
    share = held.to_numpy() / total if total > 0 else np.zeros(len(teams))
    axes[1, 1].bar(np.arange(len(teams)), share * 100, color="#2e7d32")
    axes[1, 1].set_xticks(np.arange(len(teams)), teams, rotation=45, ha="right", fontsize=8)
    axes[1, 1].set_ylabel("% of the chip-time held by jobs")
    axes[1, 1].set_title(f"Chip-time by team ({total / 3600:,.0f} chip-hours in all)"
                         if math.isfinite(total) else "Chip-time by team")
    fig.tight_layout()
    path = folder / report_file("fleet.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {"Fleet: waits, slowdowns and chip-time by size and team": path}
