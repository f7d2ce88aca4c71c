"""The fluid level's TTFT distribution of a replica (clustersim.serving.queueing): how a
prompt waits for its prefill, from the way the replica composes its iterations.

The request level (clustersim.serving.replica) composes an iteration when the one before it
ends, or, in a decode run, when a prompt arrives: the arrival interrupts the run, and the
next iteration, after the one under way, holds the prompts queued at that instant. So:

- **Prompts wait for iterations, not for each other.** The prompts that arrive while an
  iteration runs all ride in the next one (up to its room, `max_tokens_per_iteration` less
  the batch; a longer prompt's chunks go first): a prompt waits for the rest of the
  iteration under way and then shares its own with every prompt that arrived during that
  one, those before it and those after it alike. The prompts ahead of it cost it their
  prefill work, not their own iterations (an M/G/1 queue of prompts counts a decode
  iteration and the context-encoding graph's fixed time per prompt ahead of it).
- **An iteration's time is a function of its prompt tokens**, the body working on all of
  them at once (prefill_s of one chunk of T tokens, from the replica's cost model: the
  fixed time of a prefill iteration paid once, and past the tokens whose activations fit
  on chip a step; the attention per chunk is a small part). Prompts that ride together
  cost less than alone below that step and more across it.
- **Busy runs.** After decoding, the first prefill iteration holds the one prompt that
  interrupted the run; those arriving in the rest of that decode iteration (the
  interrupt composed the iteration already) wait for the next, which also holds those
  arriving during the first; and so on while any arrive (a prompt longer than the room
  taken as one iteration of all its chunks). The iterations' durations come
  from that chain (binned, a few steps: it contracts at lambda E[S] < 1).
- **An arrival** (Poisson: it sees time averages) finds a decode iteration (share of the
  time: decoding runs between busy runs, 1 / (1 - e^(-lambda T_d)) iterations each) or a
  prefill iteration (length-biased). In a prefill iteration: the rest of it (uniform),
  then its own, with the riders of that iteration's whole duration. In a decode
  iteration: if it is the first to arrive in it, the rest of that iteration and its own,
  alone; else also the first one's prefill iteration, and its own with the riders of
  that one.

Its own iterations: n(L) T_d + S(L) (clustersim.serving.queueing), and those arriving
while its earlier chunks run ride in its last. Riders' time, given their tokens and the
prompt's last chunk: P(last + tokens) - P(last), tokens past the room left to the next
iteration. Prompts are taken in up to `_CLASSES` classes by length (the riders' cost
depends on the last chunk they join). A prompt that finds the batch's places full
(QueueModel._slots: a share of arrivals, an exponential wait) is admitted when a sequence
completes, at the end of a decode run, and the replica composes the next iteration at once
with it: its TTFT is that wait and its own iterations, without a wait for an iteration under
way (at 95% utilisation about half the requests, whose TTFT the independent sum made a
prefill wait too long). Everything is convolved in the Fourier domain on one grid, whose
step resolves a decode iteration (at 95% utilisation the grid spans a minute of waiting for
a place) and whose points stand for the times nearest them (sums of many terms unbiased).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["ttft_distribution"]

_BINS = 48  # duration bins of the busy run's prefill iterations (resolution)
_STEPS = 16  # prefill iterations of a busy run followed (it contracts geometrically)
_CLASSES = 8  # classes of prompt lengths for the riders' cost
_GRAIN = 32  # tokens per step of the iteration-time table (the cost model is linear within a tile)
_POINTS = 8192  # time grid, at least
_PER_DECODE = 16  # grid steps per decode iteration, at least (a rest of one is uniform)
_TAIL = 12  # the grid spans this many mean admission waits (beyond: e^-12 of them)


def ttft_distribution(model, p) -> tuple[np.ndarray, np.ndarray]:
    """(time grid, CDF of TTFT on it) of QueueModel `model` at its QueuePoint `p` (stable)."""
    lam, dec = p.rate_per_s, p.decode_s
    b = int(round(p.batch))
    context = p.batch * model.context_per_sequence
    work, count, before = model.chunk_work(p.batch, context, dec)
    own = count * dec + work
    weights = model.weights
    slot = p.slot_wait_mean_s / p.slot_wait_p if p.slot_wait_p > 0 else 0.0
    room = max(model.budget - b, 1)
    tokens = _Tokens(model, b, context, dec, room)

    mean_s = float(np.dot(work, weights))
    busy_mean = (dec + mean_s) / max(1.0 - lam * mean_s, 1e-3)
    top = 1.2 * float(own.max() + 2 * (dec + tokens.time[-1]) + 20 * busy_mean + _TAIL * slot)
    # at 95% utilisation the wait for a place spans a minute while a decode iteration is
    # 20-40 ms: a step of top / 8,192 (28 ms for 70B) put the TTFT p50 up to 13% off
    points = max(_POINTS, 1 << math.ceil(math.log2(top * _PER_DECODE / dec)))
    g = _Grid(top / points, points)

    # the busy run's prefill iterations: the first holds the prompt that interrupted the
    # decode run; those arriving in the rest of that iteration (mean `carry`) wait for the
    # next, which holds them and those arriving during the first, and so on
    first = g.points(dec + work, weights)
    carry = _carried_s(lam, dec)
    first_d, first_w = g.binned(first)
    later = np.zeros(g.n)
    ds, ws, windows = first_d, first_w, first_d + carry
    for _ in range(_STEPS):
        held = sum(w * tokens.arriving(lam * x) for x, w in zip(windows, ws, strict=True))
        held[0] = 0.0  # none arrived: the replica decodes
        step = g.points(dec + tokens.time, held)
        later += step
        ds, ws = g.binned(step)
        windows = ds
        if ws.sum() < 1e-9:
            break
    later_d, later_w = g.binned(later)
    decoding_s = dec / (1.0 - math.exp(-lam * dec))  # decode iterations until an arrival
    cycle = decoding_s + float(np.dot(first_d, first_w)) + float(np.dot(later_d, later_w))
    # An arrival in a prefill iteration of duration x: the rest of it, then its own with
    # the riders of x (and of the carried window after the first iteration of a run).
    found = [(g.uniform(x), w * x / cycle, tokens.arriving(lam * (x + extra)))
             for xs, wts, extra in ((first_d, first_w, carry), (later_d, later_w, 0.0))
             for x, w in zip(xs, wts, strict=True)]
    # In a decode iteration, at x of it: alone when the first to arrive in it, else after
    # the first one's prefill iteration, with the riders of that iteration.
    decoding = decoding_s / cycle
    levels = (np.arange(16) + 0.5) / 16 * dec
    alone = sum(math.exp(-lam * x) * g.point(dec - x) for x in levels) / 16 * decoding
    behind = sum((1 - math.exp(-lam * x)) * g.point(dec - x) for x in levels) / 16 * decoding
    behind = behind * g.cf(first)
    behind_riders = tokens.arriving(lam * (float(np.dot(dec + work, weights)) + carry))
    mass = sum(share for _, share, _ in found) + decoding

    total = np.zeros(g.size // 2 + 1, complex)
    owns = np.zeros(g.size // 2 + 1, complex)  # its own iterations alone
    last_chunk = model.prompts - (count - 1) * room
    for k in np.unique(count):
        index = np.flatnonzero(count == k)
        classes = max(1, round(_CLASSES * len(index) / len(model.prompts)))
        for group in np.array_split(index, min(classes, len(index))):
            w = weights[group]
            share = float(w.sum())
            riders_s = tokens.riders_s(float(np.dot(last_chunk[group], w)) / share)

            def riders(held, riders_s=riders_s):
                return g.cf(g.points(riders_s, held))

            wait = alone + behind * riders(behind_riders)
            for uniform, found_share, held in found:
                wait = wait + found_share * uniform * riders(held)
            mine = g.cf(g.points(own[group], w / share))
            earlier = float(np.dot(before[group], w)) / share
            if earlier > 0:
                mine = mine * riders(tokens.arriving(lam * earlier))
            total += share * mine * wait / mass
            owns += share * mine
    if p.slot_wait_p > 0:
        # A prompt that waited for a place is admitted when a sequence completes, at the
        # end of a decode run: the replica composes the next iteration then, with it (no
        # iteration under way to wait for, no prompt ahead: the batch was full).
        total = (1.0 - p.slot_wait_p) * total + p.slot_wait_p * owns * g.cf(g.exponential(slot))
    out = np.maximum(np.fft.irfft(total, g.size), 0.0)
    head = out[: g.n].copy()
    head[-1] += out[g.n:].sum()
    return (np.arange(g.n) + 0.5) * g.dt, np.cumsum(head)  # a point holds the times nearest it


def _carried_s(lam: float, decode_s: float) -> float:
    """The mean rest of a decode iteration after the first arrival in it (given one):
    the window of the prompts that miss the iteration the first one composed."""
    if lam * decode_s < 1e-9:
        return decode_s / 2.0
    q = 1.0 - math.exp(-lam * decode_s)
    first_s = 1.0 / lam - decode_s * math.exp(-lam * decode_s) / q
    return decode_s - first_s


class _Tokens:
    """A prefill iteration's time from its prompt tokens (on a grid of _GRAIN tokens, up
    to the room), and the tokens of the prompts arriving over a window."""

    def __init__(self, model, batch: int, context: float, decode_s: float, room: int):
        grid = np.minimum(np.arange(0, room + _GRAIN, _GRAIN), room)
        self.time = np.array([model.cost.prefill_s([(int(t), 0)], batch, context, 1)
                              - decode_s if t > 0 else 0.0 for t in grid])
        self.steps = len(grid)
        index = np.round(np.minimum(model.prompts, room) / _GRAIN).astype(int)
        pmf = np.zeros(self.steps)
        np.add.at(pmf, np.minimum(index, self.steps - 1), model.weights)
        self._size = 1 << (8 * self.steps - 1).bit_length()
        self._phi = np.fft.rfft(pmf, self._size)

    def arriving(self, mean_count: float) -> np.ndarray:
        """The tokens (pmf on the grid) of a Poisson number of prompts, capped at the room:
        those past it wait for the next iteration."""
        out = np.maximum(np.fft.irfft(np.exp(mean_count * (self._phi - 1.0)), self._size), 0.0)
        head = out[: self.steps].copy()
        head[-1] += out[self.steps:].sum()
        return head / head.sum()

    def riders_s(self, last_tokens: float) -> np.ndarray:
        """The time riders' tokens add to an iteration holding a prompt's last chunk of
        `last_tokens` (per grid step of their tokens)."""
        start = min(int(round(last_tokens / _GRAIN)), self.steps - 1)
        return np.maximum(self.time[np.minimum(np.arange(self.steps) + start, self.steps - 1)]
                          - self.time[start], 0.0)


class _Grid:
    """A time grid of n steps of `dt` and its Fourier domain (twice as long: sums past the
    grid's end are kept in its last step). A point stands for the times nearest it, so that
    sums of many terms put on the grid stay unbiased (rounding each down lost half a step a
    term: at 95% utilisation, with a coarse step, 10% to 20% of the TTFT p50)."""

    def __init__(self, dt: float, n: int):
        self.dt = dt
        self.n = n
        self.size = 1 << (2 * n - 1).bit_length()
        self._omega = 2j * np.pi * np.arange(self.size // 2 + 1) / self.size
        self._t = np.arange(n) * dt

    def points(self, values, weights) -> np.ndarray:
        out = np.zeros(self.n)
        index = np.minimum(np.rint(np.asarray(values, float) / self.dt).astype(int), self.n - 1)
        np.add.at(out, index, weights)
        return out

    def cf(self, pmf: np.ndarray) -> np.ndarray:
        return np.fft.rfft(pmf, self.size)

    def point(self, x: float) -> np.ndarray:
        return np.exp(-self._omega * round(x / self.dt))

    def uniform(self, x: float) -> np.ndarray:
        """Uniform over [0, x): the end points carry half a step's mass (mean x / 2)."""
        steps = min(max(round(x / self.dt), 1), self.n - 1)
        u = np.zeros(self.n)
        u[: steps + 1] = 1.0 / steps
        u[0] = u[steps] = 0.5 / steps
        return self.cf(u)

    def exponential(self, mean_s: float) -> np.ndarray:
        """The exponential distribution of this mean on the grid."""
        edges = np.exp(-np.maximum(np.arange(self.n + 1) - 0.5, 0.0) * self.dt / mean_s)
        return edges[:-1] - edges[1:]

    def binned(self, pmf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean durations, masses) of the pmf in _BINS equal bins over its support."""
        cdf = np.cumsum(pmf)
        if cdf[-1] <= 0:
            return np.zeros(0), np.zeros(0)
        last = int(np.searchsorted(cdf, cdf[-1] * (1 - 1e-7)))
        edges = np.unique(np.linspace(0, last + 1, _BINS + 1).astype(int))
        mass = np.add.reduceat(pmf[: edges[-1]], edges[:-1])
        mean = np.add.reduceat((pmf * self._t)[: edges[-1]], edges[:-1]) / np.maximum(mass,
                                                                                      1e-300)
        keep = mass > 0
        return mean[keep], mass[keep]
