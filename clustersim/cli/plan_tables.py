"""What `clustersim plan` prints: the ranked candidates of the training and the serving
planner, and the sites."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from clustersim.cli.common import (
    err_console,
    out_console,
)


def _print_serving_plan(result: Any, out_dir: Path, written: Path | None) -> None:
    d = next(x for x in result.scenario.serve if x.name == result.deployment)
    table = Table(title=escape(
        f"serving plan for {d.name} ({d.model.name}) at {result.load_rate_per_s:,.3g} "
        f"requests/s, SLO TTFT {d.slo.ttft_s:g} s and TPOT {d.slo.tpot_s:g} s for "
        f"{result.options.goodput:.0%} of requests: top {min(result.options.top, len(result.ranked))}"
        f" of {len(result.ranked):,} that hold the load"), title_justify="left")
    mixture = d.model.moe  # its rows carry the expert parallelism searched
    for name in ("#", "hardware", "tp pp ep" if mixture else "tp pp", "per inst", "max batch",
                 "replicas", "instances", "chips", "$/h", "TTFT p99", "TPOT p99", "in SLO",
                 "$/M out tok", "capacity/replica", "$/M at capacity"):
        table.add_column(name, justify="left" if name == "hardware" else "right", no_wrap=True)
    for rank, r in enumerate(result.ranked[: result.options.top], start=1):
        capacity = r.get("capacity_rate_per_s")
        at_capacity = r.get("cost_per_million_output_tokens_at_capacity_usd")
        cost = r.get("cost_per_million_output_tokens_usd")
        table.add_row(
            str(rank), r["hardware"], f"{r['tp']} {r['pp']}" + (f" {r['ep']}" if mixture else ""),
            _per_instance(r),
            str(r["max_batch"]), f"{r['replicas']:,}", f"{r['instances']:,}",
            f"{r['chips']:,}", "-" if r["usd_per_h"] is None else f"{r['usd_per_h']:,.2f}",
            f"{r['ttft_p99_s']:.3g} s", f"{r['tpot_p99_s']:.3g} s",
            f"{r['slo_goodput']:.1%}", "-" if cost is None else f"${cost:,.2f}",
            ("none (note)" if r.get("capacity_why") else "-") if capacity is None
            else f"{capacity:,.3g}/s",
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
            f"{name} at its best: {r['replicas']:,} replica(s) of tp {r['tp']} pp {r['pp']}"
            + (f" ep {r['ep']}" if mixture else "") + ", "
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


def _per_instance(row: dict[str, Any]) -> str:
    """Replicas per instance: `4`, or `1/2` for a replica that spans two instances."""
    spans = row.get("instances_per_replica") or 1
    return f"1/{spans}" if spans > 1 else str(int(row["replicas_per_instance"]))


def _fmt(value: Any, kind: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if kind == "days":  # under 0.05 d (which printed "0.0 d"): in its own unit, e.g. 15.4s
        if value < 0.05 * 86400:
            from clustersim.hardware import units

            return units.format_duration(value, 3)
        # From a million days (or $10^10, 10^6 MWh) in three figures: the columns kept their
        # width and the table squeezed the hardware and the step to "...".
        days = value / 86400
        return f"{days:.3g} d" if days >= 1e6 else f"{days:,.1f} d"
    if kind == "usd":
        if value >= 1e10:
            return f"${value:.3g}"
        return f"${value:,.0f}" if value >= 100 else f"${value:,.2f}"
    if kind == "energy":
        if value >= 3.6e15:
            return f"{value / 3.6e9:.3g} MWh"
        return f"{value / 3.6e9:,.1f} MWh" if value >= 3.6e9 else f"{value / 3.6e6:,.2f} kWh"
    return str(value)


def _none_ranked(result: Any, name: str) -> str:
    """Why a hardware entry has no row in the ranking: nothing of it runs, or what runs
    misses --deadline or --budget (the closest of it said)."""
    rows = result.rows
    ran = rows[(rows["hardware"] == name) & (rows["status"] == "simulated")]
    if not len(ran):
        return "no feasible candidate"
    closest = []
    if result.options.deadline_s is not None:
        r = ran.loc[ran["time_to_train_s"].astype(float).idxmin()]
        closest.append(f"the fastest trains in {_fmt(float(r['time_to_train_s']), 'days')} "
                       f"at {int(r['chips']):,} chips")
    costs = ran["cost_usd"].dropna().astype(float)
    if result.options.budget_usd is not None and len(costs):
        r = ran.loc[costs.idxmin()]
        closest.append(f"the cheapest costs {_fmt(float(r['cost_usd']), 'usd')} at "
                       f"{int(r['chips']):,} chips")
    return (f"none of its {len(ran):,} simulated candidates meets the constraints"
            + (f" ({'; '.join(closest)})" if closest else ""))


def _ep(row: dict[str, Any]) -> str:
    """ep, marked `i` when the rank order puts the expert groups inside the instance or
    UltraServer, next to tensor parallelism (`tp-cp-ep-pp-dp`)."""
    from clustersim.training.ranks import DEFAULT_ORDER  # the shell loads no layer up front

    inside = row["ep"] > 1 and row.get("order", DEFAULT_ORDER) != DEFAULT_ORDER
    return f"{row['ep']}{'i' if inside else ''}"


def _layout(row: dict[str, Any]) -> str:
    """`tp 2 cp 2 pp 1 dp 32 ep 2`: every degree of the candidate's ranks (cp, ep and the
    interleave where above 1), so that they multiply to its ranks."""
    cp = f" cp {row['cp']}" if row.get("cp", 1) > 1 else ""
    ep = f" ep {_ep(row)}" if row.get("ep", 1) > 1 else ""
    v = f" v {row['interleave']}" if row.get("interleave", 1) > 1 else ""
    return f"tp {row['tp']}{cp} pp {row['pp']}{v} dp {row['dp']}{ep}"


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
            f"{r['tp']} {r['cp']} {r['pp']} {r['dp']} {_ep(r)} {r['interleave']}",
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
    if experts:
        out_console.print("a2a s: the experts' all-to-all left exposed per step; ep 16i: "
                          "expert groups next to tensor parallelism, inside an instance or "
                          "UltraServer (order tp-cp-ep-pp-dp), else strided over the "
                          "pipeline stages")
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
                out_console.print(f"{name}: {_none_ranked(result, name)}")
                continue
            r = mine[0]
            band = r.get("step_time_s_band")
            out_console.print(
                f"{name} at its best: {r['chips']:,} chips, {_layout(r)}, "
                f"{r['step_time_s']:,.3f} s per step"
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
                f", time to train {_fmt(r['time_to_train_s'], 'days')} at best"
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
