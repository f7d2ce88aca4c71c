"""A replica's throughput and latency against load, measured by the request-level simulator:
what the fluid fleet model (clustersim.serving.fleetday) steps with.

For a deployment (model, hardware, parallelism, server, router, prompt and output lengths,
SLO) the request-level simulator runs a small group of its replicas (`fluid.curve_replicas`,
4 by default, at most the deployment's maximum: the router pools them as it pools the
fleet's), without failures, through its public API (`simulate_serving` and the fleet's
per-request arrays):

- saturated (every request at once): a replica's capacity, `capacity_per_s` requests per
  second, is the output tokens the group generates per second between its 10th and 90th
  percentile completions, and not past the first replica's last admission (its batch drains
  after) (a request's first token at its first-token time, the rest evenly to its finish),
  over the group's size and the output lengths' mean (the distribution's,
  clustersim.serving.requests.length_mean; the run's for a trace). Not the completions
  counted over that window: 3,000 random draws' outputs average a percent or two off the
  distribution's mean, and the completion rate follows them. That run draws its lengths
  stratified (clustersim.serving.requests: at evenly spread probability levels, so every
  stretch of the run has the distribution's mean output and prompt work; prompt work per
  output token slows the token rate): against overloaded runs eight times as long the
  capacity is within 0.15% on the queueing grid's cells (tests/test_fluid_capacity.py; it
  was 1.5% to 2.8% high). That run is `fluid.curve_requests` requests and at least
  SATURATED_BATCHES full batches a replica (saturated_requests): the first batch starts
  together on short contexts and runs faster than the steady mix until about its longest
  request is done, and a run of few batches a replica weighed that start in (1,000 to 3,000
  requests on 4 replicas of batch 64: 0.8% to 2% high) or never filled a batch at all (200:
  3.32 requests/s a replica against 8.03; 500: 6.91, its window mostly the drain). The
  fluid queueing model's admission queue at 95% drains at a twentieth of this rate, so its
  error counts twentyfold there;
- at a grid of utilisations rho (offered rate over that capacity): the quantiles of TTFT and
  TPOT, the share of requests meeting the TPOT bound and the quantiles of their TTFT, and the
  mean time in the system (Little's law at the fleet level). The share meeting both bounds
  is that share times the part of their TTFT distribution within the TTFT bound
  (`slo_share`); both interpolate between grid points as finite numbers. (Counting the
  requests missing the TPOT bound as an infinite TTFT instead capped the share at the last
  finite quantile level, 0.995, wherever a single sample of either neighbouring grid point
  missed it, and a 0.1% longer TPOT made a day's missed requests elevenfold.)

Latency grows with load and the share meeting the TPOT bound falls with it, but each grid
point is a few thousand requests: a p99 is read off its slowest thirty, and neighbouring
points crossed by 10% to 16% (a chat deployment's TTFT p99 0.43 s at utilisation 0.35 and
0.36 s at 0.5). Each quantile level, the mean time in the system and the share meeting the
TPOT bound are therefore fitted monotone over utilisation (`monotone_over_load`: pooled
adjacent violators, equal weights, as every point has as many requests), which pools
crossing neighbours into their mean and leaves monotone stretches as measured.

So whatever the request-level model's constants are, the curves follow them. Each
deployment shape is measured once per process (cached on its settings), with a fixed seed:
the curves are a property of the deployment, not of a run's seed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from clustersim.scenario.models import FailuresSpec, Scenario
from clustersim.scenario.serving import DeploymentSpec
from clustersim.serving.attainment import share_within
from clustersim.serving.requests import length_mean
from clustersim.serving.simulate import replica_models, simulate_serving

__all__ = ["ReplicaCurve", "replica_curve", "saturated_rate_per_s", "saturated_requests",
           "monotone_over_load",
           "LEVELS", "RHO_GRID", "CURVE_SEED"]

LEVELS = np.linspace(0.0, 1.0, 201)  # quantile levels kept per grid point (p50 = 100, p99 = 198)
RHO_GRID = np.array([0.05, 0.2, 0.35, 0.5, 0.6, 0.7, 0.8, 0.87, 0.93])
CURVE_SEED = 20240  # fixed: a deployment's curve does not depend on the run's seed
# Full batches per replica in the saturated run (saturated_requests): its first batch starts
# together on short contexts, faster than the steady mix, for about the longest output's
# life; at 40 batches that start is within 0.1% of runs three times as long (module docstring)
SATURATED_BATCHES = 40
SATURATED_MOST = 100_000  # fluid.curve_requests' own maximum
_CACHE: dict[str, ReplicaCurve] = {}


@dataclass(frozen=True)
class ReplicaCurve:
    """One replica of a deployment, measured at utilisations `rho` of its capacity."""

    capacity_per_s: float  # requests per second, saturated
    output_tokens_mean: float  # the output lengths' mean (as capacity_per_s divides by)
    rho: np.ndarray  # (k,)
    ttft_q: np.ndarray  # (k, len(LEVELS)) seconds
    tpot_q: np.ndarray  # (k, len(LEVELS)) seconds
    tpot_met: np.ndarray  # (k,): share of requests meeting the TPOT bound
    met_ttft_q: np.ndarray  # (k, len(LEVELS)): TTFT quantiles of those requests (all finite)
    e2e_mean_s: np.ndarray  # (k,)
    weight_bytes: float  # the replica's weights, loaded from storage when it starts
    requests_simulated: int

    def _bracket(self, rho: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lower, upper, weight (t, 1)): the grid points around each `rho`, held beyond."""
        r = np.clip(np.asarray(rho, dtype=float), self.rho[0], self.rho[-1])
        upper = np.clip(np.searchsorted(self.rho, r, side="right"), 1, len(self.rho) - 1)
        lower = upper - 1
        return lower, upper, ((r - self.rho[lower]) / (self.rho[upper] - self.rho[lower]))[:, None]

    def slo_share(self, rho: np.ndarray, ttft_bound_s: np.ndarray | float) -> np.ndarray:
        """Share of requests meeting both bounds at utilisations `rho` (t,), their TTFT
        bound `ttft_bound_s` (scalar or (t,): the SLO less a queue's wait): the share meeting
        the TPOT bound times the share of their TTFT within the bound, each interpolated
        linearly between grid points (continuous: no 1/201 steps, no cap below 1)."""
        lower, upper, w = self._bracket(rho)
        met = self.tpot_met[lower] * (1 - w[:, 0]) + self.tpot_met[upper] * w[:, 0]
        quantiles = self.met_ttft_q[lower] * (1 - w) + self.met_ttft_q[upper] * w
        return met * share_within(quantiles, LEVELS, ttft_bound_s)

    def at(self, rho: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ttft quantiles, tpot quantiles, e2e mean) at utilisations `rho` (shape (t,)),
        interpolated linearly between grid points and held beyond them."""
        lower, upper, w = self._bracket(rho)
        e2e = self.e2e_mean_s[lower] * (1 - w[:, 0]) + self.e2e_mean_s[upper] * w[:, 0]
        return (self.ttft_q[lower] * (1 - w) + self.ttft_q[upper] * w,
                self.tpot_q[lower] * (1 - w) + self.tpot_q[upper] * w, e2e)

    def attainment(self, rho: float, wait_s: float, ttft_slo_s: float) -> float:
        """Share of requests meeting both bounds at utilisation rho, with `wait_s` of queue."""
        return float(self.slo_share(np.array([rho]), ttft_slo_s - wait_s)[0])

    def slo_rate_per_s(self, ttft_slo_s: float, goodput: float = 0.99) -> float:
        """The highest rate per replica (on the grid, linear between points) at which at
        least `goodput` of requests meet the SLO; the lowest grid rate if none does. The
        share at each grid point is `slo_share`'s, as the fleet reads attainment (counted on
        the 201 quantile levels with TPOT misses as an infinite TTFT, it stepped by 1/201
        and missed the TPOT bound's share below the last finite level)."""
        shares = self.slo_share(self.rho, ttft_slo_s)
        ok = shares >= goodput
        if not ok[0]:
            return float(self.rho[0] * self.capacity_per_s)
        last = int(np.flatnonzero(ok)[-1]) if ok.all() else int(np.argmin(ok)) - 1
        rho = self.rho[last]
        if last + 1 < len(self.rho):  # linear to the first failing point
            a, b = shares[last], shares[last + 1]
            rho += (self.rho[last + 1] - rho) * (a - goodput) / max(a - b, 1e-12)
        return float(rho * self.capacity_per_s)


def group_size(scenario: Scenario, d: DeploymentSpec) -> int:
    """Replicas the curve is measured on: the deployment's router spreads load over a few
    (least outstanding routing pools them), as over the fleet's."""
    most = d.autoscale.max_replicas if d.autoscale is not None else d.replicas
    return max(1, min(scenario.fluid.curve_replicas, most))


def saturated_requests(scenario: Scenario, d: DeploymentSpec) -> int:
    """Requests in the saturated run: `fluid.curve_requests`, and at least SATURATED_BATCHES
    full batches per replica of the curve group (module docstring), at most
    SATURATED_MOST. A full batch is the server's max_batch, or the sequences of the
    lengths' mean prompt and output its KV cache holds if fewer."""
    _, kv_tokens, _ = replica_models(scenario, d)
    batch = d.server.max_batch
    prompts, outputs = length_mean(d.workload.input_tokens), length_mean(d.workload.output_tokens)
    if prompts is not None and outputs is not None:
        batch = min(batch, max(1, int(kv_tokens // (prompts + outputs))))
    least = SATURATED_BATCHES * batch * group_size(scenario, d)
    return min(max(scenario.fluid.curve_requests, least), SATURATED_MOST)


def _key(scenario: Scenario, d: DeploymentSpec, requests: int) -> str:
    shape = d.model_dump(mode="json", exclude={"name", "autoscale", "fidelity", "replicas",
                                                "start_s", "disaggregated"})
    shape["group"] = group_size(scenario, d)
    shape["workload"] = {k: shape["workload"][k] for k in ("arrival", "cv", "input_tokens",
                                                           "output_tokens")}
    return json.dumps([scenario.hardware.model_dump(mode="json"),
                       scenario.cluster.fabric.model_dump(mode="json"), shape, requests],
                      sort_keys=True, default=str)


def _group(scenario: Scenario, d: DeploymentSpec, rate: float, requests: int) -> Scenario:
    """The deployment alone on its curve group of replicas, `requests` at `rate`, no
    failures (not revalidated: every field comes from a valid scenario)."""
    workload = d.workload.model_copy(update={"rate_per_s": rate, "load": None,
                                             "requests": requests})
    one = d.model_copy(update={"replicas": group_size(scenario, d), "autoscale": None, "fidelity": "requests",
                               "disaggregated": None, "start_s": 0.0, "workload": workload})
    variant = scenario.model_copy(update={
        "serve": [one], "jobs": [], "failures": FailuresSpec(),
        "duration_s": max(86400.0, 1.2 * requests / rate)})  # ends when all are done
    variant._source = scenario.source
    return variant


def _run(scenario: Scenario, d: DeploymentSpec, rate: float, requests: int, index: int,
         stratified: bool = False):
    variant = _group(scenario, d, rate, requests)
    result = simulate_serving(variant, np.random.SeedSequence(CURVE_SEED, spawn_key=(index,)),
                              stratified=stratified)
    return result.fleets[d.name]


def saturated_rate_per_s(fleet, output_mean: float) -> float:
    """The group's saturated completion rate from an all-at-once run (module docstring): the
    output tokens generated per second between its 10th and 90th percentile completions,
    over the outputs' mean `output_mean`; the window ends by the time a replica (of
    `fleet.replica_of`, when the fleet has it) admitted its last request, as after it its
    batch drains."""
    done = fleet.status == 1
    finish, first = fleet.finish_s[done], fleet.first_token_s[done]
    outputs = fleet.output_tokens[done].astype(float)
    ordered = np.sort(finish)
    start, end = ordered[int(0.1 * len(ordered))], ordered[int(0.9 * len(ordered))]
    replica_of = getattr(fleet, "replica_of", None)
    if replica_of is not None:  # not past the first replica's last admission: its drain
        mine = replica_of[done]
        last = min(float(np.max(first[mine == r])) for r in np.unique(mine))
        end = min(end, last) if last > start else end
    inside = np.clip(np.minimum(finish, end) - np.maximum(first, start), 0.0, None)
    decoding = np.maximum(finish - first, 1e-12)
    tokens = (float(np.sum(np.where(outputs > 1, (outputs - 1) * inside / decoding, 0.0)))
              + float(np.sum((first >= start) & (first < end))))
    return tokens / max(end - start, 1e-9) / output_mean


def monotone_over_load(table: np.ndarray, increasing: bool = True) -> np.ndarray:
    """`table` (k,) or (k, L) fitted monotone along its first axis (the grid's
    utilisations), each column on its own: the least-squares monotone fit with equal
    weights (pool adjacent violators). A (k, L) table of quantiles is sorted along L after,
    so each row stays a quantile function."""
    values = np.asarray(table, dtype=float)
    columns = values.reshape(len(values), -1)
    sign = 1.0 if increasing else -1.0
    out = np.empty_like(columns)
    for j in range(columns.shape[1]):
        blocks: list[list[float]] = []  # [mean, count] of pooled runs
        for v in sign * columns[:, j]:
            blocks.append([v, 1.0])
            while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
                mean, count = blocks.pop()
                blocks[-1] = [(blocks[-1][0] * blocks[-1][1] + mean * count)
                              / (blocks[-1][1] + count), blocks[-1][1] + count]
        out[:, j] = sign * np.repeat([b[0] for b in blocks], [int(b[1]) for b in blocks])
    out = out.reshape(values.shape)
    return np.sort(out, axis=1) if out.ndim == 2 else out


def replica_curve(scenario: Scenario, d: DeploymentSpec) -> ReplicaCurve:
    """The deployment's replica curve (measured once per process for its settings)."""
    requests = scenario.fluid.curve_requests
    key = _key(scenario, d, requests)
    if key in _CACHE:
        return _CACHE[key]
    # Saturated: every request arrives within a few milliseconds.
    saturated = saturated_requests(scenario, d)
    fleet = _run(scenario, d, 1e5, saturated, 0, stratified=True)
    if int(np.sum(fleet.status == 1)) < 10:
        _, kv_tokens, _ = replica_models(scenario, d)
        raise ValueError(f"deployment {d.name!r}: a replica completed "
                         f"{int(np.sum(fleet.status == 1))} of {saturated} requests (do they "
                         f"fit its KV cache of {kv_tokens:,} tokens?)")
    outputs_mean = length_mean(d.workload.output_tokens)
    if outputs_mean is None:  # a trace's lengths: the run's
        outputs_mean = float(np.mean(fleet.output_tokens))
    group = group_size(scenario, d)
    capacity = saturated_rate_per_s(fleet, outputs_mean) / group  # per replica
    ttft, tpot, e2e, met, met_q = [], [], [], [], []
    simulated = saturated
    for index, rho in enumerate(RHO_GRID, start=1):
        fleet = _run(scenario, d, float(rho * capacity * group), requests, index)
        simulated += requests
        keep = (fleet.status == 1) & (np.arange(len(fleet.status)) >= requests // 10)
        arrival, first = fleet.arrival_s[keep], fleet.first_token_s[keep]
        finish_s, outputs = fleet.finish_s[keep], fleet.output_tokens[keep]
        t = first - arrival
        per_token = np.where(outputs > 1, (finish_s - first) / np.maximum(outputs - 1, 1), 0.0)
        decoding = outputs > 1
        ttft.append(np.quantile(t, LEVELS))
        tpot.append(np.quantile(per_token[decoding], LEVELS) if decoding.any()
                    else np.zeros(len(LEVELS)))
        meets = per_token <= d.slo.tpot_s
        met.append(float(np.mean(meets)) if len(t) else 0.0)
        # none meeting it: the share is 0 and the quantiles only keep the rows finite
        met_q.append(np.quantile(t[meets] if meets.any() else t, LEVELS) if len(t)
                     else np.zeros(len(LEVELS)))
        e2e.append(float(np.mean(finish_s - arrival)))
    cost, _, _ = replica_models(scenario, d)
    curve = ReplicaCurve(
        capacity_per_s=float(capacity), output_tokens_mean=outputs_mean, rho=RHO_GRID.copy(),
        ttft_q=monotone_over_load(np.array(ttft)), tpot_q=monotone_over_load(np.array(tpot)),
        tpot_met=monotone_over_load(np.array(met), increasing=False),
        met_ttft_q=monotone_over_load(np.array(met_q)),
        e2e_mean_s=monotone_over_load(np.array(e2e)),
        weight_bytes=float(cost.target.weight_bytes()),
        requests_simulated=simulated)
    if not math.isfinite(curve.capacity_per_s):
        raise ValueError(f"deployment {d.name!r}: no finite capacity")
    _CACHE[key] = curve
    return curve
