"""The models on their own, without the timeline: `step` (one training step per job) and
`collective` (one collective across sizes, as nccom-test prints it)."""

from __future__ import annotations

import json
import math
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


@user_errors
def step(
    scenario: ScenarioArg,
    overrides: SetOption = None,
    json_out: JsonOption = False,
    ignore_memory: Annotated[bool, typer.Option(
        "--ignore-memory", help="Show the step figures of a job that does not fit in memory "
                                "(and exit 0).")] = False,
    timeline: Annotated[Path | None, typer.Option(
        "--timeline", help="Also write the step of each job as a Chrome trace event file "
                           "(open it in ui.perfetto.dev or chrome://tracing).",
        show_default=False)] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace the --timeline file if it exists.")] = False,
) -> None:
    """Per job: one training step's time and where it goes, tokens/s, MFU, memory, fit.
    Exit 2 when a job does not fit in its chips' memory (and no --timeline is written),
    unless --ignore-memory."""
    from clustersim.runner.api import step_profiles, topology_for
    from clustersim.scenario.loader import load_scenario

    if timeline is not None:
        _check_timeline(timeline, force)  # before the work
    spec = load_scenario(scenario, overrides or [])
    if not spec.jobs:
        raise UsageProblem(f"{scenario}: the scenario has no jobs; expected training jobs "
                           "(`jobs:`) for a step" + (" (its `serve:` deployments are "
                                                     "simulated by `run`)" if spec.serve else ""))
    topology = topology_for(spec)
    profiles = step_profiles(spec, topology)
    too_big = [job.name for job in spec.jobs if not profiles[job.name].fits_memory]
    if json_out:
        print(json.dumps({"jobs": [{**profiles[job.name].as_dict(),
                                    "parameters": job.model.parameter_count(),
                                    "active_parameters": job.model.active_parameters}
                                   for job in spec.jobs]}, indent=2, allow_nan=False))
    else:
        for job in spec.jobs:
            _print_step(job, profiles[job.name], spec, ignore_memory)
    if timeline is not None and not (too_big and not ignore_memory):
        from clustersim.runner.views import write_step_timeline

        write_step_timeline(spec, timeline, force, topology=topology)
        err_console.print(f"wrote {escape(str(timeline))}: one step per job, for "
                          "ui.perfetto.dev or chrome://tracing", soft_wrap=True)
    if too_big and not ignore_memory:
        err_console.print(f"[bold red]error: {escape(', '.join(too_big))} "
                          f"{'does' if len(too_big) == 1 else 'do'} not fit in memory[/bold red]"
                          " (exit 2; --ignore-memory shows the step figures anyway)",
                          soft_wrap=True)
        raise typer.Exit(2)


def _check_timeline(path: Path, force: bool) -> None:
    from clustersim.runner.outputs import OutputDirError, check_output_file

    try:
        check_output_file(path, force, "the step timeline")
    except OutputDirError as error:
        raise UsageProblem(f"--timeline {error}") from None


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
        from clustersim.runner.budget import fit_remedies

        out_console.print(f"[bold red]DOES NOT FIT: job {escape(profile.name)} needs "
                          f"{memory['total']:,.1f} GiB per chip, the chip has "
                          f"{memory['hbm']:,.0f} GiB[/bold red] ({fit_remedies(job)} "
                          "would help)", soft_wrap=True)


def _instances(count: int, name: str) -> str:
    """A count of instances by their name: EC2 types stay as they are (4 trn2.48xlarge),
    a word takes the plural (36 trn3-gen2 servers)."""
    plural = count != 1 and name.endswith(" server")
    return f"{count:,} {name}{'s' if plural else ''}"


def _experts(par: Any) -> str:
    """ep, and the rank order where it puts the expert groups next to tensor parallelism."""
    if par.ep == 1:
        return ""
    inside = f", order {par.order}" if par.order != "tp-cp-pp-dp" else ""
    return f" (ep {par.ep}{inside})"


def _print_step(job: Any, profile: Any, spec: Any, ignore_memory: bool = False) -> None:
    _print_memory(job, profile, spec)
    if not profile.fits_memory and not ignore_memory:
        return
    par = job.parallelism
    title = (f"{profile.name}: {job.model.name} ({_parameters(job.model)}) on "
             f"{profile.chips:,} {spec.hardware.chip.name} "
             f"chips ({_instances(profile.instances, spec.hardware.instance.name)}), tp {par.tp} x "
             f"{f'cp {par.cp} x ' if par.cp > 1 else ''}pp {par.pp}"
             f"{f' (x{par.interleave} interleaved)' if par.interleave > 1 else ''}"
             f" x dp {par.dp}{_experts(par)}, {profile.microbatches} micro-batches of "
             f"{job.micro_batch}")
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
    low, high = profile.step_time_s_band
    memory = profile.memory.as_gib()
    facts = Table(show_header=False)
    facts.add_column(style="bold")
    facts.add_column()
    facts.add_row("expected band", f"{low:,.3f} to {high:,.3f} s per step (the largest under- "
                  "and over-prediction of this chip family's published rows)")
    facts.add_row("throughput", f"{profile.tokens_per_s:,.0f} tokens/s, "
                  f"{profile.sequences_per_s:,.2f} sequences/s")
    facts.add_row("MFU / HFU", f"{profile.mfu:.1%} / {profile.hfu:.1%} of {job.precision} peak")
    fit = "[green]fits[/green]" if profile.fits_memory else (
        "[bold red]DOES NOT FIT (figures shown with --ignore-memory)[/bold red]")
    facts.add_row("memory per chip", f"{memory['total']:,.1f} of {memory['hbm']:,.0f} GiB, {fit}")
    if profile.energy_per_token_j is not None:
        facts.add_row("chip energy", f"{profile.energy_per_token_j:.3f} J/token per step (ideal)")
    if profile.cost_per_million_tokens_usd is not None:
        from clustersim.hardware.prices import price_basis

        facts.add_row("cost", f"${profile.cost_per_million_tokens_usd:,.3f} per million tokens "
                      f"per step (ideal; price: {price_basis(spec.hardware)})")
    out_console.print(facts)
    if profile.cost_per_million_tokens_usd is not None or profile.energy_per_token_j is not None:
        out_console.print("Ideal: a step's chip-time over its tokens. `clustersim run` adds the "
                          "effective figures over the run (chip-hours held over tokens trained, "
                          "lost time included).")


def _parameters(model: Any) -> str:
    """`8.0B parameters`, or for a mixture `671.0B parameters, 37.6B active`."""
    text = f"{model.parameter_count() / 1e9:,.1f}B parameters"
    if model.active_parameters != model.parameter_count():
        text += f", {model.active_parameters / 1e9:,.1f}B active"
    return text


def _parse_sizes(text: str) -> list[float]:
    """`32MB`, `1KiB:1GiB` (doubling) or `1KiB:1GiB:4` (factor 4), as nccom-test's -b/-e/-f."""
    from clustersim.hardware import units

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


@user_errors
def collective(
    hardware_name: Annotated[str, typer.Option("--hardware", help="Catalog entry, e.g. trn2.")],
    op: Annotated[str, typer.Option(help="all-reduce, all-gather, reduce-scatter, all-to-all, "
                                         "broadcast or send-recv (nccom-test names work too).")],
    ranks: Annotated[int, typer.Option(help="Ranks taking part.", min=1)],
    instances: Annotated[
        int | None, typer.Option(help="Instances to spread them over.", show_default="as few as fit",
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
    from clustersim.hardware.build import build_topology
    from clustersim.hardware.catalog import catalog_entry, catalog_names

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
                          "rows": [_finite(r) for r in rows]}, indent=2, allow_nan=False))
        return
    table = Table(
        title=f"{op_name} over {ranks} ranks on {_instances(wanted, spec.instance.name)} "
              f"({len(group.chips)} chips, {group.ranks_per_chip} ranks each)",
        title_justify="left",
    )
    for column in ("size(B)", "algorithm", "steps", "time(us)", "algbw(GB/s)", "busbw(GB/s)"):
        table.add_column(column, justify="left" if column == "algorithm" else "right",
                         no_wrap=column in ("size(B)", "algorithm"))
    for row in rows:
        table.add_row(f"{row['bytes']:,}", row["algorithm"], str(row["steps"]),
                      f"{row['time_us']:,.1f}", _bandwidth(row["algbw_gbyte_per_s"]),
                      _bandwidth(row["busbw_gbyte_per_s"]))
    out_console.print(table)
    finite = [r["busbw_gbyte_per_s"] for r in rows if math.isfinite(r["busbw_gbyte_per_s"])]
    if finite:
        out_console.print(f"Avg bus bandwidth: {sum(finite) / len(finite):.4f} GB/s")
    else:
        out_console.print("Avg bus bandwidth: - (one rank moves nothing)")


def _bandwidth(value: float) -> str:
    """GB/s for the table; '-' where there is none (one rank moves nothing in no time)."""
    return f"{value:.2f}" if math.isfinite(value) else "-"


def _finite(row: dict) -> dict:
    """A row for strict JSON: a collective that moves nothing (one rank) takes no time and has
    no finite bandwidth (null)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in row.items()}
