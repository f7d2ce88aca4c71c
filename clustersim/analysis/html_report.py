"""A run's report as one self-contained interactive HTML file (`clustersim report RUN
--html`): the PNG report's figures, drawn with Plotly from the same tables, zoomable and
with values on hover, plotly.js inlined once (no network needed to open it).

Plotly rather than Bokeh or Altair: its wheel carries plotly.js and writes it inline
(`get_plotlyjs`), one dependency (with narwhals) and no other step; the figures' needs
(stacked areas, Gantt bars from a base, subplots sharing an axis, log axes, hover) are
built in. Bokeh's inline resources would do as well for a standalone file but split its
JavaScript over several bundles; Altair writes a standalone file offline only with the
extra vl-convert package, and puts every row of its data in the page.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from clustersim.analysis.html_figures import run_figures
from clustersim.analysis.html_serving import day_figures, serving_figures
from clustersim.analysis.runs import job_status, load_run
from clustersim.hardware.units import format_or_dash

__all__ = ["html_report"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px;
       color: #212121; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
td, th { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
td:first-child, th:first-child { text-align: left; }
nav a { margin-right: 1em; } .note { color: #616161; font-size: 0.85em; }
"""


def html_report(run_dir: str | Path) -> str:
    """The whole HTML document of the run in `run_dir` (a folder `clustersim run` wrote)."""
    run = load_run(run_dir)
    summary = run.summary
    if "fleet_day" in summary:  # the fleet-level model: no timeline traces
        figures = day_figures(run.path, summary)
    else:
        figures = run_figures(run) | serving_figures(run)
    return _document(summary, figures)


def _document(summary: dict[str, Any], figures: dict[str, go.Figure]) -> str:
    title = html.escape(str(summary["scenario"]))
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}"
             f"</title><style>{_STYLE}</style>",
             f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>",
             f"<h1>{title}</h1>", _facts(summary), _tables(summary),
             "<nav>" + "".join(f"<a href='#fig-{i}'>{html.escape(name)}</a>"
                               for i, name in enumerate(figures)) + "</nav>"]
    for index, (name, figure) in enumerate(figures.items()):
        parts.append(f"<h2 id='fig-{index}'>{html.escape(name)}</h2>")
        parts.append(pio.to_html(figure, include_plotlyjs=False, full_html=False,
                                 div_id=f"plot-{index}",
                                 config={"responsive": True, "displaylogo": False}))
    parts.append("<p class='note'>Drawn by clustersim "
                 f"{html.escape(str(summary.get('clustersim_version', '')))} with Plotly; "
                 "drag to zoom, double-click to reset, click a legend entry to hide it.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _facts(summary: dict[str, Any]) -> str:
    cluster = summary["cluster"]
    horizon = float(summary["simulated_s"])
    days = horizon / 86400
    span = f"{days:,.1f} simulated days" if days >= 1 else f"{horizon / 3600:,.2f} simulated hours"
    text = (f"{cluster['chips']:,} {cluster.get('chip', '')} chips "
            f"({cluster.get('hardware', '')}), {span}, seed {summary.get('seed')}, "
            f"{summary.get('replications', 1)} replication(s).")
    if summary.get("replications", 1) > 1:
        text += " The tables give means over the replications; the plots drawn from the " \
                "traces show replication 1."
    return f"<p>{html.escape(text)}</p>"


def _cell(value: Any, form: str = "{}") -> str:
    if value is None:
        return "<td>-</td>"
    try:
        return f"<td>{html.escape(form.format(value))}</td>"
    except (ValueError, TypeError):
        return f"<td>{html.escape(str(value))}</td>"


def _tables(summary: dict[str, Any]) -> str:
    """The jobs and the deployments, the largest 30 jobs by chip-time."""
    out = []
    jobs = summary.get("jobs") or {}
    if jobs:
        ranked = sorted(jobs, key=lambda n: -(jobs[n].get("chips", 0) or 0)
                        * (jobs[n].get("wall_s", 0) or 0))[:30]
        out.append("<table><tr><th>job</th><th>status</th><th>steps</th><th>ETTR</th>"
                   "<th>interruptions</th><th>step time (s)</th><th>MFU</th>"
                   "<th>$ per M tokens, ideal</th><th>effective</th></tr>")
        for name in ranked:
            job = jobs[name]
            interruptions = job.get("interruptions")  # a mean over replications: 0.33
            out.append("<tr>" + _cell(name) + _cell(job_status(job)) +
                       _cell(job.get("steps_completed"), "{:,.0f}") +
                       _cell(job.get("ettr"), "{:.1%}") +
                       _cell(interruptions, "{:,.0f}" if isinstance(interruptions, int)
                             or float(interruptions or 0).is_integer() else "{:,.2f}") +
                       _cell(job.get("step_time_s"), "{:.3f}") + _cell(job.get("mfu"), "{:.1%}")
                       + _cell(job.get("cost_per_million_tokens_usd"), "{:,.3f}")
                       + _cell(job.get("effective_cost_per_million_tokens_usd"), "{:,.3f}")
                       + "</tr>")
        out.append("</table>")
        if len(jobs) > len(ranked):
            out.append(f"<p class='note'>The {len(ranked)} largest of {len(jobs):,} jobs by "
                       "chip-time.</p>")
    deployments = summary.get("deployments") or {}
    if deployments:
        out.append("<table><tr><th>deployment</th><th>TTFT p50 / p99 (s)</th>"
                   "<th>TPOT p50 / p99 (s)</th><th>SLO goodput</th>"
                   "<th>$ per M output tokens</th></tr>")
        for name, d in deployments.items():
            out.append("<tr>" + _cell(name) + _cell(
                f"{format_or_dash(d.get('ttft_p50_s'))} / {format_or_dash(d.get('ttft_p99_s'))}")
                + _cell(f"{format_or_dash(d.get('tpot_p50_s'))} / "
                        f"{format_or_dash(d.get('tpot_p99_s'))}")
                + _cell(d.get("slo_goodput"), "{:.1%}")
                + _cell(d.get("cost_per_million_output_tokens_usd"), "{:,.3f}") + "</tr>")
        out.append("</table>")
    return "".join(out)
