"""One serving replica as a simpy process: continuous batching, chunked prefill, a paged KV
cache, and decode iterations advanced in bulk between events.

The batch changes only when a prompt is being prefilled, a request joins or one finishes, so
between those events the replica computes how many decode iterations remain until the next
completion (or until the KV cache fills) and advances them at once (their summed duration is a
closed form, `DecodeCost.run_s`). A request routed to a replica in the middle of such a run
interrupts it when it could join the batch; it joins at the end of the iteration in progress.
Request state lives in the deployment's numpy arrays (`Fleet`), the batch in small fixed
arrays: nothing is per token.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import simpy

from clustersim.serving.iteration import IterationModel

if TYPE_CHECKING:
    from clustersim.serving.fleet import Fleet

__all__ = ["DecodeCost", "Replica"]


@dataclass(frozen=True)
class DecodeCost:
    """Decode iterations of a replica: time = base(batch) + kv x context tokens, each
    iteration emitting `tokens_per_iteration` tokens per sequence (more than one with
    speculative decoding) and adding as many to its context."""

    target: IterationModel
    draft: IterationModel | None = None
    proposed: int = 0
    acceptance: float = 0.0

    @property
    def tokens_per_iteration(self) -> float:
        if self.draft is None:
            return 1.0
        a, k = self.acceptance, self.proposed
        return (1.0 - a ** (k + 1)) / (1.0 - a)  # expected accepted + the verifier's own

    @property
    def kv_s(self) -> float:
        kv = self.target.kv_coefficient_s
        if self.draft is not None:
            kv += self.proposed * self.draft.kv_coefficient_s
        return kv

    def base_s(self, batch: int) -> float:
        if self.draft is None:
            return self.target.decode_base_s(batch)
        verify = self.target.iteration_s([], batch * (self.proposed + 1), 0.0)
        return verify + self.proposed * self.draft.decode_base_s(batch)

    def run_s(self, batch: int, context: float, n: float) -> float:
        """Time of the next n iterations of a fixed batch holding `context` KV tokens."""
        g = batch * self.tokens_per_iteration
        return n * self.base_s(batch) + self.kv_s * (n * context + g * n * (n - 1) / 2.0)

    def iterations_within(self, batch: int, context: float, elapsed: float) -> int:
        """Whole iterations finished `elapsed` seconds into a run (inverse of run_s)."""
        a = self.kv_s * batch * self.tokens_per_iteration / 2.0
        b = self.base_s(batch) + self.kv_s * context - a
        if a <= 0:
            return int(elapsed // b)
        j = int((-b + math.sqrt(b * b + 4 * a * elapsed)) / (2 * a))
        while j > 0 and self.run_s(batch, context, j) > elapsed:
            j -= 1
        while self.run_s(batch, context, j + 1) <= elapsed:
            j += 1
        return j

    def prefill_s(self, chunks: list[tuple[int, int]], batch: int, context: float,
                  outputs: int) -> float:
        time_s = self.target.iteration_s(chunks, batch, context, outputs)
        if self.draft is not None:
            time_s += self.draft.iteration_s(chunks, batch, context, outputs)
        return time_s


class Replica:
    """A replica's state and its simpy process. `role` is both, prefill or decode."""

    def __init__(self, fleet: Fleet, index: int, cost: DecodeCost, kv_capacity: int,
                 role: str = "both"):
        self.fleet = fleet
        self.env: simpy.Environment = fleet.env
        self.index = index
        self.cost = cost
        self.role = role
        server = fleet.spec.server
        self.max_batch = server.max_batch
        self.budget = server.max_tokens_per_iteration
        self.chunked = server.chunked_prefill
        self.block = server.kv_block_tokens
        self.queue_policy = server.kv_full == "queue"
        self.kv_capacity = kv_capacity
        self.kv_used = 0.0  # tokens reserved in the KV cache (whole blocks)
        self.queue: deque[int] = deque()
        self.prefilling: list[int] = []  # admitted, prompt not finished (in order)
        cap = self.max_batch
        self.ids = np.zeros(cap, dtype=np.int64)
        self.context = np.zeros(cap, dtype=np.float64)
        self.left = np.zeros(cap, dtype=np.float64)
        self.reserved = np.zeros(cap, dtype=np.float64)
        self.n = 0
        self.up = True
        self.outstanding = 0
        self.outstanding_tokens = 0.0
        self.interruptible = False
        self.idle: simpy.Event | None = None
        self.process = self.env.process(self.run())

    # ------------------------------------------------------------------ routing
    def offer(self, request: int) -> None:
        """A request routed here: queue it and wake the replica if it could take it."""
        self.queue.append(request)
        if self.idle is not None and not self.idle.triggered:
            self.idle.succeed()
        elif self.interruptible and self.n + len(self.prefilling) < self.max_batch:
            self.interruptible = False
            self.process.interrupt("arrival")

    def fail(self) -> list[int]:
        """Take the replica down; return its in-flight requests (queued, prefilling, active)."""
        lost = list(self.queue) + self.prefilling + self.ids[: self.n].tolist()
        self.queue.clear()
        self.prefilling = []
        self.n = 0
        self.kv_used = 0.0
        self.up = False
        self.outstanding = 0
        self.outstanding_tokens = 0.0
        if self.process.is_alive:
            self.process.interrupt("failure")
        return lost

    def restore(self) -> None:
        self.up = True
        self.process = self.env.process(self.run())

    # ------------------------------------------------------------------ the process
    def run(self):  # noqa: C901 - the server loop reads best in one place
        fleet = self.fleet
        env = self.env
        try:
            while True:
                if self.n == 0 and not self.queue and not self.prefilling:
                    self.idle = env.event()
                    fleet.record(self, 0.0)
                    yield self.idle
                    self.idle = None
                chunks = self._schedule_prefill()
                if chunks:
                    context = float(self.context[: self.n].sum())
                    ending = [r for r, c, p, last in chunks if last]
                    duration = self.cost.prefill_s([(c, p) for _, c, p, _ in chunks], self.n,
                                                   context, len(ending))
                    fleet.record(self, duration)
                    yield env.timeout(duration)
                    self._advance(1)
                    for request, c, _, last in chunks:
                        fleet.prefilled[request] += c
                        if last:
                            self.prefilling.remove(request)
                            fleet.first_token(self, request)
                    continue
                if self.n == 0:
                    # Nothing to decode and nothing admissible: wait for a change.
                    self.idle = env.event()
                    fleet.record(self, 0.0)
                    yield self.idle
                    self.idle = None
                    continue
                yield from self._decode_run()
        except simpy.Interrupt as interrupt:
            if interrupt.cause != "failure":
                raise
            return

    def _schedule_prefill(self) -> list[tuple[int, int, int, bool]]:
        """Prompt chunks for the next iteration: (request, tokens, earlier context, last)."""
        if self.role == "decode":
            self._admit_prefilled()
            return []
        fleet = self.fleet
        budget = self.budget - self.n
        chunks = []
        for request in self.prefilling:
            if budget <= 0:
                break
            chunk, done, total = self._chunk(request, budget)
            if chunk:
                chunks.append((request, chunk, done, done + chunk >= total))
                budget -= chunk
        while self.queue and budget > 0 and self.n + len(self.prefilling) < self.max_batch:
            request = self.queue[0]
            need = self._blocks(fleet.prompt_tokens(request) + (
                fleet.remaining(request) if self.queue_policy else 1))
            if self.kv_used + need > self.kv_capacity:
                if self.n == 0 and not self.prefilling and need > self.kv_capacity:
                    self.queue.popleft()
                    fleet.reject(self, request)  # can never fit
                    continue
                break
            chunk, done, total = self._chunk(request, budget)
            if chunk == 0:
                break
            self.queue.popleft()
            self.kv_used += need
            fleet.kv_reserved[request] = need
            self.prefilling.append(request)
            chunks.append((request, chunk, done, done + chunk >= total))
            budget -= chunk
        return chunks

    def _chunk(self, request: int, budget: int) -> tuple[int, int, int]:
        fleet = self.fleet
        total = fleet.prompt_tokens(request)
        done = int(fleet.prefilled[request])
        rest = total - done
        if self.chunked:
            return min(rest, budget), done, total
        if rest <= budget or budget == self.budget - self.n and not self.prefilling:
            return rest, done, total  # a prompt longer than the budget runs alone
        return 0, done, total

    def _admit_prefilled(self) -> None:
        """Decode pool: requests whose KV arrived join the batch while it has room."""
        fleet = self.fleet
        while self.queue and self.n < self.max_batch:
            request = self.queue[0]
            need = self._blocks(fleet.prompt_tokens(request) + (
                fleet.remaining(request) if self.queue_policy else 1))
            if self.kv_used + need > self.kv_capacity:
                break
            self.queue.popleft()
            self.kv_used += need
            fleet.kv_reserved[request] = need
            self.join(request)

    def _blocks(self, tokens: float) -> float:
        return math.ceil(tokens / self.block) * self.block

    def join(self, request: int) -> None:
        """A request with its prompt in the KV cache joins the decode batch."""
        fleet = self.fleet
        i = self.n
        self.ids[i] = request
        self.context[i] = fleet.prompt_tokens(request)  # prompt + tokens generated so far
        self.left[i] = fleet.remaining(request)
        self.reserved[i] = fleet.kv_reserved[request]
        self.n += 1
        if self.left[i] <= 0:
            self._finish()

    def _decode_run(self):
        """Decode in bulk until the next completion, KV limit or an admissible arrival."""
        env = self.env
        n = self.n
        cost = self.cost
        per_iteration = cost.tokens_per_iteration
        context = float(self.context[:n].sum())
        iterations = max(1, math.ceil(float(self.left[:n].min()) / per_iteration - 1e-9))
        if not self.queue_policy:
            room = self.kv_capacity - self.kv_used
            grow = n * per_iteration
            fits = int(room // grow) if grow > 0 else iterations
            if fits < 1:
                self._preempt()
                return
            iterations = min(iterations, fits)
        duration = cost.run_s(n, context, iterations)
        start = env.now
        self.fleet.record(self, duration)
        can_join = n < self.max_batch and self.role != "prefill"
        self.interruptible = can_join
        try:
            yield env.timeout(duration)
            self.interruptible = False
        except simpy.Interrupt as interrupt:
            if interrupt.cause == "failure":
                raise
            done = cost.iterations_within(n, context, env.now - start)
            iterations = min(iterations, done + 1)
            boundary = start + cost.run_s(n, context, iterations)
            self.fleet.record(self, boundary - env.now)
            if boundary > env.now:
                yield env.timeout(boundary - env.now)
        self._advance(iterations)

    def _advance(self, iterations: int) -> None:
        n = self.n
        if n == 0:
            return
        tokens = iterations * self.cost.tokens_per_iteration
        self.context[:n] += tokens
        self.left[:n] -= tokens
        if not self.queue_policy:
            self.kv_used += n * tokens
        if float(self.left[:n].min()) <= 1e-9:
            self._finish()

    def _finish(self) -> None:
        n = self.n
        done = self.left[:n] <= 1e-9
        fleet = self.fleet
        for i in np.flatnonzero(done):
            request = int(self.ids[i])
            freed = self.reserved[i] if self.queue_policy else self._blocks(self.context[i])
            self.kv_used -= freed
            fleet.complete(self, request)
        keep = ~done
        m = int(keep.sum())
        for array in (self.ids, self.context, self.left, self.reserved):
            array[:m] = array[:n][keep]
        self.n = m
        if self.kv_used < 1e-6:
            self.kv_used = 0.0

    def _preempt(self) -> None:
        """KV full (preempt policy): evict the newest sequence; it is recomputed later."""
        i = self.n - 1
        request = int(self.ids[i])
        self.kv_used -= self._blocks(self.context[i])
        self.n -= 1
        self.fleet.preempted(self, request, float(self.left[i]))
        self.queue.appendleft(request)
