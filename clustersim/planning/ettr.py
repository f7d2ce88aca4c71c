"""Failure-aware effective training time ratio (ETTR) of a job, by renewal-reward.

The job trains in segments: `tau` seconds of work, then a blocking checkpoint write of `w`
seconds. Failures hit the job as a Poisson process of rate `lam` (the job's rate, from the
same per-component rates the timeline samples: `job_failure_rate`), at any time. A failure
loses the segment in progress (the work since the last completed checkpoint, the write too
if it was writing) and costs a recovery of `R` = detection + waiting for hardware + restart +
restore seconds; a failure during recovery starts it again, as in the timeline.

The segment is a renewal cycle whose reward is `tau` seconds of useful work. Its expected
length, for an uninterrupted need of T = tau + w and a recovery of R (both restarted by a
failure), is the classic result (Daly 2006, the "complete" model)

    E[cycle] = exp(lam R) (exp(lam T) - 1) / lam

so ETTR = tau / E[cycle]. It tends to tau / (tau + w) without failures, and falls to zero
once the job's MTBF (1 / lam) is short next to its recovery: a larger cluster then stops
paying. `tau` is the scenario's interval, or Daly's optimum when it says `auto`.

Asynchronous checkpoints (the write costs no training time, writes back to back) are taken
to first order: each failure loses on average half an interval plus the write still in
flight, and the recovery; ETTR = 1 / (1 + lam (R + tau / 2 + w)).

Waiting for hardware: a hardware fault needs a replacement (a spare instance, or a whole
UltraServer for jobs whose tensor parallelism spans one). With s spare units and a mean of
mu = (hardware faults per s) x repair units in repair at a time (Poisson), the wait is taken
as repair x P(N >= s): the whole repair without spares, about nothing with enough of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clustersim.cluster.rates import daly_interval

__all__ = ["Recovery", "renewal_ettr", "hardware_wait_s", "stops_paying_chips"]


@dataclass(frozen=True)
class Recovery:
    """What a failure costs a job, and how it checkpoints."""

    failure_rate_per_s: float  # every interruption of the job
    hardware_rate_per_s: float  # the part that takes hardware down (needs a replacement)
    detect_s: float
    restart_s: float
    restore_s: float
    write_s: float
    interval_s: float | None  # None: Daly's optimum for this failure rate
    async_write: bool = False
    repair_s: float = math.inf
    spare_units: int = 0
    units_per_replacement: int = 1  # instances a replacement takes (ipu for whole UltraServers)

    @property
    def mtbf_s(self) -> float:
        return 1.0 / self.failure_rate_per_s if self.failure_rate_per_s > 0 else math.inf

    @property
    def wait_s(self) -> float:
        return hardware_wait_s(self)

    @property
    def recovery_s(self) -> float:
        """Detection, waiting for hardware (hardware faults only), restart and restore."""
        lam = self.failure_rate_per_s
        share = self.hardware_rate_per_s / lam if lam > 0 else 0.0
        return self.detect_s + share * self.wait_s + self.restart_s + self.restore_s

    @property
    def checkpoint_interval_s(self) -> float:
        if self.interval_s is not None:
            return self.interval_s
        if self.async_write:
            return max(self.write_s, 1e-9)  # back to back, as the timeline does
        if not math.isfinite(self.mtbf_s):
            return math.inf
        return daly_interval(self.write_s, self.mtbf_s)


def hardware_wait_s(r: Recovery) -> float:
    """Expected wait for replacement hardware after a hardware fault (see the module doc)."""
    if r.hardware_rate_per_s <= 0:
        return 0.0
    if not math.isfinite(r.repair_s):
        return 0.0 if r.spare_units >= r.units_per_replacement else math.inf
    spares = r.spare_units // r.units_per_replacement  # replacements available at once
    mu = r.hardware_rate_per_s * r.repair_s  # faults under repair at a random time
    # P(N >= spares) for N ~ Poisson(mu), its terms in logarithms: with hundreds of spares
    # (5% of 16,384 instances) k! and mu**k overflow a float, and exp(-mu) underflows.
    if mu <= 0:
        return 0.0 if spares > 0 else r.repair_s
    log_mu = math.log(mu)
    below = math.fsum(math.exp(k * log_mu - mu - math.lgamma(k + 1)) for k in range(spares))
    return r.repair_s * max(0.0, 1.0 - below)


def renewal_ettr(r: Recovery) -> float:
    """Expected ETTR (useful training time over wall time) of a long job."""
    lam = r.failure_rate_per_s
    tau = r.checkpoint_interval_s
    w = r.write_s
    recovery = r.recovery_s
    if not math.isfinite(recovery):
        return 0.0
    if lam <= 0:
        if r.async_write or not math.isfinite(tau):
            return 1.0
        return tau / (tau + w)
    if r.async_write:
        return 1.0 / (1.0 + lam * (recovery + tau / 2 + w))
    if not math.isfinite(tau):
        return 0.0  # no checkpoints: a long job loses everything, again and again
    exponent = lam * (tau + w) + lam * recovery
    if exponent > 700:
        return 0.0
    cycle = math.exp(lam * recovery) * math.expm1(lam * (tau + w)) / lam
    return tau / cycle


def stops_paying_chips(chips: list[int], time_to_train_s: list[float]) -> int | None:
    """The size past which more chips no longer shorten the time to train (None when the
    largest size is still the fastest)."""
    pairs = sorted(zip(chips, time_to_train_s, strict=True))
    best = min(range(len(pairs)), key=lambda i: pairs[i][1])
    return pairs[best][0] if best < len(pairs) - 1 else None
