"""The windowed layers' side of a replica's decode batch: the tokens of the sequences'
contexts those layers do not read (serving.attention.window_excess), kept as one sum as the
replica keeps its contexts, and the token clocks at which a sequence's excess changes how it
grows, where the replica ends its decode runs (so that within a run the excess grows
linearly: by the sequences past a sliding window, one token each an iteration's token).

A sequence below a sliding window skips nothing until its context reaches the window, then
grows its excess with its context; on a chunked layer its excess is the earlier chunks'
tokens, a constant until its context reaches the next chunk.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from clustersim.serving.attention import window_excess

__all__ = ["WindowedBatch"]


class WindowedBatch:
    """`excess`: the batch's skipped tokens at the replica's clock; `past`: the sequences
    whose excess grows with their context."""

    def __init__(self, window: tuple[int, str]):
        self.window, self.kind = window
        self.excess = 0.0
        self.past = 0
        # request -> (grows, clock of its next change or None, its excess at its last change)
        self._state: dict[int, tuple[int, float | None, float]] = {}
        self.crossings: list[tuple[float, int]] = []  # (clock of the change, request)

    def enter(self, request: int, context: float, clock: float) -> None:
        """A sequence holding `context` tokens at `clock` joins (or changes its way)."""
        window = self.window
        excess = window_excess(window, self.kind, context)
        grows = int(self.kind == "sliding" and context >= window)
        if self.kind == "sliding":
            change = None if grows else clock + (window - context)
        else:  # its next chunk
            change = clock + ((math.floor(context / window) + 1) * window - context)
        self.excess += excess
        self.past += grows
        self._state[request] = (grows, change, excess)
        if change is not None:
            heapq.heappush(self.crossings, (change, request))

    def leave(self, request: int, context: float) -> None:
        """A sequence holding `context` tokens leaves."""
        grows, _, excess = self._state.pop(request)
        self.excess -= window_excess(self.window, self.kind, context) if grows else excess
        self.past -= grows

    def clear(self) -> None:
        self.excess = 0.0
        self.past = 0
        self._state = {}
        self.crossings = []

    def advance(self, tokens: float, clock: float,
                context_of: Callable[[int], float]) -> None:
        """Every sequence emitted `tokens` tokens, to `clock`: those that reached their
        window or next chunk enter again."""
        self.excess += self.past * tokens
        while (change := self._next_change()) is not None and change <= clock + 1e-9:
            _, request = heapq.heappop(self.crossings)
            # It reached the level its change was set for (the window, or its next chunk)
            # even where a fractional clock (speculative decoding) rounds its context a
            # hair below: taken as below, it would set a change at once, again and again.
            _, _, excess = self._state[request]
            level = self.window if self.kind == "sliding" else excess + self.window
            context = context_of(request)
            self.leave(request, context)
            self.enter(request, max(context, level), clock)

    def iterations_left(self, clock: float, per_iteration: float) -> int | None:
        """Iterations (at least one) until a sequence's excess changes its way; None: none
        will."""
        change = self._next_change()
        if change is None:
            return None
        return max(1, math.ceil((change - clock) / per_iteration - 1e-9))

    def _next_change(self) -> float | None:
        """The next clock of a change (entries of sequences gone or changed since dropped)."""
        crossings, state = self.crossings, self._state
        while crossings:
            change, request = crossings[0]
            entry = state.get(request)
            if entry is not None and entry[1] == change:
                return change
            heapq.heappop(crossings)
        return None
