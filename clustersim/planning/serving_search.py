"""The serving planner's search over one hardware entry's shapes: each candidate's fewest
replicas holding the load, cheapest bound first, on the planning engine.

A candidate's search (`search_candidate`) runs whole in one worker: its trials are
request-level runs (`clustersim run`'s simulate) that stop once they cannot reach the SLO
(serving.trials), and it gives up as soon as every count it could still end on costs more
per hour than the best the search had found when it started (`best_usd`): its answer is
always more replicas than any count that failed, and the cost per hour never falls as
replicas are added, so such a candidate cannot win.

The engine runs a batch of candidates at once, each started with the best found before the
batch. `settle` then replays the batch in order against the best each one would have seen
in a one-at-a-time search: a candidate whose bound no longer beats it is pruned by the
bound; one whose trials reached a count that costs more is cut there (its record is the
prefix of trials that one-at-a-time search would have run). So the answer, every row and
every count of simulations do not depend on the engine or how many workers it has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clustersim.planning.serving_space import _instances_for, _raw_variant, _Shape
from clustersim.scenario.loader import scenario_from_dict
from clustersim.serving.simulate import deployment_figures
from clustersim.serving.trials import SloTrial

__all__ = ["MAX_SIMULATIONS_PER_CANDIDATE", "CandidateTask", "search_candidate", "settle",
           "rank_cost"]

MAX_SIMULATIONS_PER_CANDIDATE = 8


@dataclass(frozen=True)
class CandidateTask:
    """One candidate's search, picklable for a worker."""

    shape: _Shape
    raw: dict[str, Any]  # the scenario as read
    raw_deployment: dict[str, Any]
    source: str
    base_dir: Path | None
    simulate: Any  # the runner's simulate (planning sits below the runner)
    goodput: float
    deployment: str
    best_usd: float | None  # the best $/h (or chips) found before this candidate's batch


def rank_cost(shape: _Shape, replicas: int) -> float:
    """What `replicas` of the shape cost per hour (chips without a price): the instances
    the figures charge (deployment_instances: ranks over an instance's, rounded up)."""
    instances = -(-shape.tp * shape.pp * replicas // shape.spec.ranks_per_instance)
    price = shape.spec.instance.price_per_hour_usd
    return instances * (price if price is not None else shape.spec.chips_per_instance)


def search_candidate(task: CandidateTask) -> dict[str, Any]:
    """The fewest replicas holding the load: from the bound's count, up (by half again)
    until one holds or down (one less, then halving) until one fails, then bisection between
    the last count that failed and the first that held. Returns `trials` (replicas, holds)
    in the order run, `outcome` (the count it ended on, its full figures, or None when it
    gave up on cost) and `cut` (the index of the trial after which it gave up on cost)."""
    shape = task.shape
    tried: dict[int, dict[str, Any]] = {}
    order: list[tuple[int, bool]] = []
    failed = [0]  # the most replicas that failed so far

    def run(replicas: int) -> dict[str, Any]:
        if replicas not in tried:
            instances = _instances_for(shape.tp * shape.pp, replicas, shape.spec)
            mapping = _raw_variant(task.raw, task.raw_deployment, shape.hw_value, shape.tp,
                                   shape.pp, replicas, shape.max_batch, instances, shape.ep)
            scenario = scenario_from_dict(mapping, task.source, base_dir=task.base_dir)
            trial = SloTrial(task.deployment, task.goodput)
            result = task.simulate(scenario, serving_trial=trial)
            figures = result.summary["deployments"][task.deployment]
            holds = (not trial.stopped and (figures["slo_goodput"] or 0.0) >= task.goodput
                     and not figures["saturated"])
            tried[replicas] = {"replicas": replicas, "figures": figures, "holds": holds,
                               "mapping": mapping, "instances": figures["instances"],
                               "rank_cost": rank_cost(shape, replicas), "trial": trial,
                               "result": result, "scenario": scenario}
            order.append((replicas, holds))
            if not holds:
                failed[0] = max(failed[0], replicas)
        return tried[replicas]

    def complete(replicas: int) -> dict[str, Any]:
        """The run's figures to its end (a trial stopped early is run on)."""
        entry = tried[replicas]
        if entry["trial"].stopped:
            entry["trial"].finish()
            entry["figures"] = {**entry["figures"], **deployment_figures(
                entry["scenario"], entry["result"].serving)[task.deployment]}
        return entry

    def dominated() -> bool:
        return (task.best_usd is not None and failed[0] > 0
                and rank_cost(shape, failed[0] + 1) > task.best_usd)

    def answer(entry: dict[str, Any] | None, **more: Any) -> dict[str, Any]:
        if entry is None:
            return {"trials": order, "outcome": None, "cut": len(order) - 1}
        keep = {k: entry[k] for k in ("replicas", "figures", "holds", "mapping", "instances",
                                      "rank_cost")}
        return {"trials": order, "outcome": {**keep, **more}, "cut": None}

    replicas = shape.replicas_bound
    if run(replicas)["holds"]:
        # The bound is close to a lower bound, not proven one: check below it, one less,
        # then halving, and bisect between the last count that failed and the first held.
        high, low = replicas, replicas - 1
        while low >= 1 and run(low)["holds"] and len(tried) < MAX_SIMULATIONS_PER_CANDIDATE:
            high, low = low, low // 2
    else:
        previous = None
        while not run(replicas)["holds"]:
            if dominated():
                return answer(None)
            entry = run(replicas)
            # Latency-bound, not load-bound: the queue holds and more replicas did not bring
            # more requests within the SLO (long prompts that miss the TTFT bound on an idle
            # replica, say). No count of replicas will do. Judged on whole runs: a trial
            # stopped early was still short of the SLO when it stopped.
            stuck = (previous is not None and not entry["trial"].stopped
                     and not previous["trial"].stopped
                     and not entry["figures"]["saturated"]
                     and not previous["figures"]["saturated"]
                     and (entry["figures"]["slo_goodput"] or 0.0)
                     - (previous["figures"]["slo_goodput"] or 0.0) < 0.002)
            if stuck or len(tried) >= MAX_SIMULATIONS_PER_CANDIDATE:
                return answer(complete(replicas), simulations=len(tried), stuck=stuck)
            previous = entry
            replicas = max(replicas + 1, math.ceil(replicas * 1.5))
        high = replicas
        low = max(k for k in tried if not tried[k]["holds"])
    while high - low > 1 and len(tried) < MAX_SIMULATIONS_PER_CANDIDATE:
        if dominated():
            return answer(None)
        middle = (low + high) // 2
        if run(middle)["holds"]:
            high = middle
        else:
            low = middle
    if dominated():
        return answer(None)
    return answer(run(high), simulations=len(tried))


def settle(shape: _Shape, found: dict[str, Any], best_usd: float | None
           ) -> dict[str, Any] | None:
    """The candidate's outcome as a one-at-a-time search with `best_usd` found before it
    would have had it (see the module's docstring), or None when that search gives up on
    cost; then `shape.why` says why and `shape.simulations` how many trials it ran."""
    most = 0
    for index, (replicas, holds) in enumerate(found["trials"]):
        if not holds:
            most = max(most, replicas)
        if (best_usd is not None and most > 0 and rank_cost(shape, most + 1) > best_usd
                and not holds):
            shape.simulations = index + 1
            priced = shape.spec.instance.price_per_hour_usd is not None
            at_least = rank_cost(shape, most + 1)
            shape.why = (f"cost: {most:,} replicas miss the SLO and {most + 1:,} already cost "
                         + (f"${at_least:,.2f}/h, the best found ${best_usd:,.2f}/h" if priced
                            else f"{at_least:,.0f} chips, the best found takes "
                            f"{best_usd:,.0f}"))
            return None
    if found["outcome"] is None:  # gave up against a best this search does not have
        raise AssertionError("a candidate cut on cost without a count over the best")
    return found["outcome"]
