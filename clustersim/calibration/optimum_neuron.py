"""vLLM on Neuron as Hugging Face's optimum-neuron ships it (`stack: optimum-neuron@0.4`).

The rows: optimum-neuron's own vLLM benchmark (huggingface/optimum-neuron,
benchmark/vllm/single-instance/<model>-trn2/: the .env file gives the model, the compiled
batch, sequence length and TP degree; vllm-results.csv the guidellm 0.1.0 figures), run by
`optimum-cli neuron serve` on Trainium2 with optimum-neuron 0.4.0.dev0 / 0.4.1.dev0 (Neuron
SDK 2.26.0), requests of 1,500 prompt tokens (+-150) and 250 output tokens (+-20)
(benchmark/vllm/benchmark.sh at those commits; the means are the rows' lengths). The rows
here are guidellm's `synchronous` ones: one request at a time, its TTFT and inter-token
latency (the mean time between output tokens).

What the stack compiles (optimum-neuron 0.4.1.dev0, models/inference/backend): no
bucketing (`enable_bucketing` False), so one context-encoding graph of the sequence length
(every prompt padded to it) and one token-generation graph of the sequence length (each
decode reads the KV cache of every position); continuous batching with a context batch of
1, and a token-generation graph of the compiled batch (`tkg_batch_size`): every decode step
runs all its lines, idle ones included. The scenario files say so (server.buckets,
server.token_buckets, and the stack's decode_batch: compiled).

Fitted: the stack's `hbm_efficiency` and `iteration_overhead_s` (catalog/stacks.yaml) on the
two dense models' inter-token latencies (Llama 3.1 8B at batch 32 and Qwen3-32B at batch 2,
both TP 4 on one chip: the 8B's decode is mostly its 32 idle lines' KV reads and the host,
the 32B's its weights); every TTFT and the mixture rows (Qwen3-30B-A3B, Qwen3-235B-A22B,
Llama 4 Scout and Maverick) judge. Every other constant is the trn2 entry's (NxD Inference's
fit): optimum-neuron's modelling code is NxD Inference's, adapted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["STACK", "OptimumRow", "ROWS", "FITTED", "FIT_KEYS", "row_name", "row_scenario",
           "row_file", "run_row", "fit_stack", "BLOCKWISE_FITTED", "blockwise_ttft_line",
           "fit_blockwise_element", "port_blockwise_ttft_s"]

STACK = "optimum-neuron@0.4"
_REPO = "huggingface/optimum-neuron"
_SERVING_DIR = Path(__file__).resolve().parents[2] / "scenarios" / "calibration" / "serving"
_INPUT, _OUTPUT = 1500, 250  # benchmark.sh: prompt_tokens=1500, generated_tokens=250


@dataclass(frozen=True)
class OptimumRow:
    model: str  # catalog name
    folder: str  # benchmark/vllm/single-instance/<folder>/
    commit: str  # the optimum-neuron commit that added it
    version: str  # optimum-neuron's version at that commit
    tp: int
    batch: int  # the compiled batch (BATCH_SIZE)
    sequence_length: int
    ttft_ms: float  # guidellm synchronous: Time-to-first-token (ms)
    itl_ms: float  # guidellm synchronous: Inter Token Latency (ms)
    instance: str = "trn2.3xlarge"  # TP 4 is one chip's four logical cores (LNC 2)
    input_tokens: int = _INPUT
    output_tokens: int = _OUTPUT

    @property
    def source(self) -> str:
        return (f"{_REPO} benchmark/vllm/single-instance/{self.folder}/ (.env and "
                f"vllm-results.csv, commit {self.commit}: optimum-neuron {self.version}, "
                "Neuron SDK 2.26.0; guidellm 0.1.0 synchronous)")


ROWS: tuple[OptimumRow, ...] = (
    OptimumRow("llama3.1-8b", "llama-3.1-8b-trn2", "b52f1a3a", "0.4.1.dev0", 4, 32, 4096,
               197.24611802534622, 22.13561523381564),
    OptimumRow("qwen3-32b", "qwen3-32B-trn2", "56c35e6d", "0.4.1.dev0", 4, 2, 4096,
               770.858672948984, 32.083890591448515),
    OptimumRow("qwen3-30b-a3b", "qwen3-30B-A3B-trn2", "b0a576eb", "0.4.1.dev0", 4, 16, 4096,
               1546.7508435249329, 56.35983309753353),
    OptimumRow("llama4-scout", "llama4-Scout-trn2", "5996de0f", "0.4.0.dev0", 64, 32, 4096,
               575.0301304985495, 32.764181199640326, "trn2.48xlarge"),
    OptimumRow("llama4-maverick", "llama4-Maverick-trn2", "5996de0f", "0.4.0.dev0", 64, 8,
               4096, 1713.8232111930847, 16.94053329867967, "trn2.48xlarge"),
    OptimumRow("qwen3-235b-a22b", "qwen3-235B-A22B-trn2", "5996de0f", "0.4.0.dev0", 64, 4,
               4096, 4587.152791023254, 32.1826790250949, "trn2.48xlarge"),
)
FITTED = ROWS[:2]  # their inter-token latencies fit the stack's two constants
FIT_KEYS = ("hbm_efficiency", "iteration_overhead_s")
_BOUNDS = {"hbm_efficiency": (0.3, 1.0), "iteration_overhead_s": (1e-4, 3e-2)}


# The mixture rows whose TTFTs fit the stack's `blockwise_element` (one constant): the two
# Qwen3-MoE rows (optimum-neuron's modules/moe.py, NxD's ExpertMLPs); the two Llama 4 rows
# (modules/moe_v2.py, ExpertMLPsV2 with shared experts) judge it.
BLOCKWISE_FITTED = ("qwen3-30b-a3b", "qwen3-235b-a22b")
_BLOCKWISE_PROBE_S = 1e-10  # a trial value of the constant, to read the TTFT's slope


def row_name(row: OptimumRow) -> str:
    return (f"trn2-{row.model}-tp{row.tp}-b{row.batch}-{row.input_tokens}-"
            f"{row.output_tokens}-optimum-neuron")


def row_scenario(row: OptimumRow, hardware: str | dict = "trn2",
                 stack: str = STACK) -> dict:
    """The row's deployment as a user writes it for `optimum-cli neuron serve`: the model's
    compiled batch, sequence length and TP degree; one context graph and one
    token-generation graph of the sequence length (no bucketing)."""
    server = {"max_batch": row.batch, "max_tokens_per_iteration": row.sequence_length,
              "chunked_prefill": False, "buckets": [row.sequence_length],
              "token_buckets": [row.sequence_length]}
    if stack != STACK:  # a trial of the fit, on a stack without constants of its own
        server["decode_batch"] = "compiled"
    return {"model": row.model, "stack": stack, "precision": "bf16",
            "parallelism": {"tp": row.tp}, "server": server}


def row_file(row: OptimumRow) -> Path:
    """The row's scenario file (written by scripts/calibration_scenarios.py)."""
    return _SERVING_DIR / f"{row_name(row)}.yaml"


def run_row(row: OptimumRow, constants: Mapping[str, float] | None = None
            ) -> tuple[float, float]:
    """(TTFT s, inter-token latency s: the TPOT p50) of the row's scenario file as
    `clustersim run` runs it; with trial `constants`, the same scenario on trn2 with them
    (through a stack with no constants of its own, the stack's compiled shapes written
    out)."""
    import yaml

    from clustersim.runner.api import simulate
    from clustersim.scenario.loader import scenario_from_dict
    from clustersim.scenario.reading import read_yaml_file
    path = row_file(row)
    data = read_yaml_file(path)
    if constants:
        data["hardware"] = {"base": "trn2", "serving": {
            k.removesuffix("_s"): v for k, v in constants.items()}}
        data["serve"][0].update(row_scenario(row, "trn2", "nxd-inference"))
    scenario = scenario_from_dict(yaml.safe_load(yaml.safe_dump(data)), str(path),
                                  base_dir=path.parent)
    figures = simulate(scenario, seed=0).summary["deployments"]["row"]
    return figures["ttft_p50_s"], figures["tpot_p50_s"]


def _loss(constants: Mapping[str, float]) -> float:
    return sum(math.log(run_row(r, constants)[1] * 1e3 / r.itl_ms) ** 2 for r in FITTED)


def fit_stack(start: Mapping[str, float] | None = None, rounds: int = 4) -> dict[str, float]:
    """Coordinate search (golden section on each constant's log, in turn, within its
    bounds) of the stack's two constants on the fitted rows' squared log errors of the
    inter-token latency."""
    from clustersim.calibration.serving_stacks import golden_log_minimum
    from clustersim.hardware.stacks import stack_named
    own = dict(stack_named(STACK).serving)
    values = {k: float((start or own)[k]) for k in FIT_KEYS}
    for _ in range(rounds):
        for key in FIT_KEYS:
            values[key] = golden_log_minimum(
                lambda v, key=key: _loss({**values, key: v}), _BOUNDS[key], 2e-3)
    return values


def blockwise_ttft_line(row: OptimumRow) -> tuple[float, float]:
    """(TTFT s at blockwise_element 0, its slope in the constant, s per s): the row's TTFT
    through its scenario with the stack's other constants (one request at a time: the
    context-encoding iteration, linear in the constant)."""
    from clustersim.hardware.stacks import stack_named
    own = dict(stack_named(STACK).serving)
    base = {**own, "blockwise_element_s": 0.0}
    zero, _ = run_row(row, base)
    probe, _ = run_row(row, {**base, "blockwise_element_s": _BLOCKWISE_PROBE_S})
    return zero, (probe - zero) / _BLOCKWISE_PROBE_S


def fit_blockwise_element() -> float:
    """The stack's `blockwise_element` (s per element of a block's token rows): golden
    section on its log of the squared log errors of the BLOCKWISE_FITTED rows' TTFTs, each
    TTFT the line `blockwise_ttft_line` gives."""
    from clustersim.calibration.serving_stacks import golden_log_minimum
    lines = [(blockwise_ttft_line(r), r.ttft_ms * 1e-3)
             for r in ROWS if r.model in BLOCKWISE_FITTED]

    def loss(value: float) -> float:
        return sum(math.log((a + b * value) / published) ** 2
                   for (a, b), published in lines)
    return golden_log_minimum(loss, (1e-12, 1e-8), 1e-5)


def port_blockwise_ttft_s(element_s: float) -> float:
    """The DeepSeek-V3 port's TTFT (s; stack nxd-inference-contrib, its 512-token graph) if
    its context encoding ran forward_blockwise as this stack's does, at `element_s` per
    element of a block's rows (the port's every-expert constant off): what the port's row
    says of the constant, were NxD Inference's ExpertMLPsV2 (SDK 2.28, the same dispatch:
    512 x 8 routed slots >= 512) to take that path there."""
    from clustersim.calibration import models_serving as ms
    hw = ms.contrib_hardware()
    hw = hw.model_copy(update={"serving": hw.serving.model_copy(update={
        "moe_prefill": "blockwise", "blockwise_element_s": element_s,
        "expert_invocation_overhead_s": 0.0})})
    (ttft, _), = ms.predict_trn2_serving(hw, (ms.DEEPSEEK_TRN2,))
    return ttft
