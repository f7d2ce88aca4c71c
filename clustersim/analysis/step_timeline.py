"""One training step as a Chrome trace event file (`clustersim step SCENARIO --timeline`),
which ui.perfetto.dev and chrome://tracing open.

The step is the one `StepModel.profile` simulates, run again with its pipeline recording
every pass (`run_pipeline(record=...)`): a track per pipeline stage, each the stage's
representative rank (rank d x tp x cp, data-parallel replica 0: every TP, CP and DP rank of
a stage runs the same passes in the model, so a 500,000-chip job has as many tracks as a
512-chip one with the same pipeline), saying so in the track's name. Each pass (a
micro-batch's forward or backward through a chunk) is a slice, with its parts as children:
compute, then the exposed TP, EP, CP and ZeRO-3 collectives (the model times their sums per
pass, not how they interleave layer by layer, so they are drawn one after the other), with
the collectives' sizes and algorithms in the slice's arguments. Before a pass, the wait for
the neighbouring stage (`bubble`) and for the transfer (`pp`); flows join each stage's send
to the next stage's receive. After the last pass: the exposed data-parallel reduction and
ZeRO-1 gather, then the optimizer; the whole reduction, most of it overlapped with the last
backward passes, on a track of its own.

The categories (`cat`) are those of the step table: on the critical stage (the one that ends
last) the slices of each category add up to the table's figure, and the step spans 0 to the
step time. The trace event format is plain JSON (Google's "Trace Event Format" document):
written with the standard library. The `perfetto` package's trace builders write Perfetto's
protobuf format instead, which chrome://tracing does not open, and would add protobuf for
nothing the JSON lacks here.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from clustersim.collectives.model import Group
from clustersim.hardware.precision import BYTES_PER_ELEMENT
from clustersim.training.layer_mix import chunk_mixes
from clustersim.training.memory import params_per_rank, stage_share, weight_bytes_per_param
from clustersim.training.pipeline import PassRecord, run_pipeline
from clustersim.training.profile import StepProfile
from clustersim.training.ranks import pipeline_stride, rank_chips, rank_group
from clustersim.training.reduction import data_parallel_offsets
from clustersim.training.schedule import pipeline_order
from clustersim.training.stages import chunk_layers, rank_layers
from clustersim.training.step import StepModel
from clustersim.training.workload import TrainingJob, stage_work

__all__ = ["step_trace", "CATEGORIES"]

# Slice categories of the step table (the table's key for each: `StepProfile.as_dict()`'s
# `step_breakdown`); `pass` is a forward or backward pass (the parent of its parts) and
# `dp-overlapped` the data-parallel reduction running under the last backward passes.
CATEGORIES = {"compute": "compute_s", "tp": "tp_comm_s", "pp": "pp_comm_s", "dp": "dp_comm_s",
              "ep": "ep_comm_s", "cp": "cp_comm_s", "bubble": "bubble_s",
              "optimizer": "optimizer_s"}


def step_trace(model: StepModel, jobs: list[TrainingJob], names: list[str] | None = None
               ) -> dict[str, Any]:
    """The trace (a JSON-ready dict) of one step of each job, each on the cluster's first
    instances as `clustersim step` times it: a process per job."""
    events: list[dict[str, Any]] = []
    about = []
    for index, job in enumerate(jobs):
        name = names[index] if names else getattr(job, "name", f"job {index}")
        found = _job_events(model, job, name, pid=index + 1)
        events += found["events"]
        about.append(found["about"])
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"clustersim": "one training step per job", "jobs": about}}


def _job_events(model: StepModel, job: TrainingJob, name: str, pid: int) -> dict[str, Any]:
    hw = model.hardware
    par = job.parallelism
    profile: StepProfile = model.profile(job, name)
    _, placed = model._shape(job, model._placement(job))  # the placement profile() simulates
    stages = par.pp * par.interleave
    counts = chunk_layers(job.model.layers, stages)
    groups = model._parallel_groups(job, placed)
    times = model.stage_chunks(job, placed).__getitem__  # each chunk's, of its own layers

    # As StepModel._simulate: each TP rank sends its shard of the activations.
    act_bytes = job.micro_batch * (job.sequence_length // par.cp) * job.model.hidden * \
        BYTES_PER_ELEMENT[job.precision] / par.tp
    shards = min(par.tp, hw.chip.ranks)
    p2p = [0.0] * par.pp
    if par.pp > 1:
        stride = pipeline_stride(par)
        for d in range(par.pp):
            src = rank_chips(hw, np.array([d * stride]), placed)[0]
            dst = rank_chips(hw, np.array([((d + 1) % par.pp) * stride]), placed)[0]
            p2p[d] = model.collectives.cost("send-recv", Group(np.array([src]), 1),
                                            act_bytes * shards, peer=int(dst)).time_s
    microbatches = profile.microbatches
    record: list[PassRecord] = []
    ledgers = run_pipeline(pipeline_order(par.pp, microbatches, par.interleave), stages,
                           times, p2p, record)
    dp_times = model.data_parallel_times(job, placed)
    optimizer = model._optimizer_s(job)

    ranks_per_stage = par.tp * par.cp * par.dp
    sync = getattr(job, "cross_site_sync", None)
    note = ""
    if sync is not None and sync.every > 1 and model.topology.site_count > 1:
        note = (f"; the step that averages across sites (one in {sync.every}): `step` shows "
                "the mean of it and the local steps")
    events: list[dict[str, Any]] = [
        _meta("process_name", pid, 0, f"{name}: one step, {profile.step_time_s:.4g} s "
              f"({profile.chips:,} chips, tp {par.tp} cp {par.cp} pp {par.pp} dp {par.dp})"
              + note),
        _meta("process_sort_index", pid, 0, pid, key="sort_index")]
    for d in range(par.pp):
        events.append(_meta("thread_name", pid, 2 * d + 1,
                            f"stage {d}: rank {d * pipeline_stride(par)}, one representative of "
                            f"its {ranks_per_stage:,} ranks (all run these passes)"))
        events.append(_meta("thread_name", pid, 2 * d + 2,
                            f"stage {d}: data-parallel gradient reduction (overlapped)"))
        for tid in (2 * d + 1, 2 * d + 2):
            events.append(_meta("thread_sort_index", pid, tid, tid, key="sort_index"))

    details = _Details(model, job, placed, groups, counts)
    by_key = {(r.kind, r.chunk, r.microbatch): r for r in record}
    flow = pid * 10_000_000
    for r in record:
        tid = 2 * r.rank + 1
        if r.ready_s is not None:
            mid = min(r.start_s, max(r.ready_s, r.waited_s))
            _slice(events, pid, tid, "waiting for the neighbouring stage", "bubble",
                   r.waited_s, mid)
            _slice(events, pid, tid, "receiving " + ("activations" if r.kind == "F"
                                                     else "gradients"), "pp", mid, r.start_s,
                   {"bytes": act_bytes * shards})
            # The flow from the sending pass (its end) to this pass (its start).
            source = by_key[("F", r.chunk - 1, r.microbatch) if r.kind == "F"
                            else ("B", r.chunk + 1, r.microbatch)]
            flow += 1
            sent = "activations" if r.kind == "F" else "gradients"
            events.append({"ph": "s", "id": flow, "pid": pid, "tid": 2 * source.rank + 1,
                           "ts": _us(source.end_s) - 1e-3, "cat": "pp",
                           "name": f"send {sent}"})
            events.append({"ph": "f", "bp": "e", "id": flow, "pid": pid, "tid": tid,
                           "ts": _us(r.start_s), "cat": "pp", "name": f"send {sent}"})
        t = times(r.chunk)
        forward = r.kind == "F"
        label = "forward" if forward else "backward"
        _slice(events, pid, tid, f"{label} chunk {r.chunk} micro-batch {r.microbatch}", "pass",
               r.start_s, r.end_s, {"layers": counts[r.chunk], "microbatch": r.microbatch,
                                     "chunk": r.chunk})
        at = r.start_s
        last = max((i for i, (_, v) in enumerate(_parts(t, forward)) if v > 0), default=-1)
        for i, (cat, seconds) in enumerate(_parts(t, forward)):
            if seconds > 0:
                # The last part ends with its pass (not a rounding past it: viewers nest by time).
                end = r.end_s if i == last else at + seconds
                _slice(events, pid, tid, details.title(cat, label), cat, at, end,
                       details.args(cat, r.chunk, forward, seconds))
                at += seconds

    ends = {}
    for d, led in enumerate(ledgers):
        tid = 2 * d + 1
        reduce_s, gather_s = dp_times[d]
        reduce_end = max(led.end_s, led.last_backward_start_s + reduce_s)
        dp_args = details.reduction(d)
        _slice(events, pid, 2 * d + 2, dp_args["name"], "dp-overlapped",
               led.last_backward_start_s, led.last_backward_start_s + reduce_s, dp_args)
        _slice(events, pid, tid, dp_args["name"] + " (exposed)", "dp", led.end_s, reduce_end,
               dp_args)
        _slice(events, pid, tid, "ZeRO-1 parameter all-gather", "dp", reduce_end,
               reduce_end + gather_s)
        end = reduce_end + gather_s + optimizer[d]
        _slice(events, pid, tid, "optimizer step", "optimizer", reduce_end + gather_s, end)
        ends[d] = end
    critical = max(ends, key=lambda d: ends[d])
    about = {"name": name, "pid": pid, "critical_stage": critical,
             "critical_tid": 2 * critical + 1, "step_time_s": profile.step_time_s,
             "step_breakdown": profile.as_dict()["step_breakdown"],
             "representative": f"one rank per pipeline stage of {ranks_per_stage:,}",
             "note": note.removeprefix("; ")}
    return {"events": events, "about": about}


def _us(seconds: float) -> float:
    """Microseconds, rounded to the nanosecond: a slice that ends where its parent does ends
    at the same number (viewers nest slices by their times)."""
    return round(seconds * 1e9) / 1e3


def _parts(t: Any, forward: bool) -> tuple[tuple[str, float], ...]:
    """A pass's parts in the order they are drawn."""
    if forward:
        return (("compute", t.forward_compute_s), ("tp", t.forward_tp_s),
                ("ep", t.forward_ep_s), ("cp", t.forward_cp_s), ("dp", t.forward_dp_s))
    return (("compute", t.backward_compute_s), ("tp", t.backward_tp_s),
            ("ep", t.backward_ep_s), ("cp", t.backward_cp_s), ("dp", t.backward_dp_s))


def _meta(kind: str, pid: int, tid: int, value: Any, key: str = "name") -> dict[str, Any]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {key: value}}


def _slice(events: list[dict[str, Any]], pid: int, tid: int, name: str, cat: str,
           start_s: float, end_s: float, args: dict[str, Any] | None = None) -> None:
    """A complete event from `start_s` to `end_s`, none when it lasts nothing."""
    if _us(end_s) <= _us(start_s):
        return
    start_us = _us(start_s)
    event = {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": start_us,
             "dur": round(_us(end_s) * 1e3 - start_us * 1e3) / 1e3}
    if args:
        event["args"] = args
    events.append(event)


_TITLES = {"compute": "compute", "tp": "TP collectives (exposed)",
           "ep": "EP all-to-alls (exposed)", "cp": "CP exchange (exposed)",
           "dp": "ZeRO-3 parameter gathers and gradient reduce-scatters (exposed)"}


class _Details:
    """The collectives behind each slice: operation, bytes, algorithm and time, on rank 0's
    groups (those the step model costs)."""

    def __init__(self, model: StepModel, job: TrainingJob, placed: np.ndarray, groups: tuple,
                 counts: tuple[int, ...]):
        self.model, self.job, self.placed, self.counts = model, job, placed, counts
        self.tp_group, self.ep_group, self.cp_group = groups
        self.stages = len(counts)
        self._cache: dict[tuple, dict[str, Any]] = {}

    def title(self, cat: str, label: str) -> str:
        return f"{label} {_TITLES[cat]}"

    def args(self, cat: str, chunk: int, forward: bool, seconds: float) -> dict[str, Any]:
        key = (cat, chunk, forward)
        if key not in self._cache:
            self._cache[key] = self._args(cat, chunk, forward)
        return {"exposed_ms": seconds * 1e3, **self._cache[key]}

    def _args(self, cat: str, chunk: int, forward: bool) -> dict[str, Any]:
        if cat not in ("tp", "ep", "cp"):
            return {}
        job = self.job
        work = stage_work(job, self.counts[chunk], chunk == 0, chunk == self.stages - 1,
                          self.model.attention(job), chunk_mixes(job.model, self.stages)[chunk])
        group, sharing = None, 1
        if cat == "tp":
            group = self.tp_group
            ops = work.tp_collectives_forward if forward else work.tp_collectives_backward
        elif cat == "ep":
            group, sharing = self.ep_group or (None, 1)
            ops = work.ep_collectives_forward if forward else work.ep_collectives_backward
        else:
            group, sharing = self.cp_group or (None, 1)
            ops = work.cp_collectives_forward if forward else work.cp_collectives_backward
        if group is None:
            return {}
        listed = []
        for (op, size), n in Counter(ops).items():
            cost = self.model.collectives.cost(op, group, size * sharing)
            listed.append(f"{n} x {op} of {size * sharing / 2**20:,.3g} MiB over "
                          f"{len(group.chips) * group.ranks_per_chip} ranks, "
                          f"{cost.algorithm}, {cost.time_s * 1e3:.3g} ms each")
        note = {"tp": "the backward pass's may hide behind the weight-gradient GEMMs",
                "cp": "a ring exchange hides behind attention as far as it goes",
                "ep": "counting the bytes of the chip's other expert groups"}[cat]
        return {"collectives": listed, "note": note}

    def reduction(self, d: int) -> dict[str, Any]:
        """The data-parallel gradient reduction of pipeline rank d: its operation, bytes and,
        on its first group alone, algorithm."""
        job, par, hw = self.job, self.job.parallelism, self.model.hardware
        _, g_bytes, _ = weight_bytes_per_param(job.precision, hw.chip.framework.gradients)
        layers = rank_layers(job.model.layers, par.pp, par.interleave)[d]
        size = params_per_rank(job, d == 0, d == par.pp - 1, layers,
                               stage_share(job, d)) * g_bytes
        op = "all-reduce" if par.zero == 0 else "reduce-scatter"
        offsets = data_parallel_offsets(par.tp, par.cp, par.pp, par.dp, par.ep,
                                        getattr(par, "order", "tp-cp-pp-dp"))
        z = par.shard_ranks if par.zero else len(offsets)
        args: dict[str, Any] = {"name": f"DP gradient {op}", "op": op,
                                "bytes_per_rank": size, "ranks": int(z)}
        if z > 1:
            group, _ = rank_group(hw, d * pipeline_stride(par) + offsets[:z], self.placed)
            cost = self.model.collectives.cost(op, group, size)
            args["algorithm"] = cost.algorithm
            args["alone_ms"] = cost.time_s * 1e3
        return args
