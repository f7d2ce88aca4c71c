"""Windowed attention in serving (serving.attention): a windowed layer reads min(context,
window) tokens of KV per sequence at a decode iteration (sliding), or its position in its
chunk (chunked), and the closed forms integrate that exactly."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.scenario.loader import scenario_from_dict
from clustersim.serving import deployment_figures, simulate_serving
from clustersim.serving.attention import window_excess, window_excess_sum, window_pairs
from clustersim.serving.iteration import IterationModel, ReplicaShape
from clustersim.serving.simulate import requests_table
from clustersim.serving.window_batch import WindowedBatch
from clustersim.training.transformer import TransformerShape, model_preset_values

KINDS = st.sampled_from(["sliding", "chunked"])


def _span(window: int, kind: str, context: float) -> float:
    """What a windowed layer reads, from its definition."""
    return min(context, window) if kind == "sliding" else context % window


@settings(max_examples=300, deadline=None)
@given(window=st.integers(1, 300), kind=KINDS, context=st.integers(0, 1000),
       n=st.integers(0, 400), growth=st.sampled_from([1.0, 2.0, 1.5, 0.75]))
def test_excess_sum_is_the_sum_of_the_iterations(window: int, kind: str, context: int,
                                                  n: int, growth: float) -> None:
    brute = sum(window_excess(window, kind, context + growth * t) for t in range(n))
    assert window_excess_sum(window, kind, context, n, growth) == pytest.approx(brute, abs=1e-6)
    for t in range(min(n, 5)):  # reads = context - excess = the span
        c = context + growth * t
        assert c - window_excess(window, kind, c) == pytest.approx(_span(window, kind, c))


@settings(max_examples=300, deadline=None)
@given(window=st.integers(1, 300), kind=KINDS, chunk=st.integers(1, 700),
       context=st.integers(0, 700))
def test_prefill_pairs_count_each_query_s_window(window: int, kind: str, chunk: int,
                                                 context: int) -> None:
    brute = sum(min(q + 1, window) if kind == "sliding" else q % window + 1
                for q in range(context, context + chunk))
    assert window_pairs(window, kind, chunk, context) == brute
    if context == 0 and kind == "sliding":  # a whole prompt: P m - m^2 / 2 (+ m / 2)
        m = min(chunk, window)
        assert brute == chunk * m - m * (m - 1) / 2


@cache
def _model(name: str, window: int | None = -1, kind: str | None = None,
           global_every: int | None = -1, longest: int | None = None) -> IterationModel:
    values = model_preset_values(name)
    if window != -1:
        values["window"] = window
    if kind is not None:
        values["window_kind"] = kind
    if global_every != -1:
        values["global_every"] = global_every
    shape = ReplicaShape(TransformerShape(**values), "bf16", 64, 1, longest_sequence=longest)
    return IterationModel(shape, build_topology(catalog_entry("trn2"), 1))


@settings(max_examples=60, deadline=None)
@given(window=st.sampled_from([1, 16, 128, 1000]), kind=KINDS,
       contexts=st.lists(st.integers(1, 3000), min_size=1, max_size=6),
       n=st.integers(1, 300))
def test_closed_form_decode_run_is_the_sum_of_its_iterations(
        window: int, kind: str, contexts: list[int], n: int) -> None:
    it = _model("gpt-oss-20b", window, kind)
    batch = len(contexts)
    steps = sum(it.iteration_s([], batch, sum(c + t for c in contexts), window_excess=sum(
        window_excess(window, kind, c + t) for c in contexts)) for t in range(n))
    assert it.decode_run_s(contexts, n) == pytest.approx(steps, rel=1e-9)


def test_a_window_no_context_reaches_is_no_window_to_the_bit() -> None:
    plain = _model("gpt-oss-20b", None, None, None, 4000)
    for kind in ("sliding", "chunked"):
        wide = _model("gpt-oss-20b", 4000, kind, -1, 4000)
        for contexts, n in (([1], 1), ([10, 500, 3000], 999), ([3999 - 7], 7)):
            assert wide.decode_run_s(contexts, n) == plain.decode_run_s(contexts, n)
            c = sum(contexts)
            excess = sum(wide.window_excess(x) for x in contexts)
            assert excess == 0.0
            assert wide.iteration_s([(512, 0)], len(contexts), c, 1, window_excess=excess) \
                == plain.iteration_s([(512, 0)], len(contexts), c, 1)
        for prompt in (1, 513, 4000):
            assert wide.prefill_s(prompt) == plain.prefill_s(prompt)
        assert wide.kv_capacity_tokens(0.1) == plain.kv_capacity_tokens(0.1)


@pytest.mark.parametrize("kind", ["sliding", "chunked"])
def test_a_one_token_window_bounds_the_reads(kind: str) -> None:
    """Every layer windowed at one token: a sequence reads one token a layer (sliding) or
    none (chunked: its own token starts a chunk), whatever its context."""
    it = _model("gpt-oss-20b", 1, kind, None)
    per_token = it.kv_coefficient_s  # all layers, one token of context
    for contexts in ([1], [5, 7000], [100_000] * 8):
        reads = it.decode_kv_s(sum(contexts), sum(it.window_excess(c) for c in contexts))
        expected = per_token * len(contexts) if kind == "sliding" else 0.0
        assert reads == pytest.approx(expected, abs=1e-12 * sum(contexts) * per_token)


def test_chunked_reads_average_half_a_chunk() -> None:
    """Past its first chunk a chunked layer reads the position in its chunk: over a whole
    chunk of iterations, half a chunk on average."""
    it = _model("llama4-scout")
    window, kind = it.window
    assert (window, kind) == (8192, "chunked")
    n = 4 * window
    mean_excess = window_excess_sum(window, kind, window, n) / n
    mean_context = window + (n - 1) / 2
    assert mean_context - mean_excess == pytest.approx((window - 1) / 2)


def test_decode_time_is_non_decreasing_in_the_window() -> None:
    contexts = [300, 2000, 9000]
    for kind in ("sliding", "chunked"):
        times = [_model("gpt-oss-20b", w, kind).decode_run_s(contexts, 500)
                 for w in (1, 64, 128, 1024, 4096, 16384)]
        if kind == "sliding":
            assert times == sorted(times)
        plain = _model("gpt-oss-20b", None, None, None).decode_run_s(contexts, 500)
        assert times[-1] <= plain
    # served: TPOT grows with the window and reaches no window's once no request passes it
    tpot = [_served({"base": "gpt-oss-20b", "window": w}, 400)["tpot_p50_s"]
            for w in (16, 128, 512, 2048)]
    plain = _served({"base": "gpt-oss-20b", "window": None, "global_every": None}, 400)
    assert tpot == sorted(tpot) and tpot[0] < tpot[-1]
    assert tpot[-1] == plain["tpot_p50_s"]


def _served(model: dict, output_tokens: int, trace: str | None = None) -> dict:
    workload = ({"arrival": "trace", "trace": trace, "input_tokens": "trace",
                 "output_tokens": "trace"} if trace else
                {"arrival": "poisson", "rate": 2, "input_tokens": 512,
                 "output_tokens": output_tokens})
    raw = {"name": "serve", "duration": "60s", "hardware": "trn2", "cluster": {"instances": 1},
           "serve": [{"name": "chat", "model": model, "parallelism": {"tp": 64},
                      "server": {"max_batch": 16, "max_tokens_per_iteration": 32768},
                      "workload": workload}]}
    scenario = scenario_from_dict(raw)
    result = simulate_serving(scenario, np.random.SeedSequence(0))
    if trace:
        return {"table": requests_table(scenario, result), "cost": result.models["chat"][0]}
    return deployment_figures(scenario, result)["chat"]


@pytest.mark.parametrize("name", ["gpt-oss-20b", "llama4-scout"])
def test_the_simulator_s_decode_runs_are_the_closed_form(tmp_path, name: str) -> None:
    """Requests decoding together past their window (the simulator ends its runs where a
    context reaches the window or a chunk): their decode time is the closed form's, each
    iteration reading min(context, window) or the position in the chunk."""
    window = _model(name).window[0]
    prompts, outputs = [window - 40, window + 3000], [300, 100]
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(
        f"1.0,{p},{o}\n" for p, o in zip(prompts, outputs, strict=True)))
    served = _served(name, 0, str(trace))
    it = served["cost"].target  # the replica's own iteration model
    table = served["table"].to_pydict()
    first, finish = table["first_token_s"], table["finish_s"]
    # both prompts are one prefill iteration, then the two decode together until the
    # shorter ends: its context starts at its prompt and first token
    assert first[0] == first[1]
    contexts = [p + 1 for p in prompts]
    together = it.decode_run_s(contexts, outputs[1] - 1)
    assert finish[1] - first[1] == pytest.approx(together, rel=1e-9)
    alone = it.decode_run_s([contexts[0] + outputs[1] - 1], outputs[0] - outputs[1])
    assert finish[0] - first[0] == pytest.approx(together + alone, rel=1e-9)


def _bounded(context: float, joined: float, clock: list[float], calls: list[int]):
    """A replica's context_of for one sequence, failing (rather than hanging) once it has
    been asked more often than any advance needs."""
    def context_of(_request: int) -> float:
        calls[0] += 1
        assert calls[0] < 50, "WindowedBatch.advance keeps re-entering a crossing"
        return context + clock[0] - joined
    return context_of


@pytest.mark.parametrize("kind", ["sliding", "chunked"])
@pytest.mark.parametrize("acceptance", [0.9, 0.8, 0.6])
def test_a_crossing_at_a_fractional_clock_is_taken_once(kind: str, acceptance: float) -> None:
    """Speculative decoding emits a fractional number of tokens an iteration (1.9 with one
    proposal at 0.9 acceptance), so the replica's token clock is fractional: a run ending
    where a context reaches its window can leave that context a rounding below it. The
    crossing must still be taken once (the sequence then grows its excess from 0, or enters
    its next chunk), not set again at once, which looped forever."""
    tpi = (1.0 - acceptance ** 2) / (1.0 - acceptance)
    window = 128
    for start in (0, 3, 17):
        for context in range(1, window):
            batch = WindowedBatch((window, kind))
            clock = [start * tpi]
            joined = clock[0]
            batch.enter(0, float(context), joined)
            left = batch.iterations_left(clock[0], tpi)
            assert left == math.ceil((window - context) / tpi - 1e-9)
            clock[0] += left * tpi
            calls = [0]
            batch.advance(left * tpi, clock[0], _bounded(context, joined, clock, calls))
            reached = context + clock[0] - joined
            # past the window: its excess is its overshoot, and it grows (sliding); in its
            # next chunk: the first chunk skipped, the next change a chunk on (chunked)
            if kind == "sliding":
                assert batch.past == 1
                assert batch.excess == pytest.approx(max(0.0, reached - window), abs=1e-9)
                assert batch.iterations_left(clock[0], tpi) is None
            else:
                assert batch.past == 0 and batch.excess == window
                assert batch.iterations_left(clock[0], tpi) == math.ceil(
                    (2 * window - reached) / tpi - 1e-9)


def test_speculative_decoding_with_a_window_finishes() -> None:
    """GPT-OSS 120B drafted by GPT-OSS 20B (one proposal, 0.9 accepted: 1.9 tokens an
    iteration), prompts below the 128-token window: every request completes, and the
    served decode is no slower than with the window costed as absent (it skips reads)."""
    import signal

    def expired(*_args: object) -> None:
        raise TimeoutError("the serving simulation did not finish in 60 s")

    def served(model: dict | str) -> dict:
        raw = {"name": "serve", "duration": "60s", "hardware": "trn2",
               "cluster": {"instances": 1},
               "serve": [{"name": "chat", "model": model, "parallelism": {"tp": 64},
                          "speculative": {"draft": "gpt-oss-20b", "tokens": 1,
                                          "acceptance": 0.9},
                          "server": {"max_batch": 16, "max_tokens_per_iteration": 8192},
                          "workload": {"arrival": "poisson", "rate": 2,
                                       "input_tokens": {"distribution": "lognormal",
                                                        "median": 60, "sigma": 0.5,
                                                        "max": 120},
                                       "output_tokens": 300}}]}
        scenario = scenario_from_dict(raw)
        previous = signal.signal(signal.SIGALRM, expired)
        signal.alarm(60)
        try:
            result = simulate_serving(scenario, np.random.SeedSequence(0))
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        assert np.all(result.fleets["chat"].status == 1)
        return deployment_figures(scenario, result)["chat"]

    windowed = served("gpt-oss-120b")
    plain = served({"base": "gpt-oss-120b", "window": None, "global_every": None})
    assert windowed["tpot_p50_s"] <= plain["tpot_p50_s"]
