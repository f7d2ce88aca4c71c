"""`clustersim plan`: the best parallelism, size and hardware for a scenario's first job,
failures included. A thin shell over `clustersim.planning.plan`; it parses the flags, picks
the engine and writes OUT through the runner's atomic output folders."""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from clustersim.cli.common import (
    JsonOption,
    ScenarioArg,
    SetOption,
    UsageProblem,
    err_console,
    out_console,
    user_errors,
)

_DECIMAL = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_count(text: str, what: str, binary: bool = False) -> float:
    """`15T` (decimal prefixes; `binary` for batch sizes: 16M = 16 x 2^20) -> a number."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGBTP]?)\s*(tokens?)?\s*",
                         text, flags=re.IGNORECASE)
    prefixes = _BINARY if binary else _DECIMAL
    if match is None or match.group(2).upper() not in prefixes:
        raise UsageProblem(f"{what} {text!r}: expected a count such as "
                           f"{'2048 (sequences) or 16M (tokens)' if binary else '15T'}")
    value = float(match.group(1)) * prefixes[match.group(2).upper()]
    if not math.isfinite(value) or value <= 0:
        raise UsageProblem(f"{what} {text!r}: expected a positive, finite count")
    return value


def parse_chips(text: str) -> tuple[int, ...]:
    """`4096`, `1024,2048,4096`, `1024:16384` (doubling from A to B, B included) or
    `1024:4096:512` (A to B by S). Every count at most limits.MAX_CHIPS and at most
    limits.MAX_PLAN_SIZES of them, checked before any list is made."""
    from clustersim.hardware import limits

    usage = (f"--chips {text!r}: expected N, A,B,C, LOW:HIGH (doubling) or LOW:HIGH:STEP with positive "
             "whole numbers")
    if len(text) > 10_000:
        raise UsageProblem(usage)
    try:
        parts = [int(p) for p in text.split(":" if ":" in text else ",")]
    except ValueError:
        raise UsageProblem(usage) from None
    if not parts or min(parts) <= 0 or (":" in text and (len(parts) not in (2, 3)
                                                        or parts[0] > parts[1])):
        raise UsageProblem(usage)
    largest = parts[1] if ":" in text else max(parts)
    if largest > limits.MAX_CHIPS:
        raise UsageProblem(f"--chips {text!r}: {largest:,} chips; expected at most "
                           f"{limits.MAX_CHIPS:,} (docs/limits.md)")
    if ":" in text:
        first, last = parts[0], parts[1]
        if len(parts) == 3:
            count = (last - first) // parts[2] + 1
        else:
            count = (last // first).bit_length() + 1
    else:
        count = len(set(parts))
    if count > limits.MAX_PLAN_SIZES:
        raise UsageProblem(f"--chips {text!r}: {count:,} sizes; expected at most "
                           f"{limits.MAX_PLAN_SIZES} (docs/limits.md)")
    if ":" not in text:
        return tuple(sorted(set(parts)))
    if len(parts) == 3:
        return tuple(range(first, last + 1, parts[2]))
    out, chips = [], first
    while chips < last:
        out.append(chips)
        chips *= 2
    return tuple(out + [last])


def default_plan_dir(name: str) -> Path:
    """results/plan-NAME/, without doubling a scenario's own `plan-` prefix
    (plan-trn2-vs-p5en plans into results/plan-trn2-vs-p5en/)."""
    return Path("results") / f"plan-{name.removeprefix('plan-')}"


def _duration(text: str | None, what: str) -> float | None:
    if text is None:
        return None
    from clustersim.hardware.units import UnitError, parse_duration

    try:
        value = parse_duration(text)
    except UnitError as error:
        raise UsageProblem(f"{what} {text!r}: {error}") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageProblem(f"{what} {text!r}: expected a positive duration such as 60d")
    return value


@user_errors
def plan(
    scenario: ScenarioArg,
    hardware: Annotated[str | None, typer.Option(
        help="Hardware to compare, comma-separated catalog names [default: the scenario's].")
    ] = None,
    chips: Annotated[str | None, typer.Option(
        # LOW:HIGH, not A:B: the help is rich markup, where `:B:` is an emoji code
        help="Chip counts: N, A,B,C, LOW:HIGH (doubling) or LOW:HIGH:STEP [default: the "
        "scenario's].")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model preset instead of the job's.")] = None,
    global_batch: Annotated[str | None, typer.Option(
        help="Global batch: sequences (2048) or tokens (16M, binary prefixes).")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Sequence length.", min=1)] = None,
    objective: Annotated[str, typer.Option(
        help="step, cost, energy or time-to-train.")] = "step",
    tokens: Annotated[str | None, typer.Option(help="Token budget to train, e.g. 15T.")] = None,
    deadline: Annotated[str | None, typer.Option(help="Train the tokens by then, e.g. 60d.")
                        ] = None,
    budget: Annotated[float | None, typer.Option(help="Most USD to spend on the tokens.")
                      ] = None,
    max_chips: Annotated[int | None, typer.Option(help="Largest size to consider.", min=1)
                         ] = None,
    memory_headroom: Annotated[float | None, typer.Option(
        help="Fraction of HBM kept free for the runtime and fragmentation [default: 0.10, "
        "catalog/planning.yaml].", min=0.0, max=0.9)] = None,
    top: Annotated[int, typer.Option(help="Candidates to show and print.", min=1)] = 10,
    engine: Annotated[str, typer.Option(help="local or ray.")] = "local",
    workers: Annotated[int | None, typer.Option(help="Processes (at most the cores).",
                                                show_default="cores", min=1)
                       ] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster address.")] = None,
    out: Annotated[Path | None, typer.Option(
        "-o", "--out", help="Output directory [default: results/plan-NAME/].")] = None,
    write_scenario: Annotated[Path | None, typer.Option(
        help="Write the best candidate as a scenario file.")] = None,
    overrides: SetOption = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty OUT / the file.")
                     ] = False,
    json_out: JsonOption = False,
    serve: Annotated[str | None, typer.Option(
        "--serve", help="Plan this serving deployment instead of the first job [default: the "
        "first deployment of a scenario without jobs].")] = None,
    goodput: Annotated[float, typer.Option(
        help="Serving: share of requests that must meet the SLO.", min=0.01, max=1.0)] = 0.99,
) -> None:
    """Search parallelism, size and hardware for the first job (failure-aware time and cost),
    or for a serving deployment (replica shape, batch limit and replicas at its load and SLO,
    by cost per million output tokens)."""
    from clustersim.planning import PlanOptions
    from clustersim.planning.outputs import write_scenario as write_best
    from clustersim.scenario.loader import load_scenario

    sets = list(overrides or [])
    if model is not None:
        sets.append(f"jobs.0.model={model}")
    if seq_len is not None:
        sets.append(f"jobs.0.seq_len={seq_len}")
    if global_batch is not None:
        if re.fullmatch(r"\s*[0-9]+\s*", global_batch):
            sets.append(f"jobs.0.global_batch={int(global_batch)}")
        else:
            spec = load_scenario(scenario, sets, planning=True)
            length = spec.jobs[0].sequence_length if spec.jobs else 1
            batch_tokens = parse_count(global_batch, "--global-batch", binary=True)
            if batch_tokens % length:
                raise UsageProblem(f"--global-batch {global_batch!r}: {batch_tokens:,.0f} tokens "
                                   f"is not a whole number of sequences of {length}")
            sets.append(f"jobs.0.global_batch={int(batch_tokens // length)}")
    if serve is not None or _serving_only(scenario, sets):
        given = {"--chips": chips, "--model": model, "--global-batch": global_batch,
                 "--seq-len": seq_len, "--tokens": tokens, "--deadline": deadline,
                 "--budget": budget, "--max-chips": max_chips}
        training_only = [k for k, v in given.items() if v is not None]
        if objective != "step":
            training_only.append("--objective")
        if training_only:
            raise UsageProblem(f"{', '.join(training_only)}: training options; a serving plan "
                               "takes --hardware, --serve, --goodput, --top, -o, "
                               "--write-scenario, --set and --json")
        _plan_serving(scenario, sets, hardware, serve, goodput, top, out, write_scenario, force,
                      json_out)
        return
    if engine not in ("local", "ray"):
        raise UsageProblem(f"--engine {engine!r}: expected local or ray")
    if address is not None and engine != "ray":
        raise UsageProblem(f"--address {address!r}: a Ray cluster address, used only with "
                           "--engine ray")
    if engine == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise UsageProblem("--engine ray needs Ray: pip install -e '.[ray]'")
    spec = load_scenario(scenario, sets, planning=True)
    options = PlanOptions(
        hardware=tuple(h.strip() for h in hardware.split(",") if h.strip()) if hardware else (),
        chips=parse_chips(chips) if chips else (), objective=objective,
        tokens=parse_count(tokens, "--tokens") if tokens else None,
        deadline_s=_duration(deadline, "--deadline"), budget_usd=budget, max_chips=max_chips,
        top=top, **({} if memory_headroom is None else {"memory_headroom": memory_headroom}),
    )
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise UsageProblem(f"--budget {budget}: expected a positive amount of USD")
    out_dir = out if out is not None else default_plan_dir(spec.name)
    with _scenario_file(write_scenario, out_dir, force) as (temporary, commit):
        also = None if temporary is None else (lambda r: (write_best(r, temporary), commit()))
        result = _plan_into(spec, options, engine, workers, address, out_dir, force, scenario,
                            also)
    if json_out:
        print(json.dumps(result.as_json(), indent=2))
        return
    _print_plan(result, out_dir, write_scenario)


@contextlib.contextmanager
def _scenario_file(write_scenario: Path | None, out_dir: Path, force: bool) -> Iterator[Any]:
    """Check OUT and --write-scenario before any work (as `run` checks OUT) and hold the
    file's lock; yields (temporary, commit), or (None, None) without --write-scenario."""
    from clustersim.runner.outputs import (
        OutputDirError,
        atomic_output_file,
        check_output_dir,
        check_output_file,
    )

    resolved_out = check_output_dir(out_dir, force)
    if write_scenario is None:
        yield None, None
        return
    try:
        target = check_output_file(write_scenario, force, "the planned scenario")
    except OutputDirError as error:
        raise UsageProblem(f"--write-scenario {error}") from None
    if target == resolved_out or resolved_out in target.parents:
        raise UsageProblem(f"--write-scenario {write_scenario}: is -o {out_dir} or inside it; "
                           "expected a file elsewhere, e.g. scenarios/NAME.yaml")
    with atomic_output_file(write_scenario, force, "the planned scenario") as pair:
        yield pair


def _plan_into(spec: Any, options: Any, engine: str, workers: int | None, address: str | None,
               out_dir: Path, force: bool, scenario: Path, also: Any = None) -> Any:
    """Search, then write OUT (and, through `also`, the planned scenario) as one step: `also`
    runs last inside OUT's staging, so a failure of either leaves neither."""
    from clustersim.planning import Engine, PlanError
    from clustersim.planning import plan as make_plan
    from clustersim.planning.outputs import write_plan
    from clustersim.runner.outputs import atomic_output_dir

    try:
        with Engine(engine, workers, address) as runner, _progress() as progress:
            result = make_plan(spec, options, runner, progress)
    except PlanError as error:
        raise UsageProblem(f"{scenario}: {error}") from None
    with atomic_output_dir(out_dir, force=force) as staging:
        write_plan(result, staging)
        if also is not None:
            also(result)
    return result


class _progress:
    """Simulations done against those that may be needed, on stderr, only on a terminal."""

    def __enter__(self) -> Any:
        if not err_console.is_terminal:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self._bar = Progress("plan: {task.description}", BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), console=err_console, transient=True)
        self._bar.start()
        self._task = self._bar.add_task("starting", total=None)

        def update(done: int, total: int, what: str = "simulating candidates") -> None:
            self._bar.update(self._task, completed=done, total=total, description=what)

        return update

    def __exit__(self, *exc: Any) -> None:
        if getattr(self, "_bar", None) is not None:
            self._bar.stop()


def _serving_only(scenario: Path, sets: list[str]) -> bool:
    """A scenario with deployments and no jobs is planned as serving."""
    from clustersim.scenario.loader import load_scenario

    spec = load_scenario(scenario, sets, planning=True)
    return bool(spec.serve) and not spec.jobs and spec.workload is None


def _plan_serving(scenario: Path, sets: list[str], hardware: str | None, serve: str | None,
                  goodput: float, top: int, out: Path | None, write_scenario: Path | None,
                  force: bool, json_out: bool) -> None:
    """The serving planner (clustersim.runner.serving_plan): the cheapest configuration per
    hardware meeting the deployment's SLO at its load."""
    import yaml

    from clustersim.runner.outputs import atomic_output_dir
    from clustersim.runner.serving_plan import (
        ServingPlanError,
        ServingPlanOptions,
        plan_serving,
        serving_plan_scenario,
        write_serving_plan,
    )
    from clustersim.scenario.loader import load_scenario

    spec = load_scenario(scenario, sets)
    out_dir = out if out is not None else default_plan_dir(spec.name)
    options = ServingPlanOptions(
        hardware=tuple(h.strip() for h in hardware.split(",") if h.strip()) if hardware else (),
        deployment=serve, goodput=goodput, top=top)
    with _scenario_file(write_scenario, out_dir, force) as (temporary, commit):
        try:
            result = plan_serving(spec, options, Path(scenario).parent)
        except ServingPlanError as error:
            raise UsageProblem(f"{scenario}: {error}") from None
        with atomic_output_dir(out_dir, force=force) as staging:
            write_serving_plan(result, staging)
            if temporary is not None:  # last inside OUT's staging: both or neither
                text = yaml.safe_dump(serving_plan_scenario(result), sort_keys=False)
                temporary.write_text("# Written by `clustersim plan` (serving).\n" + text,
                                     encoding="utf-8")
                commit()
    if json_out:
        print(json.dumps(result.as_json(), indent=2))
        return
    _print_serving_plan(result, out_dir, write_scenario)


def _print_serving_plan(result: Any, out_dir: Path, written: Path | None) -> None:
    d = next(x for x in result.scenario.serve if x.name == result.deployment)
    table = Table(title=escape(
        f"serving plan for {d.name} ({d.model.name}) at {result.load_rate_per_s:,.3g} "
        f"requests/s, SLO TTFT {d.slo.ttft_s:g} s and TPOT {d.slo.tpot_s:g} s for "
        f"{result.options.goodput:.0%} of requests: top {min(result.options.top, len(result.ranked))}"
        f" of {len(result.ranked):,} that hold the load"), title_justify="left")
    for name in ("#", "hardware", "tp pp", "per inst", "max batch", "replicas", "instances",
                 "chips", "$/h", "TTFT p99", "TPOT p99", "in SLO", "$/M out tok", "capacity/replica",
                 "$/M at capacity"):
        table.add_column(name, justify="left" if name == "hardware" else "right", no_wrap=True)
    for rank, r in enumerate(result.ranked[: result.options.top], start=1):
        capacity = r.get("capacity_rate_per_s")
        at_capacity = r.get("cost_per_million_output_tokens_at_capacity_usd")
        cost = r.get("cost_per_million_output_tokens_usd")
        table.add_row(
            str(rank), r["hardware"], f"{r['tp']} {r['pp']}", str(r["replicas_per_instance"]),
            str(r["max_batch"]), f"{r['replicas']:,}", f"{r['instances']:,}",
            f"{r['chips']:,}", "-" if r["usd_per_h"] is None else f"{r['usd_per_h']:,.2f}",
            f"{r['ttft_p99_s']:.3g} s", f"{r['tpot_p99_s']:.3g} s",
            f"{r['slo_goodput']:.1%}", "-" if cost is None else f"${cost:,.2f}",
            "-" if capacity is None else f"{capacity:,.3g}/s",
            "-" if at_capacity is None else f"${at_capacity:,.2f}")
    from rich.console import Console

    Console(highlight=False, emoji=False, width=max(out_console.width, 200),
            file=out_console.file).print(table)
    rows = result.rows
    pruned = rows[rows["status"] == "pruned"]["why"].str.split(":").str[0].value_counts()
    out_console.print(f"considered {result.considered:,}, pruned {result.pruned:,} ("
                      + ", ".join(f"{n:,} {why}" for why, n in pruned.items())
                      + f"), simulated {result.simulated:,}")
    for name, r in result.best_per_hardware().items():
        cost = r.get("cost_per_million_output_tokens_usd")
        at_capacity = r.get("cost_per_million_output_tokens_at_capacity_usd")
        out_console.print(
            f"{name} at its best: {r['replicas']:,} replica(s) of tp {r['tp']} pp {r['pp']}, "
            f"max batch {r['max_batch']}, on {r['instances']:,} instance(s) ("
            + (f"{r['chips']:,} chips, no price" if r["usd_per_h"] is None
               else f"${r['usd_per_h']:,.2f}/h")
            + f"): TTFT p99 {r['ttft_p99_s']:.3g} s, TPOT p99 {r['tpot_p99_s']:.3g} s, "
            f"{r['slo_goodput']:.1%} within the SLO"
            + ("" if cost is None else f", ${cost:,.2f} per million output tokens at the load")
            + ("" if at_capacity is None else
               f"; ${at_capacity:,.2f} at its capacity of {r['capacity_rate_per_s']:,.3g} "
               "requests/s per replica"))
    for note in result.notes:
        err_console.print(f"note: {escape(note)}")
    out_console.print(f"wrote {out_dir}/ (plan.parquet, plan.json, pareto.png)"
                      + (f" and {written}" if written else ""))


def _fmt(value: Any, kind: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if kind == "days":
        return f"{value / 86400:,.1f} d"
    if kind == "usd":
        return f"${value:,.0f}" if value >= 100 else f"${value:,.2f}"
    if kind == "energy":
        return f"{value / 3.6e9:,.1f} MWh" if value >= 3.6e9 else f"{value / 3.6e6:,.2f} kWh"
    return str(value)


def _print_plan(result: Any, out_dir: Path, written: Path | None) -> None:
    from clustersim.hardware import units

    job = result.scenario.jobs[0]
    tokens = result.options.tokens
    if not result.met:
        out_console.print(f"[bold]{escape(result.notes[0])}[/bold]; the closest candidates:")
    table = Table(title=escape(f"plan for {job.model.name} (objective: {result.options.objective}"
                               f"{f', {tokens:.3g} tokens' if tokens else ''}): top "
                               f"{min(result.options.top, len(result.ranked))} of "
                               f"{result.simulated:,} simulated"), title_justify="left")
    experts = job.model.moe  # a mixture's table shows its exposed all-to-all
    for name in ("#", "hardware", "chips", "tp cp pp dp ep v", "mb", "recompute", "sp zero",
                 "step s", *(("a2a s",) if experts else ()), "MFU", "GiB/chip", "ETTR",
                 "time to train" if tokens else "s per 1M tok",
                 "cost" if tokens else "$ per 1M tok",
                 "energy" if tokens else "kWh per 1M tok"):
        table.add_column(name, justify="left" if name in ("hardware", "recompute") else "right",
                         no_wrap=True)
    for rank, r in enumerate(result.ranked[: result.options.top], start=1):
        wall = r["time_to_train_s"] if tokens else (
            1e6 / (r["tokens_per_s"] * r["ettr"]) if r["ettr"] > 0 else math.inf)
        table.add_row(
            str(rank), r["hardware"], f"{r['chips']:,}",
            f"{r['tp']} {r['cp']} {r['pp']} {r['dp']} {r['ep']} {r['interleave']}",
            str(r["micro_batch"]), r["recompute"],
            f"{'y' if r['sequence_parallel'] else 'n'} {r['zero']}",
            f"{r['step_time_s']:,.3f}",
            *((f"{r.get('all_to_all_s') or 0.0:,.3f}",) if experts else ()),
            f"{r['mfu']:.1%}", f"{r['memory_per_chip_gib']:.1f}",
            f"{r['ettr']:.3f}", _fmt(wall, "days") if tokens else f"{wall:,.1f}",
            _fmt(r["cost_usd"], "usd"),
            _fmt(r["energy_j"], "energy") if tokens else (
                "-" if r["energy_j"] is None else f"{r['energy_j'] / 3.6e6:,.2f}"),
        )
    from rich.console import Console

    wide = Console(highlight=False, width=max(out_console.width, 160))
    wide.print(table)
    if result.sites is not None:
        _print_sites(result.sites)
    rows = result.rows
    pruned = rows[rows["status"] == "pruned"]["why"].str.split(":").str[0].value_counts()
    out_console.print(f"considered {result.considered:,}, pruned {result.pruned:,} ("
                      + ", ".join(f"{n:,} {why}" for why, n in pruned.items())
                      + f"), simulated {result.simulated:,}")
    reference = rows[rows["reference"] & rows["step_time_s"].notna()]
    if len(reference):
        ref = reference.iloc[0]
        best = result.best
        same = best["hardware"] == ref["hardware"] and best["chips"] == ref["chips"]
        fit = f" (pruned: {ref['why']})" if ref["why"] else ""
        gain = (f"; the best takes {best['step_time_s']:,.3f} s, "
                f"{1 - best['step_time_s'] / ref['step_time_s']:.1%} less" if same else "")
        out_console.print(f"the scenario's own configuration: {ref['step_time_s']:,.3f} s per "
                          f"step{fit}{gain}")
    names = list(dict.fromkeys(g.name for g in result.groups))
    if len(names) > 1:
        for name in names:
            mine = [r for r in result.ranked if r["hardware"] == name]
            if not mine:
                out_console.print(f"{name}: no feasible candidate")
                continue
            r = mine[0]
            band = r.get("step_time_s_band")
            out_console.print(
                f"{name} at its best: {r['chips']:,} chips, tp {r['tp']} pp {r['pp']} dp "
                f"{r['dp']}, {r['step_time_s']:,.3f} s per step"
                + (f" (band {band[0]:,.3f}-{band[1]:,.3f} s)" if band else "")
                + f", ETTR {r['ettr']:.3f}"
                + (f", ${r['cost_per_million_tokens_usd']:,.3f} per million tokens"
                   if r.get("cost_per_million_tokens_usd") is not None else ""))
    for group in result.groups:
        rec = group.recovery[False]
        mine = [r for r in result.ranked if r["hardware"] == group.name
                and r["chips"] == group.chips]
        best_here = ""
        if mine:
            r = mine[0]
            best_here = f", ETTR {r['ettr']:.3f}" + (
                f", time to train {r['time_to_train_s'] / 86400:,.1f} d at best"
                if r["time_to_train_s"] is not None else "")
        out_console.print(
            f"{group.name} x {group.chips:,} chips: job MTBF "
            f"{units.format_duration(rec.mtbf_s) if math.isfinite(rec.mtbf_s) else 'none'}, "
            f"recovery {units.format_duration(rec.recovery_s)} per failure{best_here}"
            f"{' (MTBF below recovery: more chips do not pay)' if rec.mtbf_s < rec.recovery_s else ''}")
    for name, chips in result.stops_paying.items():
        if chips is not None:
            out_console.print(f"{name}: more chips stop paying past {chips:,} chips (time to "
                              f"train no longer falls)")
    for note in result.notes[0 if result.met else 1:]:
        err_console.print(f"note: {escape(note)}")
    out_console.print(f"wrote {out_dir}/ (plan.parquet, plan.json, pareto.png)"
                      + (f" and {written}" if written else ""))


def _print_sites(sites: dict[str, Any]) -> None:
    """The spread and one-site options on a cluster of several sites (planning.sites)."""
    if sites["fits_one_site"]:
        out_console.print(f"sites: the best fits in one site ({sites['job_chips']:,} chips of "
                          f"the largest site's {sites['largest_site_chips']:,})")
        return
    table = Table(title=f"over {sites['sites']} sites: {sites['job_chips']:,} chips, more than "
                  f"the largest site's {sites['largest_site_chips']:,}", title_justify="left")
    for name in ("option", "chips", "dp", "step s", "tokens/s", "$ per 1M tok"):
        table.add_column(name, justify="left" if name == "option" else "right")
    for row in sites["options"]:
        cost = row["cost_per_million_tokens_usd"]
        table.add_row(escape(row["option"]), f"{row['chips']:,}", f"{row['dp']:,}",
                      f"{row['step_time_s']:,.3f}", f"{row['tokens_per_s']:,.0f}",
                      "-" if cost is None else f"{cost:,.3f}")
    out_console.print(table)
    for row in sites["options"]:
        if "convergence_factor" in row:
            out_console.print(f"{escape(row['option'])}: convergence factor "
                              f"{row['convergence_factor']:g} (set in jobs.0.cross_site_sync, "
                              f"not modelled): {row['tokens_per_s_at_equal_loss']:,.0f} tokens/s "
                              "at equal loss")
