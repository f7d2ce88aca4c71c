"""`clustersim run`: simulate a scenario, write its outputs and print the headline figures."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from clustersim.cli.common import (
    ScenarioArg,
    SetOption,
    UsageProblem,
    err_console,
    goodput_share,
    out_console,
    user_errors,
)
from clustersim.cli.run_rows import (
    _deployment_rows,
    _fleet_day_rows,
    _money,
    _over,
    _percent,
    _plural,
)


@user_errors
def run(
    scenario: ScenarioArg,
    out: Annotated[
        Path | None, typer.Option("-o", "--out", help="Output directory.",
                                  show_default="results/NAME/")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed instead of the scenario's.", min=0)] = None,
    replications: Annotated[int, typer.Option(help="Independent seeds to run.", min=1)] = 1,
    workers: Annotated[
        int | None, typer.Option(help="Processes for replications.", show_default="cores", min=1)
    ] = None,
    engine: Annotated[str, typer.Option(
        help="Where replications after the first run: local (processes) or ray.")] = "local",
    address: Annotated[str | None, typer.Option(help="Ray cluster to join (ray engine); "
                                                     "default: start a local one.")] = None,
    overrides: SetOption = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty OUT.")] = False,
    find_rate: Annotated[bool, typer.Option(
        "--find-rate", help="Serving: search the highest arrival rate of each deployment "
        "meeting its SLO (print it; write nothing).")] = False,
    goodput: Annotated[float, typer.Option(
        help="With --find-rate: share of requests that must meet the SLO.",
        callback=goodput_share)] = 0.99,
) -> None:
    """Simulate a scenario and write summary.json (and traces) to OUT."""
    from clustersim.runner.api import check_run_arguments, run_to
    from clustersim.runner.earlier_runs import run_settings
    from clustersim.runner.outputs import check_output_dir
    from clustersim.scenario.loader import load_scenario

    problem = check_run_arguments(seed, replications)
    if problem:
        raise UsageProblem(problem)
    if engine not in ("local", "ray"):
        raise UsageProblem(f"--engine {engine!r}: expected local or ray")
    if address is not None and engine != "ray":
        raise UsageProblem("--address: the Ray cluster of --engine ray; expected --engine ray")
    if engine == "ray" and replications == 1 and not find_rate:
        # (the first replication runs in this process: with one, Ray is never reached)
        err_console.print("note: --engine ray runs the replications after the first on Ray; "
                          "with one replication the run is local"
                          + (" and --address is not contacted" if address else ""),
                          highlight=False)

    _refuse_two_seeds(seed, overrides or [])
    spec = load_scenario(scenario, overrides or [])
    from clustersim.scenario.fleetday import in_event_fleet, is_fleet_day

    # (fluid deployments beside a workload run in the timeline: replicated as it is)
    if is_fleet_day(spec) and (find_rate or replications > 1 and not in_event_fleet(spec)):
        kind = ("an event-driven fleet holding fluid deployments beside its jobs "
                "(docs/fleet-day.md#in-the-event-driven-fleet)" if in_event_fleet(spec)
                else "a fleet-day run (fluid deployments, docs/fleet-day.md)")
        raise UsageProblem(f"{'--find-rate' if find_rate else '--replications'}: {kind} "
                           "runs once, at its scenario's rates")
    if find_rate and any(d.workload.load is not None for d in spec.serve):
        raise UsageProblem("--find-rate: a deployment's rate follows its load curve "
                           "(workload.load); expected a constant rate")
    if find_rate:
        _find_rates(spec, Path(scenario).parent, goodput, seed)
        return
    out_dir = out if out is not None else Path("results") / spec.name
    from clustersim.scenario.loader import input_files

    check_output_dir(out_dir, force, replaces=run_settings(spec, seed, replications),
                     inputs=input_files(spec))
    _warn_never_admitted(spec)
    replaced = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    with _simulated_time_progress(True) as progress:
        result = run_to(spec, out_dir, force=force, seed=seed, replications=replications,
                        workers=workers, progress=progress, engine=engine, address=address)
    _print_run(result.summary, out_dir, _price_label(spec))
    if replaced:
        report = " and its report/ (run clustersim report again)" if "report" in replaced else ""
        err_console.print(f"note: replaced the earlier run in {escape(str(out_dir))}/{report}",
                          soft_wrap=True)
    hint = _plan_hint(spec, scenario, overrides or [])
    if hint:
        out_console.print(f"the best parallelism for {escape(spec.jobs[0].name)} at this size: "
                          f"{escape(hint)}", soft_wrap=True)


def _refuse_two_seeds(seed: int | None, overrides: list[str]) -> None:
    """`--seed N` with `--set seed=M` (M not N): two seeds, and which one ran was not said."""
    from clustersim.scenario.reading import OverrideError, parse_override

    if seed is None:
        return
    for text in overrides:
        try:
            path, value = parse_override(text)
        except OverrideError:
            continue  # (the scenario's loading reports it)
        if path == "seed" and (isinstance(value, bool) or value != seed):
            raise UsageProblem(f"--seed {seed} and --set {text}: two different seeds; give "
                               "one (--set seed= also redraws a workload's job mix, --seed "
                               "only the failures and requests)")


def _plan_hint(spec: Any, scenario: Path, overrides: list[str]) -> str | None:
    """The `plan` command for the first job, with the run's --set overrides; None when that
    command would not plan it: the first job is a workload's (a trace row: `plan` is for the
    scenario's own `jobs:`), or its size is below the hardware's unit (an UltraServer)."""
    import shlex

    import yaml

    from clustersim.planning.planner import PlanError, PlanOptions, _sizes

    raw = yaml.safe_load(spec.source_yaml) if spec.source_yaml else None
    if not spec.jobs or not isinstance(raw, dict) or not raw.get("jobs"):
        return None
    try:
        sizes, _ = _sizes(spec, spec.jobs[0], PlanOptions(), spec.hardware)
    except PlanError:
        return None
    if not sizes:
        return None
    return " ".join(["clustersim plan", shlex.quote(str(scenario)),
                     *(f"--set {shlex.quote(o)}" for o in overrides)])


def _warn_never_admitted(spec: Any, shown: int = 5) -> None:
    """A warning for each job its team's quota can never admit (the first `shown`)."""
    from clustersim.scenario.teams import never_admitted

    lines = never_admitted(spec)
    for line in lines[:shown]:
        err_console.print(f"warning: {escape(spec.source)}: {escape(line)}", soft_wrap=True)
    if len(lines) > shown:
        err_console.print(f"warning: ... and {len(lines) - shown:,} more jobs over their "
                          "team's quota", soft_wrap=True)


def _price_label(spec: Any) -> str:
    from clustersim.hardware.prices import price_basis

    return price_basis(spec.hardware)


@contextlib.contextmanager
def _simulated_time_progress(enabled: bool) -> Iterator[Callable[[float, float], None] | None]:
    """A progress bar of simulated time on stderr, when it is a terminal."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

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


def _count(value: float) -> str:
    """A count, or a mean count over replications (15.25): no decimals when whole."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}".rstrip("0").rstrip(".")


def _summarise_many_jobs(table: Table, summary: dict[str, Any]) -> None:
    jobs = list(summary["jobs"].values())
    cluster = summary["cluster"]
    statuses = cluster.get("jobs_by_status", {})
    # past LARGEST_JOBS the summary lists the largest only: the figures below are theirs
    over = f" of the {len(jobs):,} largest" if summary.get("jobs_listed") else ""
    # replications: each figure with its 95% interval where the summary has one (_with_ci)
    total = _with_ci(cluster, "jobs", _count) if "jobs" in cluster else f"{len(jobs):,}"
    table.add_row("jobs", f"{total}: " + ", ".join(
        f"{_with_ci(statuses, status, _count)} {status}" for status in statuses
        if not status.endswith("_ci95")))
    # with replications each job's ETTR and slowdown are its means over them: the summary
    # has no interval for figures over jobs, so the rows say what they are
    of = " (each job's mean over replications)" if summary.get("replications", 1) > 1 else ""
    ettr = [j["ettr"] for j in jobs if j.get("start_s") is not None]
    if ettr:
        wait = _with_ci(cluster, "mean_queue_wait_s", lambda s: f"{s / 3600:,.1f}") \
            if "mean_queue_wait_s" in cluster else "0.0"
        fragmentation = _with_ci(cluster, "fragmentation", lambda f: f"{f:.0%}") \
            if "fragmentation" in cluster else "0%"
        table.add_row("", f"ETTR mean {sum(ettr) / len(ettr):.1%} over started jobs{over}{of}; "
                      f"queue wait mean {wait} h; fragmentation {fragmentation}")
    slowdowns = [j["slowdown"] for j in jobs if j.get("slowdown")]
    if slowdowns:
        median = statistics.median(slowdowns)  # (of an even count: the middle two's mean)
        table.add_row("", f"slowdown versus alone{over}{of}: median {median:.2f}"
                      f", worst {max(slowdowns):.2f}")


def _find_rates(spec: Any, base_dir: Path, goodput: float, seed: int | None) -> None:
    from clustersim.cli.common import UsageProblem
    from clustersim.hardware import limits
    from clustersim.serving.capacity import find_rate

    if not spec.serve:
        raise UsageProblem("--find-rate: the scenario has no serve: deployments")
    from clustersim.runner.api import check_serving_fit
    from clustersim.runner.budget import check_request_traces

    check_request_traces(spec)  # before any trial, as `run` checks them
    check_serving_fit(spec)
    for deployment in spec.serve:
        try:
            search = find_rate(spec, deployment.name, goodput, seed, base_dir=base_dir)
        except ValueError as error:
            raise UsageProblem(f"--find-rate: {error}") from None
        tried = ", ".join(f"{r:,.3g}/s: {_percent(g)}" + (" saturated" if r in search.saturated
                                                      else "") for r, g in search.tried)
        if search.rate_per_s is None:
            out_console.print(_not_met(deployment, search, goodput) + f" (tried {tried})")
            continue
        f = search.figures or {}
        least = "at least " if search.at_ceiling else ""
        if search.at_ceiling:
            out_console.print(
                f"{deployment.name}: every rate tried held, up to {search.rate_per_s:,.3g}/s; "
                f"the search tries at most {search.ceiling_per_s:,.3g}/s here (at most "
                f"{limits.MAX_REQUEST_RATE_PER_S:,.0f}/s and "
                f"{limits.MAX_RATE_SEARCH_REQUESTS:,} expected requests a trial: "
                "docs/limits.md)")
        out_console.print(
            f"{deployment.name}: {least}{search.rate_per_s:,.3g} requests/s within the SLO (ttft "
            f"{deployment.slo.ttft_s:g} s, tpot {deployment.slo.tpot_s:g} s) for "
            f"{goodput:.0%} of requests; {f['output_tokens_per_s']:,.0f} output tokens/s, "
            f"TTFT p99 {f['ttft_p99_s']:.3g} s, TPOT p99 {f['tpot_p99_s']:.3g} s"
            + ("" if f.get("cost_per_million_output_tokens_usd") is None else
               f"; ${f['cost_per_million_output_tokens_usd']:,.2f} per million output tokens "
               "at that rate"))
        out_console.print(f"  tried {tried}")
        noise = _within_noise(search, goodput)
        if noise:
            out_console.print(f"  {noise}")


def _within_noise(search: Any, goodput: float) -> str:
    """The rates whose trials' share stayed within noise of the target at the most
    requests a trial serves (the goodput hardly moves with the rate there), or ''."""
    from clustersim.serving.capacity import Z_DECISIVE

    if not search.within_noise:
        return ""
    rates = sorted(search.within_noise | ({search.rate_per_s} if search.rate_per_s else set()))
    most = max(search.requests)
    return (f"from {rates[0]:,.3g}/s to {rates[-1]:,.3g}/s the share within the SLO stayed "
            f"within {Z_DECISIVE:g} standard deviations of {goodput:.0%} over {most:,} "
            "requests a trial: the goodput hardly changes with the rate there, so the capacity "
            "is known only to that range")


def _not_met(deployment: Any, search: Any, goodput: float) -> str:
    """The line of a deployment no rate tried held: the best goodput seen, and why lower
    rates were not tried (exit status 0: the search itself succeeded)."""
    from clustersim.serving.capacity import IDLE_LOAD

    text = (f"{deployment.name}: {goodput:.0%} of requests within the SLO (ttft "
            f"{deployment.slo.ttft_s:g} s, tpot {deployment.slo.tpot_s:g} s) not met at any "
            "rate tried")
    best = search.best()
    if best is not None:
        text += f": best goodput {_percent(best[1])} at {best[0]:,.3g}/s"
    idle = search.idle
    if idle is not None and idle.share < goodput:
        text += (f"; even on an idle replica only about {_percent(idle.share)} of its requests could "
                 f"meet it ({idle.why(deployment.slo.ttft_s, deployment.slo.tpot_s)}), so no "
                 "rate can")
    elif search.near_idle_per_s is not None:
        text += (f"; lower rates were not tried: {search.near_idle_per_s:,.3g}/s is near idle "
                 f"(under {IDLE_LOAD:.0%} of the replicas' work)")
    return text


def _with_ci(figures: dict[str, Any], key: str, show: Callable[[float], str]) -> str:
    """A figure, and its 95% interval when replications gave it one (none when all agree)."""
    text = show(figures[key])
    ci = figures.get(f"{key}_ci95")
    if isinstance(ci, float | int) and ci > 0:
        text += f" ± {show(ci)}"
    return text


def _active(job: dict[str, Any]) -> str:
    """`, 37.6B active` for a mixture of experts (a summary without the figure: nothing)."""
    active = job.get("active_parameters")
    if not isinstance(active, int) or active == job["parameters"]:
        return ""
    return f", {active / 1e9:,.1f}B active"


def _job_rows(table: Table, name: str, job: dict[str, Any]) -> None:
    """A job's rows of the run table: shape, step, outcome, lost hours, cost, why."""
    table.add_row(
        f"job {escape(name)}",
        f"{job['model']} ({job['parameters'] / 1e9:,.1f}B params{_active(job)}) on "
        f"{job['chips']:,} chips, "
        f"tp {job['tp']}{_over('cp', job)} x pp {job['pp']} x dp {job['dp']}{_over('ep', job, True)}, "
        f"{job['tokens_per_step']:,} tokens/step")
    table.add_row("", f"step {job['step_time_s']:,.2f} s, {job['tokens_per_s']:,.0f} tokens/s, "
                      f"MFU {job['mfu']:.1%}, {job['memory_per_chip_gib']:.1f} GiB per chip")
    table.add_row("", f"{_status(job)}: {_with_ci(job, 'steps_completed', lambda v: f'{v:,.0f}')}"
                      f" steps, ETTR {_with_ci(job, 'ettr', _percent)}, "
                      f"{_with_ci(job, 'interruptions', lambda v: f'{v:,.1f}'.removesuffix('.0'))}"
                      " interruptions")
    when = _when(job)
    if when:
        table.add_row("", when)
    lost_s = job["lost_time_s"]
    lost = {k: v for k, v in lost_s.items()
            if isinstance(v, float | int) and v and not k.endswith("_ci95")}
    if lost:
        hours = ", ".join(f"{k.replace('_', ' ')} {_with_ci(lost_s, k, lambda v: f'{v / 3600:,.1f}')}"
                          " h" for k, v in sorted(lost.items(), key=lambda kv: -kv[1]))
        table.add_row("", f"lost: {hours}")
    if job.get("checkpoint_default"):
        table.add_row("", f"[bold yellow]no checkpoint block: given the default[/bold yellow], "
                          f"every {_with_ci(job, 'checkpoint_interval_s', _minutes)} (Daly), "
                          f"{job['checkpoint_write_s']:,.1f} s writes of the model and optimizer "
                          "state to FSx for Lustre (docs/scenario.md#checkpoints)")
    cost = job.get("cost_per_million_tokens_usd")
    if cost is not None:
        effective = job.get("effective_cost_per_million_tokens_usd")
        table.add_row("", f"cost per million tokens: ${cost:,.3f} per step (ideal), " + (
            f"${_with_ci(job, 'effective_cost_per_million_tokens_usd', lambda v: f'{v:,.3f}')} "
            "over the run (chip-hours held)" if effective is not None else "none trained"))
    if job.get("reason"):
        table.add_row("", escape(job["reason"]))


def _status(job: dict[str, Any]) -> str:
    """The job's status; with replications that ended apart, how many ended in each."""
    by = job.get("status_by_replication")
    if not isinstance(by, dict) or len(by) < 2:
        return str(job["status"])
    return (", ".join(f"{status} in {count:,}" for status, count in by.items())
            + f" of {sum(by.values()):,} replications")


def _when(job: dict[str, Any]) -> str:
    """When the job started and finished (or that it was still going at the horizon)."""
    from clustersim.hardware.units import format_duration

    start, end = job.get("start_s"), job.get("end_s")
    if start is None:
        return "never started"
    text = f"started at {format_duration(start, 3)}"
    if end is None:
        return text + ", still going at the horizon" if start > 0 else ""
    text += f", {'finished' if job.get('status') == 'done' else 'ended'} at " \
        f"{format_duration(end, 3)} ({format_duration(end - start, 3)} later)"
    # replications: means over those where the job started (ended), when not all
    counts = [f"{what} in {job[key]:,}" for what, key in (("started", "start_s_n"),
                                                        ("ended", "end_s_n")) if key in job]
    return text + (f" (means; {', '.join(counts)} replications)" if counts else "")


def _serving_row(table: Table, summary: dict[str, Any]) -> None:
    """Chip-time held by the serving deployments and what they served, over the horizon."""
    cluster, deployments = summary["cluster"], summary.get("deployments") or {}
    serving = cluster.get("serving_instances") or 0
    if not deployments or not serving:
        return
    chips = serving * cluster["chips_per_instance"]
    hours = chips * summary["simulated_s"] / 3600
    served = sum(d.get("requests_completed", 0) for d in deployments.values())
    arrived = sum(d.get("requests", 0) for d in deployments.values())
    table.add_row("serving", f"{_plural(serving, 'instance')} ({chips:,} chips) held by "
                  f"{_plural(len(deployments), 'deployment')} for the whole run: "
                  f"{serving / cluster['instances']:.1%} of chip-time, {hours:,.1f} chip-hours; "
                  f"{served:,} requests served within the horizon ({arrived:,} arrived)")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:,.1f} min"


def _trace_rows_row(table: Table, summary: dict[str, Any]) -> None:
    """What became of a published trace's rows: replayed, and left out by reason."""
    from clustersim.scenario.traces import LEFT_OUT

    rows = summary.get("trace_rows")
    if not rows:
        return
    text = f"{rows['replayed']:,} of {rows['rows']:,} rows replayed"
    out = [f"{count:,} {LEFT_OUT[reason]}" for reason, count in rows["left_out"].items()
           if count]
    if out:
        text += "; left out: " + ", ".join(out)
    if rows["ended_at_trace_end"]:
        text += f"; {rows['ended_at_trace_end']:,} without an end ran to the trace's end"
    table.add_row("trace", text)


def _print_run(summary: dict[str, Any], out_dir: Path, price_label: str = "assumed") -> None:
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
        table.add_row("price", f"${cluster['price_per_hour_usd']:,.2f}/h for "
                      f"{_plural(cluster['instances'], 'instance')} ({price_label})")
    if cluster["chip_power_kw"] is not None:
        table.add_row("chip power", f"{cluster['chip_power_kw']:,.1f} kW")
    jobs = summary["jobs"]
    if "fleet_day" in summary:  # the fleet-level model: its own rows
        _fleet_day_rows(table, summary)
        jobs = {}
    elif len(jobs) > 8:
        _summarise_many_jobs(table, summary)
        jobs = {}
    for name, job in jobs.items():
        _job_rows(table, name, job)
    if "fleet_day" not in summary:
        _deployment_rows(table, summary)
    failures = cluster.get("failures") or {}
    if failures:
        table.add_row("failures", ", ".join(
            f"{k} {_with_ci(failures, k, lambda v: f'{v:,.1f}'.removesuffix('.0'))}"
            for k, v in failures.items() if not k.endswith("_ci95") and v))
    _serving_row(table, summary)
    _trace_rows_row(table, summary)
    if "utilisation" in cluster and summary["jobs"]:
        table.add_row("training", f"{_with_ci(cluster, 'utilisation', _percent)} of chip-time "
                      f"held by jobs, {_with_ci(cluster, 'useful_utilisation', _percent)} useful")
    if cluster.get("serving_utilisation") is not None:  # fluid deployments' holdings
        serving = summary["serving"]
        table.add_row("serving", f"{_with_ci(cluster, 'serving_utilisation', _percent)} of "
                      f"chip-time held by serving ({serving['chip_hours']:,.0f} chip-hours), "
                      f"{_money(serving['cost_per_million_output_tokens_usd'], 'per M output tokens')}"
                      f"; idle or down {cluster['idle_or_down_share']:.1%}")
    if summary.get("replications", 1) > 1:
        table.caption = (f"mean ± 95% interval over {summary['replications']} replications; a "
                         "figure without ± is the same in every replication" + (
                             ", but the serving deployments' figures, which are the first "
                             "replication's" if "serving_replication" in summary
                             else ""))
        table.caption_justify = "left"
    out_console.print(table)
    out_console.print(f"simulated {_horizon(summary['simulated_s'])}; wrote "
                      f"{escape(str(out_dir))}/summary.json in {summary['wall_s']:.2f} s")


def _horizon(seconds: float) -> str:
    """The simulated horizon in the unit that reads best: `10 min`, `7.0 days`."""
    if seconds >= 86400:
        return f"{seconds / 86400:,.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} hours"
    if seconds >= 60:
        return f"{seconds / 60:,.1f} minutes"
    return f"{seconds:,.1f} s"


