"""`clustersim report RUN_DIR`: PNG plots of a finished run and a short Markdown report.

Plots (matplotlib, no display needed): cluster utilisation over time by state (stacked),
job timelines (a Gantt of states), failures over time by component, where each job's hours
went (useful and lost, by cause), and the breakdown of one training step per job. The
topology's drawing (`clustersim topology --draw`) is `analysis.topology`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from clustersim.analysis.fleet_report import fleet_plots  # noqa: E402
from clustersim.analysis.fleetday import write_day_report  # noqa: E402
from clustersim.analysis.plotting import (
    LOST_LABELS,
    STATE_COLOURS,
    _days,
    _legend_outside,
    _save,
    bin_for,
    format_bin,
    time_unit,
)
from clustersim.analysis.report_names import report_file
from clustersim.analysis.runs import Run, job_status, load_run  # noqa: E402
from clustersim.analysis.serving_report import cell, serving_lines, serving_plots  # noqa: E402

__all__ = ["write_report", "STATE_COLOURS"]


def plot_utilisation(run: Run, path: Path) -> Path:
    frame = run.utilisation
    cluster = frame[frame["level"] == "cluster"].sort_values("bin_start_s")
    horizon = float(run.summary["simulated_s"])
    # Bins chosen from the horizon (about 300 of them, never finer than the trace's): a
    # month at the trace's 1-minute bins is 43,200 bars of noise; recomputed from the
    # intervals.
    written_s = float(cluster["bin_s"].iloc[0]) if len(cluster) else 0.0
    bin_s = bin_for(horizon, finest_s=written_s)
    if cluster.empty or bin_s != written_s:
        cluster = run.utilisation_at("cluster", bin_s=bin_s)
    cluster = _with_serving(run, cluster.copy())
    # Only the states thick enough to see (a peak of 0.3% of the axis, about a pixel) are
    # stacked and listed; the others are named under the plot with their share.
    present = [s for s in ("running", "serving", "checkpointing", "down",
                           "waiting_for_hardware", "restarting", "restoring", "failed",
                           "repairing", "idle")
               if s in cluster and cluster[s].sum() > 0]
    states = [s for s in present if cluster[s].max() >= 0.003]
    thin = [s for s in present if s not in states]
    fig, ax = plt.subplots(figsize=(11, 4.6))
    unit, name = time_unit(horizon)
    # The last bin drawn to its end: a step plot ends at its last point.
    x = np.append(cluster["bin_start_s"].to_numpy(), horizon) / unit
    ax.stackplot(x, [np.append(cluster[s].to_numpy(), cluster[s].to_numpy()[-1:]) * 100
                     for s in states], labels=states,
                 colors=[STATE_COLOURS[s] for s in states], step="post")
    ax.set_xlim(0, horizon / unit)
    ax.set_ylim(0, 100)
    ax.set_xlabel(f"{name} ({format_bin(bin_s)} bins)"
                  + ("" if not thin else "\ntoo thin to see at this scale (mean share): "
                     + ", ".join(f"{s} {cluster[s].mean():.3%}" for s in thin)))
    ax.set_ylabel("% of cluster chip-time")
    ax.set_title(f"{run.summary['scenario']}: cluster chip-time by state" + _replication(run))
    _legend_outside(ax)
    return _save(fig, path)


def _with_serving(run: Run, cluster: Any) -> Any:
    """Serving deployments hold their instances for the whole run, which the traces count as
    idle (no job holds them): show that share as `serving`, taken out of idle."""
    summary = run.summary["cluster"]
    share = (summary.get("serving_instances") or 0) / max(1, summary.get("instances") or 1)
    if share > 0 and "idle" in cluster:
        cluster["serving"] = np.minimum(cluster["idle"].to_numpy(), share)
        cluster["idle"] = cluster["idle"] - cluster["serving"]
    return cluster


def plot_job_timelines(run: Run, path: Path, window_s: tuple[float, float] | None = None,
                       title: str = "job states over time", first_job: int | None = None
                       ) -> Path:
    """A Gantt of job states: the whole run in days, or `window_s` in hours (minute-long
    states such as detection and restarts are invisible at month scale), `first_job` on top
    and then the largest jobs active in the window."""
    intervals = run.intervals
    spans = intervals[(intervals["entity"] == "job") & (intervals["state"] != "done")]
    if window_s is not None:
        lo, hi = window_s
        spans = spans[(spans["end_s"] > lo) & (spans["start_s"] < hi)]
        active = run.jobs[run.jobs["job_id"].isin(spans["entity_id"])]
        # chips from jobs.parquet: past 2,000 jobs summary.json lists only the largest
        ranked = sorted(active.itertuples(), key=lambda j: (
            j.job_id != first_job, -j.chips, j.job_id))
        jobs = active.set_index("job_id").loc[[j.job_id for j in ranked[:MAX_ROWS]]]
        jobs = jobs.reset_index()
        shown = set(jobs["name"])
        origin, unit, xlabel = lo, 3600.0, f"hours from day {lo / 86400:,.2f}"
    else:
        shown = set(_largest_jobs(run))
        jobs = run.jobs[run.jobs["name"].isin(shown)].sort_values("job_id")
        origin, unit, xlabel = 0.0, 86400.0, "day"
    fig, ax = plt.subplots(figsize=(11, 1.8 + 0.6 * len(jobs)))
    span_units = ((window_s[1] - window_s[0]) if window_s is not None
                  else float(run.summary["simulated_s"])) / unit
    # A span narrower than this (about a pixel of the axes) cannot be seen as a bar: it is
    # drawn as a marker instead, so every interruption and checkpoint shows at any scale.
    pixel = span_units / 800
    marked: dict[str, int] = {}
    for row, job_id in enumerate(jobs["job_id"]):
        mine = spans[spans["entity_id"] == job_id]
        for state, group in mine.groupby("state"):
            starts = (group["start_s"].to_numpy() - origin) / unit
            widths = (group["end_s"] - group["start_s"]).to_numpy() / unit
            wide = widths >= pixel
            # Every span is drawn (short running spans between checkpoints add up to a
            # visible bar); the legend lists a state only if some of it can be seen.
            seen = wide.any() or (state not in ("checkpointing", "down")
                                  and _merged_widest(starts, widths, pixel) >= pixel)
            ax.broken_barh(list(zip(starts, widths, strict=True)), (row - 0.35, 0.7),
                           facecolors=STATE_COLOURS.get(state, "k"),
                           label=state if seen else None)
            # Marked: checkpoints, and interruptions at their start (down; the restart and
            # restore after it are part of the same mark).
            narrow = ~wide if state in ("checkpointing", "down") else np.zeros_like(wide)
            if narrow.any():
                checkpoint = state == "checkpointing"
                ax.scatter(starts[narrow], np.full(narrow.sum(), row + (0.3 if checkpoint
                                                                        else -0.45)),
                           marker="|" if checkpoint else "v", s=28 if checkpoint else 22,
                           color=STATE_COLOURS.get(state, "k"), linewidths=0.8, zorder=3)
                marked[state] = marked.get(state, 0) + int(narrow.sum())
    what = {"checkpointing": "checkpoint", "down": "interruption (down, then restart, restore)"}
    unique = {}
    for state, count in marked.items():  # listed only when drawn, with what the mark means
        unique[f"{what[state]}: {count:,} too short to draw, marked "
               f"{'|' if state == 'checkpointing' else '▼'}"] = plt.Line2D(
            [], [], color=STATE_COLOURS.get(state, "k"), linestyle="none",
            marker="|" if state == "checkpointing" else "v")
    _legend_outside(ax, unique)
    ax.set_yticks(range(len(jobs)), jobs["name"].tolist())
    ax.set_xlabel(xlabel)
    if window_s is not None:
        ax.set_xlim(0, (window_s[1] - window_s[0]) / unit)
    else:
        ax.set_xlim(0, _days(run.summary["simulated_s"]))
    ax.invert_yaxis()  # the first job on top
    total = len(run.summary["jobs"])
    if window_s is not None and len(jobs) < total:
        ax.set_title(f"{title} ({len(jobs)} of {total} jobs, the one hit first on top)"
                     + _replication(run))
    else:
        ax.set_title(title + _of(run, shown) + _replication(run))
    return _save(fig, path)


def first_failure_window(run: Run) -> tuple[float, float, int] | None:
    """From 30 minutes before the first failure that hit a job to 30 minutes after that job
    runs again (at most a day), and the job; None when no failure hit a job."""
    events = run.events
    hits = events[(events["kind"] == "failure") & (events["job_id"] >= 0)]
    if hits.empty:
        return None
    first = hits.sort_values("time_s").iloc[0]
    t0, job = float(first["time_s"]), int(first["job_id"])
    spans = run.intervals
    back = spans[(spans["entity"] == "job") & (spans["entity_id"] == job)
                 & (spans["state"] == "running") & (spans["start_s"] > t0)]
    resumed = float(back["start_s"].min()) if len(back) else t0 + 86400.0
    horizon = float(run.summary["simulated_s"])
    return max(0.0, t0 - 1800.0), min(horizon, min(resumed, t0 + 86400.0) + 1800.0), job


def plot_failures(run: Run, path: Path) -> Path:
    events = run.events
    failures = events[events["kind"] == "failure"]
    horizon = float(run.summary["simulated_s"])
    unit, name = time_unit(horizon)
    bin_s = bin_for(horizon, bins=40, finest_s=60.0)  # about 40 bars, whatever the horizon
    bins = np.arange(0.0, horizon + bin_s, bin_s) / unit
    fig, ax = plt.subplots(figsize=(10, 3.8))
    components = failures["component"].value_counts().index.tolist()
    if components:
        ax.hist([failures.loc[failures["component"] == c, "time_s"].to_numpy() / unit
                 for c in components], bins=bins, stacked=True, label=components)
        ax.legend(fontsize=8, ncol=min(len(components), 6))
    else:
        ax.text(0.5, 0.5, "no failures", ha="center", va="center", transform=ax.transAxes)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0, horizon / unit)
    ax.set_xlabel(name)
    per = {86400.0: "day", 3600.0: "hour", 60.0: "minute"}.get(bin_s, format_bin(bin_s))
    ax.set_ylabel(f"failures per {per}")
    ax.set_title(f"failures by component ({len(failures):,} in all)" + _replication(run))
    return _save(fig, path)


MAX_ROWS = 30  # jobs drawn per plot: the largest by chip-time when there are more


def _largest_jobs(run: Run) -> dict[str, dict]:
    jobs = run.summary["jobs"]
    if len(jobs) <= MAX_ROWS:
        return jobs
    ranked = sorted(jobs, key=lambda n: -(jobs[n].get("chips", 0) * jobs[n].get("wall_s", 0)))
    return {name: jobs[name] for name in ranked[:MAX_ROWS]}


def _stacked_bars(rows: list[tuple[str, list[tuple[float, str, str]], str]], xlabel: str,
                  title: str, path: Path, unit: str = "") -> Path:
    """One horizontal bar per row, stacked from (value, label, colour) segments, annotated;
    `unit` follows the values the note names."""
    fig, ax = plt.subplots(figsize=(11, 2.2 + 0.7 * len(rows)))
    longest = max((sum(v for v, _, _ in segments) for _, segments, _ in rows), default=0.0)
    for row, (_, segments, note) in enumerate(rows):
        left = 0.0
        hidden = []
        for value, label, colour in segments:
            if value > 0:
                # A segment under about a pixel is drawn but not listed in the legend (it
                # cannot be seen); the bar's note names it instead.
                seen = value >= longest / 700
                ax.barh(row, value, left=left, color=colour, label=label if seen else None)
                left += value
                if not seen:
                    hidden.append(f"{label} {value:.2g}{unit}")
        tail = f" (too small to see: {', '.join(hidden)})" if hidden else ""
        ax.text(left, row, f"  {note}{tail}", va="center", fontsize=9)
    _legend_outside(ax)
    ax.set_yticks(range(len(rows)), [name for name, _, _ in rows])
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.margins(x=0.15)
    return _save(fig, path)


def plot_hours(run: Run, path: Path) -> Path:
    """Per job, one horizontal bar: useful hours then every cause of lost hours."""
    palette = {"useful": STATE_COLOURS["running"], "lost_work": "#d84315",
               "checkpointing": STATE_COLOURS["checkpointing"],
               "down": STATE_COLOURS["down"],
               "waiting_for_hardware": STATE_COLOURS["waiting_for_hardware"],
               "restarting": STATE_COLOURS["restarting"], "restoring": STATE_COLOURS["restoring"],
               "queued": STATE_COLOURS["queued"], "requeued": STATE_COLOURS["requeued"]}
    jobs = _largest_jobs(run)
    rows = []
    for name, job in jobs.items():
        parts = [("useful", job.get("useful_s", 0.0))] + [
            (k, v) for k, v in job.get("lost_time_s", {}).items() if not k.endswith("_ci95")]
        segments = [(seconds / 3600, "useful" if key == "useful" else LOST_LABELS.get(key, key),
                     palette.get(key, "k")) for key, seconds in parts]
        rows.append((name, segments, f"ETTR {job.get('ettr', 0):.1%}"))
    title = "where the hours went" + _of(run, jobs) + _means(run)
    return _stacked_bars(rows, "hours since the job was submitted", title, path, unit=" h")


def plot_step(run: Run, path: Path) -> Path:
    parts = [("compute_s", "compute", "#2e7d32"), ("tp_comm_s", "TP comm", "#1565c0"),
             ("pp_comm_s", "PP comm", "#00838f"), ("dp_comm_s", "DP comm", "#8e24aa"),
             ("ep_comm_s", "EP all-to-all", "#c62828"), ("bubble_s", "pipeline bubble", "#9e9e9e"),
             ("optimizer_s", "optimizer", "#ef6c00")]
    jobs = _largest_jobs(run)
    rows = []
    for name, job in jobs.items():
        breakdown = job.get("step_breakdown", {})
        segments = [(breakdown.get(key, 0.0), label, colour) for key, label, colour in parts]
        rows.append((name, segments,
                     f"{job.get('step_time_s', 0):.2f} s, MFU {job.get('mfu', 0):.1%}"))
    title = "one training step, by where its time goes" + _of(run, jobs)
    return _stacked_bars(rows, "seconds per training step", title, path, unit=" s")


def _merged_widest(starts: np.ndarray, widths: np.ndarray, gap: float) -> float:
    """The widest run of spans once gaps narrower than `gap` are closed: what the eye sees
    of spans drawn side by side (running between checkpoints), not their sum."""
    order = np.argsort(starts)
    begin, end, widest = None, None, 0.0
    for start, width in zip(starts[order], widths[order], strict=True):
        if begin is None or start - end >= gap:
            begin, end = start, start + width
        else:
            end = max(end, start + width)
        widest = max(widest, end - begin)
    return widest


def _means(run: Run) -> str:
    """Plots drawn from summary.json show means over the replications: say so."""
    n = run.summary.get("replications", 1)
    return f" (means over {n} replications)" if n > 1 else ""


def _replication(run: Run) -> str:
    """Plots drawn from traces show one replication: say which when there were several."""
    n = run.summary.get("replications", 1)
    return f"\nreplication 1 of {n} (the traces' seed stream)" if n > 1 else ""


def _of(run: Run, shown: dict) -> str:
    total = len(run.summary["jobs"])
    return f" ({len(shown)} largest of {total} jobs)" if len(shown) < total else ""


def _count(value: float) -> str:
    """A count, or a mean of counts over replications (0.33 switch failures is not 0)."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def _pair(job: dict, key: str, form: str) -> str:
    """The ideal (per step) and effective (over the run) figure, `-` where unknown."""
    values = [job.get(key), job.get(f"effective_{key}")]
    return " / ".join("-" if v is None else form.format(v) for v in values)


def write_report(run_dir: str | Path, folder: str | Path | None = None) -> Path:
    """Draw the plots into RUN_DIR/report/ (or `folder`) and write report.md there."""
    run = load_run(run_dir)
    folder = Path(folder) if folder is not None else run.path / "report"
    folder.mkdir(exist_ok=True)
    if "fleet_day" in run.summary:  # the fleet-level model: no timeline traces
        return write_day_report(run.path, run.summary, folder)
    training = bool(run.summary["jobs"])  # a serving-only run has no training plots to draw
    plots = {"Cluster utilisation": plot_utilisation(run, folder / report_file("utilisation.png"))}
    if training:
        plots["Job timelines"] = plot_job_timelines(run, folder / report_file("jobs.png"))
    window = first_failure_window(run)
    if window is not None:
        lo, hi, job = window
        plots["Around the first failure"] = plot_job_timelines(
            run, folder / report_file("first_failure.png"), (lo, hi), "job states around the first failure",
            first_job=job)
    # A serving-only run without failures has nothing to show there ("no failures" is in
    # the report's text): drawn for training, or when something failed.
    if training or (run.events["kind"] == "failure").any():
        plots["Failures"] = plot_failures(run, folder / report_file("failures.png"))
    if training:
        plots |= {"Where the hours went": plot_hours(run, folder / report_file("hours.png")),
                  "Training step": plot_step(run, folder / report_file("step.png"))}
    plots |= serving_plots(run, folder)
    plots |= fleet_plots(run, folder)
    summary = run.summary
    cluster = summary["cluster"]
    horizon = float(summary["simulated_s"])
    unit, unit_name = time_unit(horizon)
    lines = [
        f"# {cell(summary['scenario'])}",
        "",
        f"{cluster['chips']:,} {cluster['chip']} chips ({cluster['hardware']}), "
        f"{horizon / unit:,.1f} simulated {unit_name}s, seed {summary['seed']}, "
        f"{summary['replications']} replication(s), clustersim {summary['clustersim_version']}.",
        "",
        "Cluster: " + "; ".join(_chip_time(summary)) + "; failures: "
        + (", ".join(f"{k} {_count(v)}" for k, v in cluster.get("failures", {}).items()
                     if not k.endswith("_ci95")) or "none") + ".",
    ]
    if training:
        lines += ["", "| job | status | steps | ETTR | interruptions | step time | MFU | "
                  "$/M tokens, ideal / effective | J/token, ideal / effective |",
                  "|---|---|---|---|---|---|---|---|---|"]
    if summary.get("replications", 1) > 1:
        lines[2:2] = [f"The figures are means over the {summary['replications']} replications; "
                      "the plots show replication 1 of them (replication 0 as the command "
                      "line counts: the first seed stream, whose traces the run wrote).", ""]
    for name, job in summary["jobs"].items():
        lines.append(f"| {cell(name)} | {cell(job_status(job))} | {job.get('steps_completed', 0):,.0f} "
                     f"| {job.get('ettr', 0):.1%} | {_count(job.get('interruptions', 0))} | "
                     f"{job.get('step_time_s', 0):.2f} s | {job.get('mfu', 0):.1%} | "
                     f"{_pair(job, 'cost_per_million_tokens_usd', '${:,.3f}')} | "
                     f"{_pair(job, 'energy_per_token_j', '{:,.3f}')} |")
    lines += serving_lines(summary)
    for title, path in plots.items():
        lines += ["", f"## {title}", "", f"![{title}]({path.name})"]
    report = folder / report_file("report.md")
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return report


def _chip_time(summary: dict[str, Any]) -> list[str]:
    """Where the cluster's chip-time went: training jobs and serving deployments."""
    cluster, parts = summary["cluster"], []
    if summary["jobs"]:
        parts.append(f"{cluster.get('utilisation', 0):.1%} of chip-time held by jobs, "
                     f"{cluster.get('useful_utilisation', 0):.1%} useful")
    serving = cluster.get("serving_instances") or 0
    deployments = summary.get("deployments") or {}
    if serving and deployments:
        served = sum(d.get("requests_completed", 0) for d in deployments.values())
        hours = serving * cluster["chips_per_instance"] * summary["simulated_s"] / 3600
        parts.append(f"{serving / max(1, cluster['instances']):.1%} of chip-time held by "
                     f"{len(deployments)} serving deployment(s) ({hours:,.1f} chip-hours), "
                     f"{served:,} requests served")
    return parts or ["no jobs and no deployments"]


