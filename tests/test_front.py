"""What a new user reads first: run tables, reports and plots that say what happened, and the
small things that cost trust (issue 25)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from clustersim.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
SERVE = ROOT / "scenarios" / "serving-llama-trn2.yaml"


def invoke(*args: Any) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def _small_serving_scenario(tmp_path: Path) -> Path:
    import yaml

    data = yaml.safe_load(SERVE.read_text())
    data["duration"] = "2min"
    data["cluster"] = {"instances": 1}
    data["serve"] = [dict(data["serve"][0], replicas=1)]
    path = tmp_path / "serve-small.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def serving_run(tmp_path_factory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("serve")
    scenario = _small_serving_scenario(folder)
    out = folder / "run"
    # wide: one line per table row, so phrases are not split over cells' lines
    result = CliRunner().invoke(app, ["run", str(scenario), "-o", str(out)],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return out, result.output


# ---------------------------------------------------------------------------------------------
# Serving-only runs told truthfully


def test_a_serving_only_run_table_shows_serving_chip_time_and_the_horizon(serving_run):
    _, text = serving_run
    import re

    assert not re.search(r"(?<![0-9])0\.0%", text) and "allocated" not in text
    assert "100.0% of chip-time" in text and "requests served" in text
    assert "simulated 2.0 minutes" in text and "0.0 days" not in text
    assert "1 replica of" in text and "1 replicas" not in text


def test_a_serving_only_report_draws_serving_and_no_empty_training_plot(serving_run,
                                                                        monkeypatch):
    from clustersim.analysis import report as report_module

    out, _ = serving_run
    drawn: dict[str, list[str]] = {}
    original = report_module._save

    def keep(fig, path, tight=True):
        legend = fig.axes[0].get_legend()
        drawn[Path(path).name] = [t.get_text() for t in legend.get_texts()] if legend else []
        return original(fig, path, tight)

    monkeypatch.setattr(report_module, "_save", keep)
    report = report_module.write_report(out, out / "report-test")
    names = {p.name for p in (out / "report-test").iterdir()}
    assert not {"step.png", "jobs.png", "hours.png"} & names  # nothing to draw there
    assert {"utilisation.png", "latency.png", "serving.png"} <= names
    assert drawn["utilisation.png"] == ["serving"]  # not an idle instance
    text = report.read_text()
    assert "held by jobs" not in text and "requests served" in text
    assert "120.0 simulated seconds" in text and "days" not in text


def test_latency_plots_draw_each_slo(serving_run, monkeypatch):
    import matplotlib.pyplot as plt

    from clustersim.analysis import serving_report
    from clustersim.analysis.runs import load_run

    out, _ = serving_run
    run = load_run(out)
    assert serving_report.slo_bounds(run.scenario)["llama70b"] == {"TTFT": 2.0, "TPOT": 0.1}
    seen: list[str] = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: seen.extend(
        line.get_label() for ax in fig.axes for line in ax.get_lines()))
    serving_report.plot_latency_cdfs(run.table("requests"), "t", out / "x.png",
                                     serving_report.slo_bounds(run.scenario))
    assert "llama70b SLO 2 s" in seen and "llama70b SLO 0.1 s" in seen


def test_a_serving_sweep_prints_throughput_latency_slo_and_cost(tmp_path: Path):
    scenario = _small_serving_scenario(tmp_path)
    sweep = tmp_path / "rates.yaml"
    sweep.write_text(f"scenario: {scenario.name}\ngrid:\n  serve.0.workload.rate: [1, 2]\n"
                     "seeds: [0]\n")
    result = invoke("sweep", sweep, "-o", tmp_path / "out", "--workers", "1")
    assert result.exit_code == 0, result.output
    for label in ("req/s", "out tok/s", "TTFT p99 s", "TPOT p50 s", "SLO goodput",
                  "$/M out tok"):
        assert label in result.output, label
    assert "%" in result.output and "$" in result.output


# ---------------------------------------------------------------------------------------------
# The small things


def test_low_high_step_is_not_an_emoji_in_help_or_errors():
    help_text = invoke("plan", "--help").output
    assert "🅱" not in help_text and "LOW:HIGH:STEP" in " ".join(help_text.split())
    error = invoke("plan", ROOT / "scenarios" / "quickstart.yaml", "--chips", "1:x")
    assert error.exit_code == 2
    assert "🅱" not in error.output and "LOW:HIGH:STEP" in error.output


def test_the_price_says_what_it_is():
    from clustersim.hardware.catalog import catalog_entry
    from clustersim.hardware.prices import price_basis
    from clustersim.scenario.loader import load_scenario

    assert price_basis(catalog_entry("trn2")).startswith("Capacity Block rate")
    assert price_basis(catalog_entry("trn2u")).startswith("Capacity Block rate")
    assert price_basis(catalog_entry("p5en")).startswith("on-demand")
    assert price_basis(catalog_entry("p5e")) == "assumed"  # p5en's price, borrowed
    own = load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                        ["hardware.instance.price_per_hour=10"])
    assert price_basis(own.hardware) == "set in the scenario"


def test_run_labels_the_trn2_price_as_the_catalog_does(serving_run):
    _, text = serving_run
    assert "Capacity Block rate" in text and "on-demand" not in text


QUICK = ["--set", "duration=2d", "--set", "cluster.ultraservers=2", "--set", "cluster.spares=0",
         "--set", "jobs.0.parallelism.dp=128"]


def test_piped_output_keeps_each_line_whole_and_rerunning_says_what_it_replaced(tmp_path,
                                                                               monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # a file or a pipe: rich's default of 80
    out = tmp_path / ("a-folder-name-long-enough-that-the-last-line-passes-eighty-columns" * 2)
    first = invoke("run", ROOT / "scenarios" / "quickstart.yaml", "-o", out, *QUICK,
                   "--set", "jobs.0.steps=200")
    assert first.exit_code == 0, first.output
    # the closing line is one line however long (it wrapped at 80 columns mid-phrase)
    assert any(line.startswith("simulated ") and line.endswith(" s") and str(out) in line
               for line in first.output.splitlines())
    # the table shows when the job finished
    assert "finished at" in first.output
    assert invoke("report", out).exit_code == 0
    again = invoke("run", ROOT / "scenarios" / "quickstart.yaml", "-o", out, *QUICK,
                   "--set", "jobs.0.steps=200")
    assert again.exit_code == 0, again.output
    assert "replaced the earlier run" in again.output and "report/" in again.output
    assert "clustersim plan" in again.output  # where to find the best parallelism


# ---------------------------------------------------------------------------------------------
# Plots a reader trusts


def test_bins_and_time_units_follow_the_horizon():
    from clustersim.analysis.plotting import bin_for, time_unit

    assert bin_for(30 * 86400.0) == 3 * 3600.0  # a month: 3-hour bins, not 43,200 minutes
    assert bin_for(86400.0) == 300.0
    assert bin_for(600.0, finest_s=60.0) == 60.0  # never finer than the trace's bins
    assert time_unit(30 * 86400.0) == (86400.0, "day")
    assert time_unit(600.0) == (60.0, "minute")


def test_money_axes_read_in_dollars():
    from clustersim.planning.outputs import usd_formatter

    form = usd_formatter()
    assert form(2_500_000, 0) == "$2.5M"
    assert form(45_000, 0) == "$45k"
    assert form(1.29, 0) == "$1.29"


def test_the_default_plan_folder_does_not_double_plan():
    from clustersim.cli.plan import default_plan_dir

    assert default_plan_dir("plan-trn2-vs-p5en") == Path("results/plan-trn2-vs-p5en")
    assert default_plan_dir("quickstart") == Path("results/plan-quickstart")


def test_latency_log_axes_spanning_under_a_decade_are_labelled(tmp_path: Path, monkeypatch):
    """TPOT between 30 and 80 ms spans under a decade: labels at powers of ten alone left
    the axis one tick ("0.1") or none; each log axis must carry at least two labels."""
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    from clustersim.analysis import serving_report

    rng = np.random.default_rng(0)
    n = 400
    arrival = np.sort(rng.uniform(0, 600, n))
    first = arrival + rng.uniform(0.2, 0.7, n)
    outputs = rng.integers(50, 300, n)
    finish = first + (outputs - 1) * rng.uniform(0.03, 0.08, n)
    requests = pd.DataFrame({"deployment": "chat", "status": "completed",
                             "arrival_s": arrival, "first_token_s": first,
                             "finish_s": finish, "output_tokens": outputs})
    labelled: list[list[str]] = []

    def record(fig, *args, **kwargs):
        fig.canvas.draw()
        for ax in fig.axes:
            axis = ax.xaxis if ax.get_xscale() == "log" else ax.yaxis
            if (ax.get_xscale() if axis is ax.xaxis else ax.get_yscale()) != "log":
                continue
            low, high = sorted(axis.get_view_interval())
            labelled.append([t.get_text() for t in axis.get_ticklabels()
                             if t.get_text() and low <= t.get_position()[axis is ax.yaxis]
                             <= high])

    monkeypatch.setattr(plt.Figure, "savefig", record)
    serving_report.plot_latency_cdfs(requests, "t", tmp_path / "l.png")
    serving_report.plot_over_time(requests, "t", tmp_path / "o.png")
    assert len(labelled) == 4  # TTFT, TPOT, end to end; TTFT over time
    for labels in labelled:
        assert len(labels) >= 2, labels


@pytest.mark.parametrize("target", ["missing/x.yaml", "folder"])
def test_write_scenario_where_it_cannot_be_written_exits_2_before_planning(tmp_path: Path,
                                                                            target: str):
    """--write-scenario into a folder that does not exist, or onto a folder, was an internal
    error (exit 1) after the plan had run and written its folder; now exit 2 up front."""
    scenario = _small_serving_scenario(tmp_path)
    (tmp_path / "folder").mkdir()
    result = invoke("plan", scenario, "-o", tmp_path / "plan", "--write-scenario",
                    tmp_path / target, "--force")
    assert result.exit_code == 2, result.output
    assert "--write-scenario" in result.output and "internal error" not in result.output
    assert not (tmp_path / "plan").exists()
