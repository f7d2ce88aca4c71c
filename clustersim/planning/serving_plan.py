"""The serving planner: the cheapest way to serve a deployment's load within its SLO.

`clustersim plan` on a scenario with a `serve:` deployment searches, on each hardware entry,
the replica shape (tensor and pipeline parallelism, hence replicas per instance; for a
mixture of experts also every expert parallelism the deployment accepts, serving_space), the
batch limit (`server.max_batch`) and the number of replicas, and ranks the configurations
that meet the SLO at the deployment's load by cost per million output tokens at that load.

How it searches, as the training planner does: the scenario's own validation prunes shapes
that cannot run (tensor parallelism leaving a NeuronLink domain, heads not divisible, layers
not divisible by the pipeline stages); a replica whose KV cache cannot hold one long request,
or whose batch-of-one decode iteration already misses the TPOT bound, is pruned by the
iteration model. For the rest a lower bound of the replicas the load needs (the load over an
upper bound of what one replica serves within the TPOT bound: prefill of the mean prompt plus
the mean output decoded at the best batch whose iteration meets the TPOT bound, KV and
`max_batch` allowing) gives a lower bound of the fleet's cost per hour; candidates are
simulated in that order, each with the fewest replicas that hold the load (the whole
deployment simulated at the load, exactly as `clustersim run` would), until no bound left
can beat the best found for that hardware. A configuration holds the load when at least
`goodput` of its requests meet the TTFT and TPOT bounds and its queue does not grow (not
`saturated`), the test `--find-rate` uses. Each candidate's search (serving_search) runs
its trials until they cannot reach `goodput` (serving.trials: an exact bound) and gives up
once every count left costs more than the best found; candidates run on the planning
engine in batches replayed in order, so the answer does not depend on the engine.

Every figure comes from the serving simulation `run` uses: no second performance model. The
best of each hardware is also given at its SLO capacity: the highest rate one replica holds
(`find_rate`), and the cost per million output tokens there, charging a replica its share of
an instance, or the whole instances it spans when it is larger than one.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
import yaml

from clustersim.hardware.catalog import catalog_entry, catalog_names, custom_base
from clustersim.planning.engine import Engine
from clustersim.planning.serving_capacity import (
    _ep_text,
    capacities,
    instances_per_replica,
    replicas_per_instance,
)
from clustersim.planning.serving_search import CandidateTask, search_candidate, settle
from clustersim.planning.serving_space import (
    BATCHES,
    BoundTask,
    ServingPlanError,
    _load,
    _Shape,
    _shapes,
    bound_shapes,
    foreign_activations,
    foreign_stack,
    unfitted_mixture,
)
from clustersim.scenario.models import Scenario

__all__ = ["ServingPlanOptions", "ServingPlanResult", "ServingPlanError", "plan_serving"]

@dataclass(frozen=True)
class ServingPlanOptions:
    hardware: tuple[str, ...] = ()  # default: the scenario's
    deployment: str | None = None  # default: the first
    goodput: float = 0.99
    top: int = 10
    batches: tuple[int, ...] = BATCHES
    capacity: bool = True  # find each hardware's best at its SLO capacity too


@dataclass
class ServingPlanResult:
    scenario: Scenario
    deployment: str
    options: ServingPlanOptions
    load_rate_per_s: float
    mean_output_tokens: float
    rows: pd.DataFrame  # every candidate considered, with why each pruned one is out
    ranked: list[dict[str, Any]]  # simulated candidates that hold the load, cheapest first
    best_scenarios: dict[str, dict[str, Any]]  # hardware -> raw scenario of its best
    notes: list[str] = field(default_factory=list)

    @property
    def considered(self) -> int:
        return len(self.rows)

    @property
    def pruned(self) -> int:
        return int((self.rows["status"] == "pruned").sum())

    @property
    def simulated(self) -> int:
        return int((self.rows["status"] != "pruned").sum())

    @property
    def best(self) -> dict[str, Any]:
        return self.ranked[0]

    def best_per_hardware(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for row in self.ranked:
            out.setdefault(row["hardware"], row)
        return out

    def as_json(self) -> dict[str, Any]:
        return {"kind": "serving", "deployment": self.deployment,
                "load_rate_per_s": self.load_rate_per_s, "goodput": self.options.goodput,
                "best": _jsonable(self.best),
                "best_per_hardware": {k: _jsonable(v) for k, v in self.best_per_hardware().items()},
                "candidates": [_jsonable(r) for r in self.ranked[: self.options.top]],
                "considered": self.considered, "pruned": self.pruned,
                "simulated": self.simulated, "notes": self.notes}


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in row.items():
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# The search


def _deployment_index(scenario: Scenario, name: str | None) -> int:
    names = [d.name for d in scenario.serve]
    if not names:
        raise ServingPlanError("the scenario has no serve: deployment to plan")
    if name is None:
        return 0
    if name not in names:
        raise ServingPlanError(f"--serve {name!r}: no such deployment; expected one of "
                               f"{', '.join(names)}")
    return names.index(name)


class RunScenario(Protocol):
    """What the planner runs a candidate with: `clustersim run`'s simulation (the runner's
    `simulate`, passed in by the caller: planning sits below the runner), which takes a
    serving.trials.SloTrial to stop a run once it cannot hold the load. Picklable (a
    module's function) for the engine's workers."""

    def __call__(self, scenario: Scenario, *, serving_trial: Any = None) -> Any: ...


def plan_serving(scenario: Scenario, options: ServingPlanOptions,
                 base_dir: Path | None = None, *, simulate: RunScenario,
                 progress: Any = None, engine: Engine | None = None) -> ServingPlanResult:
    """Search each hardware entry for the cheapest configuration holding the load, each
    candidate run with `simulate` (a run's result, its summary's `deployments`), on `engine`
    (default: this process; the answer does not depend on it). `progress(done, total,
    what)`, if given, hears of each batch of candidates as it starts."""
    runner = engine if engine is not None else Engine("local", workers=1)
    index = _deployment_index(scenario, options.deployment)
    d = scenario.serve[index]
    if d.disaggregated is not None:
        raise ServingPlanError(f"deployment {d.name!r} is disaggregated: the serving planner "
                               "does not plan separate prefill and decode pools yet")
    if d.workload.load is not None or d.autoscale is not None:
        # A load curve or autoscaling is the fleet-day model's (its own arrivals and replica
        # counts): the planner searches a fixed replica count at one rate.
        raise ServingPlanError(
            f"deployment {d.name!r} has a load curve (workload.load) or autoscale: the serving "
            "planner plans a fixed number of replicas at a constant rate; plan a copy with "
            "workload.rate (its peak, say) and neither workload.load nor autoscale")
    raw = yaml.safe_load(scenario.source_yaml) if scenario.source_yaml else {}
    raw_deployment = raw["serve"][index]
    load, mean_in, mean_out, longest, kth_in = _load(scenario, index, base_dir, options.goodput)
    names = options.hardware or (scenario.hardware.name,)
    known = set(catalog_names())
    for name in names:
        if name not in known and name != scenario.hardware.name:
            raise ServingPlanError(f"--hardware {name!r}: not in the catalog; expected one of "
                                   f"{', '.join(sorted(known))}")
    rows: list[dict[str, Any]] = []
    ranked: list[dict[str, Any]] = []
    best_scenarios: dict[str, dict[str, Any]] = {}
    mappings: dict[int, dict[str, Any]] = {}  # id(ranked row) -> its scenario
    notes: list[str] = []
    specs: dict[str, Any] = {}  # name -> its HardwareSpec
    source = f"{scenario.source} (planned)"

    for name in names:
        spec = (scenario.hardware if name in (scenario.hardware.name,
                                              custom_base(scenario.hardware.name))
                else catalog_entry(name))
        specs[name] = spec
        hw_value = raw.get("hardware") if name == scenario.hardware.name else name
        priced = spec.instance.price_per_hour_usd is not None
        if not priced:
            notes.append(f"{name} has no price in the catalog: its candidates are ranked by "
                         "chips and have no cost figures")
        other_stack = foreign_stack(raw_deployment, hw_value)
        if other_stack is not None:
            notes.append(other_stack)
        other_activations = foreign_activations(raw_deployment, hw_value)
        if other_activations is not None:
            notes.append(other_activations)
        unfitted = unfitted_mixture(raw_deployment, d.model, hw_value, spec)
        if unfitted is not None:
            notes.append(unfitted)
        shapes = _shapes(name, hw_value, spec, options.batches, d)
        _bound_all(shapes, BoundTask((), raw, raw_deployment, source, base_dir, (
            load, mean_in, mean_out, longest, kth_in), options.goodput), runner)
        # Cheapest bound first; among equal ones (every shape that fits the load on one
        # instance, say) the most an instance could serve first, so the one kept has the
        # most headroom and the best cost at capacity.
        live = sorted((s for s in shapes if not s.why),
                      key=lambda s: (s.usd_per_h_bound, -s.rate_bound_per_s * max(
                          1, s.spec.ranks_per_instance // (s.tp * s.pp)), s.tp * s.pp))
        best_usd: float | None = None
        width = _width(runner)
        position = 0
        while position < len(live):
            # The next batch: the candidates whose bound can still beat the best found.
            batch: list[_Shape] = []
            end = position
            while end < len(live) and len(batch) < width:
                if best_usd is None or live[end].usd_per_h_bound < best_usd:
                    batch.append(live[end])
                end += 1
            if progress is not None and batch:
                progress(position, len(live), f"{name}: tp {batch[0].tp} x pp {batch[0].pp}"
                         f"{_ep_text(batch[0].ep)}, batch {batch[0].max_batch}"
                         + (f" (+{len(batch) - 1} more)" if len(batch) > 1 else ""))
            found = dict(zip((id(s) for s in batch), runner.map(search_candidate, [
                CandidateTask(s, raw, raw_deployment, source, base_dir, simulate,
                              options.goodput, d.name, best_usd) for s in batch]),
                strict=True))
            # In order, against the best a one-at-a-time search would have found by then.
            for shape in live[position:end]:
                if shape.why or _beaten(shape, best_usd, priced):
                    continue
                outcome = settle(shape, found[id(shape)], best_usd)
                if outcome is None:
                    continue
                row = _row(shape, outcome, "simulated")
                rows.append(row)
                if outcome["holds"]:
                    usd = outcome["rank_cost"]
                    if best_usd is None or usd < best_usd:
                        best_usd = usd
                    mappings[id(row)] = outcome["mapping"]
                    ranked.append(row)
            position = end
        rows += [_row(s, None, "pruned") for s in shapes if s.why]
    # Dollars and chips do not compare: priced hardware first by $/h, unpriced by chips.
    ranked.sort(key=lambda r: (r["usd_per_h"] is None, r["usd_per_h"] if r["usd_per_h"]
                               is not None else r["chips"],
                               r["cost_per_million_output_tokens_usd"] or 0))
    # Each hardware's best scenario is its first row in this order (the one reported), not
    # the first found at the cheapest $/h: equal $/h ties are broken by the cost per token.
    for row in ranked:
        best_scenarios.setdefault(row["hardware"], mappings[id(row)])
    frame = pd.DataFrame(rows)
    if not ranked:
        raise ServingPlanError(
            f"no configuration of {d.name!r} on {', '.join(names)} holds {load:,.3g} requests/s "
            f"within its SLO (TTFT {d.slo.ttft_s:g} s, TPOT {d.slo.tpot_s:g} s) for "
            f"{options.goodput:.0%} of requests: {_why_none(rows)}")
    for name in names:
        if name not in best_scenarios:
            notes.append(f"{name}: no configuration holds the load within the SLO")
    notes += _part_ultraserver_notes(ranked, specs)
    result = ServingPlanResult(scenario, d.name, options, load, mean_out, frame, ranked,
                               best_scenarios, notes)
    if options.capacity:
        capacities(result, base_dir, runner, progress)
    return result


def _width(runner: Any) -> int:
    """Candidates a batch gives the engine: two per worker (the local engine runs at most
    one process per core). Candidates' trials differ in length by several times, so with
    one per worker a batch waits on its slowest while the other workers idle; the second
    keeps them busy. A wider batch costs only candidates a narrower one would have pruned
    by the best found, which `settle` drops again (measured: 27-32 s wall at one per worker,
    24-27 s at two, on the serving plan benchmark with 2 workers)."""
    if runner.kind == "local":
        return 2 * max(1, min(runner.workers, os.cpu_count() or 1))
    return 2 * max(1, runner.workers)


def _beaten(shape: _Shape, best_usd: float | None, priced: bool) -> bool:
    """Prune the shape when its bound cannot beat the best found (saying so)."""
    if best_usd is None or shape.usd_per_h_bound < best_usd:
        return False
    shape.why = (f"bound: at least ${shape.usd_per_h_bound:,.2f}/h, the best found costs "
                 f"${best_usd:,.2f}/h" if priced else
                 f"bound: at least {shape.usd_per_h_bound:,.0f} chips, the best found takes "
                 f"{best_usd:,.0f}")
    return True


def _why_none(rows: list[dict[str, Any]]) -> str:
    """What the candidates ran into, when none held the load: how many were pruned and by
    what, and the simulated one closest to the SLO."""
    pruned: dict[str, int] = {}
    for row in rows:
        if row["status"] == "pruned":
            kind = str(row["why"]).split(":")[0]
            pruned[kind] = pruned.get(kind, 0) + 1
    parts = [f"{len(rows):,} candidates"]
    if pruned:
        parts.append("pruned: " + ", ".join(f"{n:,} by {k}" for k, n in
                                            sorted(pruned.items(), key=lambda kv: -kv[1])))
    simulated = [r for r in rows if r["status"] != "pruned"]
    if simulated:
        close = max(simulated, key=lambda r: r["slo_goodput"] or 0.0)
        parts.append(f"closest: tp {close['tp']} x pp {close['pp']}{_ep_text(close.get('ep'))}"
                     f" on {close['hardware']}, {close['why']}")
    return "; ".join(parts)


def _bound_all(shapes: list[_Shape], task: BoundTask, runner: Any) -> None:
    """Validate and bound every shape, on the engine: `_width(runner)` interleaved slices
    (a slice of every kind of shape, so the workers finish together). A mixture has up to
    log2(tp) + 1 shapes per dense one (its ep values); bounding them, not simulating them,
    is most of what they add to the planner's time."""
    parts = max(1, min(len(shapes), _width(runner) if runner.workers > 1 else 1))
    slices = [shapes[i::parts] for i in range(parts)]
    found = runner.map(bound_shapes, [dataclasses.replace(task, shapes=tuple(part))
                                      for part in slices])
    for part, figures in zip(slices, found, strict=True):
        for shape, fields in zip(part, figures, strict=True):
            for key, value in fields.items():
                setattr(shape, key, value)


def _row(shape: _Shape, outcome: dict[str, Any] | None, status: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "hardware": shape.hardware, "tp": shape.tp, "pp": shape.pp,
        # a mixture's expert parallelism; a dense model's rows have no such column
        **({} if shape.ep is None else {"ep": shape.ep}),
        # a replica larger than an instance holds whole instances: 1/2 a replica per instance
        "replicas_per_instance": replicas_per_instance(shape.tp * shape.pp, shape.spec),
        "instances_per_replica": instances_per_replica(shape.tp * shape.pp, shape.spec),
        "max_batch": shape.max_batch, "status": status, "why": shape.why,
        "kv_capacity_tokens": shape.kv_capacity_tokens or None,
        "rate_bound_per_s": shape.rate_bound_per_s if math.isfinite(shape.rate_bound_per_s)
        else None,
        "usd_per_h_bound": shape.usd_per_h_bound if math.isfinite(shape.usd_per_h_bound)
        else None,
    }
    keys = ("requests_per_s", "output_tokens_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
            "tpot_p99_s", "e2e_p99_s", "slo_goodput", "saturated",
            "cost_per_million_output_tokens_usd")
    if outcome is None:
        row.update({"replicas": None, "instances": None, "chips": None, "usd_per_h": None,
                    "meets_slo": None,
                    "simulations": shape.simulations, **{k: None for k in keys}})
    else:
        figures = outcome["figures"]
        row.update({"replicas": outcome["replicas"], "instances": outcome["instances"],
                    "chips": outcome["instances"] * shape.spec.chips_per_instance,
                    # None without a price: the search ranks such hardware by chips instead
                    "usd_per_h": (None if shape.spec.instance.price_per_hour_usd is None
                                  else outcome["rank_cost"]),
                    "meets_slo": bool(outcome["holds"]),
                    "simulations": outcome["simulations"],
                    **{k: figures.get(k) for k in keys}})
        if not outcome["holds"]:
            row["why"] = (f"slo: {outcome['replicas']:,} replicas still miss the SLO "
                          f"({figures['slo_goodput']:.1%} within it"
                          f"{', saturated' if figures['saturated'] else ''}); "
                          + ("more replicas do not help" if outcome.get("stuck")
                             else "search stopped"))
    row.update({"capacity_rate_per_s": None,
                "cost_per_million_output_tokens_at_capacity_usd": None,
                "capacity_why": None})  # why a shown row has no capacity
    return row


def _part_ultraserver_notes(ranked: list[dict[str, Any]], specs: dict[str, Any]) -> list[str]:
    """A note for each hardware whose best holds part of an UltraServer: the cost charges the
    instances the deployment holds (as `run` does), the rest left to other work, while the
    hardware is rented by whole UltraServers."""
    out, seen = [], set()
    for row in ranked:
        name = row["hardware"]
        if name in seen:
            continue
        seen.add(name)
        spec = specs[name]
        per = spec.instances_per_ultraserver
        if per <= 1 or row["instances"] % per == 0:
            continue
        whole = per * -(-row["instances"] // per)
        price = spec.instance.price_per_hour_usd
        cost = f" (${whole * price:,.2f}/h)" if price is not None else ""
        held = (f"{row['instances']} of an UltraServer's {per} instances" if row["instances"]
                < per else f"{row['instances']} instances over {whole // per} UltraServers "
                f"of {per}")
        out.append(f"{name}: its best holds {held}; its cost charges those, the rest left to "
                   f"other work, but {name} is rented by whole UltraServers: {whole} "
                   f"instances{cost} if nothing else uses them")
    return out
