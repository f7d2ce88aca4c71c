"""Serving plots of a finished run (scenarios with `serve:` deployments): latency CDFs,
throughput and latency over time, batch size and KV cache occupancy over time.

Everything is computed from `requests.parquet` and `replicas.parquet` with numpy (binned or
sampled, never per token), so a million-request run plots in seconds.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from clustersim.analysis.report_names import report_file
from clustersim.analysis.runs import Run  # noqa: E402
from clustersim.hardware.units import UnitError, format_or_dash, parse_duration  # noqa: E402

__all__ = ["serving_plots", "serving_lines", "slo_bounds"]

_BINS = 60
# Log axes labelled as plain numbers (0.3, 1, 3), not `3 x 10^0`.
_PLAIN = FuncFormatter(lambda value, _: f"{value:g}")


def _log_axis(axis: object) -> None:
    """A log axis with plain labels at 1, 2 and 5 of each decade: latencies often span less
    than a decade (TPOT between 0.03 and 0.08 s), where labels at powers of ten alone leave
    one labelled tick or none."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # type: ignore[attr-defined]
    axis.set_major_formatter(_PLAIN)  # type: ignore[attr-defined]
    axis.set_minor_formatter(NullFormatter())  # type: ignore[attr-defined]


def slo_bounds(scenario: dict) -> dict[str, dict[str, float]]:
    """Each deployment's SLO from the run's effective scenario: name -> {"TTFT": s, "TPOT": s}."""
    out: dict[str, dict[str, float]] = {}
    for deployment in (scenario or {}).get("serve") or []:
        slo = deployment.get("slo") or {}
        bounds = {}
        for key, label in (("ttft", "TTFT"), ("tpot", "TPOT")):
            value = slo.get(key)
            if value is None:
                continue
            try:
                bounds[label] = float(parse_duration(value)) if isinstance(value, str) else float(value)
            except (UnitError, ValueError, TypeError):
                continue
        out[str(deployment.get("name"))] = bounds
    return out


def _time_axis(end_s: float) -> tuple[float, str]:
    """Seconds per unit and its name for a serving run's time axis."""
    for above, unit, name in ((3 * 3600.0, 3600.0, "hours"), (180.0, 60.0, "minutes")):
        if end_s >= above:
            return unit, name
    return 1.0, "seconds"


def _latencies(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    done = frame[frame["status"] == "completed"]
    arrival = done["arrival_s"].to_numpy()
    first = done["first_token_s"].to_numpy()
    finish = done["finish_s"].to_numpy()
    outputs = done["output_tokens"].to_numpy()
    decoding = outputs > 1
    return {"TTFT": first - arrival,
            "TPOT": (finish[decoding] - first[decoding]) / (outputs[decoding] - 1),
            "end to end": finish - arrival}


def plot_latency_cdfs(requests: pd.DataFrame, title: str, path: Path,
                      slos: dict[str, dict[str, float]] | None = None) -> Path:
    """CDFs of TTFT, TPOT and end-to-end latency per deployment, each SLO bound a dotted
    vertical line in the deployment's colour."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.0))
    for index, (name, group) in enumerate(requests.groupby("deployment", observed=True,
                                                           sort=True)):
        colour = f"C{index}"
        for ax, (kind, values) in zip(axes, _latencies(group).items(), strict=True):
            if len(values) == 0:
                continue
            x = np.sort(values)
            y = np.arange(1, len(x) + 1) / len(x)
            step = max(1, len(x) // 2000)  # at most ~2,000 points per curve
            ax.plot(x[::step], y[::step], label=str(name), color=colour)
            bound = (slos or {}).get(str(name), {}).get(kind)
            if bound is not None:
                ax.axvline(bound, color=colour, linestyle=":", linewidth=1.2,
                           label=f"{name} SLO {bound:g} s")
            ax.set_xscale("log")
            _log_axis(ax.xaxis)
            ax.set_xlabel(f"{kind} (s)")
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of completed requests")
    for ax in axes[:2]:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{title}: latency distributions")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_over_time(requests: pd.DataFrame, title: str, path: Path,
                   slos: dict[str, dict[str, float]] | None = None) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    end = float(np.nanmax(requests["finish_s"].to_numpy(), initial=1.0))
    unit, unit_name = _time_axis(end)
    edges = np.linspace(0.0, max(end, 1e-9), _BINS + 1)
    width = edges[1] - edges[0]
    centres = (edges[:-1] + edges[1:]) / 2 / unit
    for index, (name, group) in enumerate(requests.groupby("deployment", observed=True,
                                                           sort=True)):
        bound = (slos or {}).get(str(name), {}).get("TTFT")
        if bound is not None:
            bottom.axhline(bound, color=f"C{index}", linestyle=":", linewidth=1.2,
                           label=f"{name} TTFT SLO {bound:g} s")
        done = group[group["status"] == "completed"]
        finish = done["finish_s"].to_numpy()
        tokens, _ = np.histogram(finish, edges, weights=done["output_tokens"].to_numpy())
        top.plot(centres, tokens / width, label=f"{name} output tokens/s", color=f"C{index}")
        ttft = done["first_token_s"].to_numpy() - done["arrival_s"].to_numpy()
        which = np.clip(np.searchsorted(edges, done["arrival_s"].to_numpy(), "right") - 1, 0,
                        _BINS - 1)
        order = np.argsort(which, kind="stable")
        groups = np.split(ttft[order], np.searchsorted(which[order], np.arange(1, _BINS)))
        p50 = [np.quantile(g, 0.5) if len(g) else np.nan for g in groups]
        p99 = [np.quantile(g, 0.99) if len(g) else np.nan for g in groups]
        bottom.plot(centres, p50, label=f"{name} TTFT p50", color=f"C{index}")
        bottom.plot(centres, p99, linestyle="--", label=f"{name} TTFT p99", color=f"C{index}")
    bottom.set_yscale("log")
    _log_axis(bottom.yaxis)
    return _over_time_done(fig, ("output tokens/s (by finish)", "TTFT (s, by arrival)"),
                           f"{title}: throughput and latency over time", path, unit_name)


def _over_time_done(fig: plt.Figure, ylabels: tuple[str, str], title: str, path: Path,
                    unit_name: str = "seconds") -> Path:
    """Label, title and save a figure of two panels over time."""
    for ax, label in zip(fig.axes, ylabels, strict=True):
        ax.set_ylabel(label)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, ncol=2, framealpha=0.7)
        ax.grid(alpha=0.3)
    fig.axes[-1].set_xlabel(f"time ({unit_name})")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _sampled(frame: pd.DataFrame, column: str, times: np.ndarray) -> np.ndarray:
    """Each replica's value of `column` at `times` (its latest row at or before): replicas x
    times."""
    out = []
    for _, rows in frame.groupby(["deployment_id", "replica"], sort=True):
        starts = rows["start_s"].to_numpy()
        order = np.argsort(starts, kind="stable")
        index = np.searchsorted(starts[order], times, "right") - 1
        values = rows[column].to_numpy()[order]
        out.append(np.where(index >= 0, values[np.clip(index, 0, None)], 0.0))
    return np.array(out)


def kv_samples(replicas: pd.DataFrame, names: list[str]):
    """The replicas' KV occupancy (%) and batch sampled at 400 times, per deployment with
    replicas: (time unit in s, its name, times, [(index, name, kv, batch)]); the PNG and the
    HTML report draw the same samples."""
    end = float((replicas["start_s"] + replicas["duration_s"]).max())
    unit, unit_name = _time_axis(end)
    times = np.linspace(0.0, max(end, 1e-9), 400)
    series = []
    for index, name in enumerate(names):
        mine = replicas[replicas["deployment_id"] == index]
        if not mine.empty:
            series.append((index, name, _sampled(mine, "kv_occupancy", times) * 100,
                           _sampled(mine, "batch", times)))
    return unit, unit_name, times, series


def plot_kv(replicas: pd.DataFrame, names: list[str], title: str, path: Path) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    unit, unit_name, times, series = kv_samples(replicas, names)
    for index, name, kv, batch in series:
        colour = f"C{index}"
        top.plot(times / unit, kv.mean(axis=0), color=colour, label=f"{name} mean")
        top.plot(times / unit, kv.max(axis=0), color=colour, linestyle="--",
                 label=f"{name} fullest replica")
        bottom.plot(times / unit, batch.mean(axis=0), color=colour, label=f"{name} mean batch")
    top.set_ylim(0, 100)
    return _over_time_done(fig, ("KV cache occupancy (%)", "sequences per iteration"),
                           f"{title}: KV cache and batch over time (sampled per replica)", path,
                           unit_name)


def serving_plots(run: Run, folder: Path) -> dict[str, Path]:
    """The serving plots of a run with a requests table (none without)."""
    if not (run.path / "requests.parquet").exists():
        return {}
    requests = run.table("requests")
    title = run.summary["scenario"]
    slos = slo_bounds(run.scenario)
    plots = {"Serving latency": plot_latency_cdfs(requests, title, folder / report_file("latency.png"), slos),
             "Serving over time": plot_over_time(requests, title, folder / report_file("serving.png"), slos)}
    if (run.path / "replicas.parquet").exists():
        names = list(run.summary.get("deployments", {}))
        plots["KV cache"] = plot_kv(run.table("replicas"), names, title, folder / report_file("kv.png"))
    return plots


def cell(text: object) -> str:
    """A name as one Markdown table cell (or heading): a newline or `|` in it would break
    the table."""
    return " ".join(str(text).split()).replace("|", "\\|")


def serving_lines(summary: dict) -> list[str]:
    """Report rows: one per deployment."""
    deployments = summary.get("deployments") or {}
    if not deployments:
        return []
    lines = ["", "| deployment | requests/s | output tokens/s | TTFT p50 / p99 | TPOT p50 / p99 "
             "| SLO goodput | $ per M output tokens | saturated | drained after the horizon |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, d in deployments.items():
        cost = d.get("cost_per_million_output_tokens_usd")
        drained = d.get("requests_drained") or 0
        drain = f"{drained:,} in {d.get('drain_s') or 0:,.3g} s" if drained else "none"
        lines.append(
            f"| {cell(name)} | {d['requests_per_s']:,.2f} | {d['output_tokens_per_s']:,.0f} | "
            f"{format_or_dash(d['ttft_p50_s'])} / {format_or_dash(d['ttft_p99_s'])} s | "
            f"{format_or_dash(d['tpot_p50_s'])} / {format_or_dash(d['tpot_p99_s'])} s | "
            f"{'-' if d['slo_goodput'] is None else format(d['slo_goodput'], '.1%')} | "
            f"{'' if cost is None else f'{cost:,.2f}'} | "
            f"{'yes' if d.get('saturated') else 'no'} | "
            f"{drain} |")
    lines.append("")
    for name, d in deployments.items():  # requests in no latency (as the run table says)
        lost = [f"{d[key]:,} {what}" for key, what in (
            ("requests_unfinished", "still running when the drain stopped (one more horizon)"),
            ("requests_rejected", "rejected (prompt and output larger than a replica's KV "
             f"cache, {d.get('kv_capacity_tokens_per_replica') or 0:,} tokens)")) if d.get(key)]
        if lost:
            lines.append(f"- {cell(name)}: " + "; ".join(lost)
                         + ": in no latency, counted as missing the SLO.")
    if lines[-1] != "":
        lines.append("")
    lines.append("Rates and cost per token count the requests completed within the horizon "
                 "and the tokens generated in it; what the requests in flight do after it is "
                 "counted apart. Saturated: the queue grew over the horizon (the rate offered "
                 "is not held).")
    return lines
