"""A deployment's fleet: its requests (numpy arrays), replicas, router and failures.

The router is a state machine on simpy events walking the arrival times; a request goes to a replica that
is up, by round robin, least outstanding requests, or least KV tokens held and owed
(`kv_aware`, relative to each replica's KV capacity). With disaggregated serving the router
feeds the prefill pool; a finished prompt's KV cache is sent over the fabric (costed by the
collectives model as a send-recv between the two replicas' chips) to the decode replica with
the fewest outstanding requests. Failures (clustersim.serving.simulate: the training
timeline's hardware failures, and software failures drawn from the rates): a failed replica
drops its in-flight requests, which the router sends elsewhere (their `retries` counted), and
returns after the outage.
"""

from __future__ import annotations

import math
from array import array
from collections import deque

import numpy as np
import simpy
from simpy.events import URGENT

from clustersim.analysis.trace import REQUEST_STATUSES
from clustersim.scenario.serving import DeploymentSpec
from clustersim.serving.events import Wake
from clustersim.serving.replica import Replica
from clustersim.serving.requests import Requests

__all__ = ["Fleet", "STATUS"]

SERIES = ("replica", "start_s", "duration_s", "batch", "kv_tokens")
STATUS = REQUEST_STATUSES  # status codes 0, 1, 2 of the requests table


_DTYPES = {"d": np.float64, "i": np.int32, "h": np.int16, "b": np.int8, "q": np.int64}


def _column(typecode: str, n: int, value: float) -> tuple[array, np.ndarray]:
    """n copies of `value` in a Python array, and a numpy view of it."""
    values = array(typecode, [value]) * n
    dtype = np.dtype(_DTYPES[typecode])
    assert values.itemsize == dtype.itemsize
    return values, np.frombuffer(values, dtype=dtype) if n else np.zeros(0, dtype)


class Fleet:
    """One deployment's simulation state on a shared simpy environment."""

    def __init__(self, env: simpy.Environment, spec: DeploymentSpec, requests: Requests,
                 replicas: list[tuple], transfer_s=None):
        """`replicas`: (DecodeCost, kv capacity tokens, role) per replica; `transfer_s`:
        seconds to move a prompt's KV cache of n tokens to the decode pool (disaggregated)."""
        self.env = env
        self.spec = spec
        n = len(requests)
        self.arrival_s = requests.arrival_s
        self.input_tokens = requests.input_tokens
        self.output_tokens = requests.output_tokens
        self._inputs = requests.input_tokens.tolist()  # plain ints for the hot paths
        self._outputs = requests.output_tokens.tolist()
        # Per-request state: Python arrays (fast to index one element at a time) with numpy
        # views of the same memory (the figures and tables read those).
        self._first, self.first_token_s = _column("d", n, math.nan)
        self._finish, self.finish_s = _column("d", n, math.nan)
        self._replica_of, self.replica_of = _column("i", n, -1)
        self._retries, self.retries = _column("h", n, 0)
        self._status, self.status = _column("b", n, 0)
        self._prefilled, self.prefilled = _column("q", n, 0)
        self._generated, self.generated = _column("q", n, 0)
        self._kv_reserved, self.kv_reserved = _column("d", n, 0.0)
        self.preemptions = 0
        self.failures = 0
        self.settled = 0
        self.transfer_s = transfer_s
        self._round_robin = spec.router == "round_robin"
        self._kv_aware = spec.router == "kv_aware"
        # Batch size and KV occupancy over time: one row per iteration group, the five
        # columns of SERIES interleaved in one flat array.
        self.rows = array("d")
        self.replicas = [Replica(self, i, cost, capacity, role)
                         for i, (cost, capacity, role) in enumerate(replicas)]
        self.entry = np.array([r.index for r in self.replicas if r.role != "decode"])
        self.decode_pool = np.array([r.index for r in self.replicas if r.role == "decode"])
        self._by_load = not self._round_robin and len(self.entry) == len(self.replicas)
        # Router load per replica (outstanding requests, or KV tokens held and owed over the
        # KV capacity); infinite while a replica is down.
        self.load = np.zeros(len(self.replicas))
        self._capacity = np.array([max(1, r.kv_capacity) for r in self.replicas], dtype=float)
        self._next = {"entry": 0, "decode": 0}
        self.pending: deque[int] = deque()
        self.done = env.event()
        if n == 0:
            self.done.succeed()
        # The router walks the arrival times (an urgent start, as a simpy process's).
        self._times = self.arrival_s.tolist()
        self.deferred: list[tuple[Replica, int]] | None = None  # see _arrival_due
        self._cursor = 0
        Wake(env, lambda _: self._arrive_from(0), priority=URGENT)

    # ------------------------------------------------------------------ requests
    def prompt_tokens(self, request: int) -> int:
        """Tokens to prefill: the prompt plus what was generated before a preemption."""
        return self._inputs[request] + self._generated[request]

    def remaining(self, request: int) -> int:
        return self._outputs[request] - self._generated[request]

    def _arrive_from(self, request: int) -> None:
        """Route the requests due now from `request` on; wait for the next one's arrival."""
        env = self.env
        times = self._times
        while request < len(times):
            time_s = times[request]
            if time_s > env.now:
                self._cursor = request
                Wake(env, self._arrival_due, time_s - env.now)
                return
            self.route(request)
            request += 1

    def _arrival_due(self, _wake: Wake) -> None:
        # Interrupts of decode runs by these arrivals are urgent events at this instant: the
        # next ones processed, in order, unless something else is already due now. So they
        # are collected and run at the end of this step, where nothing can come before them.
        self.deferred = []
        self.route(self._cursor)
        self._arrive_from(self._cursor + 1)
        deferred, self.deferred = self.deferred, None
        if not deferred:
            return
        if self.env.peek() > self.env.now:
            for replica, generation in deferred:
                replica.interrupt(generation)
        else:  # other events due now: schedule them, as simpy would have (same order)
            for replica, generation in deferred:
                Wake(self.env, replica._interrupted, priority=URGENT, cause=generation)

    def _choose(self, pool: str) -> Replica | None:
        indices = self.entry if pool == "entry" else self.decode_pool
        if self._round_robin:
            for _ in range(len(indices)):
                self._next[pool] = (self._next[pool] + 1) % len(indices)
                replica = self.replicas[int(indices[self._next[pool] - 1])]
                if replica.up:
                    return replica
            return None
        load = self.load if len(indices) == len(self.replicas) else self.load[indices]
        best = int(load.argmin())
        if load[best] == math.inf:  # every replica down
            return None
        return self.replicas[int(indices[best])]

    def route(self, request: int, pool: str = "entry") -> None:
        if self._by_load and pool == "entry":  # _choose inline: least load over all replicas
            load = self.load
            best = int(load.argmin())
            replica = None if load[best] == math.inf else self.replicas[best]
        else:
            replica = self._choose(pool)
        if replica is None:
            self.pending.append(request)
            return
        self._assign(replica, request)

    def _weight(self, replica: Replica, request: int) -> float:
        if self._kv_aware:
            return (self._inputs[request] + self._outputs[request]) \
                / self._capacity[replica.index]
        return 1.0

    def _assign(self, replica: Replica, request: int) -> None:
        self._replica_of[request] = replica.index
        self.load[replica.index] += self._weight(replica, request)
        replica.offer(request)

    def _release(self, replica: Replica, request: int) -> None:
        self.load[replica.index] -= self._weight(replica, request)

    def first_token(self, replica: Replica, request: int) -> None:
        if math.isnan(self._first[request]):
            self._first[request] = self.env.now
        self._generated[request] += 1
        if replica.role != "prefill":
            replica.join(request)
            return
        # Disaggregated: free the prompt's KV here once sent, decode elsewhere.
        replica.kv_used -= self._kv_reserved[request]
        self._release(replica, request)
        delay = self.transfer_s(self.prompt_tokens(request)) if self.transfer_s else 0.0
        event = self.env.timeout(delay)
        event.callbacks.append(lambda _: self.route(request, "decode"))

    def complete(self, replica: Replica, request: int) -> None:
        self._finish[request] = self.env.now + replica.delay  # at its iteration's end
        self._status[request] = 1
        self._generated[request] = self._outputs[request]
        self.load[replica.index] -= self._weight(replica, request)  # _release
        self.settled += 1  # _settle
        if self.settled == len(self._times) and not self.done.triggered:
            self.done.succeed()

    def reject(self, replica: Replica, request: int) -> None:
        """A request whose KV cache can never fit in a replica."""
        self._status[request] = 2
        self._release(replica, request)
        self._settle()

    def _settle(self) -> None:
        self.settled += 1
        if self.settled == len(self.arrival_s) and not self.done.triggered:
            self.done.succeed()

    def preempted(self, replica: Replica, request: int, left: float) -> None:
        """Evicted for KV room: it will prefill its prompt and output so far again."""
        self.preemptions += 1
        self._generated[request] = self._outputs[request] - int(round(left))
        self._prefilled[request] = 0

    def prefill_again(self, replica: Replica, request: int) -> None:
        """A request preempted on a decode replica: its prompt and output so far are
        prefilled again where requests enter (the prefill pool), once the loop that evicted
        it has returned."""
        self._release(replica, request)
        self.env.timeout(0.0).callbacks.append(lambda _: self.route(request, "entry"))

    # ------------------------------------------------------------------ failures
    def fail(self, index: int, down_s: float) -> None:
        replica = self.replicas[index]
        if not replica.up:
            return
        self.failures += 1
        lost = replica.fail()
        self.load[replica.index] = math.inf
        self.record(replica, down_s, batch=0, kv=0.0)
        for request in lost:
            self._retries[request] += 1
            self._generated[request] = 0
            self._prefilled[request] = 0
            self._first[request] = math.nan
            # Its KV cache is gone with the replica: it starts over where requests enter
            # (the prefill pool when disaggregated), as a retried request does.
            self.route(request, "entry")
        if math.isfinite(down_s):
            self.env.timeout(down_s).callbacks.append(lambda _: self._restore(replica))

    def _restore(self, replica: Replica) -> None:
        replica.restore()
        self.load[replica.index] = 0.0
        while self.pending:
            self.route(self.pending.popleft())

    # ------------------------------------------------------------------ series
    def record(self, replica: Replica, duration_s: float, batch: int | None = None,
               kv: float | None = None, offset: float = 0.0) -> None:
        self.rows.extend((replica.index, self.env.now + offset, duration_s,
                          len(replica.active) + len(replica.prefilling) if batch is None
                          else batch, replica.kv_used if kv is None else kv))

    @property
    def series(self) -> dict[str, np.ndarray]:
        """The recorded rows as columns (SERIES)."""
        flat = np.frombuffer(self.rows, dtype=np.float64).reshape(-1, len(SERIES))
        return {name: flat[:, i] for i, name in enumerate(SERIES)}
