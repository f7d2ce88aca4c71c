"""The search space of a training job: every parallelism the model can run on a chip count,
and why each one that cannot run is out.

A candidate is (hardware, chips, tp, pp, dp, ep, interleave, micro-batch, recompute,
sequence parallelism, ZeRO-1). Degrees count ranks and tp x pp x dp equals the job's ranks,
so for a size the space is every tp dividing the ranks, every pp dividing what is left (dp
follows), every ep dividing dp (mixtures of experts), every interleave dividing the layers a
pipeline rank holds, every micro-batch dividing a data-parallel rank's share of the batch,
the three recompute modes, sequence parallelism with tp > 1 and ZeRO-1 with dp > 1.
Equivalent settings are not listed twice (no sequence parallelism without tp, no ZeRO-1
without dp, no interleave without pp).

A candidate is pruned, in this order, for
- divisibility: layers over pp x interleave, the batch over
  micro-batch x dp, micro-batches over pp for interleaving, experts over ep (the scenario
  loader's rules);
- placement: tensor parallelism must stay inside a NeuronLink (or NVLink) domain: an
  instance, or the UltraServer (Z ring or NeuronSwitch) taken whole, never across EFA;
- memory: the step model's exact memory of the busiest rank against the chip's HBM (less a
  headroom).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from clustersim.hardware.catalog import HardwareSpec
from clustersim.training.schedule import peak_in_flight, pipeline_order
from clustersim.training.workload import (
    ParallelismSpec,
    TrainingJob,
    attention_of,
    memory_per_rank,
)

__all__ = ["Candidate", "RECOMPUTE", "divisors", "enumerate_space", "prune_reason", "job_for",
           "memory_of", "tp_domain_ranks"]

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Candidate:
    """One configuration of the job on one hardware and size."""

    hardware: str
    chips: int
    tp: int
    pp: int
    dp: int
    ep: int
    interleave: int
    micro_batch: int
    recompute: str
    sequence_parallel: bool
    zero1: bool

    @property
    def parallelism(self) -> ParallelismSpec:
        return ParallelismSpec(tp=self.tp, pp=self.pp, dp=self.dp, ep=self.ep,
                               interleave=self.interleave, zero=1 if self.zero1 else 0,
                               sequence_parallel=self.sequence_parallel)

    def key(self) -> tuple:
        return (self.hardware, self.chips, self.tp, self.pp, self.dp, self.ep, self.interleave,
                self.micro_batch, self.recompute, self.sequence_parallel, self.zero1)

    def as_dict(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "chips": self.chips, "tp": self.tp, "pp": self.pp,
                "dp": self.dp, "ep": self.ep, "interleave": self.interleave,
                "micro_batch": self.micro_batch, "recompute": self.recompute,
                "sequence_parallel": self.sequence_parallel, "zero1": self.zero1}


def divisors(n: int) -> list[int]:
    """Every positive divisor of n, ascending."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def enumerate_space(hardware_name: str, hw: HardwareSpec, chips: int, job: TrainingJob
                    ) -> list[Candidate]:
    """Every candidate considered on `chips` chips of `hw` (before any pruning)."""
    ranks = chips * hw.chip.ranks
    model = job.model
    out: list[Candidate] = []
    for tp in divisors(ranks):
        for pp in divisors(ranks // tp):
            dp = ranks // (tp * pp)
            eps = divisors(dp) if model.moe else [1]
            layers_per_rank = model.layers // pp if model.layers % pp == 0 else 0
            interleaves = [1] if pp == 1 or not layers_per_rank else divisors(layers_per_rank)
            per_rank = job.global_batch // dp if job.global_batch % dp == 0 else 0
            micro = divisors(per_rank) if per_rank else [1]
            sps = (False, True) if tp > 1 else (False,)
            zeros = (False, True) if dp > 1 else (False,)
            for ep in eps:
                for v in interleaves:
                    for mb in micro:
                        for recompute in RECOMPUTE:
                            for sp in sps:
                                for z in zeros:
                                    out.append(Candidate(hardware_name, chips, tp, pp, dp, ep, v,
                                                         mb, recompute, sp, z))
    return out


def tp_domain_ranks(hw: HardwareSpec) -> int:
    """Ranks joined by NeuronLink (NVLink): an instance, or a whole UltraServer."""
    return hw.ranks_per_instance * hw.instances_per_ultraserver


def prune_reason(c: Candidate, hw: HardwareSpec, job: TrainingJob) -> str | None:
    """Why a candidate cannot run (divisibility or placement), or None."""
    model = job.model
    # A tp that does not divide the heads pads them (as NxD does; the padded work is costed),
    # as the scenario rules accept it.
    if model.layers % (c.pp * c.interleave):
        return f"divisibility: {model.layers} layers over pp x interleave {c.pp * c.interleave}"
    if job.global_batch % (c.micro_batch * c.dp):
        return (f"divisibility: global batch {job.global_batch} over micro-batch x dp "
                f"{c.micro_batch * c.dp}")
    microbatches = job.global_batch // (c.micro_batch * c.dp)
    if c.interleave > 1 and microbatches % c.pp:
        return f"divisibility: {microbatches} micro-batches over pp {c.pp} (interleaved)"
    if c.ep > 1 and model.experts % c.ep:
        return f"divisibility: {model.experts} experts over ep {c.ep}"
    rpi = hw.ranks_per_instance
    ranks = c.tp * c.pp * c.dp
    if ranks % rpi:
        return f"placement: {ranks} ranks are not whole instances of {rpi}"
    if c.tp > rpi:
        domain = tp_domain_ranks(hw)
        if c.tp > domain or c.tp % rpi:
            where = "an instance" if hw.ultraserver is None else "an UltraServer"
            return f"placement: tp {c.tp} leaves {where} ({domain} ranks) for EFA"
        if (ranks // rpi) % hw.instances_per_ultraserver:
            return "placement: tp spans instances, so the job needs whole UltraServers"
    elif rpi % c.tp:
        return f"placement: tp {c.tp} does not tile an instance of {rpi} ranks"
    return None


def job_for(base: Any, c: Candidate) -> Any:
    """The scenario job with this candidate's parallelism, micro-batch and recompute."""
    return base.model_copy(update={
        "parallelism": c.parallelism, "micro_batch": c.micro_batch, "recompute": c.recompute,
        "instances": None,
    })


@functools.lru_cache(maxsize=65536)
def _in_flight(pp: int, microbatches: int, interleave: int) -> float:
    """Micro-batches of activations the first pipeline rank holds at once (as the step
    model's memory: the schedule's peak over the interleave)."""
    return peak_in_flight(pipeline_order(pp, microbatches, interleave)[0]) / interleave


def memory_of(job: TrainingJob, hw: HardwareSpec):
    """The step model's memory breakdown of a job (cached schedule peak)."""
    par = job.parallelism
    microbatches = job.global_batch // (job.micro_batch * par.dp)
    framework = hw.chip.framework
    return memory_per_rank(job, _in_flight(par.pp, microbatches, par.interleave),
                           hw.chip.hbm_bytes, min(hw.chip.ranks, par.ranks),
                           attention=attention_of(job, framework.attention),
                           gradients=framework.gradients)
