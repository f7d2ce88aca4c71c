"""`clustersim sweep` and `clustersim check`: grids of runs, and golden summaries re-run."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from clustersim.cli.common import UsageProblem, err_console, out_console, user_errors


@user_errors
def sweep(
    sweep_file: Annotated[Path, typer.Argument(metavar="SWEEP", help="Sweep YAML file.",
                                               show_default=False)],
    engine: Annotated[str, typer.Option(help="local (process pool) or ray.")] = "local",
    workers: Annotated[int | None, typer.Option(help="Local processes.", show_default="cores",
                                                min=1)] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster to join (ray engine); "
                                                     "default: start a local one.")] = None,
    out: Annotated[Path | None, typer.Option("-o", "--out",
                                             help="Output directory.", show_default="results/NAME/")
                   ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty OUT.")] = False,
) -> None:
    """A grid of scenario variants x seeds, each a full run, in parallel. Ctrl-C or SIGTERM
    stops it at once and writes the finished runs as a table marked partial."""
    from clustersim.runner.outputs import check_output_dir, output_lock
    from clustersim.runner.sweep import load_sweep, sweep_inputs, sweep_tasks

    if engine not in ("local", "ray"):
        raise UsageProblem(f"--engine {engine!r}: expected local or ray")
    spec, scenario_path = load_sweep(sweep_file)
    tasks = sweep_tasks(spec, scenario_path)
    out_dir = out if out is not None else Path("results") / sweep_file.stem
    inputs = sweep_inputs(sweep_file, scenario_path, tasks)  # (run refuses them alike)
    check_output_dir(out_dir, force, inputs=inputs)
    if engine == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UsageProblem("--engine ray needs Ray: pip install -e '.[ray]'") from None
    with output_lock(out_dir):  # held from the first run to the write: one sweep per OUT
        rows, summary = _run_or_write_partial(sweep_file, engine, workers, address, out_dir,
                                              force, len(tasks), inputs)
        failed = rows[rows["status"] != "ok"]
        for row in failed.itertuples():
            err_console.print(f"[red]failed:[/red] variant {escape(str(row.variant))}, seed "
                              f"{row.seed}: {escape(str(row.error))}", soft_wrap=True)
        if len(rows) and len(failed) == len(rows):
            _no_run_succeeded(failed)
        from clustersim.runner.sweep import write_sweep

        write_sweep(rows, summary, sweep_file, out_dir, force=force, inputs=inputs)
    out_console.print(f"{len(rows):,} runs ({len(failed):,} failed) of {len(summary):,} "
                      f"variants; wrote {escape(str(out_dir))}/sweep.parquet and "
                      "sweep_summary.parquet")
    _print_sweep(summary, list(spec.grid))


def _run_or_write_partial(sweep_file: Path, engine: str, workers: int | None,
                          address: str | None, out_dir: Path, force: bool, total: int,
                          inputs: list[Path]) -> tuple[Any, Any]:
    """Run the sweep; interrupted, write the finished runs marked partial and exit 130/143
    (or, with none finished, let the interruption say nothing was written)."""
    from clustersim.runner.interrupts import exit_status
    from clustersim.runner.sweep import SweepInterrupted, run_sweep, write_sweep

    try:
        with _task_progress(total) as progress:
            return run_sweep(sweep_file, engine=engine, workers=workers, address=address,
                             progress=progress)
    except SweepInterrupted as interrupted:
        done = len(interrupted.rows)
        if not done:
            raise
        note = (f"partial: the sweep was interrupted ({interrupted}) after {done:,} of "
                f"{interrupted.total:,} runs; these tables hold the finished runs only")
        write_sweep(interrupted.rows, interrupted.summary, sweep_file, out_dir, force=force,
                    partial=note, inputs=inputs)
        err_console.print(f"[red]interrupted[/red]: wrote the {done:,} finished runs of "
                          f"{interrupted.total:,} to {escape(str(out_dir))} (partial: see "
                          "PARTIAL.txt)", soft_wrap=True)
        raise typer.Exit(exit_status(interrupted)) from None


def _no_run_succeeded(failed: Any) -> None:
    """Every run failed: nothing is written. When every failure is the input's (each
    variant's scenario refused), exit 2 with the first error; otherwise exit 1."""
    from clustersim.runner.sweep import INPUT_FAULTS

    input_faults = failed["error"].astype(str).str.startswith(INPUT_FAULTS).all()
    if input_faults:
        first = failed.iloc[0]
        err_console.print(f"[red]error:[/red] no run succeeded, nothing written: every "
                          f"variant's scenario was refused; the first, variant "
                          f"{escape(str(first['variant']))}, seed {first['seed']}: "
                          f"{escape(str(first['error']))}", soft_wrap=True)
        raise typer.Exit(2)
    err_console.print("[red]no run succeeded[/red], nothing written: check the grid's paths "
                      "and values", soft_wrap=True)
    raise typer.Exit(1)


def _print_sweep(summary: Any, grid_paths: list[str]) -> None:
    """Per variant and grid point: the headline figures of each job, mean ± 95% interval."""
    headline = (".step_time_s", ".tokens_per_s", ".cost_per_million_tokens_usd",
                ".effective_cost_per_million_tokens_usd", ".ettr")
    figures = [c for c in summary.columns if c.endswith(headline) and c.count(".") == 1]
    keys = ["variant"] + grid_paths
    short = {"step_time_s": "step s", "tokens_per_s": "tokens/s",
             "cost_per_million_tokens_usd": "$/M tokens ideal",
             "effective_cost_per_million_tokens_usd": "$/M tokens effective", "ettr": "ETTR"}
    jobs = {c.split(".")[0] for c in figures[:8]}
    _print_serving_sweep(summary, keys)
    if not figures and any(c.endswith(".slo_goodput") for c in summary.columns):
        return  # serving only: its tables are printed
    of_job = f" of job {next(iter(jobs))}" if len(jobs) == 1 else ""
    table = Table(title=f"sweep summary{of_job} (mean ± 95% interval over seeds)",
                  title_justify="left")
    for column in keys + figures[:8]:
        job, _, figure = column.partition(".")
        label = column if column in keys else (
            short[figure] if len(jobs) == 1 else f"{job} {short[figure]}")
        table.add_column(label, overflow="fold")  # short names: they wrap at words, not cut
    for row in summary.to_dict("records"):
        cells = [str(row[c]) for c in keys]
        for column in figures[:8]:
            value, ci = row[column], row.get(f"{column}_ci95")
            text = "-" if value is None or (isinstance(value, float) and math.isnan(value)) else (
                f"{value:,.4g}")
            if isinstance(ci, float) and not math.isnan(ci) and ci > 0:
                text += f" ± {ci:,.2g}"
            cells.append(text)
        table.add_row(*cells)
    out_console.print(table)


# A serving deployment's headline figures in a sweep: (figure, column label, format).
_SERVING_FIGURES = (
    ("requests_per_s", "req/s", "{:,.3g}"), ("output_tokens_per_s", "out tok/s", "{:,.0f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:,.3g}"), ("ttft_p99_s", "TTFT p99 s", "{:,.3g}"),
    ("tpot_p50_s", "TPOT p50 s", "{:,.3g}"), ("tpot_p99_s", "TPOT p99 s", "{:,.3g}"),
    ("slo_goodput", "SLO goodput", "{:.1%}"),
    ("cost_per_million_output_tokens_usd", "$/M out tok", "${:,.2f}"),
)


def _print_serving_sweep(summary: Any, keys: list[str]) -> None:
    """One table per serving deployment: throughput, latency percentiles, SLO attainment and
    cost per variant and grid point (means over seeds)."""
    names = [c.removesuffix(".slo_goodput") for c in summary.columns
             if c.endswith(".slo_goodput") and c.count(".") == 1]
    for name in names:
        table = Table(title=f"sweep summary of deployment {escape(name)} (mean over seeds)",
                      title_justify="left")
        for column in keys:
            table.add_column(escape(column), overflow="fold")
        shown = [(f"{name}.{figure}", label, form) for figure, label, form in _SERVING_FIGURES
                 if f"{name}.{figure}" in summary.columns]
        for _, label, _ in shown:
            table.add_column(label, justify="right", overflow="fold")
        saturated = f"{name}.saturated" in summary.columns
        if saturated:
            table.add_column("saturated", overflow="fold")
        for row in summary.to_dict("records"):
            cells = [escape(str(row[c])) for c in keys]
            for column, _, form in shown:
                value = row.get(column)
                missing = value is None or (isinstance(value, float) and math.isnan(value))
                cells.append("-" if missing else form.format(value))
            if saturated:
                flag = row.get(f"{name}.saturated")
                cells.append("yes" if flag and not (isinstance(flag, float) and math.isnan(flag))
                             and flag > 0 else "")
            table.add_row(*cells)
        # Wide enough for one line per row whatever the terminal (piped output is 80 columns,
        # where ten figures fold into unreadable cells), as the plan table is.
        from rich.console import Console

        Console(highlight=False, emoji=False, width=max(out_console.width, 140),
                file=out_console.file).print(table)


@contextlib.contextmanager
def _task_progress(total: int) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar of finished runs on stderr, when it is a terminal."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if not err_console.is_terminal:
        yield None
        return
    with Progress(TextColumn("sweep"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("", total=total)
        yield lambda done, _total: bar.update(task, completed=done)


def _unchecked(library: Any) -> int:
    """Report the library's scenarios that no longer load and its goldens no scenario
    names (a regression the check would otherwise pass by skipping); how many."""
    for path, error in library.invalid:
        out_console.print(f"[red]invalid[/red] {escape(str(path))}")
        err_console.print(f"  {escape(error)}; fix it, or move it out of scenarios/ with its "
                          "golden", soft_wrap=True)
    for folder in library.orphaned:
        out_console.print(f"[red]no scenario[/red] {escape(str(folder))}/")
        err_console.print(f"  {escape(str(folder))}/summary.json: a golden that no "
                          f"scenarios/*.yaml names (name: {escape(folder.name)}: renamed or "
                          "deleted?); rename the folder to the scenario's new name, or delete "
                          "it", soft_wrap=True)
    return len(library.invalid) + len(library.orphaned)


@user_errors
def check(
    scenarios: Annotated[list[Path] | None, typer.Argument(
        help="Scenarios to check.", show_default="every scenario with a golden")] = None,
    update: Annotated[bool, typer.Option("--update", help="Rewrite the goldens.")] = False,
) -> None:
    """Re-run reference scenarios and compare with results/<name>/summary.json (exit 1 on a
    difference)."""
    from clustersim.runner.check import RELATIVE_TOLERANCE, References, check_scenario, references

    root = Path.cwd()
    library = References() if scenarios else references(root)
    paths = list(scenarios or library.scenarios)
    if not paths and not library.invalid and not library.orphaned:
        raise UsageProblem("no reference scenarios: no scenarios/*.yaml has a golden in "
                           "results/<name>/summary.json (run from the project folder)")
    missing = _unchecked(library)
    differing = 0
    for path in paths:
        result = check_scenario(path, root, update=update)
        label = {"ok": "[green]ok[/green]", "updated": "[blue]updated[/blue]",
                 "missing": "[red]no golden[/red]", "differs": "[red]differs[/red]"}[result.status]
        out_console.print(f"{label} {escape(result.name)} ({escape(str(path))}, "
                          f"{result.wall_s:.1f} s)")
        if result.status == "missing":
            missing += 1
            err_console.print(f"  {escape(str(path))}: no results/{escape(result.name)}/"
                              "summary.json; create it with clustersim check --update "
                              f"{escape(str(path))}", soft_wrap=True)
        if result.status == "differs":
            differing += 1
            table = Table(show_header=True, box=None, padding=(0, 2))
            for column in ("figure", "golden", "now", "change"):
                table.add_column(column, overflow="fold")
            for where, old, new in result.differences[:40]:
                change = ""
                if isinstance(old, int | float) and isinstance(new, int | float) and old:
                    change = f"{(new - old) / abs(old):+.3%}"
                table.add_row(escape(where), escape(str(old)), escape(str(new)), change)
            out_console.print(table)
            if len(result.differences) > 40:
                out_console.print(f"  ... and {len(result.differences) - 40} more")
    if missing:
        raise typer.Exit(2)
    if differing:
        err_console.print(f"{differing} of {len(paths)} scenarios moved beyond the tolerance "
                          f"({RELATIVE_TOLERANCE:g} relative); if that is intended, run "
                          "clustersim check --update and say why in the commit", soft_wrap=True)
        raise typer.Exit(1)

