"""Serving deployments of a scenario: build each replica's iteration model on its chips,
simulate the fleets on one simpy environment, and reduce the outcome to the contract's
figures and tables.

Replicas take the cluster's instances in order, deployment after deployment (each replica on
whole instances, or ranks of one instance when it needs fewer). The iteration model of a
replica shape is built once on a small topology of the same hardware and fabric (a replica's
collectives run inside its own instances; only the disaggregated KV transfer crosses the
fabric). Hardware failures come from the training timeline of the same run when it is given
(`outages`): a failure of a serving instance takes down every replica with ranks on it (a
chip's failure too: the timeline downs the whole instance for its repair) for as long as the
timeline says (the detection and
the restart when a hot spare took the instance's place, plus the repair when none was free),
so serving and training share one failure history. Software failures, which down no
hardware, and without `outages` all failures, are drawn here from the scenario's rates summed
over a replica's chips, instances and UltraServers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import simpy

from clustersim.analysis.trace import SCHEMAS
from clustersim.cluster.timeline import effective_rates
from clustersim.collectives.model import Group
from clustersim.hardware.build import build_topology
from clustersim.hardware.precision import BYTES_PER_ELEMENT
from clustersim.hardware.stacks import with_stack
from clustersim.scenario.loader import Issue, Scenario, ScenarioError
from clustersim.scenario.serving import (
    MAX_REQUEST_TOKENS,
    DeploymentSpec,
    LengthSpec,
    deployment_instances,
)
from clustersim.serving.attention import sequence_kv_bytes
from clustersim.serving.events import ServingEnvironment
from clustersim.serving.fit import weights_fit_issue
from clustersim.serving.fleet import STATUS, Fleet
from clustersim.serving.iteration import IterationModel, ReplicaShape
from clustersim.serving.layers import mixture_overheads_fitted
from clustersim.serving.load import load_rates, load_seed
from clustersim.serving.replica import DecodeCost
from clustersim.serving.request_fit import request_fit_issues
from clustersim.serving.requests import TraceError, generate_requests, read_request_trace

__all__ = ["ServingResult", "simulate_serving", "replica_models", "deployment_figures",
           "requests_table", "replica_series_table", "replicas_on_instance", "saturated",
           "weights_fit_issue", "check_serving_fit"]


@dataclass
class ServingResult:
    """The fleets after a run, with what the figures need."""

    fleets: dict[str, Fleet]
    models: dict[str, tuple[DecodeCost, int, int]]  # cost, KV capacity, instances per replica
    horizon_s: float


def _instances_per_replica(scenario: Scenario, d: DeploymentSpec) -> int:
    return max(1, math.ceil(d.tp * d.pp / scenario.hardware.ranks_per_instance))


def _longest_sequence(d: DeploymentSpec) -> int:
    """The most tokens a request of the deployment holds: its longest prompt and output (a
    trace's lengths: the loader's limit)."""
    def longest(spec: LengthSpec) -> int:
        if spec.distribution == "fixed":
            return int(spec.value)
        return spec.max if spec.distribution == "lognormal" else MAX_REQUEST_TOKENS

    return longest(d.workload.input_tokens) + longest(d.workload.output_tokens)


def replica_models(scenario: Scenario, d: DeploymentSpec) -> tuple[DecodeCost, int, Any]:
    """(decode cost, KV capacity in tokens, KV transfer time function) of one replica."""
    longest = _longest_sequence(d)  # whether a sliding window bounds the KV cache
    model = d.model
    hw = with_stack(scenario.hardware, d.serving_stack(scenario.hardware.name))
    per = _instances_per_replica(scenario, d)
    ipu = hw.instances_per_ultraserver
    small = max(2 * per, ipu * math.ceil(2 * per / ipu))
    topology = build_topology(hw, small, scenario.cluster.fabric)
    p = d.precisions
    shape = ReplicaShape(model, p.weights, d.tp, d.pp, p.kv_cache, p.activations, d.ep,
                         d.routing_skew, longest)
    target = IterationModel(shape, topology)
    draft = None
    lines = d.server.max_batch  # each line's sliding-window caches, held whole
    capacity = target.kv_capacity_tokens(d.server.kv_reserve, lines)
    if d.speculative is not None:
        q = d.draft_precisions
        draft = IterationModel(ReplicaShape(d.speculative.draft, q.weights, d.draft_tp, 1,
                                            q.kv_cache, q.activations,
                                            longest_sequence=longest), topology)
        # The draft's weights and its KV cache share the busiest chip's HBM.
        free = (target.usable_hbm_bytes(d.server.kv_reserve)
                - target.weight_bytes_per_chip() - draft.weight_bytes_per_chip()
                - target.windowed_cache_bytes_per_chip(lines)
                - draft.windowed_cache_bytes_per_chip(lines))
        capacity = int(free // (target.kv_bytes_per_token_per_chip()
                                + draft.kv_bytes_per_token_per_chip()))
    cost = DecodeCost(target, draft, d.speculative.tokens if d.speculative else 0,
                      d.speculative.acceptance if d.speculative else 0.0,
                      d.speculative.fused if d.speculative else True)
    cost.buckets = d.context_buckets(scenario.hardware.name)
    cost.static_batch = d.server.static_batch
    kv_element = BYTES_PER_ELEMENT[p.kv_cache]
    source = 0
    peer = int(per * hw.chips_per_instance)  # the same chip of the next replica's instance
    cache: dict[int, float] = {}

    def transfer_s(tokens: int) -> float:
        if tokens not in cache:
            cache[tokens] = target.collectives.cost(
                "send-recv", Group(np.array([source]), 1),
                sequence_kv_bytes(model, kv_element, tokens, longest) / target.chips,
                peer=peer).time_s
        return cache[tokens]

    return cost, max(0, capacity), transfer_s


def check_serving_fit(scenario: Scenario) -> None:
    """Refuse (ScenarioError, exit 2, before any work) every deployment whose weights do not
    fit (weights_fit_issue) or whose requests never can (serving.request_fit)."""
    issues = []
    for d in scenario.serve:
        cost, capacity, _ = replica_models(scenario, d)
        issue = weights_fit_issue(scenario, d, cost, capacity)
        issues += [issue] if issue is not None else request_fit_issues(scenario, d, capacity)
    if issues:
        raise ScenarioError(scenario.source, issues)


def check_request_trace_rows(scenario: Scenario, base_dir: Path | None) -> None:
    """Refuse (ScenarioError) a deployment's request trace whose rows `run` would refuse:
    read as the run reads it, and for `arrival: trace` its arrivals within the horizon
    (what `validate` checks without simulating)."""
    for index, d in enumerate(scenario.serve):
        if d.workload.trace is None:
            continue
        try:
            if d.workload.arrival == "trace":  # as many requests as the trace has rows
                generate_requests(d.workload, scenario.duration_s - d.start_s,
                                  np.random.SeedSequence(0), base_dir)
            else:  # the arrivals are drawn: only the lengths come from the trace
                path = Path(d.workload.trace)
                read_request_trace(path if path.is_absolute() or base_dir is None
                                   else base_dir / path)
        except TraceError as error:
            raise ScenarioError(scenario.source, [Issue(
                f"serve.{index}.workload.trace", str(error), d.workload.trace, True)]) from None


def _replica_failure_rate(scenario: Scenario, d: DeploymentSpec, software_only: bool = False
                          ) -> float:
    """Failures per second of one replica: every rate summed over the replica's chips,
    instances and UltraServers, or only the software ones (the timeline downs no hardware
    for those, so they are drawn here even when hardware failures come from it)."""
    hw = scenario.hardware
    per = _instances_per_replica(scenario, d)
    # A chip's failure downs its whole instance (as the timeline has it), so every chip of
    # the replica's instances counts, however few the replica uses.
    units = {"chip": per * hw.chips_per_instance, "instance": per, "job": 1,
             "ultraserver": per / hw.instances_per_ultraserver if hw.ultraserver else 0.0,
             "leaf": 0.0}
    scale = scenario.failures.scale
    return sum(r.events_per_s * units[r.per] * scale for r in effective_rates(scenario)
               if not software_only or r.component == "software")


def replicas_on_instance(scenario: Scenario, d: DeploymentSpec, local_instance: int,
                         chip: int = -1) -> range:
    """The replicas of a deployment with ranks on its `local_instance`-th instance, or with
    `chip` >= 0 on that chip of it (replicas take the deployment's ranks in order, chip
    after chip, instance after instance)."""
    hw = scenario.hardware
    ranks = d.tp * d.pp
    if chip >= 0:
        first_rank = (local_instance * hw.chips_per_instance + chip) * hw.chip.ranks
        width = hw.chip.ranks
    else:
        first_rank = local_instance * hw.ranks_per_instance
        width = hw.ranks_per_instance
    first = first_rank // ranks
    last = min(d.replicas, -(-(first_rank + width) // ranks))
    return range(first, last)


def _failures(env: simpy.Environment, scenario: Scenario, fleet: Fleet, d: DeploymentSpec,
              rng: np.random.Generator, horizon_s: float,
              outages: list[tuple[float, int, int, float]] | None = None) -> None:
    """Schedule the deployment's replica failures. Without `outages`, all drawn from the
    rates, each down for the detection plus the restart (a hot spare takes the replica's
    place) or plus the repair. With `outages` ((time, local instance, chip or -1, down
    seconds) from the timeline), those for the replicas they hit, plus software failures
    drawn from the rates, each down for the detection plus the restart."""
    f = scenario.failures
    rate = _replica_failure_rate(scenario, d, software_only=outages is not None) * d.replicas
    count = rng.poisson(rate * horizon_s) if rate > 0 else 0
    times = np.sort(rng.uniform(0.0, horizon_s, count))
    which = rng.integers(0, d.replicas, count)
    # software, or a hot spare (over sites, the sites' own: cluster.spares is 0 there)
    if outages is not None or scenario.total_instances > scenario.working_instances:
        drawn_down_s = f.detect_s + f.restart_s
    else:
        drawn_down_s = math.inf if f.repair_s == "never" else f.detect_s + f.repair_s + f.restart_s
    events = [(t, index, drawn_down_s)
              for t, index in zip(times.tolist(), which.tolist(), strict=True)]
    for time_s, instance, _chip, down_s in outages or ():  # the whole instance is down
        events += [(time_s, index, down_s)
                   for index in replicas_on_instance(scenario, d, instance)]
    if not events:
        return
    events.sort()

    def process():
        for time_s, index, down_s in events:
            yield env.timeout(time_s - env.now)
            fleet.fail(index, down_s)

    env.process(process())


def simulate_serving(scenario: Scenario, seed: np.random.SeedSequence,
                     base_dir: Path | None = None,
                     outages: Sequence[tuple[float, int, int, float]] | None = None,
                     trial: Any = None, stratified: bool = False) -> ServingResult:
    """Simulate every deployment of the scenario over its horizon (plus the time to drain
    requests in flight at the end, up to one more horizon). `outages`: (time, instance) of the
    hardware failures the training timeline of the same run applied to serving instances, as
    (time, slot, chip or -1, down seconds); without them, hardware failures are drawn here.
    `trial` (serving.trials.SloTrial) stops the run once its deployment's SLO attainment is
    decided short of its target. `stratified`: log-normal lengths drawn stratified (the fluid
    level's capacity run, clustersim.serving.requests)."""
    env = ServingEnvironment()
    horizon = scenario.duration_s
    fleets: dict[str, Fleet] = {}
    models: dict[str, tuple[DecodeCost, int, int]] = {}
    streams = seed.spawn(len(scenario.serve))
    first = 0  # the deployment's first instance: deployments take instances in order
    for d, stream in zip(scenario.serve, streams, strict=True):
        request_seed, failure_seed = stream.spawn(2)
        load = None
        if d.workload.load is not None:  # the same curve and noise as the fluid level
            step_s = scenario.fluid.interval_s
            load = (load_rates(d.workload.load, d.start_s, horizon - d.start_s, step_s,
                               load_seed(int(seed.entropy), len(fleets))), step_s)
        try:
            requests = generate_requests(d.workload, horizon - d.start_s, request_seed,
                                         base_dir, load, stratified)
        except TraceError as error:
            index = scenario.serve.index(d)
            raise ScenarioError(scenario.source, [Issue(
                f"serve.{index}.workload.trace", str(error), d.workload.trace, True)]) from None
        if d.start_s:
            requests = type(requests)(requests.arrival_s + d.start_s, requests.input_tokens,
                                      requests.output_tokens)
        cost, capacity, transfer = replica_models(scenario, d)
        if len(requests.input_tokens):  # compiled for the longest request (prompt and output)
            cost.token_buckets = d.token_buckets(scenario.hardware.name, int(
                (requests.input_tokens + requests.output_tokens).max()))
        cost.decode_lines = d.decode_lines(scenario.hardware.name)
        issue = weights_fit_issue(scenario, d, cost, capacity)
        if issue is not None:
            raise ScenarioError(scenario.source, [issue])
        if d.disaggregated is not None:
            roles = (["prefill"] * d.disaggregated.prefill_replicas
                     + ["decode"] * d.disaggregated.decode_replicas)
        else:
            roles = ["both"] * d.replicas
        fleet = Fleet(env, d, requests, [(cost, capacity, role) for role in roles],
                      transfer if d.disaggregated is not None else None)
        own = None
        if outages is not None:  # this deployment's instances, numbered from its first
            span = deployment_instances(d, scenario.hardware)
            own = [(t, slot - first, chip, down) for t, slot, chip, down in outages
                   if first <= slot < first + span]
        first += deployment_instances(d, scenario.hardware)
        _failures(env, scenario, fleet, d, np.random.default_rng(failure_seed), horizon, own)
        fleets[d.name] = fleet
        models[d.name] = (cost, capacity, _instances_per_replica(scenario, d))
    done = simpy.AllOf(env, [f.done for f in fleets.values()])
    end = simpy.AnyOf(env, [done, env.timeout(2 * horizon)])
    if trial is None:
        env.run_until(end)
    else:
        trial.run(env, fleets, end, horizon)
    return ServingResult(fleets, models, horizon)


# ---------------------------------------------------------------------------------------------
# Figures and tables


def _quantiles(values: np.ndarray, name: str) -> dict[str, float | None]:
    if len(values) == 0:
        return {f"{name}_p50_s": None, f"{name}_p90_s": None, f"{name}_p99_s": None}
    q = np.quantile(values, [0.5, 0.9, 0.99])
    return {f"{name}_p50_s": float(q[0]), f"{name}_p90_s": float(q[1]),
            f"{name}_p99_s": float(q[2])}


def saturated(arrival_s: np.ndarray, finish_s: np.ndarray, settled: np.ndarray,
              start_s: float, end_s: float, cv: float = 1.0, unfinished: int = 0) -> bool:
    """Whether a deployment's queue grows over the window [start_s, end_s]: requests left
    `unfinished` by the drain after it (one more window), or in its second half fewer
    finished than arrived by more than 5% of the arrivals plus 3 sqrt(arrivals) (times the
    gaps' cv when bursty). A held load ends the half with as many outstanding as it began,
    up to that noise, and drains them; an overload adds (rate - capacity) x half a window.
    Rejected requests (`settled` False, finished never) count as leaving when they arrive."""
    middle = start_s + (end_s - start_s) / 2.0
    arrived = int(((arrival_s > middle) & (arrival_s <= end_s) & settled).sum())
    finished = int(((finish_s > middle) & (finish_s <= end_s)).sum())
    return unfinished > 0 or (
        arrived - finished > 0.05 * arrived + 3.0 * max(1.0, cv) * math.sqrt(arrived))


def _tokens_by(end: float, first: np.ndarray, finish: np.ndarray, outputs: np.ndarray
               ) -> float:
    """Output tokens of requests finishing after `end` generated by `end`: none before the
    first token, the first at it, the others evenly up to the last."""
    started = first <= end
    if not started.any():
        return 0.0
    first, finish, outputs = first[started], finish[started], outputs[started]
    spread = np.maximum(finish - first, 1e-12)
    done = 1.0 + (outputs - 1.0) * np.clip((end - first) / spread, 0.0, 1.0)
    return float(np.minimum(done, outputs).sum())


def deployment_figures(scenario: Scenario, result: ServingResult) -> dict[str, dict[str, Any]]:
    """summary.json `deployments.<name>`: the contract's figures, and a few more.

    Throughput, cost and energy per token are over the window from the deployment's start to
    the horizon: requests completed inside it, and output tokens generated inside it (those
    of the requests in flight at the horizon up to it); requests that finish while the run
    drains after the horizon are counted apart (`requests_drained`, `drain_s`), since
    dividing their work after the window by the window would credit a saturated deployment
    with work it did after the window. Latencies are over every completed request, drained ones too."""
    hw = scenario.hardware
    out = {}
    for d in scenario.serve:
        fleet = result.fleets[d.name]
        cost, capacity, per = result.models[d.name]
        done = fleet.status == 1
        arrival = fleet.arrival_s[done]
        first = fleet.first_token_s[done]
        finish = fleet.finish_s[done]
        outputs = fleet.output_tokens[done]
        ttft = first - arrival
        e2e = finish - arrival
        decoding = outputs > 1
        tpot = (finish[decoding] - first[decoding]) / (outputs[decoding] - 1)
        end = result.horizon_s
        span = max(end - d.start_s, 1e-9)
        inside = finish <= end
        # Output tokens generated inside the window, divided by it: those of the requests
        # finished in it, and the part of the requests in flight at its end decoded by then
        # (first token, then one per TPOT: linear between the first and the last). Leaving
        # the latter out charged the window's chip-time to fewer tokens than it made, most
        # at capacity, where most are in flight.
        tokens = float(outputs[inside].sum()) + _tokens_by(end, first[~inside],
                                                            finish[~inside], outputs[~inside])
        drained = finish[~inside]
        meets = (ttft <= d.slo.ttft_s) & np.where(
            decoding, (finish - first) / np.maximum(outputs - 1, 1) <= d.slo.tpot_s, True)
        instances = deployment_instances(d, hw)
        price = hw.instance.price_per_hour_usd
        cost_mtok = None
        if price is not None and tokens > 0:
            cost_mtok = instances * price * span / 3600.0 / tokens * 1e6
        energy = None
        if hw.chip.power_w is not None and tokens > 0:
            energy = instances * hw.chips_per_instance * hw.chip.power_w * span / tokens
        finish_all = np.where(fleet.status == 1, fleet.finish_s, math.inf)
        arrived = fleet.arrival_s <= end
        stack = d.serving_stack(hw.name)
        out[d.name] = {
            "model": d.model.name, "stack": stack.name if stack else None,
            "mixture_overheads_fitted": mixture_overheads_fitted(d.model, with_stack(hw, stack)),
            "replicas": d.replicas, "tp": d.tp, "pp": d.pp, "ep": d.ep,
            "instances": instances, "requests": int(len(fleet.arrival_s)),
            "window_start_s": float(d.start_s), "window_end_s": float(end),
            "requests_completed": int(inside.sum()),
            "requests_per_s": float(inside.sum()) / span,
            "output_tokens_per_s": tokens / span,
            "requests_drained": int(len(drained)),
            "drain_s": float(drained.max() - end) if len(drained) else 0.0,
            "requests_unfinished": int((fleet.status == 0).sum()),
            "requests_outstanding_at_end": int((arrived & (fleet.status != 2)
                                                & (finish_all > end)).sum()),
            "saturated": saturated(fleet.arrival_s, finish_all, fleet.status != 2, d.start_s,
                                   end, d.workload.cv if d.workload.arrival == "gamma" else 1.0,
                                   int((fleet.status == 0).sum())),
            **_quantiles(ttft, "ttft"), **_quantiles(tpot, "tpot"), **_quantiles(e2e, "e2e"),
            # no requests, no share (0.0 read as "none met the SLO")
            "slo_goodput": (float(meets.sum()) / len(fleet.arrival_s) if len(fleet.arrival_s)
                            else None),
            "cost_per_million_output_tokens_usd": cost_mtok,
            "energy_per_output_token_j": energy,
            "retries": int(fleet.retries.sum()), "replica_failures": fleet.failures,
            "preemptions": fleet.preemptions,
            "requests_rejected": int((fleet.status == 2).sum()),
            "kv_capacity_tokens_per_replica": capacity,
            "disaggregated": None if d.disaggregated is None else {
                "prefill_replicas": d.disaggregated.prefill_replicas,
                "decode_replicas": d.disaggregated.decode_replicas,
                "kv_transfer_s_per_1k_tokens": float(fleet.transfer_s(1024))},
            "prefill_s_per_1k_tokens": cost.target.prefill_s(1024),
            "decode_iteration_batch1_s": cost.run_s(1, 1024, 1, cost.excess(1024)),
        }
    return out


def requests_table(scenario: Scenario, result: ServingResult) -> pa.Table:
    """One row per request of every deployment (schema: analysis.trace SCHEMAS)."""
    parts = []
    status_type = pa.dictionary(pa.int8(), pa.string())
    for index, d in enumerate(scenario.serve):
        f = result.fleets[d.name]
        n = len(f.arrival_s)
        parts.append(pa.table({
            "deployment": pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(n, dtype=np.int8)), pa.array([d.name])),
            "deployment_id": np.full(n, index, dtype=np.int16),
            "request": np.arange(n, dtype=np.int64),
            "arrival_s": f.arrival_s, "first_token_s": f.first_token_s,
            "finish_s": f.finish_s, "input_tokens": f.input_tokens.astype(np.int32),
            "output_tokens": f.output_tokens.astype(np.int32),
            "replica": f.replica_of, "status": pa.DictionaryArray.from_arrays(
                pa.array(f.status), pa.array(list(STATUS))).cast(status_type),
            "retries": f.retries,
        }))
    return (pa.concat_tables(parts) if parts else SCHEMAS["requests"].empty_table()).cast(
        SCHEMAS["requests"])


def replica_series_table(scenario: Scenario, result: ServingResult) -> pa.Table:
    """Per replica, batch size and KV occupancy over time: one row per iteration group."""
    parts = []
    for index, d in enumerate(scenario.serve):
        s = result.fleets[d.name].series
        n = len(s["start_s"])
        capacity = max(1, result.models[d.name][1])
        kv = np.ascontiguousarray(s["kv_tokens"])
        parts.append(pa.table({
            "deployment_id": np.full(n, index, dtype=np.int16),
            "replica": s["replica"].astype(np.int32),
            "start_s": np.ascontiguousarray(s["start_s"]),
            "duration_s": np.ascontiguousarray(s["duration_s"]),
            "batch": s["batch"].astype(np.int32),
            "kv_tokens": kv, "kv_occupancy": kv / capacity,
        }))
    return (pa.concat_tables(parts) if parts else SCHEMAS["replicas"].empty_table()).cast(
        SCHEMAS["replicas"])
