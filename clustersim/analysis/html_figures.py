"""The interactive (Plotly) figures of a run's HTML report: the PNG report's figures
(`analysis.report`, `fleet_report`) drawn from the same tables, plus chip-time by team over
time.

Nothing holds more points than a screen shows: series over time are binned (the PNG's bins,
or about `SCREEN_BINS` across), job timelines show the state that held most of each bin with
failures marked once per job and bin, and curves are thinned to about 2,000 points. Each
figure says how it was binned.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from clustersim.analysis.fleet_report import FLEET_COLUMNS, size_bins, started_waits
from clustersim.analysis.plotting import (
    LOST_LABELS,
    STATE_COLOURS,
    bin_for,
    format_bin,
    time_unit,
)
from clustersim.analysis.report import _largest_jobs, _with_serving, first_failure_window
from clustersim.analysis.runs import Run
from clustersim.scenario.errors import ScenarioError
from clustersim.scenario.loader import load_scenario

__all__ = ["run_figures", "held_per_bin", "SCREEN_BINS", "layout"]

SCREEN_BINS = 1500  # about the pixels across a wide plot
_STATES = ("running", "serving", "checkpointing", "down", "waiting_for_hardware",
           "restarting", "restoring", "failed", "repairing", "idle")


def layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0.01}, height=height, template="plotly_white",
                      margin={"l": 60, "r": 20, "t": 60, "b": 50},
                      legend={"orientation": "h", "y": -0.18})
    return fig


def held_per_bin(starts: np.ndarray, ends: np.ndarray, weights: np.ndarray,
                 edges: np.ndarray) -> np.ndarray:
    """Sum over spans of weight x the seconds each span overlaps each bin (`edges`: the bins'
    bounds), in O(spans log spans): the integral of the held weight up to t is
    sum w max(0, t - start) - sum w max(0, t - end), a ramp evaluated at the edges."""
    def ramp(points: np.ndarray) -> np.ndarray:
        order = np.argsort(points, kind="stable")
        p, w = points[order], weights[order]
        total_w = np.concatenate(([0.0], np.cumsum(w)))
        total_wp = np.concatenate(([0.0], np.cumsum(w * p)))
        k = np.searchsorted(p, edges, "right")
        return total_w[k] * edges - total_wp[k]

    starts = np.asarray(starts, dtype=float)
    ends = np.asarray(ends, dtype=float)
    weights = np.asarray(weights, dtype=float)
    if len(starts) == 0:
        return np.zeros(len(edges) - 1)
    return np.diff(ramp(starts) - ramp(ends))


def utilisation_figure(run: Run) -> go.Figure:
    """Cluster chip-time by state over time, stacked (the PNG's bins)."""
    frame = run.utilisation
    cluster = frame[frame["level"] == "cluster"].sort_values("bin_start_s")
    horizon = float(run.summary["simulated_s"])
    written_s = float(cluster["bin_s"].iloc[0]) if len(cluster) else 0.0
    bin_s = bin_for(horizon, finest_s=written_s)
    ratio = bin_s / written_s if written_s > 0 else 0.0
    if len(cluster) and ratio > 1 and abs(ratio - round(ratio)) < 1e-9:
        # Whole multiples of the written bins: their means (a bin's chip-time shares are
        # the mean of its equal sub-bins'), without recomputing from the intervals.
        group = (cluster["bin_start_s"].to_numpy() // bin_s).astype(np.int64)
        states = [s for s in _STATES if s in cluster]
        cluster = cluster.groupby(group)[states].mean().reset_index(names="bin")
        cluster["bin_start_s"] = cluster["bin"] * bin_s
    elif cluster.empty or bin_s != written_s:
        cluster = run.utilisation_at("cluster", bin_s=bin_s)
    cluster = _with_serving(run, cluster.copy())
    unit, name = time_unit(horizon)
    x = cluster["bin_start_s"].to_numpy() / unit
    fig = go.Figure()
    for state in _STATES:
        if state in cluster and cluster[state].sum() > 0:
            fig.add_trace(go.Scatter(x=x, y=cluster[state].to_numpy() * 100, name=state,
                                     stackgroup="states", line={"shape": "hv", "width": 0},
                                     fillcolor=STATE_COLOURS[state], mode="lines",
                                     hovertemplate="%{y:.2f}%"))
    fig.update_xaxes(title=f"{name} ({format_bin(bin_s)} bins)", range=[0, horizon / unit])
    fig.update_yaxes(title="% of cluster chip-time", range=[0, 100])
    return layout(fig, f"{run.summary['scenario']}: cluster chip-time by state")


def team_figure(run: Run) -> go.Figure | None:
    """Chip-time held by each team's jobs over time (running or not), when there are teams."""
    path = run.path / "job_summary.parquet"
    if not path.exists():
        return None
    teams = pd.read_parquet(path, columns=["name", "team"])
    if teams["team"].nunique() < 2:
        return None
    jobs = run.jobs[["job_id", "name", "chips"]].merge(teams, on="name")
    spans = run.intervals
    spans = spans[(spans["entity"] == "job")
                  & ~spans["state"].isin(("queued", "done", "failed"))]
    spans = spans.merge(jobs, left_on="entity_id", right_on="job_id")
    horizon = float(run.summary["simulated_s"])
    bin_s = bin_for(horizon, bins=SCREEN_BINS // 3)
    edges = np.arange(0.0, horizon + bin_s, bin_s)
    edges[-1] = min(edges[-1], horizon) if edges[-2] < horizon else edges[-1]
    total = float(run.summary["cluster"]["chips"])
    unit, name = time_unit(horizon)
    fig = go.Figure()
    for team, mine in spans.groupby("team", sort=True):
        held = held_per_bin(mine["start_s"].to_numpy(), mine["end_s"].to_numpy(),
                            mine["chips"].to_numpy(), edges) / np.diff(edges)
        fig.add_trace(go.Scatter(x=edges[:-1] / unit, y=held / total * 100, name=str(team),
                                 stackgroup="teams", mode="lines",
                                 line={"shape": "hv", "width": 0}, hovertemplate="%{y:.2f}%"))
    fig.update_xaxes(title=f"{name} ({format_bin(bin_s)} bins)", range=[0, horizon / unit])
    fig.update_yaxes(title="% of cluster chips held")
    return layout(fig, "chip-time held by each team's jobs (running, checkpointing, "
                       "recovering)")


def site_figure(run: Run) -> go.Figure | None:
    """Chip-time held by jobs in each site over time (% of the site's chips), when the
    cluster has several sites."""
    try:
        network = load_scenario(run.path / "scenario.yaml").site_network
    except (ScenarioError, OSError):
        return None
    if network is None or network.count < 2:
        return None
    bounds = np.cumsum(network.instances)
    held = run.allocations
    chips = float(run.summary["cluster"]["chips_per_instance"])
    site = np.searchsorted(bounds, held["instance_id"].to_numpy(), "right")
    horizon = float(run.summary["simulated_s"])
    bin_s = bin_for(horizon, bins=SCREEN_BINS // 3)
    edges = np.append(np.arange(0.0, horizon, bin_s), horizon)
    unit, name = time_unit(horizon)
    fig = go.Figure()
    for index, (label, count) in enumerate(zip(network.names, network.instances, strict=True)):
        mine = held[site == index]
        ends = mine["end_s"].fillna(horizon).to_numpy()
        share = held_per_bin(mine["start_s"].to_numpy(), np.minimum(ends, horizon),
                             np.full(len(mine), chips), edges) / np.diff(edges)
        fig.add_trace(go.Scatter(x=edges[:-1] / unit, y=share / (count * chips) * 100,
                                 name=str(label), mode="lines", line={"shape": "hv"},
                                 hovertemplate="%{y:.2f}%"))
    fig.update_xaxes(title=f"{name} ({format_bin(bin_s)} bins)", range=[0, horizon / unit])
    fig.update_yaxes(title="% of the site's chips held by jobs", range=[0, 100])
    return layout(fig, "chip-time held by jobs in each site")


def timeline_figure(run: Run, window: tuple[float, float] | None = None,
                    first_job: int | None = None, title: str = "job states over time"
                    ) -> go.Figure:
    """A Gantt of job states, the largest jobs (or those active in `window`, `first_job` on
    top), down-sampled: each segment is the state that held most of a bin of about a pixel,
    failures marked (x) once per job and bin."""
    intervals = run.intervals
    spans = intervals[(intervals["entity"] == "job") & (intervals["state"] != "done")]
    horizon = float(run.summary["simulated_s"])
    lo, hi = window if window is not None else (0.0, horizon)
    if window is not None:
        spans = spans[(spans["end_s"] > lo) & (spans["start_s"] < hi)]
        active = run.jobs[run.jobs["job_id"].isin(spans["entity_id"])]
        sizes = {n: j.get("chips", 0) for n, j in run.summary["jobs"].items()}
        ranked = sorted(active.itertuples(), key=lambda j: (
            j.job_id != first_job, -sizes.get(j.name, 0), j.job_id))[:30]
        jobs = [(j.job_id, j.name) for j in ranked]
        unit, xlabel = 3600.0, f"hours from day {lo / 86400:,.2f}"
    else:
        shown = set(_largest_jobs(run))
        table = run.jobs[run.jobs["name"].isin(shown)].sort_values("job_id")
        jobs = list(zip(table["job_id"], table["name"], strict=True))
        unit, xlabel = 86400.0, "day"
    bins = SCREEN_BINS
    edges = np.linspace(lo, hi, bins + 1)
    width = edges[1] - edges[0]
    states = [s for s in STATE_COLOURS if s in set(spans["state"])]
    segments: dict[str, list[tuple[float, float, str]]] = {s: [] for s in states}
    marks_x, marks_y = [], []
    failures = run.events[(run.events["kind"] == "failure")]
    by_job = dict(tuple(spans[spans["entity_id"].isin([j for j, _ in jobs])]
                        .groupby("entity_id")))
    for job_id, name in jobs:
        mine = by_job.get(job_id)
        if mine is None:
            continue
        shares = np.array([held_per_bin(mine.loc[mine["state"] == s, "start_s"].to_numpy(),
                                        mine.loc[mine["state"] == s, "end_s"].to_numpy(),
                                        np.ones(int((mine["state"] == s).sum())), edges)
                           for s in states])
        # (a bin the job was not in holds only the sums' rounding, some 1e-10 s)
        dominant = np.where(shares.max(axis=0) > 1e-6 * width, shares.argmax(axis=0), -1)
        change = np.flatnonzero(np.diff(dominant)) + 1
        for a, b in zip(np.r_[0, change], np.r_[change, bins], strict=True):
            if dominant[a] >= 0:
                segments[states[dominant[a]]].append(((edges[a] - lo) / unit,
                                                      (edges[b] - edges[a]) / unit, name))
        hits = failures.loc[failures["job_id"] == job_id, "time_s"].to_numpy()
        hits = hits[(hits >= lo) & (hits < hi)]
        for b in np.unique(((hits - lo) // width).astype(int)):
            marks_x.append((edges[b] - lo + width / 2) / unit)
            marks_y.append(name)
    fig = go.Figure()
    for state, rows in segments.items():
        if rows:
            base, length, name = zip(*rows, strict=True)
            fig.add_trace(go.Bar(base=list(base), x=list(length), y=list(name), name=state,
                                 orientation="h", marker={"color": STATE_COLOURS[state],
                                                          "line": {"width": 0}},
                                 hovertemplate=f"{state}<extra>%{{y}}</extra>"))
    if marks_x:
        fig.add_trace(go.Scatter(x=marks_x, y=marks_y, mode="markers", name="failure",
                                 marker={"symbol": "x", "size": 6, "color": "black"}))
    fig.update_layout(barmode="overlay", bargap=0.3)
    names = [name for _, name in jobs]
    fig.update_yaxes(categoryorder="array", categoryarray=names[::-1])
    fig.update_xaxes(title=f"{xlabel} (each segment: the state holding most of a "
                           f"{format_bin(round(width, 3)) if width >= 1 else f'{width:.3g} s'}"
                           " bin)", range=[0, (hi - lo) / unit])
    total = len(run.summary["jobs"])
    of = f" ({len(jobs)} of {total} jobs)" if len(jobs) < total else ""
    return layout(fig, title + of, height=max(300, 140 + 24 * len(jobs)))


def failures_figure(run: Run) -> go.Figure:
    """Failures per bin by component (the PNG's bins), and their blast radius: the chips
    of the jobs they stopped."""
    events = run.events
    failures = events[events["kind"] == "failure"]
    horizon = float(run.summary["simulated_s"])
    unit, name = time_unit(horizon)
    bin_s = bin_for(horizon, bins=40, finest_s=60.0)
    edges = np.arange(0.0, horizon + bin_s, bin_s)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("failures by component",
                                        "blast radius: chips of the jobs stopped"))
    centres = (edges[:-1] + bin_s / 2) / unit
    for component in failures["component"].value_counts().index:
        times = failures.loc[failures["component"] == component, "time_s"].to_numpy()
        count, _ = np.histogram(times, edges)
        fig.add_trace(go.Bar(x=centres, y=count, name=str(component),
                             legendgroup="components"), row=1, col=1)
    chips = run.jobs.set_index("job_id")["chips"]
    hit = failures[failures["job_id"] >= 0]
    stopped = chips.reindex(hit["job_id"]).fillna(0).to_numpy()
    total, _ = np.histogram(hit["time_s"].to_numpy(), edges, weights=stopped)
    fig.add_trace(go.Bar(x=centres, y=total, name="chips stopped", marker_color="#c62828"),
                  row=2, col=1)
    fig.update_layout(barmode="stack")
    per = {86400.0: "day", 3600.0: "hour", 60.0: "minute"}.get(bin_s, format_bin(bin_s))
    fig.update_yaxes(title=f"failures per {per}", row=1, col=1)
    fig.update_yaxes(title=f"chips stopped per {per}", row=2, col=1)
    fig.update_xaxes(title=name, range=[0, horizon / unit], row=2, col=1)
    return layout(fig, f"failures ({len(failures):,} in all, {len(hit):,} stopped a job)",
                  height=560)


def _stacked(rows: list[tuple[str, list[tuple[float, str, str]], str]], xlabel: str,
             title: str) -> go.Figure:
    """One horizontal bar per row stacked from (value, label, colour) segments, the row's
    note beside its name."""
    fig = go.Figure()
    labels = {label: colour for _, segments, _ in rows for _, label, colour in segments}
    names = [f"{name} ({note})" for name, _, note in rows]
    for label, colour in labels.items():
        values = [sum(v for v, lab, _ in segments if lab == label) for _, segments, _ in rows]
        fig.add_trace(go.Bar(y=names, x=values, name=label, orientation="h",
                             marker_color=colour))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(categoryorder="array", categoryarray=names[::-1])
    fig.update_xaxes(title=xlabel)
    return layout(fig, title, height=max(300, 160 + 40 * len(rows)))


def hours_figure(run: Run) -> go.Figure:
    palette = {"useful": STATE_COLOURS["running"], "lost work": "#d84315"}
    rows = []
    for name, job in _largest_jobs(run).items():
        parts = [("useful", job.get("useful_s", 0.0))] + [
            (k, v) for k, v in job.get("lost_time_s", {}).items() if not k.endswith("_ci95")]
        segments = [(s / 3600, "useful" if k == "useful" else LOST_LABELS.get(k, k),
                     palette.get(k, STATE_COLOURS.get(k, "#424242"))) for k, s in parts]
        rows.append((name, segments, f"ETTR {job.get('ettr', 0):.1%}"))
    return _stacked(rows, "hours since the job was submitted", "where the hours went")


def step_figure(run: Run) -> go.Figure:
    parts = [("compute_s", "compute", "#2e7d32"), ("tp_comm_s", "TP comm", "#1565c0"),
             ("pp_comm_s", "PP comm", "#00838f"), ("dp_comm_s", "DP comm", "#8e24aa"),
             ("ep_comm_s", "EP all-to-all", "#c62828"),
             ("bubble_s", "pipeline bubble", "#9e9e9e"), ("optimizer_s", "optimizer", "#ef6c00")]
    rows = []
    for name, job in _largest_jobs(run).items():
        breakdown = job.get("step_breakdown", {})
        rows.append((name, [(breakdown.get(k, 0.0), label, colour) for k, label, colour in parts],
                     f"{job.get('step_time_s', 0):.2f} s, MFU {job.get('mfu', 0):.1%}"))
    return _stacked(rows, "seconds per training step", "one training step, by where its "
                                                       "time goes")


def cost_figure(run: Run) -> go.Figure | None:
    """Cost per million tokens of each job: ideal (a step's chip-time) and effective (the
    chip-time held over the tokens trained)."""
    jobs = _largest_jobs(run)
    ideal = [j.get("cost_per_million_tokens_usd") for j in jobs.values()]
    effective = [j.get("effective_cost_per_million_tokens_usd") for j in jobs.values()]
    if not any(v is not None for v in ideal + effective):
        return None
    names = list(jobs)
    fig = go.Figure([go.Bar(y=names, x=ideal, name="ideal (one step)", orientation="h"),
                     go.Bar(y=names, x=effective, name="effective (over the run)",
                            orientation="h")])
    fig.update_xaxes(title="$ per million tokens")
    fig.update_yaxes(categoryorder="array", categoryarray=names[::-1])
    return layout(fig, "training cost per million tokens", height=max(300, 160 + 40 * len(names)))


def fleet_figure(run: Run) -> go.Figure | None:
    """Queue wait and slowdown by job size and by team, chip-time by team (fleet.png)."""
    path = run.path / "job_summary.parquet"
    if not path.exists():
        return None
    jobs = pd.read_parquet(path, columns=FLEET_COLUMNS)
    if len(jobs) < 2:
        return None
    jobs["size"] = size_bins(jobs["instances"])
    fig = make_subplots(rows=2, cols=2, subplot_titles=(
        "queue wait by job size (instances)", "slowdown by job size (instances)",
        "queue wait by team", "chip-time by team"))
    by_size = jobs.groupby("size")
    keys = list(by_size.groups)
    sizes = [str(s) if s == 1 else f"{s}-{2 * s - 1}" for s in keys]
    teams = sorted(jobs["team"].unique())
    by_team = jobs.groupby("team")

    def pair(x: list[str], series: Any, scale: float, row: int, col: int, first: bool) -> None:
        for quantile, label, colour in ((0.5, "median", "#1565c0"),
                                        (0.95, "95th percentile", "#ef6c00")):
            values = series.quantile(quantile).reindex(series.quantile(quantile).index)
            fig.add_trace(go.Bar(x=x, y=values.to_numpy() / scale, name=label,
                                 marker_color=colour, legendgroup=label, showlegend=first),
                          row=row, col=col)

    def waits(by: str, keys: list, labels: list[str], row: int, first: bool) -> None:
        # over the jobs that started; those never started counted in the label (fleet_report)
        median, p95, named = started_waits(jobs, by, keys, labels, "<br>")
        for values, label, colour in ((median, "median", "#1565c0"),
                                      (p95, "95th percentile", "#ef6c00")):
            fig.add_trace(go.Bar(x=named, y=values.to_numpy() / 3600, name=label,
                                 marker_color=colour, legendgroup=label, showlegend=first),
                          row=row, col=1)

    waits("size", keys, sizes, 1, True)
    pair(sizes, by_size["slowdown"], 1, 1, 2, False)
    waits("team", teams, teams, 2, False)
    held = by_team["held_chip_s"].sum().reindex(teams)
    total = float(held.sum())
    share = held.to_numpy() / total * 100 if total > 0 else np.zeros(len(teams))
    fig.add_trace(go.Bar(x=teams, y=share, name="% of chip-time held", marker_color="#2e7d32"),
                  row=2, col=2)
    fig.update_yaxes(title="queue wait of started jobs (h)", row=1, col=1)
    fig.update_yaxes(title="slowdown (x alone)", row=1, col=2)
    fig.update_yaxes(title="queue wait of started jobs (h)", row=2, col=1)
    fig.update_yaxes(title="% of chip-time held by jobs", row=2, col=2)
    return layout(fig, f"fleet: waits, slowdowns and chip-time ({total / 3600:,.0f} "
                       "chip-hours held)", height=720)


def run_figures(run: Run) -> dict[str, go.Figure]:
    """The report's figures of a run with traces (not a fleet-day run), by section title."""
    training = bool(run.summary["jobs"])
    figures: dict[str, go.Figure | None] = {"Cluster utilisation": utilisation_figure(run),
                                            "Chip-time by team": team_figure(run),
                                            "Chip-time by site": site_figure(run)}
    if training:
        figures["Job timelines"] = timeline_figure(run)
    window = first_failure_window(run)
    if window is not None:
        lo, hi, job = window
        figures["Around the first failure"] = timeline_figure(
            run, (lo, hi), job, "job states around the first failure")
    if training or (run.events["kind"] == "failure").any():
        figures["Failures"] = failures_figure(run)
    if training:
        figures |= {"Where the hours went": hours_figure(run),
                    "Training step": step_figure(run), "Cost": cost_figure(run)}
    figures["Fleet: waits, slowdowns and chip-time by size and team"] = fleet_figure(run)
    return {k: v for k, v in figures.items() if v is not None}
