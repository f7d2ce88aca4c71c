"""`clustersim report`: plots and a Markdown report of a finished run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from clustersim.cli.common import UsageProblem, out_console, user_errors


@user_errors
def report(
    run_dir: Annotated[Path, typer.Argument(help="A folder written by `clustersim run`.",
                                            show_default=False)],
    force: Annotated[bool, typer.Option(
        "--force", help="Replace RUN_DIR/report/ even if it holds files of your own.")] = False,
    html: Annotated[bool, typer.Option(
        "--html", help="Also write report.html: the same figures, interactive, in one "
                       "self-contained file (opens without a network).")] = False,
) -> None:
    """Plots (PNG) and a short Markdown report of a finished run, in RUN_DIR/report/ (written
    whole or not at all; an earlier report is replaced, a folder holding anything else
    only with --force); with --html also report.html."""
    from clustersim.analysis.report import write_report
    from clustersim.runner.outputs import atomic_output_dir, check_output_dir, earlier_report

    _check_run_folder(run_dir)
    instead = "move your files out of it"  # report has no -o
    check_output_dir(run_dir / "report", force, ours=earlier_report, instead=instead)
    with atomic_output_dir(run_dir / "report", force=force, ours=earlier_report,
                           instead=instead) as staging:
        write_report(run_dir, staging)
        if html:
            from clustersim.analysis.html_report import html_report
            from clustersim.analysis.report_names import report_file

            (staging / report_file("report.html")).write_text(html_report(run_dir), encoding="utf-8")
    out_console.print(f"wrote {escape(str(run_dir / 'report' / 'report.md'))} and its plots"
                      + (f", and {escape(str(run_dir / 'report' / 'report.html'))}"
                         if html else ""))


TRACES = ("jobs", "intervals", "events", "utilisation")


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _check_run_folder(run_dir: Path) -> None:
    """Refuse (exit 2) a folder that is not a whole run: no or a corrupt summary.json, traces
    missing, or a table that is not Parquet (truncated, empty, garbage)."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from clustersim.analysis.runs import (
        MAX_SUMMARY_BYTES,
        job_summary_problem,
        summary_problem,
        table_problem,
    )
    from clustersim.scenario.errors import ScenarioError
    from clustersim.scenario.reading import read_yaml_file, regular_file_problem

    summary = run_dir / "summary.json"
    if not summary.exists():
        raise UsageProblem(f"{run_dir}: not a run folder (no summary.json); expected the OUT "
                           "of `clustersim run`")
    problem = regular_file_problem(summary, MAX_SUMMARY_BYTES)
    if problem:
        raise UsageProblem(f"{summary}: {problem}")
    try:
        parsed = json.loads(summary.read_text(encoding="utf-8"), parse_constant=_not_json)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise UsageProblem(f"{summary}: cannot read it ({str(error)[:200]}); run the scenario "
                           "again") from None
    traces = TRACES
    if (run_dir / "day.parquet").exists() or (run_dir / "fleet.parquet").exists():
        traces = ("day", "fleet")  # a fleet-day run (docs/fleet-day.md)
    # A fleet-day run's summary has a shape of its own (docs/fleet-day.md).
    problem = summary_problem(parsed, fleet_day=traces != TRACES)
    if problem:
        raise UsageProblem(f"{summary}: not a run's summary ({problem}); run the scenario "
                           "again")
    scenario = run_dir / "scenario.yaml"
    if scenario.exists() or scenario.is_symlink():
        try:
            text = read_yaml_file(scenario)
        except ScenarioError as error:
            raise UsageProblem(f"{scenario}: cannot read it ({error}); run the scenario "
                               "again") from None
        if not isinstance(text, dict):
            raise UsageProblem(f"{scenario}: not a scenario (expected a mapping); run the "
                               "scenario again")
    missing = [t for t in traces if not (run_dir / f"{t}.parquet").exists()]
    if len(missing) == len(traces):
        raise UsageProblem(f"{run_dir}: no traces ({', '.join(missing)}.parquet missing); "
                           "run again with trace.enabled: true")
    if missing:
        raise UsageProblem(f"{run_dir}: {', '.join(t + '.parquet' for t in missing)} missing "
                           "(deleted?) while the other traces are there; run the scenario "
                           "again")
    for table in sorted(run_dir.glob("*.parquet")):
        problem = regular_file_problem(table, 16 * 2**30)
        if problem:
            raise UsageProblem(f"{table}: {problem}")
        try:
            pq.read_table(table)
            problem = table_problem(table, table.name.removesuffix(".parquet"))
            jobs = (parsed.get("cluster") or {}).get("jobs")
            if table.name == "job_summary.parquet" and traces == TRACES and not problem:
                problem = job_summary_problem(table, jobs)  # what the fleet plots read of it
            rows = pq.read_metadata(table).num_rows
            if (table.name == "jobs.parquet" and traces == TRACES and not problem
                    and isinstance(jobs, int) and rows != jobs):
                problem = f"{rows:,} jobs where summary.json counts {jobs:,}"
        except (pa.ArrowException, OSError) as error:
            raise UsageProblem(f"{table}: not a readable Parquet table ({error}); run the "
                               "scenario again") from None
        if problem:
            raise UsageProblem(f"{table}: not this run's table ({problem}); run the scenario "
                               "again")
    from clustersim.analysis.runs import TraceSchemaError, load_run

    try:
        load_run(run_dir)
    except TraceSchemaError as error:
        raise UsageProblem(str(error)) from None
