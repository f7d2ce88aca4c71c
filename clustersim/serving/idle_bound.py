"""What a deployment's requests could reach on an idle replica: the share of them that
would meet its SLO if each ran alone, an upper bound on `slo_goodput` at any rate.

A request's TTFT is at least its prompt's prefill alone, as the replica runs it: in chunks of
`max_tokens_per_iteration` with chunked prefill (each chunk an iteration with its own fixed
times: an 8,192-token prompt of Llama 3.1 405B at TP 64 on trn2 takes 2.044 s in two chunks,
1.96 s in one), padded to a compiled bucket, with a draft model's share; its TPOT at least a
decode iteration of one sequence holding its prompt; a request longer than the replica's KV
cache is rejected. `run --find-rate` reads the bound to size its trials (the margin between
the target and this share) and to stop once no rate can meet the goodput target.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clustersim.scenario.models import Scenario
from clustersim.serving.decode_cost import DecodeCost
from clustersim.serving.requests import TraceError, generate_requests
from clustersim.serving.simulate import replica_models

__all__ = ["IdleBound", "idle_bound", "lone_prefill_s"]


@dataclass(frozen=True)
class IdleBound:
    share: float  # of the sampled requests that could meet the SLO alone on a replica
    service_s: float  # the mean request's least time on a replica (prefill and decode alone)
    requests: int  # sampled
    ttft_misses: int  # whose prefill alone exceeds the TTFT bound
    tpot_misses: int  # whose batch-1 decode exceeds the TPOT bound
    too_long: int  # longer than the replica's KV cache (rejected)
    shortest_miss_tokens: int | None  # the shortest prompt whose prefill misses the TTFT bound
    shortest_miss_s: float | None  # its prefill alone

    def why(self, ttft_s: float, tpot_s: float) -> str:
        """The reasons, in words."""
        parts = []
        if self.ttft_misses:
            parts.append(f"{self.ttft_misses / self.requests:.1%} have prompts of "
                         f"{self.shortest_miss_tokens:,} tokens or more, whose prefill alone "
                         f"takes {self.shortest_miss_s:.4g} s or more, over the TTFT bound "
                         f"{ttft_s:g} s")
        if self.tpot_misses:
            parts.append(f"{self.tpot_misses / self.requests:.1%} decode alone slower than "
                         f"the TPOT bound {tpot_s:g} s")
        if self.too_long:
            parts.append(f"{self.too_long / self.requests:.1%} do not fit the KV cache")
        return "; ".join(parts)


def idle_bound(scenario: Scenario, index: int, base_dir: Path | None,
               sample: int) -> IdleBound | None:
    """The bound over about `sample` requests drawn as the deployment draws them (its
    lengths; arrivals at 1/s), or None when they cannot be drawn so (lengths from a trace
    with fewer rows)."""
    d = scenario.serve[index]
    workload = d.workload.model_copy(update={"rate_per_s": 1.0, "load": None,
                                             "requests": None, "arrival": "poisson"})
    try:
        requests = generate_requests(workload, float(sample), np.random.SeedSequence(
            scenario.seed), base_dir)
    except TraceError:
        return None
    inputs, outputs = requests.input_tokens, requests.output_tokens
    if len(inputs) == 0:
        return None
    cost, capacity, _ = replica_models(scenario, d)
    budget = d.server.max_tokens_per_iteration if d.server.chunked_prefill else None
    prefill = {int(n): lone_prefill_s(cost, int(n), budget) for n in np.unique(inputs)}
    decode = {int(n): cost.run_s(1, float(n), 1, cost.least_excess(float(n)))
              / cost.tokens_per_iteration for n in prefill}
    prefill_s = np.array([prefill[int(n)] for n in inputs])
    token_s = np.array([decode[int(n)] for n in inputs])
    ttft_miss = prefill_s > d.slo.ttft_s
    tpot_miss = (outputs > 1) & (token_s > d.slo.tpot_s)
    too_long = inputs + outputs > capacity
    meets = ~(ttft_miss | tpot_miss | too_long)
    missed = inputs[ttft_miss]
    shortest = int(missed.min()) if len(missed) else None
    return IdleBound(
        share=float(meets.mean()),
        service_s=float(np.mean(prefill_s + np.maximum(outputs - 1, 0) * token_s)),
        requests=int(len(inputs)), ttft_misses=int(ttft_miss.sum()),
        tpot_misses=int(tpot_miss.sum()), too_long=int(too_long.sum()),
        shortest_miss_tokens=shortest,
        shortest_miss_s=None if shortest is None else prefill[shortest])


def lone_prefill_s(cost: DecodeCost, tokens: int, budget: int | None) -> float:
    """A prompt's prefill alone on an idle replica, as the replica schedules it: chunks of
    `budget` tokens (None: without chunked prefill, the whole prompt in one iteration),
    each an iteration of the decode cost (its compiled buckets and draft included)."""
    if budget is None or tokens <= budget:
        return cost.prefill_s([(max(1, tokens), 0)], 0, 0.0, 1)
    total, done = 0.0, 0
    while done < tokens:
        chunk = min(budget, tokens - done)
        total += cost.prefill_s([(chunk, done)], 0, 0.0, int(done + chunk >= tokens))
        done += chunk
    return total
