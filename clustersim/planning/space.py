"""The search space of a training job: every parallelism the model can run on a chip count,
and why each one that cannot run is out.

A candidate is (hardware, chips, tp, cp, pp, dp, ep, interleave, micro-batch, recompute,
sequence parallelism, ZeRO stage, rank order). Degrees count ranks and tp x cp x pp x dp
equals the job's ranks, so for a size the space is every tp dividing the ranks, every
context-parallel degree of `CP_DEGREES` that divides the sequence (keeping at least
`MIN_CP_POSITIONS` positions per rank), every pp dividing what is left up to the layers
(stages may be uneven: training.stages), dp following, every ep dividing dp (mixtures of
experts), in the default rank order and, where that brings expert groups that span
NeuronLink domains into one domain each, in the order `tp-cp-ep-pp-dp` (`training.ranks`;
`_expert_layouts`), every interleave up to `limits.MAX_INTERLEAVE` dividing the most or the
fewest layers a pipeline rank holds, every micro-batch dividing a data-parallel rank's share
of the batch, the three recompute modes (two with flash attention, where selective recompute
frees nothing and costs time), sequence parallelism with tp > 1 and ZeRO 0 to 3 with more
than one data-parallel rank. Equivalent settings are not listed twice (no sequence
parallelism without tp, no ZeRO without data-parallel ranks, no interleave without pp).
Hybrid sharding (`shard`) and the all-to-all context exchange are evaluated when a scenario
gives them, not searched.

A candidate is pruned, in this order, for
- divisibility: at least one layer per stage (pp x interleave at most the layers), tp at
  most the query heads (beyond, ranks hold only padding heads), the
  sequence over cp, a cp rank's sequence over tp with sequence parallelism (Megatron and
  NxD scatter it over the tp ranks), the batch over micro-batch x dp, micro-batches over pp for interleaving,
  experts over ep (the scenario loader's rules; a tp that does not divide the heads pads
  them, as NxD does);
- placement: tensor parallelism must stay inside a NeuronLink (or NVLink) domain: an
  instance, or the UltraServer (Z ring or NeuronSwitch) taken whole, never across EFA;
- memory: the step model's exact memory of the busiest rank against the chip's HBM less a
  headroom (`--memory-headroom`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from clustersim.hardware import limits
from clustersim.hardware.catalog import HardwareSpec
from clustersim.training.memory import BusiestMemory, busiest_memory
from clustersim.training.ranks import DEFAULT_ORDER, EXPERTS_INSIDE
from clustersim.training.transformer import TransformerShape
from clustersim.training.workload import Degrees, ParallelismSpec, TrainingJob, attention_of

__all__ = ["Candidate", "ScreenJob", "screen_job", "RECOMPUTE", "CP_DEGREES", "MIN_CP_POSITIONS", "divisors",
           "enumerate_space", "space_size", "prune_reason", "job_for", "memory_of",
           "MemoryScreen", "tp_domain_ranks"]

RECOMPUTE = ("none", "selective", "full")
# With flash attention selective recompute (Korthikanti et al.: recompute the attention core,
# whose stored scores it frees) frees nothing, flash never stores them, and costs time: it is
# not searched (a scenario may still give it).
FLASH_RECOMPUTE = ("none", "full")
# Context-parallel degrees searched, and the fewest sequence positions a rank keeps: splitting
# an 8k sequence finer than 1k positions costs more in exchange than it saves (Megatron-Core
# and Llama 3 use CP 2 to 16 for 32k-128k sequences).
CP_DEGREES = (1, 2, 4, 8, 16)
MIN_CP_POSITIONS = 1024


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
    zero: int
    cp: int = 1
    order: str = DEFAULT_ORDER  # rank order (training.ranks); searched only with ep > 1

    @property
    def parallelism(self) -> ParallelismSpec:
        # Not validated again: the space only makes degrees within the spec's bounds (the
        # planner makes tens of thousands of these).
        return ParallelismSpec.model_construct(
            tp=self.tp, cp=self.cp, pp=self.pp, dp=self.dp, ep=self.ep,
            interleave=self.interleave, zero=self.zero,
            sequence_parallel=self.sequence_parallel, cp_comm="ring", shard=None,
            order=self.order)

    def key(self) -> tuple:
        return (self.hardware, self.chips, self.tp, self.cp, self.pp, self.dp, self.ep,
                self.interleave, self.micro_batch, self.recompute, self.sequence_parallel,
                self.zero, self.order)

    def as_dict(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "chips": self.chips, "tp": self.tp, "cp": self.cp,
                "pp": self.pp, "dp": self.dp, "ep": self.ep, "interleave": self.interleave,
                "micro_batch": self.micro_batch, "recompute": self.recompute,
                "sequence_parallel": self.sequence_parallel, "zero": self.zero,
                "order": self.order}


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


def _interleaves(layers: int, pp: int) -> list[int]:
    """Interleaves for pp stages: dividing the most or the fewest layers a rank holds, at
    most `limits.MAX_INTERLEAVE`, at least one layer per chunk."""
    if pp == 1 or pp > layers:
        return [1]
    values = set(divisors(-(-layers // pp))) | set(divisors(layers // pp))
    return sorted(v for v in values if v <= limits.MAX_INTERLEAVE and pp * v <= layers)


def _layouts(hw: HardwareSpec, chips: int, job: TrainingJob
             ) -> Iterator[tuple[int, int, int, int]]:
    """Every (tp, cp, pp, dp) over the job's ranks on `chips` chips, in the search's order:
    cp among CP_DEGREES splitting the sequence no finer than MIN_CP_POSITIONS, pp no more
    stages than layers."""
    ranks = chips * hw.chip.ranks
    seq = job.sequence_length
    cps = [cp for cp in CP_DEGREES
           if seq % cp == 0 and (cp == 1 or seq // cp >= MIN_CP_POSITIONS)]
    for tp in divisors(ranks):
        for cp in cps:
            if (ranks // tp) % cp:
                continue
            for pp in divisors(ranks // (tp * cp)):
                if pp > job.model.layers:
                    break
                yield tp, cp, pp, ranks // (tp * cp * pp)


def enumerate_space(hardware_name: str, hw: HardwareSpec, chips: int, job: TrainingJob
                    ) -> list[Candidate]:
    """Every candidate considered on `chips` chips of `hw` (before any pruning). A (tp, cp,
    pp) that cannot run whatever the rest (heads over tp, the batch over dp, placement, ...)
    is listed once, with the first of the other settings, not once per micro-batch, recompute
    and so on; so is an (ep, interleave, micro-batch) whose micro-batches do not suit it."""
    model = job.model
    attention = attention_of(job, hw.chip.framework.attention)
    out: list[Candidate] = []
    for tp, cp, pp, dp in _layouts(hw, chips, job):
        first = Candidate(hardware_name, chips, tp, pp, dp, 1, 1, 1, "none", False, 0,
                          cp)
        if prune_reason(first, hw, job) is not None:
            out.append(first)  # out whatever the other settings
            continue
        eps = divisors(dp) if model.moe else [1]
        micro = divisors(job.global_batch // dp)
        sps = (False, True) if tp > 1 else (False,)
        zeros = (0, 1, 2, 3) if dp * cp > 1 else (0,)
        recomputes = RECOMPUTE if attention == "unfused" else FLASH_RECOMPUTE
        for ep, order in _expert_layouts(hw, eps, tp, cp, pp):
            if ep > 1 and model.experts % ep:
                out.append(Candidate(hardware_name, chips, tp, pp, dp, ep, 1, 1, "none",
                                     False, 0, cp, order))
                continue
            for v in _interleaves(model.layers, pp):
                for mb in micro:
                    if v > 1 and (job.global_batch // (mb * dp)) % pp:
                        out.append(Candidate(hardware_name, chips, tp, pp, dp, ep, v,
                                             mb, "none", False, 0, cp, order))
                        continue
                    for recompute in recomputes:
                        for sp in sps:
                            for z in zeros:
                                out.append(Candidate(hardware_name, chips, tp, pp, dp,
                                                     ep, v, mb, recompute, sp, z, cp, order))
    return out


def _expert_layouts(hw: HardwareSpec, eps: list[int], tp: int, cp: int, pp: int
                    ) -> Iterator[tuple[int, str]]:
    """(ep, rank order) pairs: every ep in the default order, and ep > 1 also in the order
    `tp-cp-ep-pp-dp` where the default spreads an expert group over more than one
    NeuronLink domain (tp x cp x pp x ep ranks beyond a domain) and the inner order puts
    every group inside one (tp x cp x ep tiles the domain). Not listed elsewhere: where
    tp x cp x ep does not tile a domain some of its groups still straddle two (the step
    costs the slowest group, `collectives.uneven`); where the default's group already fits
    a domain the inner order only spreads the pipeline stages. Listing it for every ep
    would double a mixture's space (past `limits.MAX_PLAN_CANDIDATES` on 128 Trn3
    UltraServers)."""
    domain = tp_domain_ranks(hw)
    for ep in eps:
        yield ep, DEFAULT_ORDER
        if ep > 1 and domain % (tp * cp * ep) == 0 and tp * cp * pp * ep > domain:
            yield ep, EXPERTS_INSIDE


def space_size(hw: HardwareSpec, chips: int, job: TrainingJob) -> int:
    """At most how many candidates `enumerate_space` lists, counted without listing them (the
    plan's size is bounded before any work: limits.MAX_PLAN_CANDIDATES). The same loops over
    (tp, cp, pp) and (interleave, micro-batch) as the enumeration, with the settings under
    them multiplied out instead of listed: what the enumeration lists once (a (tp, cp, pp)
    that cannot run whatever the rest, an interleave whose micro-batches do not suit it)
    counts once; experts that ep does not divide and ZeRO-3 with ep > 1 count in full, so
    this is an upper bound (and equal for dense models)."""
    model = job.model
    flash = attention_of(job, hw.chip.framework.attention) != "unfused"
    recomputes = len(FLASH_RECOMPUTE if flash else RECOMPUTE)
    total = 0
    for tp, cp, pp, dp in _layouts(hw, chips, job):
        first = Candidate("", chips, tp, pp, dp, 1, 1, 1, "none", False, 0, cp)
        if prune_reason(first, hw, job) is not None:
            total += 1
            continue
        eps = (sum(1 for _ in _expert_layouts(hw, divisors(dp), tp, cp, pp)) if model.moe
               else 1)
        settings = recomputes * (2 if tp > 1 else 1) * (4 if dp * cp > 1 else 1)
        micro = divisors(job.global_batch // dp)  # dp divides the batch: `first` runs
        per_ep = 0
        for v in _interleaves(model.layers, pp):
            for mb in micro:
                unsuited = v > 1 and (job.global_batch // (mb * dp)) % pp
                per_ep += 1 if unsuited else settings
        total += eps * per_ep
    return total


def tp_domain_ranks(hw: HardwareSpec) -> int:
    """Ranks joined by NeuronLink (NVLink): an instance, or a whole UltraServer."""
    return hw.ranks_per_instance * hw.instances_per_ultraserver


def prune_reason(c: Candidate, hw: HardwareSpec, job: TrainingJob) -> str | None:
    """Why a candidate cannot run (divisibility or placement), or None."""
    model = job.model
    # A tp that does not divide the heads pads them (as NxD does; the padded work is costed),
    # as the scenario rules accept it.
    if model.layers < c.pp * c.interleave:
        return (f"divisibility: {model.layers} layers cannot fill pp x interleave "
                f"{c.pp * c.interleave} stages")
    if job.global_batch % (c.micro_batch * c.dp):
        return (f"divisibility: global batch {job.global_batch} over micro-batch x dp "
                f"{c.micro_batch * c.dp}")
    microbatches = job.global_batch // (c.micro_batch * c.dp)
    if c.interleave > limits.MAX_INTERLEAVE:  # what the loader accepts (a model of 1,000 layers)
        return f"limit: interleave {c.interleave} above {limits.MAX_INTERLEAVE}"
    passes = c.pp * c.interleave * microbatches
    if passes > limits.MAX_PIPELINE_PASSES:  # the schedule built for its memory and time
        return (f"limit: {passes:,} pipeline passes (pp x interleave x micro-batches) above "
                f"{limits.MAX_PIPELINE_PASSES:,}")
    if c.interleave > 1 and microbatches % c.pp:
        return f"divisibility: {microbatches} micro-batches over pp {c.pp} (interleaved)"
    if c.ep > 1 and model.experts % c.ep:
        return f"divisibility: {model.experts} experts over ep {c.ep}"
    if c.tp > model.heads:  # every head already has a rank of its own
        return (f"divisibility: tp {c.tp} above the {model.heads} query heads (ranks of "
                f"padding heads only)")
    if job.sequence_length % c.cp:
        return f"divisibility: sequence {job.sequence_length} over cp {c.cp}"
    if c.sequence_parallel and (job.sequence_length // c.cp) % c.tp:
        return (f"divisibility: sequence {job.sequence_length // c.cp} per cp rank over tp "
                f"{c.tp} (sequence parallelism)")
    rpi = hw.ranks_per_instance
    ranks = c.tp * c.cp * c.pp * c.dp
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


@dataclass(frozen=True)
class _Degrees(Degrees):
    """A candidate's parallelism for screening (memory and bound): the spec's fields
    without its validation, which would cost more than the screening itself."""

    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    interleave: int
    zero: int
    sequence_parallel: bool
    shard: int | None = None
    cp_comm: str = "ring"
    order: str = DEFAULT_ORDER


@dataclass(frozen=True)
class ScreenJob:
    """What memory and the bound read of a candidate's job (a TrainingJob)."""

    model: TransformerShape
    global_batch: int
    micro_batch: int
    parallelism: _Degrees
    precision: str
    recompute: str
    attention: str | None
    sequence_length: int


def screen_job(base: Any, c: Candidate) -> ScreenJob:
    """The light job of a candidate, for screening; `job_for` gives the scenario's."""
    return ScreenJob(base.model, base.global_batch, c.micro_batch,
                     _Degrees(c.tp, c.cp, c.pp, c.dp, c.ep, c.interleave, c.zero,
                              c.sequence_parallel, order=c.order),
                     base.precision, c.recompute, getattr(base, "attention", None),
                     base.sequence_length)


def job_for(base: Any, c: Candidate) -> Any:
    """The scenario job with this candidate's parallelism, micro-batch and recompute."""
    return base.model_copy(update={
        "parallelism": c.parallelism, "micro_batch": c.micro_batch, "recompute": c.recompute,
        "instances": None,
    })


class MemoryScreen:
    """Bytes per chip of the busiest pipeline rank of many candidates of one job on one
    hardware: `memory_of(...).per_chip`, the same figure, at a fraction of the cost
    (`workload.BusiestMemory`)."""

    def __init__(self, job: Any, hw: HardwareSpec):
        framework = hw.chip.framework
        self.ranks = hw.chip.ranks
        self.table = BusiestMemory(attention_of(job, framework.attention), framework.gradients)

    def per_chip(self, job: Any) -> float:
        par = job.parallelism
        microbatches = job.global_batch // (job.micro_batch * par.dp)
        return self.table.per_rank(job, microbatches) * min(self.ranks, par.ranks)


def memory_of(job: TrainingJob, hw: HardwareSpec):
    """The step model's memory breakdown of a job (its busiest pipeline rank)."""
    par = job.parallelism
    microbatches = job.global_batch // (job.micro_batch * par.dp)
    framework = hw.chip.framework
    return busiest_memory(job, microbatches, hw.chip.hbm_bytes, min(hw.chip.ranks, par.ranks),
                          attention=attention_of(job, framework.attention),
                          gradients=framework.gradients)
