"""A plan's failure-aware figures, its ranking, and what to say when nothing is feasible.

Per simulated candidate: ETTR from the group's failure and recovery figures (whole
UltraServers are replaced whole when tensor parallelism spans one), time to train a token
budget in whole steps (the budget rounded up to whole steps' tokens, / (tokens per second
x ETTR): the steps the planned scenario runs), cost (the job's instances and the scenario's
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
from clustersim.planning.plans import OBJECTIVES, Group, PlanError, PlanOptions, PlanResult
from clustersim.planning.space import memory_of, screen_job
from clustersim.scenario.loader import JobSpec, Scenario

__all__ = ["finish", "fewest_chips"]


def _add_figures(group: Group, row: dict[str, Any], job: JobSpec, options: PlanOptions,
                 spares: int) -> None:
    """ETTR, time to train, cost (the job's instances and `spares`) and energy of a row."""
    hw = group.hw
    recovery = group.recovery[group.hw.whole_ultraservers(row["tp"])]
    ettr = renewal_ettr(recovery)
    tokens_per_step = job.global_batch * job.sequence_length
    tokens_per_s = tokens_per_step / row["step_time_s"]
    effective = tokens_per_s * ettr
    if options.tokens is not None:  # whole steps, as the scenario the plan writes runs them
        tokens = math.ceil(options.tokens / tokens_per_step) * tokens_per_step
    else:
        tokens = 1e6
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
                _add_figures(g, row, job, options, g.key.instances - g.instances)
                if row["status"] == "simulated":
                    simulated.append(row)
    considered = len(rows)
    pruned = sum(1 for r in rows if r["status"] == "pruned")
    for g in groups:
        if not any(r["status"] == "simulated" for r in g.rows):
            notes.append(f"{g.name} x {g.chips:,} chips: nothing runs ({_causes(g)})")
    if not simulated:
        raise PlanError(_nothing_fits(scenario, job, options, groups))
    metric = OBJECTIVES[options.objective]
    missing = [r["hardware"] for r in simulated if r.get(metric) is None]
    if missing:
        what = "instance.price_per_hour" if options.objective == "cost" else "chip.power"
        names = sorted(set(missing))
        example = "instance: {price_per_hour: 30}" if options.objective == "cost" else \
            "chip: {power: 700W}"
        raise PlanError(f"--objective {options.objective}: {', '.join(names)} "
                        f"{'has' if len(names) == 1 else 'have'} no {what} in the catalog; "
                        f"give the scenario hardware: {{base: {names[0]}, {example}}} "
                        f"(--hardware {names[0]} then plans it with that {what}) or choose "
                        "another objective")
    for r in simulated:
        r["unmet"] = _unmet(r, options)
        r["meets"] = not r["unmet"]
    feasible = [r for r in simulated if r["meets"]]
    met = bool(feasible)
    if not met:
        # Nothing meets the constraints: the closest ones are ranked instead (the fastest to
        # train for a deadline, the cheapest for a budget), and the plan says so.
        notes.insert(0, _infeasible(simulated, options))
        closest = "time_to_train_s" if options.deadline_s is not None else "cost_usd"
        ranked = sorted(simulated, key=lambda r: (_or_inf(r.get(closest)), r[metric],
                                                  r["step_time_s"], r["chips"]))
    else:
        ranked = sorted(feasible, key=lambda r: (r[metric], r["step_time_s"], r["chips"]))
    missed = len(simulated) - len(feasible)
    if met and missed:
        notes.append(f"{missed:,} simulated candidates miss the constraints (plan.parquet: "
                     f"meets false, unmet says which)")
    _mark_dominated(simulated)
    ranked = [r for r in ranked if not r["dominated"]]
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
    for column in ("why", "step_time_s", "bound_s", "memory_per_chip_gib", "meets", "unmet",
                   "dominated"):
        if column not in frame:
            frame[column] = None
    frame["why"] = frame["why"].fillna("")
    if "step_time_s_band" in frame:
        frame["step_time_s_band"] = frame["step_time_s_band"].map(
            lambda b: None if b is None or (isinstance(b, float) and math.isnan(b))
            else list(b))
    result = PlanResult(scenario, options, frame, ranked, groups, considered, pruned,
                        len(simulated) + sum(1 for r in rows if r["status"] == "pruned"
                                             and r.get("step_time_s") is not None),
                        stops, notes)
    result.met = met
    return result


def _or_inf(value: Any) -> float:
    return math.inf if value is None else float(value)


def _unmet(row: dict[str, Any], options: PlanOptions) -> str:
    """Which constraints a simulated candidate misses ("" when it meets them all)."""
    misses = []
    if options.deadline_s is not None and row["time_to_train_s"] > options.deadline_s:
        misses.append(f"deadline: trains in {units.format_duration(row['time_to_train_s'])}")
    if options.budget_usd is not None:
        cost = row.get("cost_usd")
        if cost is None or cost > options.budget_usd:
            misses.append("budget: no price" if cost is None else f"budget: costs {cost:,.0f} USD")
    return "; ".join(misses)


def _mark_dominated(rows: list[dict[str, Any]]) -> None:
    """A candidate is dominated when another of the same hardware and size is no slower and
    needs no more memory, and is better in one of the two (selective recompute with flash
    attention, say, costs time and saves nothing; ZeRO-1 beside ZeRO-2 at the same step).
    Dominated rows stay in plan.parquet (`dominated`) but out of the ranked list."""
    by_group: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        r["dominated"] = False
        by_group.setdefault((r["hardware"], r["chips"]), []).append(r)
    for members in by_group.values():
        members.sort(key=lambda r: (r["step_time_s"], r["memory_per_chip_gib"]))
        least_memory = math.inf
        for r in members:  # faster first: dominated when an earlier one needs no more
            if r["memory_per_chip_gib"] >= least_memory:
                r["dominated"] = True
            least_memory = min(least_memory, r["memory_per_chip_gib"])


def _causes(g: Group) -> str:
    """Why nothing of a group runs: each kind of pruning with its count and an example."""
    kinds: dict[str, list[str]] = {}
    for r in g.rows:
        if r["status"] == "pruned" and r["why"]:
            kinds.setdefault(r["why"].split(":")[0], []).append(r["why"])
    parts = []
    for kind in ("divisibility", "placement", "memory", "bound"):
        whys = kinds.get(kind)
        if not whys:
            continue
        if kind == "memory":
            needed = [r.get("memory_per_chip_gib") or r["memory_least_gib"] for r in g.rows
                      if r["why"].startswith("memory")]
            parts.append(f"{len(whys):,} need more memory than there is, the least "
                         f"{min(needed):.1f} GiB per chip of {g.hw.chip.hbm_bytes / 2**30:.0f}")
        else:
            common = max(set(whys), key=whys.count)
            parts.append(f"{len(whys):,} out for {kind} ({common.split(': ', 1)[1]}, ...)")
    return "; ".join(parts) or "no candidate"


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
            parts.append(f"--budget {usd(options.budget_usd)} USD: the cheapest candidate "
                         f"({cheapest['hardware']}, {cheapest['chips']} chips) costs "
                         f"{usd(cheapest['cost_usd'])} USD")
    return "nothing meets the constraints: " + "; ".join(parts)


def usd(amount: float) -> str:
    """An amount of USD as written: whole dollars from 100 up, else three significant digits
    (a budget of 0.000001 printed as 0)."""
    return f"{amount:,.0f}" if abs(amount) >= 100 else f"{amount:.3g}"


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
            if memory_of(screen_job(job, c), hw).per_chip <= usable:
                return chips
        chips *= 2
    return None


def _nothing_fits(scenario: Scenario, job: JobSpec, options: PlanOptions, groups: list[Group]
                  ) -> str:
    lines = [f"{g.name} x {g.chips} chips: {_causes(g)}" for g in groups]
    hints = []
    for name in dict.fromkeys(g.name for g in groups):
        hw = next(g.hw for g in groups if g.name == name)
        fewest = fewest_chips(scenario, job, hw, options)
        if fewest is not None:
            hints.append(f"{name}: it fits on {fewest} chips (the fewest, doubling whole "
                         f"{'UltraServers' if hw.ultraserver else 'instances'})")
        else:
            hints.append(f"{name}: it fits on no size up to 2M chips")
    return (f"{job.model.name} runs nowhere: " + "; ".join(lines) + ". What would make it "
            "feasible: " + "; ".join(hints))
