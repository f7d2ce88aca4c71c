"""The published Trn2 speculative-decoding rows that check the serving model's fused
speculation: Neuron docs, NxD Inference tutorial "Using Speculative
Decoding to improve Llama-3.3-70B inference performance on Trn2 instances" (SDK 2.29):
trn2.48xlarge, LNC 2, TP 64, bf16, vLLM with one sequence at a time, LLMPerf with 10,000
input and 1,500 output tokens per request; p50 TTFT and TPOT. Without speculation, and with
fused speculation (a Llama 3.2 1B draft on the target's 64 ranks, 7 speculative tokens).

The model's TTFT is one prefill iteration of the prompt (with the draft's prefill beside it
when speculating); its TPOT the mean decode iteration over the output, context growing, over
the tokens each iteration emits. Acceptance is not published: `acceptance` (default the
scenario default, docs/serving.md) decides the speculative row's TPOT with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import HardwareSpec, catalog_entry
from clustersim.scenario.serving import DEFAULT_ACCEPTANCE
from clustersim.serving.iteration import IterationModel, ReplicaShape
from clustersim.serving.replica import DecodeCost
from clustersim.training.transformer import TransformerShape, model_preset_values

__all__ = ["SpeculationMeasurement", "TRN2_SPECULATION", "predict_speculation"]

_SOURCE = ("Neuron docs, NxD Inference tutorial: Llama-3.3-70B speculative decoding on "
           "trn2.48xlarge (SDK 2.29)")


@dataclass(frozen=True)
class SpeculationMeasurement:
    run: str
    draft: str | None
    proposed: int
    ttft_ms: float
    tpot_ms: float
    model: str = "llama3.3-70b"
    tp: int = 64
    input_tokens: int = 10_000
    output_tokens: int = 1_500
    # NxD compiles context encoding in power-of-two buckets up to --max-context-length 12288:
    # the 10,000-token prompt runs the 12,288-token bucket (clustersim.calibration.trn2)
    prefill_tokens: int = 12_288
    source: str = _SOURCE


TRN2_SPECULATION: tuple[SpeculationMeasurement, ...] = (
    SpeculationMeasurement("no speculation", None, 0, 814.3, 19.66),
    SpeculationMeasurement("fused speculation", "llama3.2-1b", 7, 870.1, 5.39),
)


def predict_speculation(hardware: HardwareSpec | None = None,
                        acceptance: float = DEFAULT_ACCEPTANCE) -> list[tuple[float, float]]:
    """Model (TTFT s, TPOT s) of every row on one trn2.48xlarge (or on `hardware`)."""
    hardware = hardware or catalog_entry("trn2")
    topology = build_topology(hardware, 1)
    out = []
    for m in TRN2_SPECULATION:
        target = IterationModel(ReplicaShape(
            TransformerShape(**model_preset_values(m.model)), "bf16", m.tp, 1), topology)
        draft = None
        if m.draft is not None:
            draft = IterationModel(ReplicaShape(
                TransformerShape(**model_preset_values(m.draft)), "bf16", m.tp, 1), topology)
        cost = DecodeCost(target, draft, m.proposed, acceptance if draft else 0.0)
        ttft = cost.prefill_s([(m.prefill_tokens, 0)], 0, 0.0, 1)
        tokens = m.output_tokens - 1
        iterations = tokens / cost.tokens_per_iteration
        out.append((ttft, cost.run_s(1, m.input_tokens + 1, iterations) / tokens))
    return out
