"""The rules that tie a scenario's sections together, checked once every section is valid.

Each rule yields an Issue naming the key path, the value and what was expected, so that one
ScenarioError lists every problem of the file at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from clustersim.hardware import limits, units
from clustersim.hardware.topology import TopologyTooLarge, check_topology_size
from clustersim.scenario.errors import Issue
from clustersim.scenario.fleetday import fleet_day_checks, is_fleet_day
from clustersim.scenario.serving import serve_budget_checks, serve_cross_checks
from clustersim.scenario.sites import site_checks
from clustersim.training.transformer import sharded_heads

if TYPE_CHECKING:
    from clustersim.scenario.models import JobSpec, Scenario

__all__ = ["cross_checks"]


def _size_checks(s: Scenario) -> Iterable[Issue]:
    """The whole cluster within what one machine simulates: chips, and the nodes and links of
    its topology graph (docs/limits.md)."""
    where = "cluster.sites" if s.cluster.sites else (
        "cluster.instances" if s.cluster.instances is not None else "cluster.ultraservers")
    if s.total_chips > limits.MAX_CHIPS:
        yield Issue(where, f"the cluster would have {s.total_chips:,} chips (spares "
                    f"included); expected at most {limits.MAX_CHIPS:,} (docs/limits.md)",
                    s.cluster.instances or s.cluster.ultraservers, True)
        return
    try:
        check_topology_size(s.hardware, s.total_instances, s.cluster.fabric)
    except TopologyTooLarge as error:
        yield Issue("cluster", str(error))


def _sharding_checks(at: str, job: JobSpec, planned: bool = False) -> Iterable[Issue]:
    """Context parallelism and ZeRO's shard groups against the model and the degrees;
    routing's load against ep (`planned`: `clustersim plan` chooses ep, so any)."""
    par, model = job.parallelism, job.model
    if par.cp > 1:
        if job.sequence_length % par.cp:
            yield Issue(f"{at}.parallelism.cp", f"the sequence length {job.sequence_length} is "
                        f"not divisible by cp", par.cp, True)
        per_rank = sharded_heads(model, par.tp).per_rank
        if par.cp_comm == "all-to-all" and per_rank % par.cp:
            yield Issue(f"{at}.parallelism.cp", f"all-to-all context parallelism splits the "
                        f"{per_rank} heads of a tensor-parallel rank over cp", par.cp, True)
    positions = job.sequence_length // par.cp  # a context-parallel rank's share
    if par.sequence_parallel and par.tp > 1 and not job.sequence_length % par.cp and (
            positions % par.tp):
        # Megatron and NxD scatter the sequence over the tensor-parallel ranks between the
        # tensor-parallel blocks and assert that tp divides it (_split_along_first_dim).
        what = (f"a cp rank's {positions} positions (seq_len {job.sequence_length} over cp "
                f"{par.cp})" if par.cp > 1 else f"seq_len {job.sequence_length}")
        by = f"tp x cp = {par.tp * par.cp}" if par.cp > 1 else f"tp = {par.tp}"
        yield Issue(f"{at}.parallelism.sequence_parallel", f"splits {what} over tp {par.tp}, "
                    f"which does not divide it; expected a seq_len divisible by {by}, as "
                    "Megatron and NxD scatter the sequence over the tp ranks; or "
                    "sequence_parallel: false", par.sequence_parallel, True)
    if par.shard is not None:
        if par.zero == 0:
            yield Issue(f"{at}.parallelism.shard", "a shard group needs zero 1, 2 or 3",
                        par.shard, True)
        elif par.replicas % par.shard:
            yield Issue(f"{at}.parallelism.shard", f"must divide the {par.replicas} "
                        f"data-parallel ranks (dp x cp)", par.shard, True)
    if not model.moe and (job.routing_imbalance != 1.0 or job.capacity_factor is not None):
        key = "routing_imbalance" if job.routing_imbalance != 1.0 else "capacity_factor"
        yield Issue(f"{at}.{key}", f"applies to a mixture of experts; {model.name} is dense",
                    getattr(job, key), True)
    elif model.moe and job.capacity_factor is not None and (
            job.capacity_factor > model.experts / model.top_k):
        # An expert's capacity past every routed token is padding no token fills.
        most = model.experts / model.top_k
        yield Issue(f"{at}.capacity_factor", f"an expert of {model.name} receives at most "
                    f"every token, {most:g}x its mean ({model.experts} experts over top_k "
                    f"{model.top_k}); expected at most {most:g}", job.capacity_factor, True)
    elif model.moe and job.routing_imbalance != 1.0:
        # training.experts.expert_load would otherwise drop or cap the written value
        if job.capacity_factor is not None:
            yield Issue(f"{at}.routing_imbalance", "a capacity_factor sets the busiest "
                        "rank's load in its place; expected one of the two",
                        job.routing_imbalance, True)
        elif planned:
            pass  # the plan's ep is not known yet; expert_load caps the load at it
        elif par.ep == 1:
            yield Issue(f"{at}.routing_imbalance", "without expert parallelism (ep 1) a rank "
                        "holds every expert and sees every routed token: its load is 1; "
                        "expected 1, or ep > 1", job.routing_imbalance, True)
        elif job.routing_imbalance > par.ep:
            yield Issue(f"{at}.routing_imbalance", f"the busiest of ep {par.ep} expert-"
                        f"parallel ranks receives at most {par.ep}x the mean (every rank's "
                        f"tokens); expected at most {par.ep}", job.routing_imbalance, True)
    if par.ep > 1 and par.shard is not None:
        yield Issue(f"{at}.parallelism.shard", "hybrid sharding of a mixture of experts with "
                    "ep > 1 is not modelled yet; use ZeRO without shard", par.shard, True)


def _team_checks(s: Scenario) -> Iterable[Issue]:
    """Teams named once; with a `teams:` list, every job's team is on it (a typo would
    otherwise make a team without quota); a quota no job could ever fit under."""
    names = [t.name for t in s.teams]
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            yield Issue(f"teams.{index}.name", "named twice; expected each team once", name,
                        True)
        seen.add(name)
    if not s.teams:
        return
    quotas = {t.name: t.quota for t in s.teams}
    for index, job in enumerate(s.jobs):
        if job.team is not None and job.team not in quotas:
            yield Issue(f"jobs.{index}.team", f"not a team of `teams:`; expected one of "
                        f"{', '.join(sorted(quotas)[:10])}", job.team, True)
            return  # one is enough: a generated mix would repeat it 100,000 times


def cross_checks(s: Scenario, planning: bool = False) -> Iterable[Issue]:
    """Every problem that spans sections: cluster sizes against UltraServers and leaves, each
    job's parallelism against its instances, the model and the batch, times against the
    duration. With `planning`, the first job's parallelism may be omitted (plan chooses it)."""
    site_issues = list(site_checks(s))
    if site_issues:  # the cluster's size is not known: nothing else can be checked
        yield from site_issues
        return
    hw = s.hardware
    per_us = hw.instances_per_ultraserver
    if s.cluster.ultraservers is not None and hw.ultraserver is None:
        yield Issue(
            "cluster.ultraservers", f"hardware {hw.name} has no UltraServer; give instances",
            s.cluster.ultraservers, True,
        )
    if hw.ultraserver is not None:
        if s.cluster.instances is not None and s.cluster.instances % per_us:
            yield Issue(
                "cluster.instances",
                f"{hw.name} instances come in UltraServers of {per_us}; expected a multiple "
                f"of {per_us} (or give ultraservers)",
                s.cluster.instances, True,
            )
        if s.cluster.spares % per_us:
            yield Issue(
                "cluster.spares",
                f"spares of {hw.name} are whole UltraServers; expected a multiple of {per_us}",
                s.cluster.spares, True,
            )
    per_leaf = s.cluster.fabric.instances_per_leaf
    if per_leaf is not None and per_leaf % per_us:
        yield Issue(
            "cluster.fabric.instances_per_leaf",
            f"a leaf holds whole UltraServers; expected a multiple of {per_us}",
            per_leaf, True,
        )
    if s.trace.bin_s > s.duration_s:
        yield Issue("trace.bin", f"longer than the scenario's duration "
                    f"({units.format_duration(s.duration_s)})",
                    units.format_duration(s.trace.bin_s), True)

    yield from _size_checks(s)
    seen: set[str] = set()
    rpi = hw.ranks_per_instance
    # (once: over several sites it resolves the site network, 130 us a job of a million)
    working = s.working_instances
    for index, job in enumerate(s.jobs):
        at = f"jobs.{index}"
        par = job.parallelism
        if job.name in seen:
            yield Issue(f"{at}.name", "job names must be unique", job.name, True)
        seen.add(job.name)
        if "parallelism" not in job.model_fields_set:
            # `clustersim plan` chooses the first job's parallelism; a run needs it written.
            if not (planning and index == 0):
                yield Issue(f"{at}.parallelism", "required key is missing: give {tp, pp, dp} "
                            "or let `clustersim plan SCENARIO --write-scenario FILE` choose it")
            continue
        cp_shown = f" x cp {par.cp}" if par.cp > 1 else ""
        # the degrees whose product the messages below are about, as the value shown
        degrees = {"tp": par.tp, **({"cp": par.cp} if par.cp > 1 else {}), "pp": par.pp,
                   "dp": par.dp}
        shown = f"tp {par.tp}{cp_shown} x pp {par.pp} x dp {par.dp} = {par.ranks} ranks"
        if job.instances is not None:
            if par.ranks != job.instances * rpi:
                yield Issue(
                    f"{at}.parallelism",
                    f"{shown}; expected {job.instances * rpi} = {job.instances} instances x "
                    f"{rpi} ranks per {hw.instance.name}",
                    degrees, True,
                )
        elif par.ranks % rpi:
            yield Issue(
                f"{at}.parallelism",
                f"{shown} is not a whole number of {hw.instance.name} instances "
                f"({rpi} ranks each); expected a multiple of {rpi}",
                degrees, True,
            )
        instances = s.job_instances(job)
        if instances > working:
            written = job.instances is not None
            yield Issue(
                f"{at}.instances" if written else f"{at}.parallelism",
                f"the job needs {instances} instances but the cluster has "
                f"{s.working_instances} (plus {s.total_instances - s.working_instances} "
                "spares)",  # (with sites the spares are per site: cluster.spares is 0)
                instances if written else degrees, True,
            )
        model = job.model
        # A tp that does not divide the heads is run as NxD runs it: heads padded up to a
        # multiple of tp, KV heads replicated or converted (training.transformer
        # .sharded_heads); the padded work is costed and `step` notes it.
        if par.ep > 1 and not model.moe:
            yield Issue(f"{at}.parallelism.ep",
                        f"expert parallelism needs a mixture-of-experts model; {model.name} "
                        f"is dense (experts: 1)", par.ep, True)
        elif par.ep > 1 and (par.dp % par.ep or model.experts % par.ep):
            yield Issue(f"{at}.parallelism.ep",
                        f"ep must divide both dp ({par.dp}) and the model's {model.experts} "
                        f"experts", par.ep, True)
        stages = par.pp * par.interleave
        if model.layers < stages:
            # Uneven stages are fine (training.stages); an empty one is not.
            yield Issue(
                f"{at}.parallelism",
                f"the model's {model.layers} layers cannot fill pp x interleave = {stages} "
                f"stages (each needs at least one layer)",
                {"pp": par.pp, "interleave": par.interleave}, True,
            )
        yield from _sharding_checks(at, job, planning and index == 0)
        if par.interleave > 1 and par.pp == 1:
            yield Issue(
                f"{at}.parallelism.interleave",
                "interleaved schedules need pp greater than 1", par.interleave, True,
            )
        microbatches = job.global_batch // (job.micro_batch * par.dp)
        passes = par.pp * par.interleave * microbatches
        if passes > limits.MAX_PIPELINE_PASSES:
            yield Issue(
                f"{at}.global_batch",
                f"one step would schedule {passes:,} pipeline passes (pp x interleave x "
                f"{microbatches:,} micro-batches); expected at most "
                f"{limits.MAX_PIPELINE_PASSES:,} (docs/limits.md): a larger micro_batch",
                job.global_batch, True,
            )
        if par.interleave > 1 and microbatches % par.pp:
            yield Issue(
                f"{at}.parallelism.interleave",
                f"the interleaved schedule needs the {microbatches} micro-batches per step "
                f"(global_batch / (micro_batch x dp)) to be a multiple of pp = {par.pp}",
                par.interleave, True,
            )
        if job.global_batch % (job.micro_batch * par.dp):
            yield Issue(
                f"{at}.global_batch",
                f"not divisible by micro_batch x dp = {job.micro_batch} x {par.dp}",
                job.global_batch, True,
            )
        if job.precision not in hw.chip.tflops:
            yield Issue(
                f"{at}.precision",
                f"{hw.chip.name} has no {job.precision} figure; expected one of "
                f"{', '.join(hw.chip.tflops)}",
                job.precision, True,
            )
        if job.submit_s >= s.duration_s:
            yield Issue(f"{at}.submit", f"at or after the end of the scenario "
                        f"({units.format_duration(s.duration_s)})",
                        units.format_duration(job.submit_s), True)
    largest_job = max((s.job_instances(job) for job in s.jobs), default=0)
    # A job whose tensor parallelism spans a ring UltraServer's instances is placed on whole
    # UltraServers (as the timeline places it).
    whole = max((-(-s.job_instances(job) // hw.instances_per_ultraserver) for job in s.jobs
                 if hw.whole_ultraservers(job.parallelism.tp)), default=0)
    yield from _team_checks(s)
    yield from (Issue(path, message, value, True) for path, message, value in fleet_day_checks(s))
    if is_fleet_day(s):  # replicas come and go, jobs wait or are preempted for them
        largest_job = whole = 0
    for path, message, value in serve_cross_checks(s.serve, hw, s.working_instances,
                                                    largest_job, whole):
        yield Issue(path, message, value, value is not None)  # (None: a count of several)
    for path, message, value in serve_budget_checks(s.serve, hw, s.duration_s,
                                                     (job.name for job in s.jobs)):
        yield Issue(path, message, value, True)
    for index, d in enumerate(s.serve):  # a draft proposes the target's tokens
        draft = d.speculative.draft if d.speculative is not None else None
        if draft is not None and draft.vocab != d.model.vocab:
            yield Issue(f"serve.{index}.speculative.draft", f"its vocabulary has "
                        f"{draft.vocab:,} tokens, the target's {d.model.vocab:,}: a draft "
                        "proposes the target's tokens; expected a draft of the target's "
                        "tokenizer", draft.name, True)
