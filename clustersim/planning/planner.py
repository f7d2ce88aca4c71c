"""`plan`: the best parallelism, size and hardware for a scenario's first job, failures in.

For each hardware and chip count (a group) the planner lists the search space
(`space.enumerate_space`), prunes it by divisibility, placement and the exact memory model,
bounds the rest from below (`simulate.step_lower_bound`) and simulates the step of the
candidates in order of their bound, in rounds of a fixed size, until the bound of every
candidate left is no faster than the group's best simulated step: the best is exact (the
bound is a true lower bound), and the result does not depend on the engine or its workers.
Within a group the candidates share their failure rates (except that tensor parallelism across
a Z ring makes a fault cost a whole UltraServer), so the fastest step is also, nearly always,
the shortest time to train, the cheapest and the most frugal; across groups the
failure-aware figures (ETTR, time to train, cost, energy) rank them.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from clustersim.cluster.rates import default_checkpoint, effective_rates, job_failure_rate
from clustersim.hardware import limits
from clustersim.hardware.catalog import HardwareSpec, catalog_entry, catalog_names, custom_base
from clustersim.planning.engine import Engine
from clustersim.planning.ettr import Recovery
from clustersim.planning.plans import OBJECTIVES, Group, PlanError, PlanOptions, PlanResult
from clustersim.planning.simulate import (
    GroupKey,
    op_model,
    quick_bound,
    simulate_task,
    step_lower_bound,
    step_model,
)
from clustersim.planning.space import (
    Candidate,
    MemoryScreen,
    enumerate_space,
    job_for,
    prune_reason,
    screen_job,
    space_size,
)
from clustersim.scenario.loader import CheckpointSpec, JobSpec, Scenario

__all__ = ["PlanOptions", "PlanError", "PlanResult", "Group", "plan", "OBJECTIVES",
           "checkpoint_of", "recovery_for", "spares_for"]

ROUND = 4  # candidates simulated per group per round (fixed: the answer must not depend on it)


def checkpoint_of(job: JobSpec, scenario: Scenario | None = None, instances: int | None = None
                  ) -> CheckpointSpec:
    """The job's checkpointing, or the default one the plan assumes (and writes): as the
    timeline gives a job without one (`rates.default_checkpoint`: Daly's interval, the
    weights and optimizer state written and read back at the storage's per-instance
    throughput within its aggregate), on `instances` instances."""
    if job.checkpoint is not None:
        return job.checkpoint
    if scenario is None or instances is None:
        return CheckpointSpec()
    return default_checkpoint(scenario, job.model_copy(update={"instances": instances}))


def spares_for(scenario: Scenario, hw: HardwareSpec, instances: int) -> int:
    """Hot spares of a cluster of `instances` working instances of `hw`: the scenario's share
    (`cluster.spares: 5%`, or its count over its own size), rounded up to whole UltraServers
    where `hw` has them, so that every size keeps the same share."""
    unit = hw.instances_per_ultraserver
    share = scenario.spares_share
    return math.ceil(share * instances / unit - 1e-9) * unit


def recovery_for(scenario: Scenario, hw: HardwareSpec, job: JobSpec, instances: int,
                 whole_ultraservers: bool) -> Recovery:
    """The failure and recovery figures of `job` on `instances` instances of `hw`."""
    group = scenario.model_copy(update={"hardware": hw})
    sized = job.model_copy(update={"instances": instances})
    rate = job_failure_rate(group, sized)
    hardware_only = group.model_copy(update={"failures": scenario.failures.model_copy(update={
        "preset": "none",
        "rates": [r for r in effective_rates(scenario) if r.component != "software"]})})
    hw_rate = job_failure_rate(hardware_only, sized)
    ck = checkpoint_of(job, group, instances)
    f = scenario.failures
    ipu = hw.instances_per_ultraserver
    return Recovery(
        failure_rate_per_s=rate, hardware_rate_per_s=hw_rate, detect_s=f.detect_s,
        restart_s=f.restart_s, restore_s=ck.restore_s, write_s=ck.write_s,
        interval_s=(None if ck.interval_s == "auto" else math.inf if ck.interval_s == "never"
                    else float(ck.interval_s)),
        async_write=ck.async_write,
        repair_s=math.inf if f.repair_s == "never" else float(f.repair_s),
        spare_units=spares_for(scenario, hw, instances),
        units_per_replacement=ipu if whole_ultraservers else 1,
    )


def _hardware_list(scenario: Scenario, names: tuple[str, ...]) -> list[tuple[str, HardwareSpec]]:
    if not names:
        return [(scenario.hardware.name, scenario.hardware)]
    out = []
    for name in names:
        if name in (scenario.hardware.name, custom_base(scenario.hardware.name)):
            # (the scenario's own, a catalog entry's keys changed included: its price, say)
            out.append((name, scenario.hardware))
            continue
        try:
            out.append((name, catalog_entry(name)))
        except KeyError:
            raise PlanError(f"--hardware {name!r}: unknown hardware; expected one of "
                            f"{', '.join(catalog_names())}") from None
    return out


def _check_site_sizes(scenario: Scenario, options: PlanOptions) -> None:
    """On a cluster of several sites, the spread options place the best on the sites' own
    instances: a --chips size beyond their working chips has nowhere to go."""
    net = scenario.site_network
    if net is None or not options.chips:
        return
    cpi = scenario.hardware.chips_per_instance
    working = sum(n - s for n, s in zip(net.instances, net.spares, strict=True)) * cpi
    beyond = [c for c in options.chips if c > working]
    if beyond:
        raise PlanError(f"--chips {beyond[0]:,}: more than the {working:,} working chips of "
                        f"the scenario's {net.count} sites; expected sizes up to {working:,} "
                        "on a multi-site cluster (or larger sites in cluster.sites)")


def _sizes(scenario: Scenario, job: JobSpec, options: PlanOptions, hw: HardwareSpec
           ) -> tuple[list[int], list[str]]:
    """Chip counts to try on `hw`: whole instances (whole UltraServers where it has them)."""
    if options.chips:
        wanted = list(options.chips)
    elif not scenario.cluster_given:
        raise PlanError("the scenario has no cluster: give the sizes to plan with --chips "
                        "(e.g. --chips 4096:32768) or a cluster: section")
    else:
        instances = job.instances or scenario.working_instances
        wanted = [instances * scenario.hardware.chips_per_instance]
    unit = hw.chips_per_instance * hw.instances_per_ultraserver
    what = "UltraServers" if hw.ultraserver else "instances"
    kept, notes = [], []
    for chips in wanted:
        if options.max_chips is not None and chips > options.max_chips:
            notes.append(f"{chips} chips: above --max-chips {options.max_chips}")
            continue
        if chips % unit:
            # Hardware of another UltraServer size on the same --chips list: the whole
            # UltraServers that fit in the size, so each entry is compared at about it.
            if chips < unit:
                notes.append(f"{hw.name}: {chips:,} chips is less than one of its {what} "
                             f"({unit} chips)")
                continue
            rounded = chips // unit * unit
            count = rounded // unit
            notes.append(f"{hw.name}: {chips:,} chips is not a whole number of {what} of "
                         f"{unit} chips; planned at {rounded:,} ({count:,} "
                         f"{what if count > 1 else what[:-1]})")
            chips = rounded
        if chips not in kept:
            kept.append(chips)
            notes += (_factoring_note(hw.name, chips, unit, what)
                      or _batch_note(hw.name, chips, unit, what, job.global_batch))
    return kept, notes


BAD_PRIME = 7  # a count of UltraServers with a prime factor above it factors badly


def _largest_prime(n: int) -> int:
    largest, p = 1, 2
    while p * p <= n:
        while n % p == 0:
            largest, n = p, n // p
        p += 1
    return max(largest, n) if n > 1 else largest


def _factoring_note(name: str, chips: int, unit: int, what: str) -> list[str]:
    """A size whose count of UltraServers (or instances) has a large prime factor: every
    parallel degree must divide the chips, so its shapes are few (PP 57 at 131,328 Trn3
    chips: 19 x 48 UltraServers); the nearest counts below and above that factor well."""
    count = chips // unit
    prime = _largest_prime(count)
    if prime <= BAD_PRIME or count < 2 * BAD_PRIME:
        return []
    # the nearest counts of the form 2^a 3^b (degrees of powers of two, and threes)
    below = next(n for n in range(count - 1, 0, -1) if _largest_prime(n) <= 3)
    above = next(n for n in range(count + 1, 2 * count + 2) if _largest_prime(n) <= 3)
    return [f"{name}: {chips:,} chips is {count:,} {what}, a multiple of the prime {prime}: "
            f"the parallel degrees must divide it, so it factors badly (pipeline or "
            f"data-parallel degrees with {prime} in them); sizes near it that factor well: "
            f"{below * unit:,} and {above * unit:,} chips ({below:,} and {above:,} {what})"]


def _untaken(chips: int, batch: int) -> int:
    """The part of `chips` made of primes the batch (sequences) lacks: data parallelism
    divides the batch, so that part must go to tensor, context or pipeline degrees."""
    if chips < 1 or batch < 1:
        return 1
    rest, p, b = chips, 2, batch
    while p * p <= b:
        if b % p == 0:
            while rest % p == 0:
                rest //= p
            while b % p == 0:
                b //= p
        p += 1
    while b > 1 and rest % b == 0:
        rest //= b
    return rest


def _batch_note(name: str, chips: int, unit: int, what: str, batch: int | None) -> list[str]:
    """A size with factors the batch lacks (72 Trn2 instances, 2^3 x 3^2, for 1,024
    sequences: the 3s go to pipeline, tensor or context degrees and it plans slower than
    1,024 chips), when a size near it leaves less of that: the nearest such below and above."""
    if not batch:
        return []
    count, rest = chips // unit, _untaken(chips, batch)
    if rest == 1:
        return []
    below = next((n for n in range(count - 1, max(1, count // 2) - 1, -1)
                  if _untaken(n * unit, batch) < rest), None)
    above = next((n for n in range(count + 1, 2 * count + 1)
                  if _untaken(n * unit, batch) < rest), None)
    near = [n for n in (below, above) if n is not None]
    if not near:
        return []
    sizes = " and ".join(f"{n * unit:,} chips ({n:,} {what})" for n in near)
    return [f"{name}: {chips:,} chips has a factor {rest:,} the batch of {batch:,} sequences "
            f"lacks: data parallelism divides the batch, so it must go to pipeline, tensor or "
            f"context degrees, and it may plan slower per chip; sizes near it leaving less of "
            f"that: {sizes}"]


def _make_group(scenario: Scenario, job: JobSpec, name: str, hw: HardwareSpec, chips: int
                ) -> Group:
    instances = chips // hw.chips_per_instance
    key = GroupKey(name, hw.model_dump_json(by_alias=True),
                   instances + spares_for(scenario, hw, instances),
                   scenario.cluster.fabric.model_dump_json(by_alias=True))
    recovery = {whole: recovery_for(scenario, hw, job, instances, whole) for whole in (False, True)}
    return Group(name, hw, chips, instances, key, recovery)


def _is_reference(c: Candidate, job: JobSpec, given: bool, chips: int, name: str,
                  scenario: Scenario) -> bool:
    if not given or name != scenario.hardware.name:
        return False
    par = job.parallelism
    return (c.chips == chips and (c.tp, c.cp, c.pp, c.dp, c.ep, c.interleave) ==
            (par.tp, par.cp, par.pp, par.dp, par.ep, par.interleave)
            and c.micro_batch == job.micro_batch and c.recompute == job.recompute
            and c.sequence_parallel == par.sequence_parallel and c.zero == par.zero
            and c.order == par.order)


def _own_candidate(job: JobSpec, group: Group) -> Candidate | None:
    """The scenario's parallelism as a candidate of this group (None at another size)."""
    par = job.parallelism
    if par.ranks != group.chips * group.hw.chip.ranks:
        return None
    return Candidate(group.name, group.chips, par.tp, par.pp, par.dp, par.ep, par.interleave,
                     job.micro_batch, job.recompute, par.sequence_parallel, par.zero, par.cp,
                     par.order)


def _least_memory(c: Candidate, job: JobSpec, memory: MemoryScreen) -> float:
    """Bytes per chip of the candidate's (tp, cp, pp, dp, ep, interleave, micro-batch) at its
    leanest: full recompute, sequence parallelism, the ZeRO stage that keeps the least."""
    zeros = [z for z in (2, 3) if c.dp * c.cp > 1] or [0]
    return min(memory.per_chip(screen_job(job, replace(c, recompute="full",
                                                       sequence_parallel=c.tp > 1, zero=z)))
               for z in zeros)


def _screen(group: Group, job: JobSpec, options: PlanOptions, given: bool, scenario: Scenario,
            shared: dict) -> list[tuple[float, dict[str, Any], Any]]:
    """Prune a group's space; the survivors as (bound, row, candidate), and every row
    recorded. Memory never falls as the micro-batch grows (activations of min(in flight x
    micro-batch, batch / dp) sequences, logits of one micro-batch), so once a micro-batch
    does not fit at its leanest (`_least_memory`), the larger ones of the same degrees are
    pruned without being costed one by one. Bounds and memory depend on the hardware, not
    on the size: the groups of one hardware share their tables (`shared`)."""
    hw = group.hw
    model = op_model(group.key.hardware_json)
    cache, screen = shared.setdefault(group.key.hardware_json, ({}, MemoryScreen(job, hw)))
    survivors = []
    usable = hw.chip.hbm_bytes * (1.0 - options.memory_headroom)
    too_big: dict[tuple, tuple[int, float]] = {}  # degrees -> (first micro-batch, bytes)
    probed: set[tuple] = set()
    space = enumerate_space(group.name, hw, group.chips, job)
    if given and group.name == scenario.hardware.name:
        # The scenario's own configuration is simulated even where the search leaves it out
        # (selective recompute with flash attention, hybrid sharding is not searched).
        own = _own_candidate(job, group)
        if own is not None and own not in space:
            space.append(own)
    for c in space:
        row: dict[str, Any] = c.as_dict()
        row["reference"] = _is_reference(c, job, given, group.chips, group.name, scenario)
        row["why"] = ""
        group.rows.append(row)
        reason = prune_reason(c, hw, job)
        if reason is not None:
            row["status"], row["why"] = "pruned", reason
            continue
        degrees = (c.tp, c.cp, c.pp, c.dp, c.ep, c.interleave)
        if degrees not in too_big and (degrees, c.micro_batch) not in probed:
            probed.add((degrees, c.micro_batch))
            least = _least_memory(c, job, screen)
            if least > usable:
                too_big[degrees] = (c.micro_batch, least)
        if degrees in too_big and not row["reference"]:
            first, least = too_big[degrees]
            row["status"], row["memory_least_gib"] = "pruned", least / 2**30
            row["why"] = (f"memory: at least {least / 2**30:.1f} GiB per chip with micro-batch "
                          f"{first} or more, even with full recompute, sequence parallelism "
                          f"and ZeRO; {usable / 2**30:.1f} GiB usable")
            continue
        candidate_job = screen_job(job, c)  # the scenario's job when it is simulated
        per_chip = screen.per_chip(candidate_job)
        row["memory_per_chip_gib"] = per_chip / 2**30
        bound = step_lower_bound(model, candidate_job, cache)
        row["bound_s"] = bound
        if per_chip > usable:
            row["status"] = "pruned"
            row["why"] = (f"memory: {per_chip / 2**30:.1f} GiB per chip, "
                          f"{usable / 2**30:.1f} GiB usable")
            if row["reference"]:
                survivors.append((bound, row, c))  # simulated all the same
            continue
        row["status"] = "bounded"
        survivors.append((bound, row, c))
    survivors.sort(key=lambda s: (s[0], tuple(str(v) for v in s[1].values())))
    return survivors


def plan(scenario: Scenario, options: PlanOptions = PlanOptions(), engine: Engine | None = None,
         progress: Any = None) -> PlanResult:
    """Search the scenario's first job's configurations; see the module doc."""
    if options.objective not in OBJECTIVES:
        raise PlanError(f"--objective {options.objective!r}: expected one of "
                        f"{', '.join(OBJECTIVES)}")
    if options.objective == "time-to-train" and options.tokens is None:
        raise PlanError("--objective time-to-train needs --tokens (e.g. --tokens 15T)")
    if (options.deadline_s is not None or options.budget_usd is not None) and not options.tokens:
        raise PlanError("--deadline and --budget need --tokens: the token budget to train")
    if not scenario.jobs:
        raise PlanError(f"{scenario.source}: jobs: the scenario has no job to plan")
    job = scenario.jobs[0]
    _check_site_sizes(scenario, options)
    if options.tokens is not None:
        # The planned scenario runs the budget as steps: at most MAX_STEPS of them (1e30
        # tokens planned 2e22 days, and the table squeezed its columns to "...").
        tokens_per_step = job.global_batch * job.sequence_length
        steps = math.ceil(options.tokens / tokens_per_step)
        if steps > limits.MAX_STEPS:
            raise PlanError(f"--tokens {options.tokens:.3g}: {steps:.3g} steps of the job's "
                            f"{tokens_per_step:,}-token batch; expected at most "
                            f"{limits.MAX_STEPS:.0e} steps, {limits.MAX_STEPS * tokens_per_step:.3g}"
                            " tokens (MAX_STEPS, docs/limits.md)")
    given = "parallelism" in job.model_fields_set
    notes: list[str] = []
    groups: list[Group] = []
    for name, hw in _hardware_list(scenario, options.hardware):
        if job.precision not in hw.chip.tflops:
            notes.append(f"{name}: no {job.precision} peak; skipped")
            continue
        sizes, size_notes = _sizes(scenario, job, options, hw)
        notes += size_notes
        groups += [_make_group(scenario, job, name, hw, chips) for chips in sizes]
    if not groups:
        raise PlanError("no hardware and size to plan on: " + "; ".join(notes))
    size = sum(space_size(g.hw, g.chips, job) for g in groups)
    if size > limits.MAX_PLAN_CANDIDATES:
        raise PlanError(f"the search would consider {size:,} candidates over {len(groups)} "
                        f"hardware and size(s); expected at most {limits.MAX_PLAN_CANDIDATES:,} "
                        "(docs/limits.md): fewer --chips sizes or --hardware, or a global batch "
                        "with fewer divisors")
    screened = {}
    shared: dict[str, tuple[dict, MemoryScreen]] = {}
    for index, g in enumerate(groups):
        if progress is not None:
            progress(index, len(groups), f"screening {g.name} x {g.chips:,} chips")
        screened[id(g)] = _screen(g, job, options, given, scenario, shared)
    with engine or Engine("local", workers=1) as runner:
        _branch_and_bound(job, groups, screened, runner, progress)
    result = _finish(scenario, job, options, groups, notes)
    if scenario.site_network is not None:
        from clustersim.planning.sites import site_options

        result.sites = site_options(scenario, result.best)
    return result


def _branch_and_bound(job: JobSpec, groups: list[Group], screened: dict[int, list],
                      runner: Engine, progress: Any) -> None:
    """Simulate each group's survivors in order of bound, in rounds, until every bound left
    is no faster than the group's best step (a reference is simulated first, always)."""
    position = {id(g): 0 for g in groups}
    best = {id(g): math.inf for g in groups}
    total = sum(len(s) for s in screened.values())
    first = [(g, row, job_for(job, c)) for g in groups for _, row, c in screened[id(g)]
             if row["reference"]]
    done = 0
    while True:
        batch = first
        first = []
        for g in groups:
            queue = screened[id(g)]
            taken = 0
            while position[id(g)] < len(queue) and taken < ROUND:
                bound, row, c = queue[position[id(g)]]
                if bound >= best[id(g)]:
                    break
                position[id(g)] += 1
                if row["reference"]:
                    continue
                cjob = job_for(job, c)
                tighter = quick_bound(step_model(g.key), cjob, bound)
                row["bound_s"] = tighter
                if tighter >= best[id(g)]:
                    row["status"] = "pruned"
                    row["why"] = (f"bound: at least {tighter:.4g} s per step, no faster than "
                                  f"the best simulated ({best[id(g)]:.4g} s)")
                    continue
                batch.append((g, row, cjob))
                taken += 1
        if not batch:
            break
        tasks = [(g.key, [cjob]) for g, _, cjob in batch]
        for (g, row, _), figures in zip(batch, runner.map(simulate_task, tasks), strict=True):
            if "unplaceable" in figures[0]:
                row["status"] = "pruned"
                row["why"] = f"placement: {figures[0]['unplaceable']}"
                continue
            row.update(figures[0])
            if row["status"] == "bounded":  # a reference pruned for memory stays pruned
                row["status"] = "simulated"
                best[id(g)] = min(best[id(g)], row["step_time_s"])
        done += len(batch)
        if progress is not None:
            progress(done, total, "simulating candidates")
    for g in groups:
        for bound, row, _ in screened[id(g)][position[id(g)]:]:
            if row["status"] == "bounded" and row.get("step_time_s") is None:
                row["status"] = "pruned"
                row["why"] = (f"bound: at least {bound:.4g} s per step, no faster than the "
                              f"best simulated ({best[id(g)]:.4g} s)")


def _finish(scenario: Scenario, job: JobSpec, options: PlanOptions, groups: list[Group],
            notes: list[str]) -> PlanResult:
    from clustersim.planning.figures import finish  # the figures and ranking

    return finish(scenario, job, options, groups, notes)
