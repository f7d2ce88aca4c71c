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

import heapq
import math
from collections import deque
from typing import TYPE_CHECKING

import simpy

from clustersim.serving.iteration import IterationModel

if TYPE_CHECKING:
    from clustersim.serving.fleet import Fleet

__all__ = ["DecodeCost", "Replica"]


class DecodeCost:
    """Decode iterations of a replica: time = base(batch) + kv x context tokens, each
    iteration emitting `tokens_per_iteration` tokens per sequence (more than one with
    speculative decoding) and adding as many to its context."""

    def __init__(self, target: IterationModel, draft: IterationModel | None = None,
                 proposed: int = 0, acceptance: float = 0.0):
        self.target = target
        self.draft = draft
        self.proposed = proposed
        self.acceptance = acceptance
        if draft is None:
            self.tokens_per_iteration = 1.0
            self.kv_s = target.kv_coefficient_s
        else:  # expected accepted proposals plus the verifier's own token
            a, k = acceptance, proposed
            self.tokens_per_iteration = (1.0 - a ** (k + 1)) / (1.0 - a)
            self.kv_s = target.kv_coefficient_s + k * draft.kv_coefficient_s
        self._base: dict[int, float] = {}

    def base_s(self, batch: int) -> float:
        base = self._base.get(batch)
        if base is None:
            if self.draft is None:
                base = self.target.decode_base_s(batch)
            else:
                base = (self.target.iteration_s([], batch * (self.proposed + 1), 0.0)
                        + self.proposed * self.draft.decode_base_s(batch))
            self._base[batch] = base
        return base

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
        # The decode batch: a token clock (tokens each sequence has emitted since the
        # replica started), each sequence's clock at its end in a heap, its clock and
        # context when it joined; the batch's total context kept as one sum.
        self.clock = 0.0
        self.ends: list[tuple[float, int]] = []
        self.active: dict[int, tuple[float, float]] = {}  # request -> (clock, context) at join
        self.context_sum = 0.0
        self.up = True
        self.interruptible = False
        self.delay = 0.0  # until the iteration in progress ends (after an interrupt)
        self.last_iteration_s = 0.0  # when the last iteration of the decode run starts
        self.idle: simpy.Event | None = None
        self.process = self.env.process(self.run())

    # ------------------------------------------------------------------ routing
    def offer(self, request: int) -> None:
        """A request routed here: queue it and wake the replica if it could take it."""
        self.queue.append(request)
        if self.idle is not None and not self.idle.triggered:
            self.idle.succeed()
        elif (self.interruptible and len(self.active) + len(self.prefilling) < self.max_batch
              and self.env.now < self.last_iteration_s):
            # (in the run's last iteration the run's end is the iteration's end: no need)
            self.interruptible = False
            self.process.interrupt("arrival")

    def fail(self) -> list[int]:
        """Take the replica down; return its in-flight requests (queued, prefilling, active)."""
        lost = list(self.queue) + self.prefilling + list(self.active)
        self.queue.clear()
        self.prefilling = []
        self.active = {}
        self.ends = []
        self.context_sum = 0.0
        self.kv_used = 0.0
        self.up = False
        self.delay = 0.0
        if self.process.is_alive:
            self.process.interrupt("failure")
        return lost

    @property
    def n(self) -> int:
        """Sequences decoding."""
        return len(self.active)

    def restore(self) -> None:
        self.up = True
        self.process = self.env.process(self.run())

    # ------------------------------------------------------------------ the process
    def run(self):  # noqa: C901 - the server loop reads best in one place
        fleet = self.fleet
        env = self.env
        try:
            while True:
                if not self.active and not self.queue and not self.prefilling:
                    yield from self._wait()
                chunks = self._schedule_prefill()
                if chunks:
                    ending = [r for r, c, p, last in chunks if last]
                    duration = self.cost.prefill_s([(c, p) for _, c, p, _ in chunks],
                                                   len(self.active), self.context_sum,
                                                   len(ending))
                    fleet.record(self, duration, offset=self.delay)
                    yield env.timeout(self.delay + duration)
                    self.delay = 0.0
                    self._advance(1)
                    for request, c, _, last in chunks:
                        fleet.prefilled[request] += c
                        if last:
                            self.prefilling.remove(request)
                            fleet.first_token(self, request)
                    continue
                if not self.active:
                    yield from self._wait()  # nothing admissible: wait for a change
                    continue
                yield from self._decode_run()
        except simpy.Interrupt as interrupt:
            if interrupt.cause != "failure":
                raise
            return

    def _wait(self):
        """Sleep until a request is offered (after the iteration in progress ends)."""
        if self.delay:
            yield self.env.timeout(self.delay)
            self.delay = 0.0
            if self.queue:
                return
        self.idle = self.env.event()
        self.fleet.record(self, 0.0)
        yield self.idle
        self.idle = None

    def _schedule_prefill(self) -> list[tuple[int, int, int, bool]]:
        """Prompt chunks for the next iteration: (request, tokens, earlier context, last)."""
        if not self.queue and not self.prefilling:
            return []
        if self.role == "decode":
            self._admit_prefilled()
            return []
        fleet = self.fleet
        budget = self.budget - len(self.active)
        chunks = []
        for request in self.prefilling:
            if budget <= 0:
                break
            chunk, done, total = self._chunk(request, budget)
            if chunk:
                chunks.append((request, chunk, done, done + chunk >= total))
                budget -= chunk
        while self.queue and budget > 0 and len(self.active) + len(self.prefilling) < self.max_batch:
            request = self.queue[0]
            need = self._blocks(fleet.prompt_tokens(request) + (
                fleet.remaining(request) if self.queue_policy else 1))
            if self.kv_used + need > self.kv_capacity:
                if len(self.active) == 0 and not self.prefilling and need > self.kv_capacity:
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
        if rest <= budget or budget == self.budget - len(self.active) and not self.prefilling:
            return rest, done, total  # a prompt longer than the budget runs alone
        return 0, done, total

    def _admit_prefilled(self) -> None:
        """Decode pool: requests whose KV arrived join the batch while it has room."""
        fleet = self.fleet
        while self.queue and len(self.active) < self.max_batch:
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
        context = float(fleet.prompt_tokens(request))  # prompt + tokens generated so far
        left = float(fleet.remaining(request))
        self.active[request] = (self.clock, context)
        self.context_sum += context
        heapq.heappush(self.ends, (self.clock + left, request))
        if left <= 1e-9:
            self._finish()

    def _decode_run(self):
        """Decode in bulk until the next completion, KV limit or an admissible arrival.

        An arrival interrupts the run: the iteration in progress still ends (at `delay`
        from now), and the next iteration, with the newcomer's prompt, starts after it."""
        env = self.env
        n = len(self.active)
        cost = self.cost
        context = self.context_sum
        per_iteration = cost.tokens_per_iteration
        iterations = max(1, math.ceil((self.ends[0][0] - self.clock) / per_iteration - 1e-9))
        if not self.queue_policy:
            room = self.kv_capacity - self.kv_used
            grow = n * per_iteration
            fits = int(room // grow) if grow > 0 else iterations
            if fits < 1:
                self._preempt()
                return
            iterations = min(iterations, fits)
        # cost.run_s inline (this is the hot path): n x base + kv x (n x context + growth).
        base = cost.base_s(n)
        kv_growth = cost.kv_s * n * per_iteration
        duration = iterations * (base + cost.kv_s * context) + kv_growth * iterations * (
            iterations - 1) / 2.0
        start = env.now + self.delay
        self.last_iteration_s = start + duration - (
            base + cost.kv_s * context + kv_growth * (iterations - 1))
        self.fleet.record(self, duration, offset=self.delay)
        self.interruptible = n < self.max_batch and self.role != "prefill"
        try:
            yield env.timeout(self.delay + duration)
            self.interruptible = False
            self.delay = 0.0
        except simpy.Interrupt as interrupt:
            if interrupt.cause == "failure":
                raise
            done = cost.iterations_within(n, context, max(0.0, env.now - start))
            iterations = min(iterations, done + 1)
            self.delay = start + cost.run_s(n, context, iterations) - env.now
        self._advance(iterations)

    def _advance(self, iterations: int) -> None:
        n = len(self.active)
        if n == 0:
            return
        tokens = iterations * self.cost.tokens_per_iteration
        self.clock += tokens
        self.context_sum += n * tokens
        if not self.queue_policy:
            self.kv_used += n * tokens
        if self.ends[0][0] <= self.clock + 1e-9:
            self._finish()

    def _context(self, request: int) -> float:
        joined, context = self.active[request]
        return context + self.clock - joined

    def _finish(self) -> None:
        """Sequences whose last token came: free their KV, report them."""
        fleet = self.fleet
        ends = self.ends
        while ends and ends[0][0] <= self.clock + 1e-9:
            _, request = heapq.heappop(ends)
            if request not in self.active:
                continue  # preempted earlier (a stale heap entry)
            context = self._context(request)
            freed = fleet.kv_reserved[request] if self.queue_policy else self._blocks(context)
            self.kv_used -= freed
            self.context_sum -= context
            del self.active[request]
            fleet.complete(self, request)
        if self.kv_used < 1e-6:
            self.kv_used = 0.0
        if not self.active:
            self.context_sum = 0.0
            self.ends = []

    def _preempt(self) -> None:
        """KV full (preempt policy): evict the newest sequence; it is recomputed later."""
        request = next(reversed(self.active))
        context = self._context(request)
        joined, _ = self.active.pop(request)
        end = next(e for e, r in self.ends if r == request)
        self.kv_used -= self._blocks(context)
        self.context_sum -= context
        self.ends = [(e, r) for e, r in self.ends if r != request]
        heapq.heapify(self.ends)
        self.fleet.preempted(self, request, end - self.clock)
        self.queue.appendleft(request)
