"""Session 17, helper fix17a2: the busiest expert group at small batches, MLA prefill under a
sliding window, and messages a new user met (plan flags on a serving scenario, the
weights-fit error, MX weights with fp8 activations, fluid disaggregation, models' MLA dims)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_helpers import invoke, refused, write

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.serving.experts import expected_busiest_group, expected_distinct_experts
from clustersim.serving.iteration import IterationModel, ReplicaShape
from clustersim.training.transformer import TransformerShape, model_preset_values


def _monte_carlo_busiest(experts: int, top_k: int, groups: int, tokens: int, samples: int,
                         active: int | None = None, seed: int = 0) -> list[tuple[float, float]]:
    """(mean, standard error) of the busiest group's reached experts after 1..`tokens`
    tokens, each choosing `top_k` distinct experts uniformly among `active` of them (a hot
    set drawn uniformly per sample; every expert when None)."""
    rng = np.random.default_rng(seed)
    active = active or experts
    rows = np.arange(samples)[:, None]
    hot = np.argsort(rng.random((samples, experts)), axis=1)[:, :active]
    reached = np.zeros((samples, experts), dtype=bool)
    out = []
    for _ in range(tokens):
        pick = np.argpartition(rng.random((samples, active)), top_k - 1, axis=1)[:, :top_k]
        reached[rows, hot[rows, pick]] = True
        busiest = reached.reshape(samples, groups, experts // groups).sum(axis=2).max(axis=1)
        out.append((float(busiest.mean()), float(busiest.std() / np.sqrt(samples))))
    return out


@pytest.mark.parametrize(("experts", "top_k", "groups", "skew"), [
    (16, 1, 2, 0.0), (16, 2, 4, 0.0), (64, 1, 8, 0.0), (64, 2, 8, 0.0), (64, 8, 4, 0.0),
    (128, 1, 16, 0.0), (256, 8, 8, 0.0), (256, 2, 16, 0.0), (64, 2, 8, 0.5)])
def test_busiest_expert_group_matches_a_monte_carlo(experts: int, top_k: int, groups: int,
                                                     skew: float) -> None:
    """The busiest of the ep groups' reached experts was the maximum of independent
    binomials (p = D/E): 0.66 for one token's top-1 over 16 groups, where the one reached
    expert sits in some group (1.0). Against a Monte Carlo (fixed seed, 2,000 samples) at
    batches 1..64: within 4 standard errors + 0.005. The skew row's routing is on a hot half
    of the experts, drawn per sample."""
    active = round(experts * (1 - skew))
    mc = _monte_carlo_busiest(experts, top_k, groups, 64, 2000, active)
    for tokens, (mean, se) in enumerate(mc, start=1):
        got = expected_busiest_group(experts, top_k, tokens, groups, skew)
        assert abs(got - mean) <= 4 * se + 0.005, (tokens, got, mean, se)


def test_busiest_group_at_batch_1_holds_a_whole_expert_and_saturates() -> None:
    """docs/serving.md: at batch 1 some group holds a whole reached expert; once every
    expert is reached each group holds all of its own; one group is D itself."""
    assert expected_busiest_group(128, 1, 1, 16) == pytest.approx(1.0, abs=1e-9)
    assert expected_busiest_group(16, 1, 1, 2) == pytest.approx(1.0, abs=1e-9)
    assert expected_busiest_group(256, 8, 100_000, 8) == pytest.approx(32.0, abs=1e-6)
    assert expected_busiest_group(256, 8, 20, 1) == expected_distinct_experts(256, 8, 20)
    # the groups together hold D: the busiest at least D / groups
    for tokens in (1, 3, 17, 300):
        assert expected_busiest_group(256, 8, tokens, 8) >= \
            expected_distinct_experts(256, 8, tokens) / 8 - 1e-9


def _iteration(model: dict) -> IterationModel:
    values = {**model_preset_values("deepseek-v3"), **model}
    shape = ReplicaShape(TransformerShape(**values), "fp8", 64, 1, ep=64)
    return IterationModel(shape, build_topology(catalog_entry("trn2"), 1))


@pytest.mark.parametrize("kind", ["sliding", "chunked"])
def test_mla_prefill_attention_uses_the_window(kind: str) -> None:
    """MLA with a window: serving's prefill returned MLA's attention over the whole prompt
    before looking at the window (TTFT 4.74 s with and without a 128-token window on
    DeepSeek-V3 at 60,000 tokens; decode used it). A windowed layer's prompt scores only
    its window's keys: a window no prompt reaches changes nothing (to the bit), a short one
    cuts the prefill, and windowing half the layers (global_every 2: 31 of 61) saves 31/61
    of windowing all of them."""
    plain = _iteration({})
    wide = _iteration({"window": 100_000, "window_kind": kind})
    every = _iteration({"window": 128, "window_kind": kind})
    half = _iteration({"window": 128, "window_kind": kind, "global_every": 2})
    for prompt in (1, 4096, 60_000):
        assert wide.prefill_s(prompt) == plain.prefill_s(prompt)
    for chunk, context in ((60_000, 0), (8192, 30_000), (512, 2000)):
        base = plain.iteration_s([(chunk, context)], 0, 0.0, 1)
        whole = every.iteration_s([(chunk, context)], 0, 0.0, 1)
        some = half.iteration_s([(chunk, context)], 0, 0.0, 1)
        assert whole < some < base
        assert base - some == pytest.approx((base - whole) * 31 / 61, rel=1e-9)


_SERVING = {"name": "serving-plan", "duration": "2min", "hardware": "trn2",
            "cluster": {"instances": 1},
            "serve": [{"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 8},
                       "workload": {"rate": "2/s", "input_tokens": 512, "output_tokens": 64},
                       "slo": {"ttft": "1s", "tpot": "50ms"}}]}


@pytest.mark.parametrize("flags", [["--model", "deepseek-v3"], ["--seq-len", "4096"],
                                   ["--global-batch", "64"], ["--global-batch", "4M"]])
def test_plan_training_flags_on_a_serving_scenario_say_so(tmp_path: Path,
                                                          flags: list[str]) -> None:
    """--model, --seq-len and --global-batch became jobs.0.* overrides before the planner
    knew the scenario served: "--set 'jobs.0.model=...': no list item '0'". They are
    training options, as --chips and --objective already said."""
    out = tmp_path / "plan"
    result = invoke("plan", write(tmp_path, _SERVING), *flags, "-o", out)
    refused(result, f"{flags[0]}: training options; a serving plan takes")
    assert "jobs.0" not in result.output and not out.exists()


def _window_server(server: dict) -> dict:
    return {"name": "fit", "duration": "2min", "hardware": "trn2", "cluster": {"instances": 1},
            "serve": [{"name": "d", "model": "trinity-large", "precision": "fp8",
                       "parallelism": {"tp": 64, "ep": 8}, "server": server,
                       "workload": {"rate": "1/s", "input_tokens": 8000,
                                    "output_tokens": 200}}]}


def test_the_fit_refusal_names_kv_reserve_when_the_reserve_is_the_cause(tmp_path: Path) -> None:
    """kv_reserve 0.999 on qwen3-8b (7.63 GiB a chip of 96) said "the weights do not fit
    ... expected more tp or pp, fp8 weights, or a smaller model". It names kv_reserve and
    the largest that leaves room for the shortest request (3,024 tokens; one block's room,
    0.92, was then refused by the request check): 0.918, which validates."""
    raw = {"name": "fit", "duration": "2min", "hardware": "trn2", "cluster": {"instances": 1},
           "serve": [{"name": "d", "model": "qwen3-8b", "parallelism": {"tp": 8},
                      "server": {"kv_reserve": 0.999},
                      "workload": {"rate": "1/s", "input_tokens": 3000, "output_tokens": 10}}]}
    result = invoke("validate", write(tmp_path, raw))
    refused(result, "serve.0.server.kv_reserve = 0.999", "expected server.kv_reserve at most 0.918")
    assert "weights do not fit" not in result.stderr and "more tp" not in result.stderr
    raw["serve"][0]["server"]["kv_reserve"] = 0.918  # (room for a 3,010-token request)
    assert invoke("validate", write(tmp_path, raw)).exit_code == 0


def test_the_fit_refusal_names_max_batch_when_the_window_caches_are_the_cause(
        tmp_path: Path) -> None:
    """Trinity-Large's sliding-window caches of max_batch 4096 sequences (1440 GiB) beside
    23.42 GiB of weights: the refusal named the weights (expected mxfp4 weights, ...). It
    names max_batch and the most sequences that leave room for the shortest request (8,208
    tokens: a one-block room let the request check refuse the value it named), which
    validates; one more does not."""
    result = invoke("validate", write(tmp_path, _window_server({"max_batch": 4096})))
    refused(result, "serve.0.server.max_batch = 4096", "expected server.max_batch at most ")
    assert "weights do not fit" not in result.stderr
    most = int(result.stderr.split("max_batch at most ")[1].split()[0].rstrip(".,;"))
    assert invoke("validate", write(tmp_path, _window_server({"max_batch": most}))
                  ).exit_code == 0
    refused(invoke("validate", write(tmp_path, _window_server({"max_batch": most + 1}))),
            "no request can fit a replica's KV cache")


def test_the_fit_refusal_still_names_the_weights_when_they_are_the_cause(
        tmp_path: Path) -> None:
    raw = _window_server({})
    raw["serve"][0].update(model="llama3.1-405b", precision="bf16", parallelism={"tp": 4})
    refused(invoke("validate", write(tmp_path, raw)), "serve.0.parallelism",
            "the weights do not fit", "expected more tp or pp, fp8 weights")


@pytest.mark.parametrize("where", ["target", "draft"])
def test_fp8_activations_with_mx_weights_are_one_clear_sentence(tmp_path: Path,
                                                                where: str) -> None:
    """`precision: {weights: mxfp8, activations: fp8}` printed both union branches' texts
    glued: "serve.0.precision: expected 'bf16', ... or 'mxfp8'; or activations fp8 with
    mxfp8 weights: ...". One line now, on the activations key, its value and what fits."""
    precision = {"weights": "mxfp8", "activations": "fp8"}
    deployment = {"name": "d", "model": "llama3.1-8b", "parallelism": {"tp": 8},
                  "workload": {"rate": "1/s", "input_tokens": 512, "output_tokens": 64}}
    if where == "target":
        deployment["precision"] = precision
        key = "serve.0.precision.activations"
    else:
        deployment["speculative"] = {"draft": "llama3.2-1b", "precision": precision}
        key = "serve.0.speculative.precision.activations"
    raw = {"name": "mx", "duration": "2min", "hardware": "trn3-gen2",
           "cluster": {"instances": 1}, "serve": [deployment]}
    result = invoke("validate", write(tmp_path, raw))
    refused(result, f"{key} = 'fp8': fp8 with mxfp8 weights",
            "expected bf16 or fp16", "or weights: fp8")
    assert "'mxfp4'" not in result.stderr and result.stderr.count("error:") == 1


def test_the_fluid_refusal_of_disaggregation_prints_it_as_written(tmp_path: Path) -> None:
    """The fluid level's refusal of disaggregated pools printed `serve.0.disaggregated =
    'set'`, a value nobody wrote."""
    raw = {"name": "fluid", "duration": "10min", "hardware": "trn2",
           "cluster": {"instances": 2},
           "serve": [{"name": "d", "model": "llama3.1-70b", "parallelism": {"tp": 32},
                      "replicas": 4, "fidelity": "fluid",
                      "disaggregated": {"prefill_replicas": 1, "decode_replicas": 3},
                      "workload": {"rate": "2/s", "input_tokens": 2000,
                                   "output_tokens": 300}}]}
    result = invoke("validate", write(tmp_path, raw))
    refused(result, "serve.0.disaggregated = {prefill_replicas: 1, decode_replicas: 3}: "
            "not yet in the fluid model")
    assert "'set'" not in result.stderr


def test_models_table_of_an_mla_preset_leaves_out_the_widths_mla_does_not_use() -> None:
    """`clustersim models deepseek-v3` printed head_dim 56 (hidden / heads), a width MLA
    never uses (its are qk_nope + qk_rope = 192 and v 128): left out, with kv_heads; a
    grouped-query preset keeps them."""
    mla = invoke("models", "deepseek-v3")
    assert mla.exit_code == 0
    fields = {line.split("│")[1].strip() for line in mla.stdout.splitlines()
              if line.count("│") == 3}
    assert {"qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "heads"} <= fields
    assert not {"head_dim", "kv_heads"} & fields
    gqa = invoke("models", "llama3-8b")
    assert "head_dim" in gqa.stdout and "kv_heads" in gqa.stdout


@pytest.mark.parametrize("value", ["null", "3", "[1]"])
def test_a_model_that_is_neither_a_name_nor_a_mapping_names_the_presets(
        tmp_path: Path, value: str) -> None:
    """`--set jobs.0.model=null` said "expected a mapping", not that a preset name would
    do (a misspelt name's message lists them)."""
    from cli_helpers import SMALL

    result = invoke("validate", write(tmp_path, SMALL), "--set", f"jobs.0.model={value}")
    refused(result, "jobs.0.model = ", "expected a model preset (", "llama3-8b",
            "or a mapping of the shape")
