"""`clustersim report RUN --html`: one self-contained interactive HTML file with the PNG
report's figures, from the same tables, down-sampled to what a screen shows; opened in
headless Chromium where it is installed (CI installs it; skipped elsewhere)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from cli_helpers import refused
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import clustersim
from clustersim.analysis.html_figures import SCREEN_BINS, held_per_bin, utilisation_figure
from clustersim.analysis.plotting import bin_for
from clustersim.analysis.runs import load_run
from clustersim.cli.app import app
from clustersim.runner.outputs import earlier_report

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

_spec = importlib.util.spec_from_file_location("html_open", ROOT / "scripts" / "html_open.py")
html_open = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(html_open)
# Skipped where Chromium is missing, except in CI (.ci/run installs it): there it must run.
needs_chromium = pytest.mark.skipif(html_open.chromium() is None and not os.environ.get("CI"),
                                    reason="chromium not installed (apt-get install chromium)")

SERVING_DAY = {
    "name": "serving-day-test", "duration": "1d", "hardware": "trn2", "seed": 0,
    "cluster": {"instances": 64}, "fluid": {"interval": "10min", "curve_requests": 1000},
    "failures": {"preset": "llama3"},
    "serve": [{"name": name, "model": "llama3.1-8b", "parallelism": {"tp": 4},
               "router": "least_outstanding", "slo": {"ttft": "1s", "tpot": "50ms"},
               "workload": {"load": {"sinusoid": {"peak": peak, "trough": "5/s",
                                                  "peak_at": at}},
                            "input_tokens": {"distribution": "lognormal", "median": 512,
                                             "sigma": 0.8, "max": 4096},
                            "output_tokens": {"distribution": "lognormal", "median": 200,
                                              "sigma": 0.8, "max": 1024}},
               "autoscale": {"min": 1, "max": 40, "policy": "slo", "headroom": 0.2,
                             "warmup": "2min"}}
              for name, peak, at in (("chat", "120/s", "19h"), ("code", "60/s", "10h"))],
}


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def run_scenario(scenario: Path | dict, out: Path, *sets: str) -> Path:
    if isinstance(scenario, dict):
        path = out.parent / f"{scenario['name']}.yaml"
        path.write_text(yaml.safe_dump(scenario))
        scenario = path
    options = [x for s in sets for x in ("--set", s)]
    result = invoke("run", scenario, "-o", out, *options)
    assert result.exit_code == 0, result.stdout + result.stderr
    return out


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qs") / "run"
    # Three days (the month is the slow test's): failures, checkpoints, a first failure.
    return run_scenario(ROOT / "scenarios" / "quickstart.yaml", out, "duration=3d")


def sections(page: str) -> list[str]:
    return re.findall(r"<h2 id='fig-\d+'>([^<]*)</h2>", page)


def test_quickstart_html_has_the_png_figures_and_needs_no_network(quickstart: Path):
    result = invoke("report", quickstart, "--html")
    assert result.exit_code == 0, result.stdout + result.stderr
    folder = quickstart / "report"
    page = (folder / "report.html").read_text()
    # Every figure of the PNG report is a section of the page.
    pngs = re.findall(r"^## (.*)$", (folder / "report.md").read_text(), re.M)
    assert pngs and set(pngs) <= set(sections(page)), (pngs, sections(page))
    # Self-contained: plotly.js inline once, nothing loaded from elsewhere.
    assert page.count("<script type='text/javascript'>") == 1
    assert not re.search(r"""<script[^>]*\ssrc=|<link[^>]*href=["']?https?:""", page)
    assert page.count("Plotly.newPlot(") == len(sections(page))
    # An earlier report (report.html included) is one `report` replaces without --force.
    assert earlier_report(folder)


def test_utilisation_figure_is_the_png_tables(quickstart: Path):
    run = load_run(quickstart)
    figure = utilisation_figure(run)
    horizon = float(run.summary["simulated_s"])
    bins = run.utilisation_at("cluster", bin_s=bin_for(horizon, finest_s=60.0))  # the PNG's
    assert {t.name for t in figure.data} >= {"running", "checkpointing", "idle"}
    for trace in figure.data:  # the written bins' means: the recomputed bins
        assert np.allclose(np.asarray(trace.y), bins[trace.name].to_numpy() * 100), trace.name
        assert len(trace.x) == len(bins) <= 300


def test_timeline_is_down_sampled_to_the_screen(tmp_path: Path, quickstart: Path):
    html = clustersim.write_html_report(quickstart, tmp_path / "r.html")
    page = html.read_text()
    figures = re.findall(r'Plotly\.newPlot\(\s*"plot-\d+",\s*(\[.*?\]),\s*\{', page, re.S)
    assert figures
    for data in figures:
        for trace in json.loads(data):
            # No trace holds more points than a wide plot has pixels (x, or y for bars).
            points = max(len(trace.get("x", []) or []), len(trace.get("y", []) or []))
            assert points <= SCREEN_BINS * 2 + 1, (trace.get("name"), points)
    with pytest.raises(clustersim.runner.outputs.OutputDirError, match="exists"):
        clustersim.write_html_report(quickstart, html)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 50), st.integers(1, 1000)),
                min_size=0, max_size=20), st.integers(1, 30))
def test_held_per_bin_is_the_overlap_of_each_span(spans, bins):
    edges = np.linspace(0.0, 120.0, bins + 1)
    starts = np.array([s for s, _, _ in spans], dtype=float)
    ends = starts + np.array([d for _, d, _ in spans], dtype=float)
    weights = np.array([w for _, _, w in spans], dtype=float)
    expected = np.zeros(bins)
    for s, e, w in zip(starts, ends, weights, strict=True):
        expected += w * np.clip(np.minimum(e, edges[1:]) - np.maximum(s, edges[:-1]), 0, None)
    got = held_per_bin(starts, ends, weights, edges)
    assert np.allclose(got, expected, atol=1e-6 * max(1.0, weights.sum()) * 120)


def test_refusals(tmp_path: Path, quickstart: Path):
    refused(invoke("report", tmp_path / "missing", "--html"), "not a run folder")
    mine = quickstart / "report" / "notes.txt"
    (quickstart / "report").mkdir(exist_ok=True)
    mine.write_text("mine")
    try:
        refused(invoke("report", quickstart, "--html"), "--force")
        assert mine.read_text() == "mine"
    finally:
        mine.unlink()
    target = tmp_path / "mine.html"
    target.write_text("my page")
    with pytest.raises(clustersim.runner.outputs.OutputDirError, match="exists"):
        clustersim.write_html_report(quickstart, target)
    assert target.read_text() == "my page"


def open_and_check(page: Path, shot: Path) -> dict:
    result = html_open.open_report(page, screenshot=shot)
    assert result["errors"] == [], result["errors"]
    assert result["plots"] == len(sections(page.read_text())) > 0
    # The screenshot shows something: not one flat colour.
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[0] > 1000 and pixels.std() > 0.05
    return result


@needs_chromium
@pytest.mark.slow
def test_reports_open_in_chromium_without_console_errors(tmp_path: Path, quickstart: Path):
    """The quickstart, a fleet replay (the Philly sample) and a serving day (the fleet-level
    model) open in headless Chromium with every plot drawn and no console error; a
    screenshot of each is taken and looked at."""
    runs = {"quickstart": run_scenario(ROOT / "scenarios" / "quickstart.yaml",
                                       tmp_path / "quickstart"),
            "fleet-replay": run_scenario(ROOT / "scenarios" / "trace-philly.yaml",
                                         tmp_path / "philly"),
            "serving-day": run_scenario(SERVING_DAY, tmp_path / "day")}
    for name, run in runs.items():
        result = invoke("report", run, "--html", "--force")
        assert result.exit_code == 0, (name, result.stdout + result.stderr)
        open_and_check(run / "report" / "report.html", tmp_path / f"{name}.png")


@needs_chromium
@pytest.mark.slow
def test_request_level_serving_report_opens_in_chromium(tmp_path: Path):
    run = run_scenario(ROOT / "scenarios" / "serving-llama-trn2.yaml", tmp_path / "serving")
    page = clustersim.write_html_report(run, tmp_path / "serving.html")
    assert {"Serving latency", "Serving over time", "KV cache"} <= set(
        sections(page.read_text()))
    open_and_check(page, tmp_path / "serving.png")


def test_the_documented_down_sampling_is_the_code_s():
    from clustersim.analysis.html_serving import _CURVE_POINTS

    page = (ROOT / "docs" / "analysis.md").read_text()
    assert f"each of {SCREEN_BINS:,} bins" in page
    assert f"curves keep about {_CURVE_POINTS:,} points" in page


def test_chip_time_by_site_adds_up_to_the_cluster_s(tmp_path: Path):
    from clustersim.analysis.html_figures import site_figure

    run_dir = run_scenario(ROOT / "scenarios" / "sites-spread.yaml", tmp_path / "sites",
                           "trace.enabled=true", "jobs.0.instances=384",
                           "jobs.0.parallelism.dp=96", "jobs.0.global_batch=768")
    run = load_run(run_dir)
    figure = site_figure(run)
    assert [t.name for t in figure.data] == ["east", "west"]
    site_chips = 256 * 16  # 64 UltraServers of 4 instances of 16 chips each
    held = sum(np.asarray(t.y) / 100 * site_chips for t in figure.data)
    x = np.append(np.asarray(figure.data[0].x), run.summary["simulated_s"] / 3600)
    mean = float(np.sum(held * np.diff(x)) / x[-1]) / run.summary["cluster"]["chips"]
    assert mean == pytest.approx(run.summary["cluster"]["utilisation"], rel=0.01)
    # The 384-instance job fills one site and half the other.
    assert sorted(round(float(np.max(t.y))) for t in figure.data) == [50, 100]


def test_job_timelines_hold_each_job_within_its_life(tmp_path: Path):
    from clustersim.analysis.html_figures import timeline_figure

    run = load_run(run_scenario(ROOT / "scenarios" / "trace-philly.yaml", tmp_path / "philly"))
    figure = timeline_figure(run)
    jobs = run.jobs.set_index("name")
    horizon = float(run.summary["simulated_s"])
    width_days = horizon / SCREEN_BINS / 86400
    for trace in figure.data:
        if trace.type != "bar":
            continue
        for base, length, name in zip(trace.base, trace.x, trace.y, strict=True):
            job = jobs.loc[name]
            end = job["end_s"] if job["end_s"] == job["end_s"] else horizon  # NaN: running
            # Within the job's life, to a bin (a segment is whole bins).
            assert base >= job["start_s"] / 86400 - width_days
            assert base + length <= end / 86400 + width_days, (name, base + length, end)


@pytest.mark.slow
def test_a_524288_chip_month_stays_under_20_mb(tmp_path: Path):
    """The month of scenarios/trn2-512k-month.yaml (524,288 chips, 6,375 interruptions):
    its page stays under 20 MB and opens in Chromium (where installed) with every plot
    drawn and no console error. How long it takes to open: scripts/bench.py."""
    run = run_scenario(ROOT / "scenarios" / "trn2-512k-month.yaml", tmp_path / "month")
    page = clustersim.write_html_report(run, tmp_path / "month.html")
    assert page.stat().st_size < 20 * 2**20
    if html_open.chromium() is not None:
        result = html_open.open_report(page)
        assert result["errors"] == [] and result["plots"] == len(sections(page.read_text()))


@needs_chromium
@pytest.mark.slow
def test_the_browser_check_sees_console_errors_and_network_loads(tmp_path: Path):
    """The check the reports pass is not vacuous: a page that logs an error, throws, and
    loads a script from the network and a missing image fails it on all four."""
    page = tmp_path / "bad.html"
    page.write_text("<html><head><script src='https://cdn.example.com/x.js'></script></head>"
                    "<body><img src='missing.png'><script>console.error('logged');"
                    "undefinedFunction();</script></body></html>")
    errors = html_open.open_report(page)["errors"]
    text = " ".join(errors)
    assert "cdn.example.com" in text and "missing.png" in text and "logged" in text
    assert "undefinedFunction" in text
