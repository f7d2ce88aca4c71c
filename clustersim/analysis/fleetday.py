"""The report of a fleet-day run (docs/fleet-day.md): the day drawn from `day.parquet` and
`fleet.parquet` (load, replicas and SLO attainment per deployment; the fleet's chips by
state and the training jobs' chips), and its tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from clustersim.analysis.report_names import report_file
from clustersim.hardware.units import format_or_dash  # noqa: E402

__all__ = ["write_day_report", "plot_day"]

_STATES = ("serving", "scaling", "training", "down", "idle")
_COLOURS = {"serving": "#1f77b4", "scaling": "#ff7f0e", "training": "#2ca02c",
            "down": "#d62728", "idle": "#c7c7c7"}


def _replica_axis(ax: Any, replicas: np.ndarray) -> None:
    """Whole replicas: a linear axis with integer ticks up to 100 of them; a symlog one
    (linear to 10) when deployments differ by orders of magnitude. (A symlog axis over 1 to
    8 replicas showed a single tick.)"""
    from matplotlib.ticker import MaxNLocator

    top = float(np.nanmax(replicas)) if replicas.size else 0.0
    if top > 100:
        ax.set_yscale("symlog", linthresh=10)
    else:
        ax.set_ylim(0, max(top * 1.05, 1))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=3))


def plot_day(run_dir: Path, title: str, path: Path) -> Path:
    day = pq.read_table(run_dir / "day.parquet").to_pandas()
    fleet = pq.read_table(run_dir / "fleet.parquet").to_pandas()
    fig, axes = plt.subplots(4, 1, figsize=(12, 13), sharex=True)
    hours = fleet["time_s"].to_numpy() / 3600.0
    names = list(dict.fromkeys(day["deployment"].astype(str)))
    load = np.array([day.loc[day["deployment"] == n, "load_per_s"].to_numpy() for n in names])
    replicas = np.array([day.loc[day["deployment"] == n, "replicas"].to_numpy() for n in names])
    attain = np.array([day.loc[day["deployment"] == n, "slo_attainment"].to_numpy()
                       for n in names])
    if names:
        axes[0].stackplot(hours, load, labels=names)
        axes[0].legend(fontsize=7, loc="upper left", ncol=2)
        for name, row in zip(names, replicas, strict=True):
            axes[1].plot(hours, row, label=name, lw=1)
        _replica_axis(axes[1], replicas)
        for name, row in zip(names, attain, strict=True):
            axes[2].plot(hours, row, label=name, lw=1)
    axes[0].set_ylabel("load (requests/s)")
    axes[1].set_ylabel("replicas serving")
    axes[2].set_ylabel("SLO attainment")
    axes[2].set_ylim(-0.02, 1.02)
    states = [fleet[f"{s}_chips"].to_numpy() for s in _STATES]
    axes[3].stackplot(hours, states, labels=_STATES, colors=[_COLOURS[s] for s in _STATES])
    for column in (c for c in fleet.columns if c.startswith("job:")):
        axes[3].plot(hours, fleet[column].to_numpy(), lw=1, ls="--",
                     label=f"training: {column[4:]}")
    axes[3].set_ylabel("chips")
    axes[3].set_xlabel("hours")
    axes[3].legend(fontsize=7, loc="upper left", ncol=3)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}: load, replicas, SLO attainment and the fleet's chips")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_day_report(run_dir: Path, summary: dict, folder: Path) -> Path:
    """report.md and day.png of a fleet-day run."""
    day = summary["fleet_day"]
    cluster = summary["cluster"]
    hours = day["chip_hours"]
    total = max(day["chip_hours_total"], 1e-9)
    lines = [f"# {summary['scenario']}", "",
             f"{cluster['chips']:,} {cluster['chip']} chips ({cluster['hardware']}), "
             f"{summary['simulated_s'] / 86400:,.1f} simulated days at a "
             f"{day['interval_s']:g} s step (the fleet-level model), seed {summary['seed']}, "
             f"clustersim {summary['clustersim_version']}.", "",
             "Chip-hours: " + ", ".join(f"{k} {v:,.0f} ({v / total:.1%})"
                                        for k, v in hours.items()) + ".", ""]
    cost = day.get("serving_cost_per_million_output_tokens_usd")
    train = day.get("training_cost_per_million_tokens_usd")
    if cost is not None:
        lines += [f"Serving costs ${cost:,.3f} per million output tokens (its chips' hours); "
                  + (f"training ${train:,.3f} per million tokens; " if train else "")
                  + f"the whole fleet ${day['fleet_cost_per_million_output_tokens_usd']:,.3f} "
                  "per million output tokens.", ""]
    lines += ["| deployment | peak load/s | replicas | TTFT p50 / p99 | TPOT p50 / p99 | "
              "SLO goodput | $ per M output tokens |", "|---|---|---|---|---|---|---|"]
    for name, d in summary["deployments"].items():
        c = d.get("cost_per_million_output_tokens_usd")
        lines.append(f"| {name} | {d['peak_load_per_s']:,.1f} | {d['replicas_min']:,}-"
                     f"{d['replicas_max']:,} | {format_or_dash(d['ttft_p50_s'])} / "
                     f"{format_or_dash(d['ttft_p99_s'])} s | {format_or_dash(d['tpot_p50_s'])} / "
                     f"{format_or_dash(d['tpot_p99_s'])} s | {format_or_dash(d['slo_goodput'], '.1%')} | "
                     f"{'' if c is None else f'{c:,.2f}'} |")
    lines += ["", "| job | status | tokens | ETTR | preemptions | failures | lost work |",
              "|---|---|---|---|---|---|---|"]
    for name, j in summary["jobs"].items():
        lines.append(f"| {name} | {j['status']} | {j['tokens_trained']:,.3g} | "
                     f"{j['ettr']:.1%} | {j['preemptions']} | {j['interruptions']} | "
                     f"{j['lost_work_s'] / 3600:,.1f} h |")
    if (run_dir / "day.parquet").exists():
        path = plot_day(run_dir, summary["scenario"], folder / report_file("day.png"))
        lines += ["", "## The day", "", f"![The day]({path.name})"]
    report = folder / report_file("report.md")
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return report
