"""A replica's latency against load from a queueing model of its iterations: the fluid
level's TTFT and TPOT without a request-level run per load.

A replica runs iterations back to back. Each decodes one token of every sequence in its
batch; prompts waiting are prefilled first, packed into the next iteration up to the token
budget (`max_tokens_per_iteration` less the decoding sequences), a prompt longer than that
chunked over several (clustersim.serving.replica). From the replica's own iteration model
(clustersim.serving.iteration, DecodeCost), at arrival rate lambda per replica:

- **Decode.** A decode iteration of B sequences holding C KV tokens takes T_d(B, C). A prompt
  of L tokens adds S(L) to the iterations it rides in (its chunks' work over the decode
  iteration's), and n(L) = ceil(L / room) iterations. Per second the replica spends
  lambda E[S] prefilling, so iterations come every T_d / (1 - lambda E[S]): the time per
  output token. The batch is B = lambda x output tokens x TPOT (Little's law), and C its
  prompts and its outputs so far, length-biased (a sequence is met in proportion to how
  long it stays: E[out^2] / (2 E[out]) of its outputs): a fixed point, solved by iteration.
- **Prefill queue (M/G/1), in the mean.** A prompt waits for the work of the prompts
  ahead. Its work is S(L) plus the decode iterations it needs (n(L) of them when alone;
  L / budget when packed with others, as at load): Q(L). With rho = lambda E[Q], the mean
  wait is lambda E[Q^2] / (2 (1 - rho)) (QueuePoint.wait_mean_s, and rho < 1 its
  stability); the TTFT's distribution does not take prompts as served one after another
  (below).
- **Batch admission.** A prompt is admitted only while the batch has a place (`max_batch`
  = c of them): a birth-death chain over the requests in the replica. Below c it completes
  at n over their outputs x TPOT(n) with n sequences decoding (a small batch decodes faster
  than a full one), tempered above its mode by DISPERSION (bursts of prompts slow every
  sequence at once and push the batch up, not down). With the batch full (admission_chain's
  `full`, QueueModel.full_states) every entry brings a prefill during which nothing
  completes (the prompt that took the last place, or the one a completion admitted), so the
  occupancy steps up at c; past it the levels fall at the queue's own rate: while requests
  queue for a place each completion admits one, so prompts come at the completion rate and
  the full batch completes at the replica's saturated rate, and the queue drains at that
  rate less the arrivals, spread by the Allen-Cunneen factor of a request's time in a full
  batch (saturated_cv2: the outputs', the prefill each completion admits, the context that
  prompt holds while it stays). An arrival finding the places full waits an exponential
  time of that mean. The saturated rate is the one figure taken from the request level when
  given (`capacity_per_s`, measured by clustersim.serving.curves; the chain's rates are
  scaled to it): at 95% the queue drains at a twentieth of it, so 1% moves the wait by a
  fifth.
- **TTFT**: the prompt's prefill wait from the way the replica composes its iterations
  (clustersim.serving.queueing_ttft: a prompt waits for the rest of the iteration under
  way, not for the prompts ahead, which ride in its own iteration with those arriving after
  it; an iteration's time is that of its prompt tokens together, its fixed time paid once;
  an arrival that interrupts a decode run composes the next iteration at once, so those
  arriving in the rest of that decode iteration wait for one more) + its own iterations,
  n(L) T_d + S(L), with the prompts that ride in its last (those arriving while its
  earlier chunks run, timed chunk by chunk: a prompt a little past an iteration's room
  spends nearly all its time in its full chunks, its last chunk only the rest) + the
  admission wait: a distribution convolved on a grid, over the prompt lengths'
  distribution (a quadrature of 64 slices, refined in the top 10% and 1% where the TTFT
  p99 comes from); a prompt that waited for a place instead goes straight into the iteration
  composed when a sequence completes (the admission wait and its own iterations).

Two constants with meaning, not fitted per case: `PACKING`, how far the decode iterations a
prompt needs go from n(L) (alone) to L / budget (packed) as the queue builds (the mean
prefill wait and its stability only), and
`DISPERSION`, how much more the batch's occupancy varies upward than the chain's. Checked against
the request level over load, prompt spread and model size (clustersim.serving.queueing_grid,
tests/test_fluid_queue.py): CHECKED.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from clustersim.scenario.serving import DeploymentSpec, LengthSpec
from clustersim.serving.queueing_ttft import ttft_distribution

__all__ = ["QueueModel", "QueuePoint", "length_quadrature", "erlang_c", "admission_chain",
           "PACKING", "DISPERSION", "CHECKED", "checked", "checked_text"]

PACKING = 1.0  # share of packing reached at rho = 1 (0: every prompt alone)
# The batch's occupancy varies more than a chain whose completion rates follow its size
# alone (admission_chain): the iteration time also moves with the prompt work arriving
# (QueueModel.dispersion, from the prompts' lengths) and with the contexts in the batch,
# which the chain averages: DISPERSION. Read off the request level's admissions (the value
# at which the model's share of arrivals waiting for a place is the request level's: 1.37 to
# 1.52 at 85% over 8B and 70B, prompt sigma 0 to 1.2, tests/test_fluid_queue.py, which also
# checks the share waiting and their mean wait within 10% at 85% and 95%). It sets how often
# an arrival finds the batch full, not how fast the queue then drains. Tempering the chain
# below its mode too (as it did until the full batch's states had their step) put the share
# waiting at 95% 8% to 18% low.
DISPERSION = 1.45
# Where the model is checked against the request level within 10% on TTFT p50 and p99 and
# TPOT p50 (clustersim.serving.queueing_grid, tests/test_fluid_queue.py: utilisation 10-95%
# of a replica's saturated capacity, prompt sigma 0-1.2, Llama 3.1 8B and 70B on trn2):
# (largest prompt sigma, highest utilisation) pairs; docs/fleet-day.md has the grid's
# figures. At 95% about half the requests wait for a place and the TTFT p50 lies between
# those admitted at once and those waiting: it moves threefold with a tenth more or less of
# them waiting, so the share waiting decides it (the full batch's states, full_states).
CHECKED = ((1.2, 0.95),)
_QUADRATURE = 64


def length_quadrature(spec: LengthSpec, points: int = _QUADRATURE) -> tuple[np.ndarray,
                                                                            np.ndarray]:
    """(token counts, weights) standing for a length distribution: its quantiles at the
    middles of slices of its probability, clipped and rounded as the request level draws.
    Half the `points` slice [0, 0.9] evenly, a quarter [0.9, 0.99] and a quarter the top 1%:
    the TTFT p99 is the longest prompts' (and those past `max`, all at `max`, may take one
    more iteration), which one slice of 1/points would stand for with a single length."""
    if spec.distribution == "fixed":
        return np.array([float(spec.value)]), np.array([1.0])
    if spec.distribution != "lognormal":
        raise ValueError("the queueing model needs fixed or lognormal lengths")
    half, quarter = points // 2, points // 4
    edges = np.concatenate((np.linspace(0.0, 0.9, half + 1),
                            np.linspace(0.9, 0.99, quarter + 1)[1:],
                            np.linspace(0.99, 1.0, quarter + 1)[1:]))
    levels = (edges[:-1] + edges[1:]) / 2.0
    # The standard library's normal quantile: scipy is not a dependency of the package.
    normal_quantiles = np.array([NormalDist().inv_cdf(float(level)) for level in levels])
    tokens = spec.median * np.exp(spec.sigma * normal_quantiles)
    tokens = np.clip(np.round(tokens), spec.min, spec.max)
    return tokens, np.diff(edges)


def checked_text() -> str:
    """CHECKED in words: "prompt sigma up to 0.8 to 85% utilisation, up to 1.2 to 50%"."""
    parts = [f"{'up to ' if sigma else ''}{sigma:g} to {top:.0%}" for sigma, top in CHECKED]
    return f"prompt sigma {parts[0]} utilisation" + "".join(f", {p}" for p in parts[1:])


def checked(utilisation: float, prompt_sigma: float) -> bool:
    """Whether the model was checked at this utilisation and prompt spread (CHECKED)."""
    return any(prompt_sigma <= sigma + 1e-12 and utilisation <= top + 1e-12
               for sigma, top in CHECKED)


def erlang_c(servers: int, offered: float) -> float:
    """Erlang C: the probability that an arrival waits in an M/M/c queue of `servers`
    servers offered `offered` Erlangs (< servers), by the stable Erlang B recursion."""
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    rho = offered / servers
    return b / (1.0 - rho + rho * b)


@dataclass(frozen=True)
class QueuePoint:
    """The model at one arrival rate per replica."""

    rate_per_s: float
    batch: float  # decoding sequences, mean
    decode_s: float  # one decode iteration
    tpot_s: float  # mean time per output token
    rho: float  # the prefill queue's utilisation (>= 1: it grows without bound)
    wait_mean_s: float
    ttft_mean_s: float
    slot_occupancy: float = 0.0  # the batch's places held (>= 1: admission queue grows)
    slot_wait_p: float = 0.0
    slot_wait_mean_s: float = 0.0

    @property
    def stable(self) -> bool:
        return self.rho < 1.0 and self.slot_occupancy < 1.0


class QueueModel:
    """The queueing model of one replica of a deployment (module docstring)."""

    def __init__(self, cost, d: DeploymentSpec, capacity_per_s: float | None = None):
        """`capacity_per_s`: the replica's saturated completion rate as the request level
        measures it (replica_curve's all-at-once rate); None: the model's own."""
        self.cost = cost
        self.budget = d.server.max_tokens_per_iteration
        self.max_batch = d.server.max_batch
        self.prompts, self.weights = length_quadrature(d.workload.input_tokens)
        outputs, out_w = length_quadrature(d.workload.output_tokens)
        self.output_mean = float(np.dot(outputs, out_w))
        self.output_cv2 = float(np.dot(outputs**2, out_w)) / self.output_mean**2 - 1.0
        self._rates: dict[float, np.ndarray] = {}
        self._full_work: tuple[float, float] | None = None
        self._full_work_per_prompt = np.zeros(0)  # S per quadrature prompt, full batch
        self._distributions: dict[float, tuple[np.ndarray, np.ndarray] | None] = {}
        self.prompt_mean = float(np.dot(self.prompts, self.weights))
        # A sequence in the batch is met in proportion to how long it stays there (its
        # outputs): its expected context is its prompt plus E[out^2] / (2 E[out]), the
        # length-biased half of its outputs, not E[out] / 2 (longer with spread outputs).
        self.context_per_sequence = self.prompt_mean + self.output_mean * (
            1.0 + self.output_cv2) / 2.0
        own = self._own_saturated_per_s()
        self.saturated_per_s = float(capacity_per_s) if capacity_per_s else own
        self._rate_scale = self.saturated_per_s / own

    # ----------------------------------------------------------------------- iterations
    def _decode_s(self, batch: float, context: float) -> float:
        low = max(int(math.floor(batch)), 1)
        high = low + 1
        w = min(max(batch - low, 0.0), 1.0)
        base = (1 - w) * self.cost.base_s(low) + w * self.cost.base_s(high)
        return base + self.cost.kv_read_s(batch, context)

    def _prefill_work(self, batch: float, context: float, decode_s: float
                      ) -> tuple[np.ndarray, np.ndarray]:
        """(S(L), n(L)) per quadrature prompt: the time its chunks add to the iterations
        they ride in, and how many iterations they take."""
        extra, count, _ = self.chunk_work(batch, context, decode_s)
        return extra, count

    def chunk_work(self, batch: float, context: float, decode_s: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(S(L), n(L), E(L)) per quadrature prompt: S and n as _prefill_work, and E the
        time of its iterations before its last (each chunk's iteration: its prefill work
        and the decode iteration it rides in). A prompt longer than an iteration's room
        (`budget` less the batch) fills full chunks and leaves the rest to its last one, so
        its earlier chunks take nearly all its time when it is a little past the room, not
        (n - 1) / n of it: E is the window in which the prompts that ride in its last
        iteration arrive, after its wait."""
        room = max(self.budget - int(round(batch)), 1)
        b = max(int(round(batch)), 0)
        extra, count, earlier = [], [], []
        for tokens in self.prompts.tolist():
            tokens = int(tokens)
            done, added, before, n = 0, 0.0, 0.0, 0
            while done < tokens:
                chunk = min(room, tokens - done)
                last = done + chunk >= tokens
                iteration = self.cost.prefill_s([(chunk, done)], b, context, int(last))
                added += iteration - decode_s
                if not last:
                    before += iteration
                done += chunk
                n += 1
            extra.append(max(added, 0.0))
            count.append(n)
            earlier.append(before)
        return np.array(extra), np.array(count, dtype=float), np.array(earlier)

    def point(self, rate_per_s: float) -> QueuePoint:
        """The steady state at `rate_per_s` arrivals per second on this replica."""
        lam = float(rate_per_s)
        batch = 1.0
        for _ in range(40):
            context = batch * self.context_per_sequence
            decode = self._decode_s(batch, context)
            work, _ = self._prefill_work(batch, context, decode)
            busy = lam * float(np.dot(work, self.weights))
            tpot = decode / max(1.0 - busy, 1e-6)
            new = min(max(lam * self.output_mean * tpot, 1.0), float(self.max_batch))
            if abs(new - batch) < 1e-3 * batch:
                batch = new
                break
            batch = 0.5 * (batch + new)
        context = batch * self.context_per_sequence
        decode = self._decode_s(batch, context)
        work, count = self._prefill_work(batch, context, decode)
        busy = lam * float(np.dot(work, self.weights))
        tpot = decode / max(1.0 - busy, 1e-6)
        queue, rho = self._queue_work(lam, work, count, decode)
        wait = (lam * float(np.dot(queue**2, self.weights)) / (2.0 * (1.0 - rho))
                if rho < 1 else math.inf)
        slot_p, slot_wait, slot_rho = self._slots(lam)
        own = count * decode + work
        ttft = decode / 2.0 + wait + slot_wait + float(np.dot(own, self.weights))
        return QueuePoint(lam, batch, decode, tpot, rho, wait, ttft, slot_rho, slot_p,
                          slot_wait)

    def _slots(self, lam: float) -> tuple[float, float, float]:
        """Batch admission: (probability of waiting, mean wait, occupancy of the saturated
        rate) from the chain over the requests in the replica (admission_chain: below
        max_batch n over their outputs x TPOT at that batch, _tpot_at; the full batch's
        states from full_states). The share of arrivals admitted at once sets the prompt
        work's part of the dispersion (those that wait come in at completions, whose spread
        the Allen-Cunneen factor holds): a fixed point. The wait of those that wait: the
        queue drains at the saturated rate less the arrivals (not the chain's full-batch
        rate at lambda, which counts lambda's prefill), times the Allen-Cunneen factor."""
        rates = self._completion_rates(lam)
        occupancy = lam / self.saturated_per_s
        if occupancy >= 1.0 or lam >= float(rates[-1]):
            return 1.0, math.inf, occupancy
        factor = (1.0 + self.saturated_cv2()) / 2.0  # Poisson arrivals: their cv^2 is 1
        full = self.full_states(lam, rates, factor)
        p_wait = 0.0
        for _ in range(60):
            new, _ = admission_chain(lam, rates, self.dispersion(lam, 1.0 - p_wait), full)
            if abs(new - p_wait) < 1e-7:
                break
            p_wait = 0.5 * (p_wait + new)
        return p_wait, p_wait * factor / (self.saturated_per_s - lam), occupancy

    def full_states(self, lam: float, rates: np.ndarray, factor: float) -> float:
        """The mass of the states with the batch full over that with one place free. A
        full batch's state has two phases: a prefill under way (nothing completes; it ends
        at 1 / E[S], S a prompt's prefill work in a full batch's iterations) or decoding
        (sequences complete at mu, the full batch's rate without prefill: rates[-1] over
        1 - lambda E[S]). Every entry into the full batch brings a prefill (the arrival
        that took the last place), and so does every completion while requests wait (it
        admits one); arrivals leave the phase as it is. A quasi-birth-death process over
        the levels n >= c: pi_(c+k) = pi_c R^k, R the minimal solution of A0 + R A1 +
        R^2 A2 = 0 and pi_c from the flux lambda pi_(c-1) into it (the request level's
        occupancy is 1.19 to 1.29 times as high at c as at c - 1 at 95%; the chain's, the
        full batch's completions at its mean rate, fell there). Its levels fall at its own
        rate eta, the spectral radius of R; the request level's at the queue's, (lambda /
        saturated rate) ** (1 / factor), factor the Allen-Cunneen one (within 7% at 95%):
        R is scaled by their ratio (the chain's geometric tail, tempered, made the queue
        behind a full batch 1.6 to 2.2 times the request level's)."""
        mean, _ = self._full_batch_work()
        mu = float(rates[-1]) / max(1.0 - lam * mean, 1e-6)
        up = lam * np.eye(2)  # phases: a prefill under way, decoding
        local = np.array([[-(lam + 1.0 / mean), 1.0 / mean], [0.0, -(lam + mu)]])
        down = np.array([[0.0, 0.0], [mu, 0.0]])  # a completion admits one: a prefill
        inverse = np.linalg.inv(local)
        r = np.zeros((2, 2))
        for _ in range(100_000):
            new = -(up + r @ r @ down) @ inverse
            if np.abs(new - r).max() < 1e-14:
                break
            r = new
        r = new
        pi_c = np.linalg.solve((local + r @ down).T, np.array([-lam, 0.0]))
        eta = float(max(abs(np.linalg.eigvals(r))))
        tail = (lam / self.saturated_per_s) ** (1.0 / factor)
        return float((pi_c @ np.linalg.inv(np.eye(2) - r * (tail / eta))).sum())

    def saturated_cv2(self) -> float:
        """cv^2 of the completions of a full batch over a long time (the queue for a place
        drains by them: the Allen-Cunneen factor's service term). In tokens the batch's
        places complete as renewal processes of its outputs, cv^2(out); in time each
        completion admits a prompt of L tokens that costs the replica U: its prefill work S,
        and, while it stays (its outputs), its context beyond the batch's mean read by every
        decode iteration, kv (L - E[L]) out. So Var(U) = Var(S) + kv^2 E[out^2] Var(L) +
        2 kv E[out] Cov(S, L), and with the replica's time a share p prefill, (1 - p)^2
        cv^2(out) + rate^2 Var(U), rate the saturated one (without the context, p^2
        cv^2(S)): a burst of completions admits as many prompts, which slow every sequence,
        and a batch holding long prompts decodes slower for as long as they stay (a fifth
        to a third of the figure with prompt sigma 1.2)."""
        mean, square = self._full_batch_work()
        share = min(self.saturated_per_s * mean, 1.0)
        work = self._full_work_per_prompt
        prompts = self.prompts - self.prompt_mean
        kv_s = self.cost.kv_s
        variance = (square - mean**2
                    + kv_s**2 * self.output_mean**2 * (1.0 + self.output_cv2)
                    * float(np.dot(prompts**2, self.weights))
                    + 2.0 * kv_s * self.output_mean * float(np.dot(work * prompts, self.weights)))
        return (1.0 - share) ** 2 * self.output_cv2 + self.saturated_per_s**2 * variance

    def _full_batch_work(self) -> tuple[float, float]:
        """E[S] and E[S^2], S the prefill work a prompt adds to a full batch's iterations."""
        if self._full_work is None:
            batch = float(self.max_batch)
            context = batch * self.context_per_sequence
            work, _ = self._prefill_work(batch, context, self._decode_s(batch, context))
            self._full_work_per_prompt = work
            self._full_work = (float(np.dot(work, self.weights)),
                               float(np.dot(work**2, self.weights)))
        return self._full_work

    def dispersion(self, lam: float, admitted: float = 1.0) -> float:
        """How much more the batch's occupancy varies than the chain's: DISPERSION (the
        contexts in the batch) times 1 + a lambda^2 E[S^2] / (1 - lambda E[S])^2, S the
        prefill work a prompt adds to a full batch's iterations and a the share of arrivals
        `admitted` at once. Over a sequence's life the prefill share moves with the prompts
        that arrive, every sequence slowed together: with m sequences held for T, the
        share's variance lambda E[S^2] / T, relative to (1 - share)^2, times m^2 =
        (lambda T)^2 adds that term to the batch's variance over its mean; the prompts
        admitted at completions come as evenly as those (saturated_cv2)."""
        mean, square = self._full_batch_work()
        return DISPERSION * (1.0 + admitted * lam**2 * square
                             / (1.0 - min(lam * mean, 0.99)) ** 2)

    def _completion_rates(self, lam: float) -> np.ndarray:
        """Requests completed per second with n = 1..max_batch sequences decoding, at `lam`
        prompts per second (the prefill share of the replica's time slows them all), scaled
        so that the model's saturated rate is `saturated_per_s`."""
        found = self._rates.get(lam)
        if found is None:
            found = self._rates[lam] = self._rate_scale * self._own_rates(lam)
        return found

    def _own_rates(self, lam: float) -> np.ndarray:
        n = np.arange(1, self.max_batch + 1, dtype=float)
        # TPOT at a few batch sizes, linear between (it is smooth in the batch)
        knots = np.unique(np.round(np.geomspace(1, self.max_batch, 12)))
        tpot = np.interp(n, knots, [self._tpot_at(lam, float(b)) for b in knots])
        return n / (self.output_mean * tpot)

    def _own_saturated_per_s(self) -> float:
        """The model's saturated rate: the full batch's completion rate when prompts arrive
        as fast as it completes (its prefill share at that rate), by bisection."""
        low, high = 1e-6, 1.0
        while float(self._own_rates(high)[-1]) > high:
            low, high = high, 2.0 * high
        for _ in range(60):
            middle = (low + high) / 2.0
            if float(self._own_rates(middle)[-1]) > middle:
                low = middle
            else:
                high = middle
        return (low + high) / 2.0

    def _tpot_at(self, lam: float, batch: float) -> float:
        context = batch * self.context_per_sequence
        decode = self._decode_s(batch, context)
        work, _ = self._prefill_work(batch, context, decode)
        busy = lam * float(np.dot(work, self.weights))
        return decode / max(1.0 - busy, 1e-6)

    def _queue_work(self, lam: float, work: np.ndarray, count: np.ndarray, decode: float
                    ) -> tuple[np.ndarray, float]:
        """Q(L), the replica time a prompt ahead costs a waiting one, and rho = lambda E[Q]:
        packing moves its decode iterations from n(L) toward L / budget as rho grows."""
        room = max(self.budget - 1, 1)
        packed = self.prompts / room
        alone = work + count * decode
        rho = lam * float(np.dot(alone, self.weights))
        for _ in range(30):
            share = PACKING * min(rho, 1.0)
            queue = work + decode * ((1 - share) * count + share * packed)
            new = lam * float(np.dot(queue, self.weights))
            if abs(new - rho) < 1e-9:
                break
            rho = new
        return queue, rho

    # ----------------------------------------------------------------------- quantiles
    def _distribution(self, rate_per_s: float) -> tuple[np.ndarray, np.ndarray] | None:
        """(time grid, CDF of TTFT on it); None when a queue is unstable: the prefill wait
        from the way the replica composes its iterations, the prompt's own iterations and
        the batch admission's wait (clustersim.serving.queueing_ttft). Kept per rate."""
        found = self._distributions.get(rate_per_s)
        if found is None:
            p = self.point(rate_per_s)
            found = ttft_distribution(self, p) if p.stable else None
            self._distributions[rate_per_s] = found
        return found

    def ttft_quantiles(self, rate_per_s: float, levels: np.ndarray) -> np.ndarray:
        """TTFT at quantile `levels` (inf when a queue is unstable)."""
        found = self._distribution(rate_per_s)
        if found is None:
            return np.full(len(levels), math.inf)
        t, cdf = found
        return np.interp(levels, cdf, t)

    def attainment(self, rate_per_s: float, ttft_slo_s: float) -> float:
        """Share of requests whose TTFT is within the bound: continuous, from the model's
        distribution (no quantile grid, no cap)."""
        found = self._distribution(rate_per_s)
        if found is None:
            return 0.0
        t, cdf = found
        return float(np.interp(ttft_slo_s, t, cdf, left=0.0, right=float(cdf[-1])))


def admission_chain(lam: float, rates: np.ndarray, dispersion: float = 1.0,
                    full: float | None = None) -> tuple[float, float]:
    """A birth-death chain over the requests in a replica: arrivals at `lam`, completions at
    rates[n - 1] with n <= c = len(rates) sequences in the batch and rates[-1] beyond (the
    rest wait for a place). Returns (the probability that an arrival waits, the rate at
    which the queue ahead of it drains: its wait, given it waits, is exponential of this
    rate, first-come first-served). (1, inf) when the chain is unstable. With rates n mu and
    `dispersion` 1 it is M/M/c: the probability is Erlang C. `dispersion` D tempers the
    chain above its mode, pi_n / pi_mode to the power 1 / D: D times its variance there
    (module docstring, DISPERSION). `full`: the mass of the states n >= c over pi_(c-1)
    (QueueModel.full_states); None: the chain's, a geometric tail of ratio (lambda /
    rates[-1]) ** (1 / D)."""
    top = float(rates[-1])
    if lam >= top:
        return 1.0, math.inf
    # pi_n / pi_0 = prod lam / rates_k, in logs (c may be in the hundreds)
    log_pi = np.concatenate(([0.0], np.cumsum(np.log(lam / np.asarray(rates, float)))))
    mode = int(np.argmax(log_pi[:-1]))
    log_pi[mode:] = log_pi[mode] + (log_pi[mode:] - log_pi[mode]) / dispersion
    pi = np.exp(log_pi - log_pi.max())
    if full is None:
        waiting = pi[-1] / (1.0 - (lam / top) ** (1.0 / dispersion))  # n >= c: geometric
    else:
        waiting = pi[-2] * full
    total = float(pi[:-1].sum()) + waiting
    return waiting / total, top - lam
