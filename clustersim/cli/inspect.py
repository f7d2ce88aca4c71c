"""Looking without simulating: `validate`, `topology`, `hardware` and `schema`."""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.measure import Measurement
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
def validate(
    scenarios: Annotated[list[Path], typer.Argument(help="Scenario files.", show_default=False)],
    overrides: SetOption = None,
) -> None:
    """Check scenario files without simulating."""
    from clustersim.scenario.loader import ScenarioError, load_scenario

    failed = 0
    for path in scenarios:
        try:
            # A first job without parallelism is a scenario for `plan` (which chooses it).
            spec = load_scenario(path, overrides or [], planning=True)
            if spec.serve:  # the checks `run` makes before any work, and its traces' rows
                from clustersim.runner.api import check_serving_fit
                from clustersim.runner.budget import check_request_traces
                from clustersim.serving import check_request_trace_rows

                check_request_traces(spec)
                check_serving_fit(spec)
                check_request_trace_rows(spec, path.parent)
        except ScenarioError as error:
            failed += 1
            err_console.print(f"[red]error:[/red] {escape(str(error))}", soft_wrap=True)
            continue
        for_plan = bool(spec.jobs) and "parallelism" not in spec.jobs[0].model_fields_set
        out_console.print(
            f"ok: {escape(str(path))} ({spec.name}: {spec.total_chips:,} {spec.hardware.chip.name} chips, "
            f"{_count(len(spec.jobs), 'job')}"
            + (f", {_count(len(spec.serve), 'deployment')})" if spec.serve else ")")
            + (" for `plan`: jobs.0.parallelism is left to the planner (`run` needs it)"
               if for_plan else "")
        )
    if failed:
        raise typer.Exit(2)


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'s' if number != 1 else ''}"


@user_errors
def topology(
    scenario: ScenarioArg,
    overrides: SetOption = None,
    json_out: JsonOption = False,
    draw: Annotated[
        Path | None, typer.Option("--draw", help="Draw the first UltraServer (or instance) "
                                                 "as a PNG to this path.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --draw file."
                                        )] = False,
) -> None:
    """Chips, instances, UltraServers, links by kind, per-chip bandwidths, fabric bisection."""
    from clustersim.hardware import units
    from clustersim.runner.api import topology_for
    from clustersim.scenario.loader import load_scenario

    spec = load_scenario(scenario, overrides or [])
    if draw is not None and draw.suffix.lower() != ".png":
        raise UsageProblem(f"--draw {draw}: expected a .png path")
    if draw is not None and (draw.is_dir() or not draw.parent.is_dir()):
        raise UsageProblem(f"--draw {draw}: expected a .png file in an existing folder")
    if draw is not None:
        _check_output_file(draw, force, "--draw", "the drawing")
    started = time.perf_counter()
    topo = topology_for(spec)
    topo.graph  # built on first use: this command reports it, so build it here  # noqa: B018
    build_s = time.perf_counter() - started
    if draw is not None:
        from clustersim.analysis.sites import draw_sites
        from clustersim.analysis.topology import draw_topology

        try:
            with _output_file(draw, force, "--draw", "the drawing", ".png") as (temporary,
                                                                                 commit):
                if topo.site_count > 1:  # the sites and their links (a chip would be a speck)
                    draw_sites(topo, temporary)
                else:
                    draw_topology(topo, temporary)
                commit()
        except OSError as error:
            raise UsageProblem(f"--draw {draw}: cannot write it ({error.strerror or error})"
                               ) from None
        err_console.print(f"drew {escape(str(draw))}")
    figures = topo.summary()
    figures["build_s"] = round(build_s, 3)
    figures["nodes"] = topo.graph.number_of_nodes()
    figures["edges"] = topo.graph.number_of_edges()
    if json_out:
        print(json.dumps(_without_float_noise(figures), indent=2, allow_nan=False))
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
    for site in figures.get("sites", []):
        joined = ", ".join(f"{other} {link['gbyte_per_s']:,.0f} GB/s {link['latency_ms']:g} ms"
                           + (" (backbone)" if link["via"] == "backbone" else "")
                           for other, link in site["links"].items())
        table.add_row(f"site {site['name']}", f"{site['chips']:,} chips ({site['spares']:,} "
                      f"spare instances), {site['leaves']:,} leaves, {site['spines']} spines; "
                      f"to {joined}")
    out_console.print(table)
    links = Table(title="links by kind", title_justify="left")
    for column in ("kind", "count", "per link, each way", "latency", "per chip (as quoted)"):
        links.add_column(column, justify="right" if column != "kind" else "left",
                         overflow="fold")
    for kind, count in figures["links"].items():
        per_chip = figures["per_chip_bandwidth_gbyte_per_s"].get(kind)
        links.add_row(
            kind, f"{count:,}", f"{figures['link_bandwidth_gbyte_per_s'][kind]:,.2f} GB/s",
            units.format_duration(figures["link_latency_us"][kind] / 1e6),
            "" if per_chip is None else f"{per_chip:,.1f} GB/s",
        )
    out_console.print(links)


@user_errors
def hardware(
    name: Annotated[str | None, typer.Argument(help="Catalog entry to print.")] = None,
    json_out: JsonOption = False,
) -> None:
    """List the hardware catalog, or print one entry with its sources."""
    from clustersim.hardware.catalog import catalog_entry, catalog_names, catalog_source_refs
    from clustersim.hardware.paths import flatten

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
    table.add_column("field", overflow="fold")
    table.add_column("value", justify="right", overflow="fold")
    table.add_column("source", overflow="fold")
    for path, value in flatten(spec.model_dump(by_alias=True, exclude={"sources"})).items():
        table.add_row(path, _show(path, value), spec.sources.get(path, ""))
    out_console.print(table)
    refs = catalog_source_refs()
    used = sorted({s.split(":")[0] for s in spec.sources.values()} & set(refs))
    for ref in used:
        out_console.print(f"[bold]{ref}[/bold]: {refs[ref]}", soft_wrap=True)


@user_errors
def models(
    name: Annotated[str | None, typer.Argument(help="Model preset to print.")] = None,
    json_out: JsonOption = False,
) -> None:
    """List the model presets (a job's or deployment's `model:`), or print one with its
    shape, parameter counts and source."""
    from clustersim.training.transformer import (
        TransformerShape,
        model_preset_names,
        model_preset_source,
        model_preset_values,
    )

    names = model_preset_names()
    if name is not None and name not in names:
        raise UsageProblem(f"unknown model {name!r}; expected one of {', '.join(names)}")
    rows, shapes = [], []
    for preset in names if name is None else [name]:
        shape = TransformerShape.model_validate(model_preset_values(preset))
        shapes.append(shape)
        fields = shape.model_dump(mode="json")
        if shape.attention == "mla":  # unused: its ranks set the widths and every head
            # reads the one latent (the defaults, hidden / heads and heads, would mislead)
            fields.update(head_dim=None, kv_heads=None)
        rows.append({**fields,
                     "parameters": shape.parameter_count(),
                     "active_parameters": shape.active_parameters,
                     "source": model_preset_source(preset)})
    if json_out:
        print(json.dumps({"models": rows} if name is None else rows[0], indent=2,
                         allow_nan=False))
        return
    if name is not None:
        row = rows[0]
        table = Table(title=f"{name}: {row['parameters'] / 1e9:,.1f}B parameters, "
                      f"{row['active_parameters'] / 1e9:,.1f}B active", title_justify="left")
        table.add_column("field", overflow="fold")
        table.add_column("value", justify="right", overflow="fold")
        skip = {"name", "parameters", "active_parameters", "source"}
        if row["attention"] == "mla":  # (its widths are qk_nope/qk_rope/v_head_dim)
            skip |= {"head_dim", "kv_heads"}
        for key, value in row.items():
            if key not in skip:
                table.add_row(key, "-" if value is None else str(value))
        out_console.print(table)
        out_console.print(f"source: {row['source']}", soft_wrap=True)
        return
    table = Table(title="model presets (docs/models.md)", title_justify="left")
    for column in ("name", "layers", "hidden", "heads", "attention", "experts", "window",
                   "params", "active"):
        table.add_column(column, no_wrap=True)
    lines = []
    for row, shape in zip(rows, shapes, strict=True):
        kv = "latent" if shape.attention == "mla" else shape.n_kv_heads  # MLA: one, shared
        heads = f"{shape.heads}" + (f"/{kv}" if kv != shape.heads else "")  # query/KV
        experts = "-" if row["experts"] <= 1 else (
            f"{row['experts']} top {row['top_k']}"
            + (f" +{row['shared_experts']}" if row["shared_experts"] else ""))
        window = "-" if row["window"] is None else f"{row['window']:,} {row['window_kind']}"
        attention = row["attention"] + (" gated" if shape.attention_gate else "")
        cells = (row["name"], str(row["layers"]), f"{row['hidden']:,}", heads,
                 attention, experts, window, f"{row['parameters'] / 1e9:,.1f}B",
                 f"{row['active_parameters'] / 1e9:,.1f}B")
        table.add_row(*cells)
        lines.append(f"[bold]{cells[0]}[/bold]: {cells[1]} layers of {cells[2]}, {cells[3]} "
                     f"query/KV heads ({cells[4]}), experts {cells[5]}, window {cells[6]}, {cells[7]} "
                     f"parameters, {cells[8]} active")
    _table_or_lines(table, "model presets (docs/models.md)", lines)


def _list_hardware(json_out: bool) -> None:
    from clustersim.hardware.catalog import catalog_entry, catalog_names

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
        print(json.dumps({"hardware": rows}, indent=2, allow_nan=False))
        return
    table = Table(title="hardware catalog (prices are assumptions: override them)",
                  title_justify="left")
    for column in ("name", "instance", "chip", "chips", "BF16 TFLOPS", "HBM", "links", "EFA",
                   "$/h"):
        table.add_column(column, no_wrap=True)
    lines = []
    for row in rows:
        chips = str(row["chips_per_instance"])
        if row["instances_per_ultraserver"] > 1:
            chips += f" x {row['instances_per_ultraserver']}"
        cells = (row["name"], row["instance"], row["chip"], chips, f"{row['bf16_tflops']:g}",
                 f"{row['hbm_gib']:.3g} GiB", row["interconnect"],
                 f"{row['efa_gbit_per_s']:,.0f} Gbps",
                 "-" if row["price_per_hour_usd"] is None else f"{row['price_per_hour_usd']:.2f}")
        table.add_row(*cells)
        lines.append(f"[bold]{cells[0]}[/bold]: {cells[1]}, {cells[3]} {cells[2]} chips, "
                     f"{cells[4]} BF16 TFLOPS and {cells[5]} HBM each, {cells[6]} links, "
                     f"{cells[7]} EFA, "
                     + ("no price" if cells[8] == "-" else f"${cells[8]}/h"))
    _table_or_lines(table, "hardware catalog (prices are assumptions: override them)", lines)


def _table_or_lines(table: Table, title: str, lines: list[str]) -> None:
    """The table, or on a console narrower than it one wrapped line per entry under
    `title` rather than cut cells."""
    wide = Measurement.get(out_console, out_console.options.update(max_width=10_000), table)
    if wide.maximum > out_console.width:
        out_console.print(title)
        for line in lines:
            out_console.print(line)
        return
    out_console.print(table)


def _show(path: str, value: Any) -> str:
    """Values with their units, read off the field name."""
    from clustersim.hardware import units

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
    if isinstance(value, float):  # a derived figure's binary rounding left out (0.01109,
        return str(float(f"{value:.12g}"))  # not 0.011090000000000001)
    return str(value)


@user_errors
def schema(
    out: Annotated[Path | None, typer.Option("-o", "--out", help="Write to a file.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing -o file."
                                        )] = False,
) -> None:
    """Print the JSON Schema of scenario files (for editors' completion and checks)."""
    from clustersim.scenario.schema import scenario_json_schema

    text = json.dumps(scenario_json_schema(), indent=2, allow_nan=False) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        try:
            with _output_file(out, force, "-o", "the schema") as (temporary, commit):
                temporary.write_text(text, encoding="utf-8")
                commit()
        except OSError as error:
            raise UsageProblem(f"-o {out}: cannot write it ({error.strerror})") from None
        err_console.print(f"wrote {out}")


def _check_output_file(path: Path, force: bool, option: str, what: str) -> None:
    """An existing file (or a symbolic link to one) is replaced only with --force."""
    from clustersim.runner.outputs import OutputDirError, check_output_file

    try:
        check_output_file(path, force, what)
    except OutputDirError as error:
        raise UsageProblem(f"{option} {error}") from None


@contextlib.contextmanager
def _output_file(path: Path, force: bool, option: str, what: str, suffix: str = ""
                 ) -> Iterator[tuple[Path, Any]]:
    """`atomic_output_file` with its refusals as usage problems naming `option`."""
    from clustersim.runner.outputs import OutputDirError, atomic_output_file

    try:
        with atomic_output_file(path, force, what, suffix) as pair:
            yield pair
    except OutputDirError as error:
        raise UsageProblem(f"{option} {error}") from None


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
