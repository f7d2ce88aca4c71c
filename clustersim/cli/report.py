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
) -> None:
    """Plots (PNG) and a short Markdown report of a finished run, in RUN_DIR/report/ (written
    whole or not at all; an earlier report is replaced)."""
    from clustersim.analysis.report import write_report
    from clustersim.runner.outputs import atomic_output_dir

    _check_run_folder(run_dir)
    with atomic_output_dir(run_dir / "report", force=True) as staging:
        write_report(run_dir, staging)
    out_console.print(f"wrote {escape(str(run_dir / 'report' / 'report.md'))} and its plots")


TRACES = ("jobs", "intervals", "events", "utilisation")


def _check_run_folder(run_dir: Path) -> None:
    """Refuse (exit 2) a folder that is not a whole run: no or a corrupt summary.json, traces
    missing, or a table that is not Parquet (truncated, empty, garbage)."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    summary = run_dir / "summary.json"
    if not summary.is_file():
        raise UsageProblem(f"{run_dir}: not a run folder (no summary.json); expected the OUT "
                           "of `clustersim run`")
    try:
        json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UsageProblem(f"{summary}: cannot read it ({error}); run the scenario "
                           "again") from None
    traces = TRACES
    if (run_dir / "day.parquet").exists() or (run_dir / "fleet.parquet").exists():
        traces = ("day", "fleet")  # a fleet-day run (docs/fleet-day.md)
    missing = [t for t in traces if not (run_dir / f"{t}.parquet").exists()]
    if len(missing) == len(traces):
        raise UsageProblem(f"{run_dir}: no traces ({', '.join(missing)}.parquet missing); "
                           "run again with trace.enabled: true")
    if missing:
        raise UsageProblem(f"{run_dir}: {', '.join(t + '.parquet' for t in missing)} missing "
                           "(deleted?) while the other traces are there; run the scenario "
                           "again")
    for table in sorted(run_dir.glob("*.parquet")):
        try:
            pq.read_table(table)
        except (pa.ArrowException, OSError) as error:
            raise UsageProblem(f"{table}: not a readable Parquet table ({error}); run the "
                               "scenario again") from None
    from clustersim.analysis.runs import TraceSchemaError, load_run

    try:
        load_run(run_dir)
    except TraceSchemaError as error:
        raise UsageProblem(str(error)) from None
