"""A plan's failure-aware figures, its ranking, and what to say when nothing is feasible.

Per simulated candidate: ETTR from the group's failure and recovery figures (whole
UltraServers are replaced whole when tensor parallelism spans one), time to train a token
budget (tokens / (tokens per second x ETTR)), cost (the job's instances and the scenario's
spares, at the catalog's price, for that wall time) and energy (the job's chips at their
power for that wall time). Without a token budget, cost and energy are for one million
tokens (`cost_usd`, `energy_j` are then per million tokens) so that sizes still compare.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from clustersim.hardware import units
from clustersim.planning.ettr import renewal_ettr, stops_paying_chips
from clustersim.planning.planner import OBJECTIVES, Group, PlanError, PlanOptions, PlanResult
from clustersim.planning.space import job_for, memory_of
from clustersim.scenario.loader import JobSpec, Scenario

__all__ = ["finish", "fewest_chips"]


def _add_figures(group: Group, row: dict[str, Any], job: JobSpec, options: PlanOptions,
                 spares: int) -> None:
    hw = group.hw
    recovery = group.recovery[group.hw.whole_ultraservers(row["tp"])]
    ettr = renewal_ettr(recovery)
    tokens_per_step = job.global_batch * job.sequence_length
    tokens_per_s = tokens_per_step / row["step_time_s"]
    effective = tokens_per_s * ettr
    tokens = options.tokens if options.tokens is not None else 1e6
    wall = tokens / effective if effective > 0 else math.inf
    price = hw.instance.price_per_hour_usd
    power = hw.chip.power_w
    row.update(
        ettr=ettr, job_mtbf_s=recovery.mtbf_s, recovery_s=recovery.recovery_s,
        checkpoint_interval_s=recovery.checkpoint_interval_s, tokens_per_s=tokens_per_s,
        time_to_train_s=wall if options.tokens is not None else None,
        cost_usd=None if price is None else price * (group.instances + spares) * wall / 3600,
        energy_j=None if power is None else power * group.chips * wall,
    )
    row["cost_per_million_tokens_usd"] = (None if row["cost_usd"] is None
                                          else row["cost_usd"] * 1e6 / tokens)
    row["energy_per_token_j"] = None if row["energy_j"] is None else row["energy_j"] / tokens


def finish(scenario: Scenario, job: JobSpec, options: PlanOptions, groups: list[Group],
           notes: list[str]) -> PlanResult:
    rows = [row for g in groups for row in g.rows]
    simulated = []
    for g in groups:
        for row in g.rows:
            if row.get("step_time_s") is not None:
                _add_figures(g, row, job, options,
                             scenario.total_instances - scenario.working_instances)
                if row["status"] == "simulated":
                    simulated.append(row)
    considered = len(rows)
    pruned = sum(1 for r in rows if r["status"] == "pruned")
    for g in groups:
        if not any(r["status"] == "simulated" for r in g.rows):
            needed = [r["memory_per_chip_gib"] for r in g.rows if r.get("memory_per_chip_gib")]
            least = (f"the least memory a candidate needs is {min(needed):.1f} GiB per chip, "
                     f"{g.hw.chip.hbm_bytes / 2**30:.0f} GiB available" if needed
                     else "no candidate passes divisibility and placement")
            notes.append(f"{g.name} x {g.chips:,} chips: nothing fits ({least})")
    if not simulated:
        raise PlanError(_nothing_fits(scenario, job, options, groups))
    metric = OBJECTIVES[options.objective]
    missing = [r["hardware"] for r in simulated if r.get(metric) is None]
    if missing:
        what = "instance.price_per_hour" if options.objective == "cost" else "chip.power"
        raise PlanError(f"--objective {options.objective}: {', '.join(sorted(set(missing)))} "
                        f"has no {what} in the catalog; set hardware.{what} in the scenario "
                        f"or choose another objective")
    feasible = [r for r in simulated if _feasible(r, options)]
    if not feasible:
        raise PlanError(_infeasible(simulated, options))
    ranked = sorted(feasible, key=lambda r: (r[metric], r["step_time_s"], r["chips"]))
    stops = {}
    for name in dict.fromkeys(g.name for g in groups):
        per_size = {}
        for r in simulated:
            if r["hardware"] == name:
                wall = r["time_to_train_s"]
                if wall is None:
                    wall = 1e6 / (r["tokens_per_s"] * r["ettr"]) if r["ettr"] > 0 else math.inf
                per_size[r["chips"]] = min(per_size.get(r["chips"], math.inf), wall)
        stops[name] = stops_paying_chips(list(per_size), list(per_size.values())) if len(
            per_size) > 1 else None
    frame = pd.DataFrame(rows)
    for column in ("why", "step_time_s", "bound_s", "memory_per_chip_gib"):
        if column not in frame:
            frame[column] = None
    frame["why"] = frame["why"].fillna("")
    if "step_time_s_band" in frame:
        frame["step_time_s_band"] = frame["step_time_s_band"].map(
            lambda b: None if b is None or (isinstance(b, float) and math.isnan(b))
            else list(b))
    return PlanResult(scenario, options, frame, ranked, groups, considered, pruned,
                      len(simulated) + sum(1 for r in rows if r["status"] == "pruned"
                                           and r.get("step_time_s") is not None),
                      stops, notes)


def _feasible(row: dict[str, Any], options: PlanOptions) -> bool:
    if options.deadline_s is not None and row["time_to_train_s"] > options.deadline_s:
        return False
    if options.budget_usd is not None:
        cost = row.get("cost_usd")
        if cost is None or cost > options.budget_usd:
            return False
    return True


def _infeasible(rows: list[dict[str, Any]], options: PlanOptions) -> str:
    fastest = min(rows, key=lambda r: r["time_to_train_s"])
    parts = []
    if options.deadline_s is not None:
        parts.append(f"--deadline {units.format_duration(options.deadline_s)}: the fastest "
                     f"candidate ({fastest['hardware']}, {fastest['chips']} chips) trains in "
                     f"{units.format_duration(fastest['time_to_train_s'])}; give a deadline of at "
                     f"least that, more chips (--chips) or fewer --tokens")
    if options.budget_usd is not None:
        priced = [r for r in rows if r.get("cost_usd") is not None]
        if not priced:
            parts.append("--budget: no candidate's hardware has a price in the catalog")
        else:
            cheapest = min(priced, key=lambda r: r["cost_usd"])
            parts.append(f"--budget {options.budget_usd:,.0f} USD: the cheapest candidate "
                         f"({cheapest['hardware']}, {cheapest['chips']} chips) costs "
                         f"{cheapest['cost_usd']:,.0f} USD")
    return "nothing meets the constraints: " + "; ".join(parts)


def fewest_chips(scenario: Scenario, job: JobSpec, hw: Any, options: PlanOptions,
                 limit_chips: int = 2**21) -> int | None:
    """The fewest chips (whole instances or UltraServers, doubling) on which some
    configuration of the job fits in memory."""
    from clustersim.planning.space import enumerate_space, prune_reason

    unit = hw.chips_per_instance * hw.instances_per_ultraserver
    chips = unit
    usable = hw.chip.hbm_bytes * (1.0 - options.memory_headroom)
    while chips <= limit_chips:
        for c in enumerate_space(hw.name, hw, chips, job):
            if c.recompute != "full" or prune_reason(c, hw, job) is not None:
                continue  # full recompute needs the least memory of the three
            if memory_of(job_for(job, c), hw).per_chip <= usable:
                return chips
        chips *= 2
    return None


def _nothing_fits(scenario: Scenario, job: JobSpec, options: PlanOptions, groups: list[Group]
                  ) -> str:
    lines = []
    for g in groups:
        needed = [r["memory_per_chip_gib"] for r in g.rows if r.get("memory_per_chip_gib")]
        least = f"; the least memory any candidate needs is {min(needed):.1f} GiB per chip" if (
            needed) else "; no candidate passes the divisibility and placement rules"
        lines.append(f"{g.name} x {g.chips} chips: nothing fits in "
                     f"{g.hw.chip.hbm_bytes / 2**30:.0f} GiB of HBM{least}")
    hints = []
    for name in dict.fromkeys(g.name for g in groups):
        hw = next(g.hw for g in groups if g.name == name)
        fewest = fewest_chips(scenario, job, hw, options)
        if fewest is not None:
            hints.append(f"{name}: it fits on {fewest} chips (the fewest, doubling whole "
                         f"{'UltraServers' if hw.ultraserver else 'instances'})")
        else:
            hints.append(f"{name}: it fits on no size up to 2M chips")
    return (f"{job.model.name} fits nowhere: " + "; ".join(lines) + ". What would make it "
            "feasible: " + "; ".join(hints))
