"""The pipeline of one training step as simpy processes, one per pipeline rank (never per
chip): each rank runs its schedule's forward and backward passes in order, a pass waiting for
the neighbouring stage's pass of the same micro-batch and the send/receive of its
activations (forward) or gradients (backward). What each rank spent its time on is kept in a
ledger; the data-parallel reduction and the optimizer come after, in the step model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import simpy

from clustersim.training.chunk import ChunkTimes
from clustersim.training.schedule import Task, pipeline_order

__all__ = ["PassRecord", "StageLedger", "run_pipeline", "kept_pipeline"]

PassKey = tuple[str, int, int]  # ("F" or "B", global chunk, micro-batch)


@dataclass(frozen=True)
class PassRecord:
    """When one pass ran on one pipeline rank (times in seconds from the step's start): it
    waited from `waited_s` for the neighbouring pass (done at `ready_s`, None for the first
    chunk's forward and the last chunk's backward) and its transfer, started at `start_s`;
    what its time went on is `chunk_times(chunk)` of its kind."""

    rank: int
    kind: str  # "F" or "B"
    chunk: int  # global chunk
    microbatch: int
    waited_s: float
    ready_s: float | None
    start_s: float
    end_s: float


@dataclass
class StageLedger:
    """Where one pipeline rank's time went until its last pass was done."""

    compute_s: float = 0.0
    tp_s: float = 0.0  # exposed tensor-parallel collectives
    ep_s: float = 0.0  # exposed expert-parallel all-to-alls
    cp_s: float = 0.0  # exposed context-parallel exchange
    dp_s: float = 0.0  # exposed ZeRO-3 gathers and reduce-scatters
    pp_s: float = 0.0  # waiting for a transfer from a neighbouring stage
    idle_s: float = 0.0  # waiting for a neighbouring stage, transfers included
    end_s: float = 0.0  # when its last pass was done
    last_backward_start_s: float = 0.0


def run_pipeline(orders: list[list[Task]], stages: int,
                 chunk_times: Callable[[int], ChunkTimes], p2p_s: list[float],
                 record: list[PassRecord] | None = None) -> list[StageLedger]:
    """Run the passes of `orders` (one list of (kind, chunk, micro-batch) per pipeline
    rank) over `stages` global chunks, chunk g taking `chunk_times(g)` and the transfer from
    pipeline rank d to d + 1 (mod pp) `p2p_s[d]`; one ledger per pipeline rank. `record`, a
    list, gets every pass's `PassRecord` (for a timeline of the step)."""
    pp = len(orders)
    env = simpy.Environment()
    done: dict[PassKey, simpy.Event] = {}
    finished_at: dict[PassKey, float] = {}
    ledgers = [StageLedger() for _ in range(pp)]

    def event(key: PassKey) -> simpy.Event:
        if key not in done:
            done[key] = env.event()
        return done[key]

    def stage(d: int) -> Iterator[simpy.Event]:
        led = ledgers[d]
        for kind, chunk, mb in orders[d]:
            g = chunk * pp + d
            ready_from: PassKey | None = None
            transfer = 0.0
            if kind == "F" and g > 0:
                ready_from = ("F", g - 1, mb)
                transfer = p2p_s[(d - 1) % pp]
            elif kind == "B" and g < stages - 1:
                ready_from = ("B", g + 1, mb)
                transfer = p2p_s[d]  # gradients flow back over the same pair of chips
            waited_from = env.now
            if ready_from is not None:
                yield event(ready_from)
                arrival = finished_at[ready_from] + transfer
                if arrival > env.now:
                    in_transfer = arrival - max(finished_at[ready_from], waited_from)
                    led.pp_s += max(0.0, in_transfer)
                    yield env.timeout(arrival - env.now)
            led.idle_s += env.now - waited_from
            t = chunk_times(g)
            compute = t.forward_compute_s if kind == "F" else t.backward_compute_s
            tp = t.forward_tp_s if kind == "F" else t.backward_tp_s
            ep = t.forward_ep_s if kind == "F" else t.backward_ep_s
            cp = t.forward_cp_s if kind == "F" else t.backward_cp_s
            dp = t.forward_dp_s if kind == "F" else t.backward_dp_s
            start = env.now
            yield env.timeout(compute + tp + ep + cp + dp)
            led.compute_s += compute
            led.tp_s += tp
            led.ep_s += ep
            led.cp_s += cp
            led.dp_s += dp
            key = (kind, g, mb)
            finished_at[key] = env.now
            event(key).succeed()
            if kind == "B":
                led.last_backward_start_s = start
            if record is not None:
                record.append(PassRecord(d, kind, g, mb, waited_from,
                                         None if ready_from is None else finished_at[ready_from],
                                         start, env.now))
        led.end_s = env.now

    for d in range(pp):
        env.process(stage(d))
    env.run()
    return ledgers


def kept_pipeline(kept: MutableMapping, par: Any, microbatches: int,
                  chunks: tuple[ChunkTimes, ...], p2p_s: list[float]) -> list[StageLedger]:
    """`run_pipeline` of the schedule of `par`'s degrees, chunk g taking `chunks[g]`, kept in
    `kept` by all it reads: a spread job's splits over the sites, and small jobs' placements
    alike but for their data-parallel reduction, run the same passes (once, not once each).
    The ledgers are shared: read, never changed."""
    key = (par.pp, microbatches, par.interleave, chunks, tuple(p2p_s))
    found = kept.get(key)
    if found is None:
        orders = pipeline_order(par.pp, microbatches, par.interleave)
        found = kept[key] = run_pipeline(orders, len(chunks), chunks.__getitem__, p2p_s)
    return found
