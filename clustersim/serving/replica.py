"""One serving replica, a state machine on simpy events: continuous batching, chunked prefill, a paged KV
cache, and decode iterations advanced in bulk between events.

The batch changes only when a prompt is being prefilled, a request joins or one finishes, so
between those events the replica computes how many decode iterations remain until the next
completion (or until the KV cache fills) and advances them at once (their summed duration is a
closed form, `DecodeCost.run_s`; a run also ends where a sequence's context reaches its
window, or its next chunk, so that within a run the tokens the windowed layers skip grow
linearly). A request routed to a replica in the middle of such a run
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
from simpy.events import URGENT

from clustersim.serving.decode_cost import DecodeCost
from clustersim.serving.events import Wake
from clustersim.serving.window_batch import WindowedBatch

if TYPE_CHECKING:
    from clustersim.serving.fleet import Fleet

__all__ = ["DecodeCost", "Replica"]


_IDLE = object()  # the wake target while a replica sleeps until a request is offered
# What the replica does when the event it waits for comes (the generator's resume points).
_PREFILL, _DECODE, _DELAY_TOP, _DELAY_MID, _IDLE_TOP, _IDLE_MID = range(6)


class Replica:
    """A replica's state and its server loop. `role` is both, prefill or decode.

    The loop is a state machine driven by `Wake` events: `_proceed` runs it until it must
    wait (a prefill iteration, a decode run, the end of an interrupted iteration or the next
    request), and `_resume` continues from there. An arrival that can join a decode run
    interrupts it (an urgent event at once, as simpy's Interruption); a failure ends the loop,
    and `restore` starts a new one (an urgent event, as a new process's Initialize)."""

    def __init__(self, fleet: Fleet, index: int, cost: DecodeCost, kv_capacity: int,
                 role: str = "both"):
        self.fleet = fleet
        self.env: simpy.Environment = fleet.env
        self.index = index
        self.cost = cost
        self.role = role
        self._joins = role != "prefill"  # arrivals may join its decode batch
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
        # the tokens of those contexts the windowed layers skip (serving.window_batch)
        self.windows = WindowedBatch(cost.window) if cost.window is not None else None
        self.up = True
        self.interruptible = False
        self.delay = 0.0  # until the iteration in progress ends (after an interrupt)
        self.last_iteration_s = 0.0  # when the last iteration of the decode run starts
        # The loop: alive (a generation per start), the event it waits for, what follows.
        self._generation = 0
        self._alive = False
        self._target: object = None
        self._state = _IDLE_TOP
        self._idle = 0  # 0 no idle event, 1 sleeping until an offer, 2 offered (woken)
        self._chunks: list[tuple[int, int, int, bool]] = []
        # n, context, iterations, start, excess, past
        self._run: tuple[int, float, int, float, float, int] = (0, 0.0, 0, 0.0, 0.0, 0)
        self._rows = fleet.rows
        self._start()

    def _start(self) -> None:
        self._generation += 1
        self._alive = True
        self._target = None
        Wake(self.env, self._begin, priority=URGENT, cause=self._generation)

    # ------------------------------------------------------------------ routing
    def offer(self, request: int) -> None:
        """A request routed here: queue it and wake the replica if it could take it."""
        self.queue.append(request)
        if self._idle == 1:
            self._idle = 2
            wake = Wake(self.env, self._resume)
            if self._target is _IDLE:
                self._target = wake
        elif (self.interruptible and len(self.active) + len(self.prefilling) < self.max_batch
              and self.env.now < self.last_iteration_s):
            # (in the run's last iteration the run's end is the iteration's end: no need)
            self.interruptible = False
            if self.fleet.deferred is not None:  # the router's step runs it at its end
                self.fleet.deferred.append((self, self._generation))
            else:
                Wake(self.env, self._interrupted, priority=URGENT, cause=self._generation)

    def fail(self) -> list[int]:
        """Take the replica down; return its in-flight requests (queued, prefilling, active)."""
        lost = list(self.queue) + self.prefilling + list(self.active)
        self.queue.clear()
        self.prefilling = []
        self.active = {}
        self.ends = []
        self.context_sum = 0.0
        if self.windows is not None:
            self.windows.clear()
        self.kv_used = 0.0
        self.up = False
        self.delay = 0.0
        self.interruptible = False  # no arrival may interrupt a loop that is ending
        if self._alive:
            Wake(self.env, self._stopped, priority=URGENT, cause=self._generation)
        return lost

    @property
    def n(self) -> int:
        """Sequences decoding."""
        return len(self.active)

    def restore(self) -> None:
        self.up = True
        self._start()

    # ------------------------------------------------------------------ the loop
    def _begin(self, wake: Wake) -> None:
        if wake.cause == self._generation and self._alive:
            self._proceed(True)

    def _stopped(self, wake: Wake) -> None:
        """The failure reaches the loop: it ends (what it waited for is ignored)."""
        if wake.cause == self._generation and self._alive:
            self._alive = False
            self._target = None

    def _proceed(self, check: bool) -> None:
        """Run the server loop until it waits for an event (`check`: look whether there is
        anything to do first, as at the top of the loop)."""
        while True:
            if check and not self.active and not self.queue and not self.prefilling:
                self._wait(_DELAY_TOP)
                return
            check = True
            chunks = self._schedule_prefill() if self.queue or self.prefilling else None
            if chunks:
                ending = 0
                pairs = []
                for _, c, p, last in chunks:
                    pairs.append((c, p))
                    ending += last
                duration = self.cost.prefill_s(pairs, len(self.active), self.context_sum,
                                               ending, self._excess())
                self._record(duration)
                self._chunks = chunks
                self._state = _PREFILL
                self._target = Wake(self.env, self._resume, self.delay + duration)
                return
            if not self.active:
                self._wait(_DELAY_MID)  # nothing admissible: wait for a change
                return
            if self._decode_run():
                return

    def _resume(self, wake: Wake) -> None:
        """The event the loop waited for came: continue where it stopped."""
        if wake is not self._target:
            return  # interrupted or ended since
        self._target = None
        state = self._state
        if state == _DECODE:
            self.interruptible = False
            self.delay = 0.0
            self._advance(self._run[2])
            self._proceed(True)
        elif state == _PREFILL:
            self.delay = 0.0
            self._advance(1)
            fleet = self.fleet
            for request, c, _, last in self._chunks:
                fleet._prefilled[request] += c
                if last:
                    self.prefilling.remove(request)
                    fleet.first_token(self, request)
            self._proceed(True)
        elif state in (_DELAY_TOP, _DELAY_MID):
            self.delay = 0.0
            if self.queue:
                self._proceed(state == _DELAY_MID)
            else:
                self._sleep(_IDLE_TOP if state == _DELAY_TOP else _IDLE_MID)
        else:
            self._idle = 0
            self._proceed(state == _IDLE_MID)

    def _wait(self, state: int) -> None:
        """Sleep until a request is offered (after the iteration in progress ends)."""
        if self.delay:
            self._state = state
            self._target = Wake(self.env, self._resume, self.delay)
            return
        self._sleep(_IDLE_TOP if state == _DELAY_TOP else _IDLE_MID)

    def _record(self, duration_s: float) -> None:
        """A row of the replica series (Fleet.record inline: one per iteration group)."""
        self._rows.extend((self.index, self.env.now + self.delay, duration_s,
                           len(self.active) + len(self.prefilling), self.kv_used))

    def _sleep(self, state: int) -> None:
        self._idle = 1
        self.fleet.record(self, 0.0)
        self._state = state
        self._target = _IDLE

    def _schedule_prefill(self) -> list[tuple[int, int, int, bool]]:
        """Prompt chunks for the next iteration: (request, tokens, earlier context, last)."""
        if not self.queue and not self.prefilling:
            return []
        if self.role == "decode":
            self._admit_prefilled()
            return []
        fleet = self.fleet
        decoding = len(self.active)
        budget = self.budget - decoding
        chunks = []
        prefilling = self.prefilling
        for request in prefilling:
            if budget <= 0:
                break
            chunk, done, total = self._chunk(request, budget)
            if chunk:
                chunks.append((request, chunk, done, done + chunk >= total))
                budget -= chunk
        queue = self.queue
        inputs, outputs, generated = fleet._inputs, fleet._outputs, fleet._generated
        block = self.block
        while queue and budget > 0 and decoding + len(prefilling) < self.max_batch:
            request = queue[0]
            made = generated[request]
            # _blocks(prompt tokens + (remaining or 1)), inline
            need = math.ceil((inputs[request] + made + (
                outputs[request] - made if self.queue_policy else 1)) / block) * block
            if self.kv_used + need > self.kv_capacity:
                if decoding == 0 and not prefilling and need > self.kv_capacity:
                    queue.popleft()
                    fleet.reject(self, request)  # can never fit
                    continue
                break
            chunk, done, total = self._chunk(request, budget)
            if chunk == 0:
                break
            queue.popleft()
            self.kv_used += need
            fleet._kv_reserved[request] = need
            prefilling.append(request)
            chunks.append((request, chunk, done, done + chunk >= total))
            budget -= chunk
        return chunks

    def _chunk(self, request: int, budget: int) -> tuple[int, int, int]:
        fleet = self.fleet
        total = fleet._inputs[request] + fleet._generated[request]  # prompt_tokens
        done = fleet._prefilled[request]
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
            fleet._kv_reserved[request] = need
            self.join(request)

    def _blocks(self, tokens: float) -> float:
        return math.ceil(tokens / self.block) * self.block

    def join(self, request: int) -> None:
        """A request with its prompt in the KV cache joins the decode batch."""
        fleet = self.fleet
        generated = fleet._generated[request]
        context = float(fleet._inputs[request] + generated)  # prompt + tokens so far
        left = float(fleet._outputs[request] - generated)
        self.active[request] = (self.clock, context)
        self.context_sum += context
        if self.windows is not None:
            self.windows.enter(request, context, self.clock)
        heapq.heappush(self.ends, (self.clock + left, request))
        if left <= 1e-9:
            self._finish()

    def _decode_run(self) -> bool:
        """Decode in bulk until the next completion, KV limit or an admissible arrival;
        False when the KV cache is full instead (a sequence preempted, no run started).

        An arrival interrupts the run: the iteration in progress still ends (at `delay`
        from now), and the next iteration, with the newcomer's prompt, starts after it."""
        n = len(self.active)
        cost = self.cost
        context = self.context_sum
        per_iteration = cost.tokens_per_iteration
        iterations = math.ceil((self.ends[0][0] - self.clock) / per_iteration - 1e-9)
        if iterations < 1:
            iterations = 1
        if not self.queue_policy:
            room = self.kv_capacity - self.kv_used
            grow = n * per_iteration
            fits = int(room // grow) if grow > 0 else iterations
            if fits < 1:
                self._preempt()
                return False
            iterations = min(iterations, fits)
        excess, past = 0.0, 0
        if self.windows is not None:  # the run ends where a context reaches its window
            windows = self.windows  # (or its next chunk)
            excess, past = windows.excess, windows.past
            left = windows.iterations_left(self.clock, per_iteration)
            if left is not None:
                iterations = min(iterations, left)
        # cost.run_s inline (this is the hot path): n x base + kv x (n x context + growth).
        base = cost._base.get(n)
        if base is None:
            base = cost.base_s(n)
        kv = cost.kv_s
        kv_growth = kv * n * per_iteration
        first = base + kv * context  # the run's first iteration
        if excess or past:  # less what the windowed layers skip
            first -= cost.window_s * excess
            kv_growth -= cost.window_s * past * per_iteration
        duration = iterations * first + kv_growth * iterations * (iterations - 1) / 2.0
        last = first + kv_growth * (iterations - 1)
        if cost.token_buckets or cost.decode_lines > n:  # padded reads or idle lines
            duration = cost.run_s(n, context, iterations, excess, past)
            last = duration - cost.run_s(n, context, iterations - 1, excess, past)
        delay = self.delay
        start = self.env.now + delay
        self.last_iteration_s = start + duration - last
        self._rows.extend((self.index, start, duration, n + len(self.prefilling),
                           self.kv_used))  # _record inline
        self.interruptible = n < self.max_batch and self._joins
        self._run = (n, context, iterations, start, excess, past)
        self._state = _DECODE
        self._target = Wake(self.env, self._resume, delay + duration)
        return True

    def _interrupted(self, wake: Wake) -> None:
        self.interrupt(wake.cause)

    def interrupt(self, generation: int) -> None:
        """An arrival stops the decode run after the iteration in progress (what simpy's
        Interruption of the loop's `generation` did, as an urgent event at once)."""
        if generation != self._generation or not self._alive:
            return
        if self._state != _DECODE or self._target is None:
            raise RuntimeError(f"replica {self.index}: an arrival interrupted no decode run")
        self._target = None
        n, context, iterations, start, excess, past = self._run
        cost = self.cost
        done = cost.iterations_within(n, context, max(0.0, self.env.now - start), excess, past)
        iterations = min(iterations, done + 1)
        self.delay = start + cost.run_s(n, context, iterations, excess, past) - self.env.now
        self._advance(iterations)
        self._proceed(True)

    def _advance(self, iterations: int) -> None:
        n = len(self.active)
        if n == 0:
            return
        tokens = iterations * self.cost.tokens_per_iteration
        self.clock += tokens
        self.context_sum += n * tokens
        if self.windows is not None:
            self.windows.advance(tokens, self.clock, self._context)
        if not self.queue_policy:
            self.kv_used += n * tokens
        if self.ends[0][0] <= self.clock + 1e-9:
            self._finish()

    def _excess(self) -> float:
        return self.windows.excess if self.windows is not None else 0.0

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
            freed = fleet._kv_reserved[request] if self.queue_policy else self._blocks(context)
            self.kv_used -= freed
            self.context_sum -= context
            if self.windows is not None:
                self.windows.leave(request, context)
            del self.active[request]
            fleet.complete(self, request)
        if self.kv_used < 1e-6:
            self.kv_used = 0.0
        if not self.active:
            self.context_sum = 0.0
            self.ends = []
            if self.windows is not None:
                self.windows.clear()

    def _preempt(self) -> None:
        """KV full (preempt policy): evict the newest sequence; it is recomputed later."""
        request = next(reversed(self.active))
        context = self._context(request)
        joined, _ = self.active.pop(request)
        end = next(e for e, r in self.ends if r == request)
        self.kv_used -= self._blocks(context)
        self.context_sum -= context
        if self.windows is not None:
            self.windows.leave(request, context)
        self.ends = [(e, r) for e, r in self.ends if r != request]
        heapq.heapify(self.ends)
        self.fleet.preempted(self, request, end - self.clock)
        if self.role == "decode":
            # Its KV cache is gone and a decode replica prefills nothing: taken back into
            # its own queue it rejoined at once without the recompute, evicted again by the
            # same full cache, and the loop never advanced the clock (a hang).
            self.fleet.prefill_again(self, request)
        else:
            self.queue.appendleft(request)

