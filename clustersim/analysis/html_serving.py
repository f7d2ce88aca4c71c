"""The HTML report's serving figures (as `serving_report`'s PNGs: latency CDFs, throughput
and TTFT over time, KV cache and batch) and a fleet-day run's day (as `day_report`'s PNG:
load, replicas, SLO attainment and the fleet's chips), from the same tables, plus the
deployments' cost."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pyarrow.parquet as pq
from plotly.subplots import make_subplots

from clustersim.analysis.html_figures import SCREEN_BINS, layout
from clustersim.analysis.runs import Run
from clustersim.analysis.serving_report import (
    _BINS,
    _latencies,
    _time_axis,
    kv_samples,
    slo_bounds,
)

__all__ = ["serving_figures", "day_figures", "thinned"]

_CURVE_POINTS = 2000
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")


def _colour(index: int) -> str:
    return _PALETTE[index % len(_PALETTE)]


def thinned(length: int, points: int = _CURVE_POINTS) -> np.ndarray:
    """Indices of about `points` of `length` evenly spaced, the last one kept."""
    if length <= points:
        return np.arange(length)
    return np.unique(np.r_[np.linspace(0, length - 1, points).astype(int), length - 1])


def latency_figure(requests: pd.DataFrame, title: str, slos: dict) -> go.Figure:
    fig = make_subplots(rows=1, cols=3, subplot_titles=("TTFT", "TPOT", "end to end"))
    for index, (name, group) in enumerate(requests.groupby("deployment", observed=True,
                                                           sort=True)):
        for col, (kind, values) in enumerate(_latencies(group).items(), start=1):
            if len(values) == 0:
                continue
            x = np.sort(values)
            keep = thinned(len(x))
            fig.add_trace(go.Scatter(x=x[keep], y=(keep + 1) / len(x), name=str(name),
                                     legendgroup=str(name), showlegend=col == 1,
                                     line={"color": _colour(index)}), row=1, col=col)
            bound = slos.get(str(name), {}).get(kind)
            if bound is not None:
                fig.add_vline(x=bound, line={"color": _colour(index), "dash": "dot"},
                              row=1, col=col)
            fig.update_xaxes(type="log", title=f"{kind} (s)", row=1, col=col)
    fig.update_yaxes(title="share of completed requests", range=[0, 1], row=1, col=1)
    return layout(fig, f"{title}: latency distributions (dotted: the SLO)")


def over_time_figure(requests: pd.DataFrame, title: str, slos: dict) -> go.Figure:
    end = float(np.nanmax(requests["finish_s"].to_numpy(), initial=1.0))
    unit, unit_name = _time_axis(end)
    edges = np.linspace(0.0, max(end, 1e-9), _BINS + 1)
    width = edges[1] - edges[0]
    centres = (edges[:-1] + edges[1:]) / 2 / unit
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    for index, (name, group) in enumerate(requests.groupby("deployment", observed=True,
                                                           sort=True)):
        colour = _colour(index)
        done = group[group["status"] == "completed"]
        tokens, _ = np.histogram(done["finish_s"].to_numpy(), edges,
                                 weights=done["output_tokens"].to_numpy())
        fig.add_trace(go.Scatter(x=centres, y=tokens / width, name=f"{name} output tokens/s",
                                 line={"color": colour}), row=1, col=1)
        ttft = done["first_token_s"].to_numpy() - done["arrival_s"].to_numpy()
        which = np.clip(np.searchsorted(edges, done["arrival_s"].to_numpy(), "right") - 1, 0,
                        _BINS - 1)
        order = np.argsort(which, kind="stable")
        groups = np.split(ttft[order], np.searchsorted(which[order], np.arange(1, _BINS)))
        for q, dash in ((0.5, "solid"), (0.99, "dash")):
            fig.add_trace(go.Scatter(x=centres, y=[np.quantile(g, q) if len(g) else None
                                                   for g in groups],
                                     name=f"{name} TTFT p{round(q * 100)}",
                                     line={"color": colour, "dash": dash}), row=2, col=1)
        bound = slos.get(str(name), {}).get("TTFT")
        if bound is not None:
            fig.add_hline(y=bound, line={"color": colour, "dash": "dot"}, row=2, col=1)
    fig.update_yaxes(title="output tokens/s (by finish)", row=1, col=1)
    fig.update_yaxes(title="TTFT (s, by arrival)", type="log", row=2, col=1)
    fig.update_xaxes(title=f"time ({unit_name}, {_BINS} bins)", row=2, col=1)
    return layout(fig, f"{title}: throughput and latency over time", height=600)


def kv_figure(replicas: pd.DataFrame, names: list[str], title: str) -> go.Figure:
    unit, unit_name, times, series = kv_samples(replicas, names)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    for index, name, kv, batch in series:
        colour = _colour(index)
        fig.add_trace(go.Scatter(x=times / unit, y=kv.mean(axis=0), name=f"{name} mean",
                                 line={"color": colour}), row=1, col=1)
        fig.add_trace(go.Scatter(x=times / unit, y=kv.max(axis=0),
                                 name=f"{name} fullest replica",
                                 line={"color": colour, "dash": "dash"}), row=1, col=1)
        fig.add_trace(go.Scatter(x=times / unit, y=batch.mean(axis=0),
                                 name=f"{name} mean batch", line={"color": colour}),
                      row=2, col=1)
    fig.update_yaxes(title="KV cache occupancy (%)", range=[0, 100], row=1, col=1)
    fig.update_yaxes(title="sequences per iteration", row=2, col=1)
    fig.update_xaxes(title=f"time ({unit_name}, 400 samples per replica)", row=2, col=1)
    return layout(fig, f"{title}: KV cache and batch over time", height=600)


def serving_cost_figure(summary: dict) -> go.Figure | None:
    deployments = summary.get("deployments") or {}
    costs = {n: d.get("cost_per_million_output_tokens_usd") for n, d in deployments.items()}
    costs = {n: c for n, c in costs.items() if c is not None}
    if not costs:
        return None
    fig = go.Figure(go.Bar(y=list(costs), x=list(costs.values()), orientation="h",
                           marker_color="#1565c0", name="$ per M output tokens"))
    fig.update_xaxes(title="$ per million output tokens")
    fig.update_yaxes(categoryorder="array", categoryarray=list(costs)[::-1])
    return layout(fig, "serving cost per million output tokens",
                  height=max(280, 160 + 30 * len(costs)))


def serving_figures(run: Run) -> dict[str, go.Figure]:
    if not (run.path / "requests.parquet").exists():
        return {}
    requests = run.table("requests")
    title = run.summary["scenario"]
    slos = slo_bounds(run.scenario)
    figures = {"Serving latency": latency_figure(requests, title, slos),
               "Serving over time": over_time_figure(requests, title, slos)}
    if (run.path / "replicas.parquet").exists():
        names = list(run.summary.get("deployments", {}))
        figures["KV cache"] = kv_figure(run.table("replicas"), names, title)
    cost = serving_cost_figure(run.summary)
    if cost is not None:
        figures["Serving cost"] = cost
    return figures


_DAY_STATES = ("serving", "scaling", "training", "down", "idle")
_DAY_COLOURS = {"serving": "#1f77b4", "scaling": "#ff7f0e", "training": "#2ca02c",
                "down": "#d62728", "idle": "#c7c7c7"}


def _binned_mean(hours: np.ndarray, values: np.ndarray, bins: int = SCREEN_BINS
                 ) -> tuple[np.ndarray, np.ndarray]:
    """`values` over `hours` averaged in at most `bins` equal groups of consecutive steps."""
    if len(hours) <= bins:
        return hours, values
    groups = np.array_split(np.arange(len(hours)), bins)
    return (np.array([hours[g[0]] for g in groups]),
            np.array([values[g].mean() for g in groups]))


def day_figures(run_dir: Path, summary: dict) -> dict[str, go.Figure]:
    """A fleet-day run: load, replicas and SLO attainment per deployment and the fleet's
    chips by state over the day (day.png), TTFT p99 per deployment, and the cost per
    deployment."""
    if not (run_dir / "day.parquet").exists():
        return {}
    day = pq.read_table(run_dir / "day.parquet").to_pandas()
    fleet = pq.read_table(run_dir / "fleet.parquet").to_pandas()
    hours = fleet["time_s"].to_numpy() / 3600.0
    fig = make_subplots(rows=5, cols=1, shared_xaxes=True, vertical_spacing=0.03)
    names = list(dict.fromkeys(day["deployment"].astype(str)))
    for index, name in enumerate(names):
        mine = day[day["deployment"].astype(str) == name]
        colour = _colour(index)
        for row, column, extra in ((1, "load_per_s", {"stackgroup": "load"}),
                                   (2, "replicas", {}), (3, "slo_attainment", {}),
                                   (4, "ttft_p99_s", {})):
            x, y = _binned_mean(mine["time_s"].to_numpy() / 3600.0,
                                mine[column].to_numpy().astype(float))
            fig.add_trace(go.Scatter(x=x, y=y, name=name, legendgroup=name,
                                     showlegend=row == 1, mode="lines",
                                     line={"color": colour, "width": 1}, **extra),
                          row=row, col=1)
    for state in _DAY_STATES:
        x, y = _binned_mean(hours, fleet[f"{state}_chips"].to_numpy().astype(float))
        fig.add_trace(go.Scatter(x=x, y=y, name=f"{state} chips", stackgroup="chips",
                                 mode="lines", line={"width": 0},
                                 fillcolor=_DAY_COLOURS[state]), row=5, col=1)
    for column in (c for c in fleet.columns if c.startswith("job:")):
        x, y = _binned_mean(hours, fleet[column].to_numpy().astype(float))
        fig.add_trace(go.Scatter(x=x, y=y, name=f"training: {column[4:]}", mode="lines",
                                 line={"dash": "dash", "width": 1}), row=5, col=1)
    fig.update_yaxes(title="load (requests/s)", row=1, col=1)
    fig.update_yaxes(title="replicas serving", type="log", row=2, col=1)
    fig.update_yaxes(title="SLO attainment", range=[-0.02, 1.02], row=3, col=1)
    fig.update_yaxes(title="TTFT p99 (s)", type="log", row=4, col=1)
    fig.update_yaxes(title="chips", row=5, col=1)
    fig.update_xaxes(title="hours", row=5, col=1)
    figures = {"The day": layout(fig, f"{summary['scenario']}: load, replicas, SLO attainment, "
                                      "TTFT and the fleet's chips", height=1300)}
    cost = serving_cost_figure(summary)
    if cost is not None:
        figures["Serving cost"] = cost
    return figures
