"""`clustersim` command line: a thin shell over the Python API (docs/cli.md).

Exit status: 0 success; 2 bad scenario, bad arguments or refused output directory (a message
on stderr naming the file, key path, value and what was expected, never a traceback);
1 anything else.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import clustersim
from clustersim.hardware import units
from clustersim.hardware.catalog import catalog_entry, catalog_names, catalog_source_refs
from clustersim.runner.api import run_to, step_profiles, topology_for
from clustersim.runner.outputs import OutputDirError, check_output_dir
from clustersim.scenario.loader import ScenarioError, load_scenario, scenario_json_schema
from clustersim.training.step import JobDoesNotFit

app = typer.Typer(
    name="clustersim",
    help="Simulate large AWS Trainium clusters: topology, collectives, steps, failures, goodput.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out_console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

F = TypeVar("F", bound=Callable[..., Any])


class UsageProblem(Exception):
    """A bad argument the command itself found (exit 2)."""


def _user_errors(command: F) -> F:
    """Turn user mistakes into a message and exit 2, and anything else into exit 1."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (ScenarioError, OutputDirError, UsageProblem, JobDoesNotFit) as error:
            err_console.print(f"[red]error:[/red] {escape(str(error))}", soft_wrap=True)
            raise typer.Exit(2) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as error:  # a bug or an environment problem, not the user's input
            if os.environ.get("CLUSTERSIM_DEBUG"):
                raise
            err_console.print(
                f"[red]internal error:[/red] {type(error).__name__}: {escape(str(error))}\n"
                "(set CLUSTERSIM_DEBUG=1 for a traceback)", soft_wrap=True,
            )
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        out_console.print(f"clustersim {clustersim.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """clustersim: a discrete-event simulator of large Trainium clusters."""


ScenarioArg = Annotated[Path, typer.Argument(help="Scenario YAML file.", show_default=False)]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a scenario key: PATH=VALUE (repeatable).",
                 show_default=False),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead.")]


@app.command()
@_user_errors
def run(
    scenario: ScenarioArg,
    out: Annotated[
        Path | None, typer.Option("-o", "--out", help="Output directory [default: results/NAME/].")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed instead of the scenario's.", min=0)] = None,
    replications: Annotated[int, typer.Option(help="Independent seeds to run.", min=1)] = 1,
    workers: Annotated[
        int | None, typer.Option(help="Processes for replications [default: cores].", min=1)
    ] = None,
    overrides: SetOption = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty OUT.")] = False,
) -> None:
    """Simulate a scenario and write summary.json (and traces) to OUT."""
    spec = load_scenario(scenario, overrides or [])
    out_dir = out if out is not None else Path("results") / spec.name
    check_output_dir(out_dir, force, replaces=spec.name)
    with _simulated_time_progress(True) as progress:
        result = run_to(spec, out_dir, force=force, seed=seed, replications=replications,
                        workers=workers, progress=progress)
    _print_run(result.summary, out_dir)


@contextlib.contextmanager
def _simulated_time_progress(enabled: bool) -> Iterator[Callable[[float, float], None] | None]:
    """A progress bar of simulated time on stderr, when it is a terminal."""
    if not enabled or not err_console.is_terminal:
        yield None
        return
    columns = (TextColumn("simulating"), BarColumn(), TextColumn("{task.description}"),
               TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task("", total=1.0)

        def update(now: float, horizon: float) -> None:
            bar.update(task, completed=now / horizon,
                       description=f"day {now / 86400:,.1f} of {horizon / 86400:,.1f}")

        yield update


def _summarise_many_jobs(table: Table, summary: dict[str, Any]) -> None:
    jobs = list(summary["jobs"].values())
    cluster = summary["cluster"]
    statuses = cluster.get("jobs_by_status", {})
    table.add_row("jobs", f"{len(jobs):,}: " + ", ".join(
        f"{count:,.0f} {status}" for status, count in statuses.items()
        if not status.endswith("_ci95")))
    ettr = [j["ettr"] for j in jobs if j.get("start_s") is not None]
    if ettr:
        table.add_row("", f"ETTR mean {sum(ettr) / len(ettr):.1%} over started jobs; queue wait "
                      f"mean {cluster.get('mean_queue_wait_s', 0) / 3600:,.1f} h; fragmentation "
                      f"{cluster.get('fragmentation', 0):.0%}")
    slowdowns = [j["slowdown"] for j in jobs if j.get("slowdown")]
    if slowdowns:
        table.add_row("", f"slowdown versus alone: median {sorted(slowdowns)[len(slowdowns) // 2]:.2f}"
                      f", worst {max(slowdowns):.2f}")


def _print_run(summary: dict[str, Any], out_dir: Path) -> None:
    cluster = summary["cluster"]
    table = Table(title=f"{summary['scenario']}: {cluster['chips']:,} {cluster['chip']} chips",
                  show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("hardware", f"{cluster['hardware']} ({cluster['instance_type']})")
    table.add_row("instances", f"{cluster['instances']:,} ({cluster['spare_instances']} spare)"
                  + (f", {cluster['ultraservers']:,} UltraServers" if cluster["ultraservers"] else ""))
    table.add_row("switches", f"{cluster['leaf_switches']:,} leaf, {cluster['spine_switches']:,} spine")
    table.add_row("peak BF16", f"{cluster['peak_pflops']['bf16']:,.1f} PFLOPS")
    table.add_row("HBM", f"{cluster['hbm_tib']:,.1f} TiB at {cluster['hbm_bandwidth_tbyte_per_s']:,.1f} TB/s")
    table.add_row("EFA bisection", f"{cluster['bisection_gbyte_per_s']:,.0f} GB/s")
    if cluster["price_per_hour_usd"] is not None:
        table.add_row("on-demand price", f"${cluster['price_per_hour_usd']:,.2f}/h (assumed)")
    if cluster["chip_power_kw"] is not None:
        table.add_row("chip power", f"{cluster['chip_power_kw']:,.1f} kW")
    jobs = summary["jobs"]
    if len(jobs) > 8:
        _summarise_many_jobs(table, summary)
        jobs = {}
    for name, job in jobs.items():
        table.add_row(
            f"job {name}",
            f"{job['model']} ({job['parameters'] / 1e9:,.1f}B params) on {job['chips']:,} chips, "
            f"tp {job['tp']} x pp {job['pp']} x dp {job['dp']}, "
            f"{job['tokens_per_step']:,} tokens/step",
        )
        table.add_row(
            "",
            f"step {job['step_time_s']:,.2f} s, {job['tokens_per_s']:,.0f} tokens/s, "
            f"MFU {job['mfu']:.1%}, {job['memory_per_chip_gib']:.1f} GiB per chip",
        )
        ci = f" ± {job['ettr_ci95']:.1%}" if "ettr_ci95" in job else ""
        table.add_row(
            "",
            f"{job['status']}: {job['steps_completed']:,.0f} steps, ETTR {job['ettr']:.1%}{ci}, "
            f"{job['interruptions']:,.0f} interruptions",
        )
        lost = {k: v for k, v in job["lost_time_s"].items()
                if isinstance(v, float | int) and v and not k.endswith("_ci95")}
        if lost:
            hours = ", ".join(f"{k.replace('_', ' ')} {v / 3600:,.1f} h"
                              for k, v in sorted(lost.items(), key=lambda kv: -kv[1]))
            table.add_row("", f"lost: {hours}")
        if job.get("reason"):
            table.add_row("", escape(job["reason"]))
    failures = cluster.get("failures") or {}
    if failures:
        table.add_row("failures", ", ".join(f"{k} {v:,.1f}".replace(".0 ", " ").removesuffix(".0")
                                            for k, v in failures.items()
                                            if not k.endswith("_ci95") and v))
    if "utilisation" in cluster:
        table.add_row("utilisation", f"{cluster['utilisation']:.1%} of chip-time allocated, "
                      f"{cluster['useful_utilisation']:.1%} useful")
    out_console.print(table)
    out_console.print(f"simulated {summary['simulated_s'] / 86400:,.1f} days; wrote "
                      f"{out_dir}/summary.json in {summary['wall_s']:.2f} s")


@app.command()
@_user_errors
def sweep(
    sweep_file: Annotated[Path, typer.Argument(metavar="SWEEP", help="Sweep YAML file.",
                                               show_default=False)],
    engine: Annotated[str, typer.Option(help="local (process pool) or ray.")] = "local",
    workers: Annotated[int | None, typer.Option(help="Local processes [default: cores].",
                                                min=1)] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster to join (ray engine); "
                                                     "default: start a local one.")] = None,
    out: Annotated[Path | None, typer.Option("-o", "--out",
                                             help="Output directory [default: results/NAME/].")
                   ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty OUT.")] = False,
) -> None:
    """A grid of scenario variants x seeds, each a full run, in parallel."""
    from clustersim.runner.sweep import load_sweep, run_sweep, sweep_tasks, write_sweep

    if engine not in ("local", "ray"):
        raise UsageProblem(f"--engine {engine!r}: expected local or ray")
    spec, scenario_path = load_sweep(sweep_file)
    tasks = sweep_tasks(spec, scenario_path)
    out_dir = out if out is not None else Path("results") / sweep_file.stem
    check_output_dir(out_dir, force)
    if engine == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UsageProblem("--engine ray needs Ray: pip install -e '.[ray]'") from None
    with _task_progress(len(tasks)) as progress:
        rows, summary = run_sweep(sweep_file, engine=engine, workers=workers, address=address,
                                  progress=progress)
    write_sweep(rows, summary, sweep_file, out_dir, force=force)
    failed = rows[rows["status"] != "ok"]
    out_console.print(f"{len(rows):,} runs ({len(failed):,} failed) of {len(summary):,} "
                      f"variants; wrote {escape(str(out_dir))}/sweep.parquet and "
                      "sweep_summary.parquet")
    for row in failed.itertuples():
        err_console.print(f"[red]failed:[/red] variant {escape(str(row.variant))}, seed "
                          f"{row.seed}: {escape(str(row.error))}", soft_wrap=True)
    _print_sweep(summary, list(spec.grid))
    if len(rows) and len(failed) == len(rows):
        err_console.print("[red]no run succeeded[/red]: check the grid's paths and values")
        raise typer.Exit(1)


def _print_sweep(summary: Any, grid_paths: list[str]) -> None:
    """Per variant and grid point: the headline figures of each job, mean ± 95% interval."""
    headline = (".step_time_s", ".tokens_per_s", ".cost_per_million_tokens_usd", ".ettr")
    figures = [c for c in summary.columns if c.endswith(headline) and c.count(".") == 1]
    keys = ["variant"] + grid_paths
    table = Table(title="sweep summary (mean ± 95% interval over seeds)", title_justify="left")
    for column in keys + figures[:8]:
        table.add_column(column, overflow="fold")
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


@contextlib.contextmanager
def _task_progress(total: int) -> Iterator[Callable[[int, int], None] | None]:
    if not err_console.is_terminal:
        yield None
        return
    with Progress(TextColumn("sweep"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("", total=total)
        yield lambda done, _total: bar.update(task, completed=done)


@app.command()
@_user_errors
def check(
    scenarios: Annotated[list[Path] | None, typer.Argument(
        help="Scenarios to check [default: every scenario with a golden].",
        show_default=False)] = None,
    update: Annotated[bool, typer.Option("--update", help="Rewrite the goldens.")] = False,
) -> None:
    """Re-run reference scenarios and compare with results/<name>/summary.json (exit 1 on a
    difference)."""
    from clustersim.runner.check import RELATIVE_TOLERANCE, check_scenario, reference_scenarios

    root = Path.cwd()
    paths = list(scenarios or reference_scenarios(root))
    if not paths:
        raise UsageProblem("no reference scenarios: no scenarios/*.yaml has a golden in "
                           "results/<name>/summary.json (run from the project folder)")
    differing = missing = 0
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


@app.command()
@_user_errors
def validate(
    scenarios: Annotated[list[Path], typer.Argument(help="Scenario files.", show_default=False)],
    overrides: SetOption = None,
) -> None:
    """Check scenario files without simulating."""
    failed = 0
    for path in scenarios:
        try:
            spec = load_scenario(path, overrides or [])
        except ScenarioError as error:
            failed += 1
            err_console.print(f"[red]error:[/red] {escape(str(error))}", soft_wrap=True)
            continue
        out_console.print(
            f"ok: {escape(str(path))} ({spec.name}: {spec.total_chips:,} {spec.hardware.chip.name} chips, "
            f"{len(spec.jobs):,} job{'s' if len(spec.jobs) != 1 else ''})"
        )
    if failed:
        raise typer.Exit(2)


@app.command()
@_user_errors
def topology(
    scenario: ScenarioArg,
    overrides: SetOption = None,
    json_out: JsonOption = False,
    draw: Annotated[
        Path | None, typer.Option("--draw", help="Draw the first UltraServer (or instance) "
                                                 "as a PNG to this path.")
    ] = None,
) -> None:
    """Chips, instances, UltraServers, links by kind, per-chip bandwidths, fabric bisection."""
    spec = load_scenario(scenario, overrides or [])
    if draw is not None and draw.suffix.lower() != ".png":
        raise UsageProblem(f"--draw {draw}: expected a .png path")
    if draw is not None and (draw.is_dir() or not draw.parent.is_dir()):
        raise UsageProblem(f"--draw {draw}: expected a .png file in an existing folder")
    started = time.perf_counter()
    topo = topology_for(spec)
    build_s = time.perf_counter() - started
    if draw is not None:
        from clustersim.analysis.report import draw_topology

        draw_topology(topo, draw)
        err_console.print(f"drew {escape(str(draw))}")
    figures = topo.summary()
    figures["build_s"] = round(build_s, 3)
    figures["nodes"] = topo.graph.number_of_nodes()
    figures["edges"] = topo.graph.number_of_edges()
    if json_out:
        print(json.dumps(_without_float_noise(figures), indent=2))
        return
    table = Table(title=f"{spec.name}: topology of {figures['hardware']}", title_justify="left",
                  show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("chips", f"{figures['chips']:,} ({figures['ranks']:,} ranks)")
    table.add_row("instances", f"{figures['instances']:,}")
    table.add_row("UltraServers", f"{figures['ultraservers']:,}")
    table.add_row("switches", f"{figures['switches']:,} chip switches, {figures['leaves']:,} leaf, "
                  f"{figures['spines']:,} spine")
    table.add_row("graph", f"{figures['nodes']:,} nodes, {figures['edges']:,} edges, "
                  f"built in {build_s:.2f} s")
    table.add_row("fabric bisection", f"{figures['bisection_gbyte_per_s']:,.0f} GB/s per direction")
    out_console.print(table)
    links = Table(title="links by kind", title_justify="left")
    for column in ("kind", "count", "per link, each way", "latency", "per chip (as quoted)"):
        links.add_column(column, justify="right" if column != "kind" else "left")
    for kind, count in figures["links"].items():
        per_chip = figures["per_chip_bandwidth_gbyte_per_s"].get(kind)
        links.add_row(
            kind, f"{count:,}", f"{figures['link_bandwidth_gbyte_per_s'][kind]:,.2f} GB/s",
            units.format_duration(figures["link_latency_us"][kind] / 1e6),
            "" if per_chip is None else f"{per_chip:,.1f} GB/s",
        )
    out_console.print(links)


@app.command()
@_user_errors
def step(
    scenario: ScenarioArg,
    overrides: SetOption = None,
    json_out: JsonOption = False,
    ignore_memory: Annotated[bool, typer.Option(
        "--ignore-memory", help="Show the step figures of a job that does not fit in memory "
                                "(and exit 0).")] = False,
) -> None:
    """Per job: one training step's time and where it goes, tokens/s, MFU, memory, fit.
    Exit 2 when a job does not fit in its chips' memory, unless --ignore-memory."""
    spec = load_scenario(scenario, overrides or [])
    if not spec.jobs:
        raise UsageProblem(f"{scenario}: the scenario has no jobs")
    profiles = step_profiles(spec)
    too_big = [job.name for job in spec.jobs if not profiles[job.name].fits_memory]
    if json_out:
        print(json.dumps({"jobs": [p.as_dict() for p in profiles.values()]}, indent=2))
    else:
        for job in spec.jobs:
            _print_step(job, profiles[job.name], spec, ignore_memory)
    if too_big and not ignore_memory:
        err_console.print(f"[bold red]error: {escape(', '.join(too_big))} "
                          f"{'does' if len(too_big) == 1 else 'do'} not fit in memory[/bold red]"
                          " (exit 2; --ignore-memory shows the step figures anyway)",
                          soft_wrap=True)
        raise typer.Exit(2)


def _print_memory(job: Any, profile: Any, spec: Any) -> None:
    """Where a chip's memory goes, adding up to its total, against its HBM."""
    memory = profile.memory.as_gib()
    out_console.print(f"[bold]{escape(profile.name)}[/bold]: memory per "
                      f"{spec.hardware.chip.name} chip (the busiest)")
    table = Table()
    table.add_column("part", style="bold")
    table.add_column("GiB", justify="right")
    for part in ("weights", "gradients", "optimizer", "activations", "logits"):
        table.add_row(part, f"{memory[part]:,.1f}")
    table.add_row("total", f"{memory['total']:,.1f}", style="bold")
    table.add_row("HBM", f"{memory['hbm']:,.0f}")
    out_console.print(table)
    if not profile.fits_memory:
        out_console.print(f"[bold red]DOES NOT FIT: job {escape(profile.name)} needs "
                          f"{memory['total']:,.1f} GiB per chip, the chip has "
                          f"{memory['hbm']:,.0f} GiB[/bold red] (more tensor or pipeline "
                          "parallelism, ZeRO-1, sequence parallelism or recompute would help)",
                          soft_wrap=True)


def _print_step(job: Any, profile: Any, spec: Any, ignore_memory: bool = False) -> None:
    _print_memory(job, profile, spec)
    if not profile.fits_memory and not ignore_memory:
        return
    par = job.parallelism
    title = (f"{profile.name}: {job.model.name} on {profile.chips:,} {spec.hardware.chip.name} "
             f"chips ({profile.instances:,} {spec.hardware.instance.name}), tp {par.tp} x "
             f"pp {par.pp}{f' (x{par.interleave} interleaved)' if par.interleave > 1 else ''}"
             f" x dp {par.dp}, {profile.microbatches} micro-batches of {job.micro_batch}")
    out_console.print(escape(title), soft_wrap=False)
    table = Table()
    table.add_column("step", style="bold")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    rows = [("compute", profile.compute_s)]
    rows += [(f"exposed {kind} communication", value)
             for kind, value in profile.exposed_comm_s.items()]
    rows += [("pipeline bubble", profile.bubble_s), ("optimizer", profile.optimizer_s)]
    for label, value in rows:
        table.add_row(label, f"{value:,.3f}", f"{value / profile.step_time_s:.1%}")
    table.add_row("step time", f"{profile.step_time_s:,.3f}", "100%", style="bold")
    out_console.print(table)
    memory = profile.memory.as_gib()
    facts = Table(show_header=False)
    facts.add_column(style="bold")
    facts.add_column()
    facts.add_row("throughput", f"{profile.tokens_per_s:,.0f} tokens/s, "
                  f"{profile.sequences_per_s:,.2f} sequences/s")
    facts.add_row("MFU / HFU", f"{profile.mfu:.1%} / {profile.hfu:.1%} of {job.precision} peak")
    fit = "[green]fits[/green]" if profile.fits_memory else (
        "[bold red]DOES NOT FIT (figures shown with --ignore-memory)[/bold red]")
    facts.add_row("memory per chip", f"{memory['total']:,.1f} of {memory['hbm']:,.0f} GiB, {fit}")
    if profile.energy_per_token_j is not None:
        facts.add_row("chip energy", f"{profile.energy_per_token_j:.3f} J/token")
    if profile.cost_per_million_tokens_usd is not None:
        facts.add_row("cost", f"${profile.cost_per_million_tokens_usd:,.3f} per million tokens "
                      "(on-demand price, an assumption)")
    out_console.print(facts)


@app.command()
@_user_errors
def hardware(
    name: Annotated[str | None, typer.Argument(help="Catalog entry to print.")] = None,
    json_out: JsonOption = False,
) -> None:
    """List the hardware catalog, or print one entry with its sources."""
    if name is None:
        _list_hardware(json_out)
        return
    if name not in catalog_names():
        raise UsageProblem(f"unknown hardware {name!r}; expected one of {', '.join(catalog_names())}")
    spec = catalog_entry(name)
    if json_out:
        print(spec.model_dump_json(by_alias=True, indent=2))
        return
    out_console.print(f"[bold]{name}[/bold]: {spec.description}")
    table = Table(show_header=True, title_justify="left")
    table.add_column("field")
    table.add_column("value", justify="right")
    table.add_column("source")
    for path, value in _flatten(spec.model_dump(by_alias=True, exclude={"sources"})):
        table.add_row(path, _show(path, value), spec.sources.get(path, ""))
    out_console.print(table)
    refs = catalog_source_refs()
    used = sorted({s.split(":")[0] for s in spec.sources.values()} & set(refs))
    for ref in used:
        out_console.print(f"[bold]{ref}[/bold]: {refs[ref]}", soft_wrap=True)


def _list_hardware(json_out: bool) -> None:
    rows = []
    for entry in catalog_names():
        spec = catalog_entry(entry)
        rows.append({
            "name": entry,
            "instance": spec.instance.name,
            "chip": spec.chip.name,
            "chips_per_instance": spec.chips_per_instance,
            "instances_per_ultraserver": spec.instances_per_ultraserver,
            "bf16_tflops": spec.chip.tflops["bf16"],
            "hbm_gib": spec.chip.hbm_bytes / 2**30,
            "interconnect": spec.instance.interconnect.topology,
            "efa_gbit_per_s": spec.instance.efa_bytes_per_s * 8 / 1e9,
            "price_per_hour_usd": spec.instance.price_per_hour_usd,
        })
    if json_out:
        print(json.dumps({"hardware": rows}, indent=2))
        return
    table = Table(title="hardware catalog (prices are assumptions: override them)",
                  title_justify="left")
    for column in ("name", "instance", "chip", "chips", "BF16 TFLOPS", "HBM", "links", "EFA",
                   "$/h"):
        table.add_column(column, no_wrap=column == "name")
    for row in rows:
        chips = str(row["chips_per_instance"])
        if row["instances_per_ultraserver"] > 1:
            chips += f" x {row['instances_per_ultraserver']}"
        table.add_row(
            row["name"], row["instance"], row["chip"], chips, f"{row['bf16_tflops']:g}",
            f"{row['hbm_gib']:.3g} GiB", row["interconnect"], f"{row['efa_gbit_per_s']:,.0f} Gbps",
            "-" if row["price_per_hour_usd"] is None else f"{row['price_per_hour_usd']:.2f}",
        )
    out_console.print(table)


def _without_float_noise(node: Any) -> Any:
    """Floats to 12 significant digits: 15 us / 2 in microseconds is 7.5, not
    7.499999999999999 (binary rounding noise, far below any figure's precision)."""
    if isinstance(node, dict):
        return {k: _without_float_noise(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_without_float_noise(v) for v in node]
    if isinstance(node, float) and math.isfinite(node) and node:
        return float(f"{node:.12g}")
    return node


def _flatten(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        items: list[tuple[str, Any]] = []
        for key, value in node.items():
            items.extend(_flatten(value, f"{prefix}.{key}" if prefix else key))
        return items
    return [(prefix, node)]


def _show(path: str, value: Any) -> str:
    """Values with their units, read off the field name."""
    if value is None:
        return "-"
    leaf = path.rsplit(".", 1)[-1]
    if leaf in ("hbm", "sram", "host_memory"):
        return units.format_bytes(value)
    if leaf == "efa":
        return units.format_bandwidth(value, bits=True)
    if leaf in ("hbm_bandwidth", "bandwidth"):
        return units.format_bandwidth(value)
    if leaf == "latency":
        return units.format_duration(value)
    if leaf == "power":
        return units.format_power(value)
    return str(value)


def _parse_sizes(text: str) -> list[float]:
    """`32MB`, `1KiB:1GiB` (doubling) or `1KiB:1GiB:4` (factor 4), as nccom-test's -b/-e/-f."""
    parts = text.split(":")
    if len(parts) > 3 or not all(parts):
        raise UsageProblem(f"--sizes {text!r}: expected SIZE, MIN:MAX or MIN:MAX:FACTOR")
    try:
        low = units.parse_bytes(parts[0])
        high = units.parse_bytes(parts[1]) if len(parts) > 1 else low
        factor = float(parts[2]) if len(parts) > 2 else 2.0
    except ValueError as error:
        raise UsageProblem(f"--sizes {text!r}: {error}") from None
    if not (1 <= round(low) and low <= high and math.isfinite(high) and 1 < factor < math.inf):
        raise UsageProblem(f"--sizes {text!r}: expected 1 byte <= MIN <= MAX and a finite "
                           "FACTOR > 1")
    if math.log(high / low) / math.log(factor) >= 200:
        raise UsageProblem(f"--sizes {text!r}: more than 200 sizes; expected a larger FACTOR")
    sizes = []
    size = low
    while size <= high * (1 + 1e-9):
        sizes.append(float(round(size)))
        size *= factor
    return sizes


@app.command()
@_user_errors
def collective(
    hardware_name: Annotated[str, typer.Option("--hardware", help="Catalog entry, e.g. trn2.")],
    op: Annotated[str, typer.Option(help="all-reduce, all-gather, reduce-scatter, all-to-all, "
                                         "broadcast or send-recv (nccom-test names work too).")],
    ranks: Annotated[int, typer.Option(help="Ranks taking part.", min=1)],
    instances: Annotated[
        int | None, typer.Option(help="Instances to spread them over [default: as few as fit].",
                                 min=1)
    ] = None,
    sizes: Annotated[str, typer.Option(help="SIZE, MIN:MAX (doubling) or MIN:MAX:FACTOR.")] = (
        "1KiB:1GiB:4"),
    algorithm: Annotated[str, typer.Option(help="auto, ring, biring, mesh, mesh1, rdh, kangaring, "
                                                "or hierarchical.")] = "auto",
    intra: Annotated[str, typer.Option(help="Algorithm inside the instance (multi-node).")] = "auto",
    inter: Annotated[str, typer.Option(help="Algorithm over EFA (multi-node).")] = "auto",
    json_out: JsonOption = False,
) -> None:
    """One collective across sizes, as nccom-test prints it (GB/s = 1e9 bytes/s)."""
    from clustersim.collectives.model import (
        CollectiveError,
        CollectiveModel,
        check_rank_split,
        normalise_op,
        place_ranks,
    )
    from clustersim.hardware.topology import build_topology

    if hardware_name not in catalog_names():
        raise UsageProblem(
            f"--hardware {hardware_name!r}: unknown; expected one of {', '.join(catalog_names())}"
        )
    size_list = _parse_sizes(sizes)
    spec = catalog_entry(hardware_name)
    try:
        op_name = normalise_op(op)
        wanted = instances or max(1, -(-ranks // spec.ranks_per_instance))
        check_rank_split(ranks, wanted)  # before the graph: --instances may be huge
        per_us = spec.instances_per_ultraserver
        topo = build_topology(spec, -(-wanted // per_us) * per_us)
        model = CollectiveModel(topo)
        group = place_ranks(topo, ranks, wanted)
        costs = [model.cost(op_name, group, size, algorithm=algorithm, intra=intra, inter=inter)
                 for size in size_list]
    except CollectiveError as error:
        raise UsageProblem(str(error)) from None
    rows = [{
        "bytes": int(c.size_bytes),
        "algorithm": c.algorithm,
        "time_us": c.time_s * 1e6,
        "algbw_gbyte_per_s": c.algbw_bytes_per_s / 1e9,
        "busbw_gbyte_per_s": c.busbw_bytes_per_s / 1e9,
        "steps": c.steps,
    } for c in costs]
    if json_out:
        print(json.dumps({"hardware": hardware_name, "op": op_name, "ranks": ranks,
                          "instances": wanted, "ranks_per_chip": group.ranks_per_chip,
                          "rows": rows}, indent=2))
        return
    table = Table(
        title=f"{op_name} over {ranks} ranks on {wanted} {spec.instance.name} "
              f"({len(group.chips)} chips, {group.ranks_per_chip} ranks each)",
        title_justify="left",
    )
    for column in ("size(B)", "algorithm", "steps", "time(us)", "algbw(GB/s)", "busbw(GB/s)"):
        table.add_column(column, justify="left" if column == "algorithm" else "right",
                         no_wrap=column in ("size(B)", "algorithm"))
    for row in rows:
        table.add_row(f"{row['bytes']:,}", row["algorithm"], str(row["steps"]),
                      f"{row['time_us']:,.1f}", f"{row['algbw_gbyte_per_s']:.2f}",
                      f"{row['busbw_gbyte_per_s']:.2f}")
    out_console.print(table)
    average = sum(r["busbw_gbyte_per_s"] for r in rows) / len(rows)
    out_console.print(f"Avg bus bandwidth: {average:.4f} GB/s")


@app.command()
@_user_errors
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


@app.command()
@_user_errors
def schema(
    out: Annotated[Path | None, typer.Option("-o", "--out", help="Write to a file.")] = None,
) -> None:
    """Print the JSON Schema of scenario files (for editors' completion and checks)."""
    text = json.dumps(scenario_json_schema(), indent=2) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as error:
            raise UsageProblem(f"-o {out}: cannot write it ({error.strerror})") from None
        err_console.print(f"wrote {out}")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
