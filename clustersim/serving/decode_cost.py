"""The cost of a replica's iterations as the simulator advances them: decode runs in closed
form (`DecodeCost.run_s`) and prefill iterations through the stack's compiled buckets."""

from __future__ import annotations

import math

from clustersim.hardware.stacks import padded_kv_tokens, padded_tokens
from clustersim.serving.attention import window_excess
from clustersim.serving.iteration import IterationModel

__all__ = ["DecodeCost"]


class DecodeCost:
    """Decode iterations of a replica: time = base(batch) + kv x context tokens - window x
    excess tokens (those of the context the windowed layers do not read), each iteration
    emitting `tokens_per_iteration` tokens per sequence (more than one with speculative
    decoding) and adding as many to its context. Between two changes of the batch, the
    excess grows by `tokens_per_iteration` an iteration for each of the `past` sequences
    past a sliding window and stays for the others (below their window, or inside a chunk):
    the replica ends a decode run where a context reaches its window or its next chunk.

    With a draft, an iteration is the draft's `proposed` steps, each on the draft's own
    shapes (its layers, precision and tensor-parallel group), then the target verifying the
    proposals and its own token in one pass over `proposed + 1` tokens per sequence. Fused
    (NxD Inference's fused speculation) the draft runs inside the target's graph: one host
    overhead per iteration; unfused each draft step is a launch with its own."""

    def __init__(self, target: IterationModel, draft: IterationModel | None = None,
                 proposed: int = 0, acceptance: float = 0.0, fused: bool = True):
        self.target = target
        self.draft = draft
        self.proposed = proposed
        self.acceptance = acceptance
        self.fused = fused
        # The window's tokens and kind (the target's), and the seconds per excess token.
        self.window = target.window
        self.window_s = target.window_coefficient_s
        if draft is None:
            self.tokens_per_iteration = 1.0
            self.kv_s = target.kv_coefficient_s
        else:  # expected accepted proposals plus the verifier's own token
            a, k = acceptance, proposed
            self.tokens_per_iteration = (1.0 - a ** (k + 1)) / (1.0 - a)
            self.kv_s = target.kv_coefficient_s + k * draft.kv_coefficient_s
            # a draft windowed as the target is reads its window too; a draft with another
            # window is costed as reading its whole context (an upper bound)
            if draft.window is not None and draft.window == self.window:
                self.window_s += k * draft.window_coefficient_s
        self._base: dict[int, float] = {}
        # Compiled context-encoding buckets: a prompt encoded whole runs padded (set by the
        # deployment, clustersim.hardware.stacks; () pads nothing).
        self.buckets: tuple[int, ...] = ()
        self.static_batch = False  # the prompts of an iteration are one static batch
        # Compiled token-generation buckets: decode reads the KV cache padded to the one
        # holding its position (transformers-neuronx; () reads the tokens held).
        self.token_buckets: tuple[int, ...] = ()
        # Lines every decode iteration runs (the compiled batch, idle lines included:
        # optimum-neuron's static graph); 0 runs the batch's own.
        self.decode_lines = 0

    def _draft_step_s(self, batch: int) -> float:
        assert self.draft is not None
        return self.draft.step_s(batch) if self.fused else self.draft.decode_base_s(batch)

    def base_s(self, batch: int) -> float:
        base = self._base.get(batch)
        if base is None:
            if self.draft is None:
                base = self.target.decode_base_s(batch)
            else:
                base = (self.target.iteration_s([], batch * (self.proposed + 1), 0.0)
                        + self.proposed * self._draft_step_s(batch))
            self._base[batch] = base
        return base

    def run_s(self, batch: int, context: float, n: float, excess: float = 0.0,
              past: int = 0) -> float:
        """Time of the next n iterations of a fixed batch holding `context` KV tokens,
        `excess` of them unread by the windowed layers, `past` sequences past a sliding
        window (their excess grows with their context)."""
        if self.decode_lines > batch:  # idle lines: their work, and reads as long as ours
            return (n * self.base_s(self.decode_lines)
                    + self.decode_lines / batch * self._kv_run_s(batch, context, n, excess, past))
        return n * self.base_s(batch) + self._kv_run_s(batch, context, n, excess, past)

    def _kv_run_s(self, batch: int, context: float, n: float, excess: float = 0.0,
                  past: int = 0) -> float:
        """The KV reads of n iterations of the batch's own sequences (with compiled
        token-generation buckets the windowed layers read their bucket less the excess)."""
        tpi = self.tokens_per_iteration
        if self.token_buckets:
            time_s = self.kv_s * padded_kv_tokens(self.token_buckets, batch, context, tpi, int(n))
        else:
            g = batch * tpi
            time_s = self.kv_s * (n * context + g * n * (n - 1) / 2.0)
        if excess or past:
            time_s -= self.window_s * (n * excess + past * tpi * n * (n - 1) / 2.0)
        return time_s

    def excess(self, context: float) -> float:
        """Tokens of a sequence's `context` the windowed layers do not read."""
        return 0.0 if self.window is None else window_excess(*self.window, context)

    def kv_read_s(self, batch: float, context: float) -> float:
        """One iteration's KV reads of `batch` sequences holding `context` tokens in all,
        each taken to hold context / batch (the analytic models' mean sequence)."""
        time_s = self.kv_s * context
        if self.window is not None and batch > 0:
            time_s -= self.window_s * batch * self.excess(context / batch)
        return time_s

    def least_excess(self, context: float) -> float:
        """The most of a sequence's `context` its windowed layers may skip once it holds at
        least that many tokens (a lower bound's): the excess on a sliding window, which
        grows with the context; all of it on chunked layers, whose span restarts at each
        chunk."""
        if self.window is None:
            return 0.0
        window, kind = self.window
        return window_excess(window, kind, context) if kind == "sliding" else context

    def iterations_within(self, batch: int, context: float, elapsed: float,
                          excess: float = 0.0, past: int = 0) -> int:
        """Whole iterations finished `elapsed` seconds into a run (inverse of run_s)."""
        if self.token_buckets or self.decode_lines > batch:  # bisection on the run's time
            low, high = 0, 1 + int(elapsed / max(self.base_s(batch), 1e-12))
            while low < high:
                middle = (low + high + 1) // 2
                low, high = (middle, high) \
                    if self.run_s(batch, context, middle, excess, past) <= elapsed \
                    else (low, middle - 1)
            return low
        if excess or past:
            return self._windowed_within(batch, context, elapsed, excess, past)
        kv = self.kv_s
        a = kv * batch * self.tokens_per_iteration / 2.0
        base = self.base_s(batch)
        b = base + kv * context - a
        if a <= 0:
            return int(elapsed // b)
        j = int((-b + math.sqrt(b * b + 4 * a * elapsed)) / (2 * a))
        g = batch * self.tokens_per_iteration
        # run_s(batch, context, j) inline (an interrupted decode run is a hot path)
        while j > 0 and j * base + kv * (j * context + g * j * (j - 1) / 2.0) > elapsed:
            j -= 1
        k = j + 1
        while k * base + kv * (k * context + g * k * (k - 1) / 2.0) <= elapsed:
            k += 1
        return k - 1

    def _windowed_within(self, batch: int, context: float, elapsed: float, excess: float,
                         past: int) -> int:
        """iterations_within for a batch with window excess: the same quadratic, its first
        iteration's reads less the excess and their growth less the `past` sequences'."""
        base = self.base_s(batch)

        def run_s(k: int) -> float:
            return k * base + self._kv_run_s(batch, context, k, excess, past)

        tpi = self.tokens_per_iteration
        a = (self.kv_s * batch - self.window_s * past) * tpi / 2.0
        b = base + self.kv_s * context - self.window_s * excess - a
        j = int(elapsed // b) if a <= 0 else int(
            (-b + math.sqrt(max(0.0, b * b + 4 * a * elapsed))) / (2 * a))
        while j > 0 and run_s(j) > elapsed:
            j -= 1
        k = j + 1
        while run_s(k) <= elapsed:
            k += 1
        return k - 1

    def prefill_s(self, chunks: list[tuple[int, int]], batch: int, context: float,
                  outputs: int, excess: float = 0.0) -> float:
        """An iteration of prompt chunks (tokens, earlier context) riding with `batch`
        decoding sequences holding `context` tokens, `excess` of them unread by the windowed
        layers; `outputs` of the chunks end their prompt."""
        if self.buckets:
            chunks = [(padded_tokens(c, self.buckets) if p == 0 else c, p) for c, p in chunks]
        time_s = self.target.iteration_s(chunks, batch, context, outputs, self.static_batch,
                                         excess)
        if self.draft is not None:  # the draft fills its own KV cache from the prompt
            time_s += self.draft.iteration_s(
                chunks, batch, context, outputs,
                window_excess=excess if self.draft.window == self.window else 0.0)
            if self.fused:  # one graph: one host overhead, one context-encoding overhead
                # (the draft's layers keep their per-layer share: they run in the graph)
                time_s -= self.draft.overhead_s + (
                    self.draft.hardware.serving.prefill_overhead_s if chunks else 0.0)
        return time_s
