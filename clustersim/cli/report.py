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
    """Plots (PNG) and a short Markdown report of a finished run, in RUN_DIR/report/."""
    from clustersim.analysis.report import write_report
    from clustersim.analysis.runs import TraceSchemaError

    if not (run_dir / "summary.json").exists():
        raise UsageProblem(f"{run_dir}: not a run folder (no summary.json); expected the OUT "
                           "of `clustersim run`")
    missing = [t for t in ("jobs", "intervals", "events", "utilisation")
               if not (run_dir / f"{t}.parquet").exists()]
    if missing:
        raise UsageProblem(f"{run_dir}: no traces ({', '.join(missing)}.parquet missing); "
                           "run again with trace.enabled: true")
    try:
        path = write_report(run_dir)
    except TraceSchemaError as error:
        raise UsageProblem(str(error)) from None
    out_console.print(f"wrote {escape(str(path))} and its plots")


