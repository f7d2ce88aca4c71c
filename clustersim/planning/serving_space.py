"""The serving planner's candidates: replica shapes per hardware (a mixture's at each expert
parallelism it accepts), the scenario variant of each, the deployment's load and a lower
bound of the replicas it needs."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clustersim.hardware.catalog import catalog_entry, catalog_names
from clustersim.hardware.stacks import default_stack, stack_named
from clustersim.scenario.errors import ScenarioError
from clustersim.scenario.loader import scenario_from_dict
from clustersim.scenario.models import Scenario
from clustersim.scenario.serving import expert_parallel_issue
from clustersim.serving.requests import TraceError, generate_requests
from clustersim.serving.simulate import replica_models

__all__ = [
]

BATCHES = (16, 32, 64, 128, 256)


PIPELINE = (1, 2, 4)


class ServingPlanError(ValueError):
    """The plan cannot be made (no deployment, a trace's arrivals, nothing fits)."""


def _raw_variant(raw: dict[str, Any], deployment: dict[str, Any], hardware: Any, tp: int,
                 pp: int, replicas: int, max_batch: int, instances: int,
                 ep: int | None = None) -> dict[str, Any]:
    """The scenario serving only this deployment on `instances` of `hardware` (`ep`: a
    mixture's expert parallelism, written even at 1; None for a dense model, none written)."""
    out = copy.deepcopy(raw)
    out.pop("jobs", None)
    out.pop("workload", None)
    out["hardware"] = copy.deepcopy(hardware)
    # The deployment's own instances, as one site: `sites` (and the links and site events
    # that need them) replace instances, and `run` refuses both.
    cluster = {k: v for k, v in dict(out.get("cluster") or {}).items()
               if k not in ("ultraservers", "instances", "sites", "inter_site")}
    cluster["instances"] = instances
    out["cluster"] = cluster
    failures = out.get("failures")
    if isinstance(failures, dict) and "site_events" in failures:
        out["failures"] = {k: v for k, v in failures.items() if k != "site_events"}
    d = copy.deepcopy(deployment)
    if foreign_stack(d, hardware) is not None:
        del d["stack"]  # each hardware at its own best: with its own (default) stack
    if foreign_activations(d, hardware) is not None:
        d["precision"] = {k: v for k, v in d["precision"].items() if k != "activations"}
    d["parallelism"] = {"tp": tp, "pp": pp} if ep is None else {"tp": tp, "pp": pp, "ep": ep}
    d["replicas"] = replicas
    d["server"] = {**dict(d.get("server") or {}), "max_batch": max_batch}
    out["serve"] = [d]
    return out


def foreign_stack(deployment: dict[str, Any], hardware: Any) -> str | None:
    """What the plan says when the deployment's `stack` does not run on `hardware` (a
    catalog name of --hardware; the scenario's own hardware validated it): its stack is
    left out there, the hardware's default taken instead; None when it runs there."""
    named = stack_named(str(deployment.get("stack"))) if deployment.get("stack") else None
    if named is None or not isinstance(hardware, str):
        return None
    base = hardware.split("+")[0]
    if base in named.hardware:
        return None
    default = default_stack(base)
    return (f"{hardware}: the deployment's stack {named.name} runs on "
            f"{', '.join(named.hardware)}, so {hardware} is planned with "
            f"{default.name if default else 'no stack'} (its default)")


def foreign_activations(deployment: dict[str, Any], hardware: Any) -> str | None:
    """What the plan says when the deployment's activations (`precision.activations`, fp8)
    have no peak on `hardware` (a catalog name of --hardware: A100 has no fp8): they are
    left to their default there (the weights' precision, bf16 for fp8 weights); None when
    they run there."""
    precision = deployment.get("precision")
    if not isinstance(precision, dict) or not isinstance(hardware, str):
        return None
    compute = precision.get("activations")
    base = hardware.split("+")[0]
    if compute is None or base not in catalog_names() or \
            compute in catalog_entry(base).chip.tflops:
        return None
    return (f"{hardware}: its chip has no {compute} peak, so {hardware} is planned with the "
            f"activations at their default (weights {precision.get('weights', 'bf16')}, "
            "weight-only where the chip lacks them)")


def unfitted_mixture(deployment: dict[str, Any], model: Any, hardware: Any,
                     spec: Any) -> str | None:
    """What the plan says when a mixture is planned on `hardware` (HardwareSpec `spec`) with
    a stack that has no fitted MoE time there: its candidates' latencies are fast at small
    batches (serving.layers.mixture_overheads_fitted); None otherwise."""
    from clustersim.hardware.stacks import with_stack
    from clustersim.serving.layers import mixture_overheads_fitted

    named = stack_named(str(deployment.get("stack"))) if deployment.get("stack") else None
    stack = (named if named is not None and foreign_stack(deployment, hardware) is None
             else default_stack(spec.name.split("+")[0]))
    if mixture_overheads_fitted(model, with_stack(spec, stack)) is not False:
        return None
    label = hardware if isinstance(hardware, str) else spec.name
    whose = (f"its stack {stack.name} has no fitted MoE time there" if stack
             else "it has no serving stack there, so no fitted MoE time")
    return (f"{label}: {model.name} is a mixture and {whose}: its "
            "candidates' MoE layers cost their reads, FLOPs and all-to-all only, fast at small "
            "batches (docs/calibration.md#a-mixture-on-a-stack-without-a-mixture-fit)")


def _instances_for(ranks_per_replica: int, replicas: int, hw: Any) -> int:
    """Instances the replicas take, in whole UltraServers on UltraServer hardware."""
    instances = -(-ranks_per_replica * replicas // hw.ranks_per_instance)
    per = hw.instances_per_ultraserver if hw.ultraserver else 1
    return per * -(-instances // per)


@dataclass
class _Shape:
    """A replica shape on one hardware entry, with its bound."""

    hardware: str
    hw_value: Any  # what goes under `hardware:` in the scenario
    spec: Any  # HardwareSpec
    tp: int
    pp: int
    max_batch: int
    why: str = ""
    rate_bound_per_s: float = math.inf  # requests/s one replica can serve at most
    replicas_bound: int = 1
    instances_bound: int = 1
    usd_per_h_bound: float = math.inf
    kv_capacity_tokens: int = 0
    decode_batch1_s: float = math.nan
    simulations: int = 0  # trials run for a shape the search gave up on cost
    ep: int | None = None  # a mixture's expert parallelism (None: a dense model)


def _load(scenario: Scenario, index: int, base_dir: Path | None, goodput: float
          ) -> tuple[float, float, float, int, int]:
    """(rate, mean input, mean output, longest request, the shortest prompt that
    `goodput` of the requests reach) of the deployment's requests over the horizon (the
    requests `run` draws)."""
    d = scenario.serve[index]
    try:
        requests = generate_requests(d.workload, scenario.duration_s - d.start_s,
                                     np.random.SeedSequence(scenario.seed), base_dir)
    except TraceError as error:  # as `run` refuses it: the key, the value, the reason
        raise ServingPlanError(f"serve.{index}.workload.trace = "
                               f"{d.workload.trace!r}: {error}") from None
    if len(requests.arrival_s) == 0:
        raise ServingPlanError(f"deployment {d.name!r} gets no requests over the horizon")
    span = max(scenario.duration_s - d.start_s, 1e-9)
    rate = float(d.workload.rate_per_s) if d.workload.rate_per_s else len(requests.arrival_s) / span
    inputs, outputs = requests.input_tokens, requests.output_tokens
    # The k-th shortest prompt, k = goodput x requests: if it alone misses the TTFT bound,
    # so does every prompt at least as long, and fewer than goodput of the requests can meet
    # the SLO (a request's TTFT is at least its prompt's prefill on an idle replica).
    k = max(1, math.ceil(goodput * len(inputs) - 1e-9))
    return (rate, float(inputs.mean()), float(outputs.mean()),
            int((inputs + outputs).max()), int(np.partition(inputs, k - 1)[k - 1]))


@dataclass(frozen=True)
class BoundTask:
    """Some shapes' bounds, picklable for a worker: each shape's one-replica scenario
    validated, then `_bound` at the deployment's load (`_load`'s figures)."""

    shapes: tuple[_Shape, ...]
    raw: dict[str, Any]  # the scenario as read
    raw_deployment: dict[str, Any]
    source: str
    base_dir: Path | None
    load: tuple[float, float, float, int, int]  # _load's (rate, mean in, mean out, ...)
    goodput: float


# What bounding sets on a shape, sent back from a worker.
BOUND_FIELDS = ("why", "kv_capacity_tokens", "decode_batch1_s", "rate_bound_per_s",
                "replicas_bound", "instances_bound", "usd_per_h_bound")


def bound_shapes(task: BoundTask) -> list[dict[str, Any]]:
    """Each shape's BOUND_FIELDS once validated (`why` says why not) and bounded: the same
    figures wherever it runs, so the engine that runs it changes no answer."""
    out = []
    for shape in task.shapes:
        if shape.why:  # pruned already
            out.append({key: getattr(shape, key) for key in BOUND_FIELDS})
            continue
        try:
            one = scenario_from_dict(_raw_variant(
                task.raw, task.raw_deployment, shape.hw_value, shape.tp, shape.pp, 1,
                shape.max_batch, _instances_for(shape.tp * shape.pp, 1, shape.spec),
                shape.ep), task.source, base_dir=task.base_dir)
        except ScenarioError as error:
            shape.why = "validation: " + _first_issue(error)
        else:
            _bound(shape, one, *task.load, task.goodput)
        out.append({key: getattr(shape, key) for key in BOUND_FIELDS})
    return out


def _first_issue(error: ScenarioError) -> str:
    text = str(error).strip().splitlines()
    return (text[1] if len(text) > 1 else text[0]).strip().lstrip("- ")


def _bound(shape: _Shape, variant: Scenario, load: float, mean_in: float, mean_out: float,
           longest: int, kth_in: int, goodput: float) -> None:
    """Prune the shape, or set its lower bound of replicas and cost per hour at the load."""
    d = variant.serve[0]
    cost, capacity, _ = replica_models(variant, d)
    shape.kv_capacity_tokens = int(capacity)
    if capacity < longest:
        shape.why = (f"memory: the KV cache holds {capacity:,} tokens per replica, the longest "
                     f"request needs {longest:,}")
        return
    tpi = cost.tokens_per_iteration
    context = mean_in  # each sequence holds at least its prompt's KV while it decodes
    # what its windowed layers skip of it at most (all of it on chunked layers, whose span
    # restarts at each chunk), so the reads stay a lower bound
    excess = cost.least_excess(context)
    shape.decode_batch1_s = cost.run_s(1, context, 1, excess) / tpi
    if shape.decode_batch1_s > d.slo.tpot_s:
        shape.why = (f"slo: a decode iteration of one sequence takes "
                     f"{shape.decode_batch1_s * 1e3:,.1f} ms per token, over the TPOT bound "
                     f"{d.slo.tpot_s * 1e3:g} ms")
        return
    prefill = cost.target.prefill_s(max(1, kth_in))
    if prefill > d.slo.ttft_s:
        shape.why = (f"slo: a {kth_in:,}-token prompt alone takes {prefill:,.2f} s to prefill, "
                     f"over the TTFT bound {d.slo.ttft_s:g} s, and over {1 - goodput:.1%} of "
                     "the prompts are at least that long")
        return
    # The least seconds per output token at a batch whose iteration meets the TPOT bound,
    # within max_batch and the KV cache (each sequence holds at least its prompt). An
    # iteration's time grows with the batch, so the largest such batch is found exactly
    # (bisection); below it, between sampled batches b < b' (at most 10% apart), a batch's
    # per-token time is at least base(b) / b', so the minimum is bounded from below without
    # costing every batch (24 sampled batches alone missed the best one by up to 27%).
    most = max(1, min(shape.max_batch, int(capacity // max(1.0, context))))
    tpot = d.slo.tpot_s * tpi
    low, high = 1, most  # iteration(low) meets the bound (checked above)
    while low < high:
        middle = (low + high + 1) // 2
        if cost.run_s(middle, middle * context, 1, middle * excess) <= tpot:
            low = middle
        else:
            high = middle - 1
    samples = np.unique(np.round(np.geomspace(
        1, low, num=max(2, math.ceil(math.log(max(low, 2)) / math.log(1.1)) + 1))).astype(int))
    # The least of base(b_i) / b_(i+1) and base(low) / low (base: the iteration less its KV
    # reads), from the largest sample down. An iteration of b sequences costs at least one of
    # one, so base(b_i) / b_(i+1) >= base(1) / b_(i+1): once that cannot beat the least found,
    # no smaller sample's term can, and the rest are not costed. The same minimum as costing
    # every sample, from the few largest (a mixture's ep shapes made this loop most of the
    # planner's time).
    first = cost.run_s(1, 0.0, 1)  # samples[0] is 1
    per_batch = cost.run_s(int(samples[-1]), 0.0, 1) / low
    for i in range(len(samples) - 2, -1, -1):
        if first / samples[i + 1] >= per_batch:
            break
        per_batch = min(per_batch, (first if i == 0 else cost.run_s(int(samples[i]), 0.0, 1))
                        / samples[i + 1])
    per_token = (per_batch + cost.kv_s * context - cost.window_s * excess) / tpi
    # Prefill counts at half its marginal time (its iteration less a one-token one): merged
    # into decode iterations by chunked prefill, a prompt's matrix work shares their weight
    # streaming, so its standalone time overstates what it adds; halved, the rate stays an
    # upper bound on the calibrated cases (tests/test_serving_plan.py checks it against the
    # capacity found by simulation). The first output token is prefill's: decode makes the
    # rest.
    prefill = cost.target.prefill_s(max(1, int(mean_in))) - cost.target.prefill_s(1)
    seconds_per_request = 0.5 * max(0.0, prefill) + max(0.0, mean_out - 1.0) * per_token
    shape.rate_bound_per_s = 1.0 / seconds_per_request if seconds_per_request > 0 else math.inf
    shape.replicas_bound = max(1, math.ceil(load / shape.rate_bound_per_s - 1e-9))
    # The instances the cost figure charges (deployment_instances: not rounded up to whole
    # UltraServers, as the cluster _instances_for builds is), so the bound stays below it.
    shape.instances_bound = -(-shape.tp * shape.pp * shape.replicas_bound
                              // shape.spec.ranks_per_instance)
    price = shape.spec.instance.price_per_hour_usd
    shape.usd_per_h_bound = shape.instances_bound * (price if price is not None else
                                                     shape.spec.chips_per_instance)


def _shapes(name: str, hw_value: Any, spec: Any, batches: tuple[int, ...], d: Any
            ) -> list[_Shape]:
    """Every replica shape to consider: tensor parallelism in powers of two up to the
    NeuronLink (or NVLink) domain, pipeline stages, batch limits, and for a mixture every
    expert parallelism a deployment accepts (`_expert_parallelism`)."""
    domain = spec.ranks_per_instance * (spec.instances_per_ultraserver if spec.ultraserver
                                        else 1)
    tps = [2 ** k for k in range(int(math.log2(domain)) + 1)]
    out = []
    for tp in tps:
        for pp in PIPELINE:
            for ep in _expert_parallelism(tp, d.model):
                for batch in sorted(set(batches) | {d.server.max_batch}):
                    out.append(_Shape(name, hw_value, spec, tp, pp, batch, ep=ep))
    return out


def _expert_parallelism(tp: int, model: Any) -> list[int | None]:
    """The expert parallelism of a replica of tensor parallelism `tp`: [None] for a dense
    model (no `ep` key, as before the planner searched it); for a mixture each divisor of
    tp the deployment's own rule accepts (scenario.serving.expert_parallel_issue: ep divides
    tp and the experts), 1 included. ep never adds ranks (its groups are made of the tp
    ranks), so a shape's chips and price are its tp x pp whatever its ep. At most
    log2(tp) + 1 values per tp: 28 (tp, ep) pairs for 7 tps on a 64-rank domain, each
    bounded and pruned as any shape (the bounds on the engine: serving_plan._bound_all)."""
    if not model.moe:
        return [None]
    return [ep for ep in range(1, tp + 1)
            if tp % ep == 0 and expert_parallel_issue(ep, tp, model) is None]
