"""Arcee Trinity on Trainium2, from NxD Inference's contrib port: mixtures the model was not
fitted on, judged on the port's stack.

The port (aws-neuron/neuronx-distributed-inference, contrib/models/Trinity, README at
c8184dc, 2026-03-18; SDK 2.28, NxDI 0.8.0, bf16, seq_len 2,048 with bucketing, LNC 2) runs
its model with its own script, as the DeepSeek-V3 port does (stack nxd-inference-contrib):
TTFT averaged over 10 forward passes of the context graph after 3 warm-ups, on its test's
prompt ("Hello, how are you?", a few tokens, padded to the 128-token context bucket: NxD's
generate_buckets(128, 2,048)); the token-generation time averaged over 28 tokens (32
generated, the first 3 discarded). At batch 2 and 4 the compiled batch of prompts is
encoded together and decodes together. Nano and Mini on trn2.3xlarge (one chip) at TP 4,
Large on trn2.48xlarge at TP 64. The TP 2 and inf2 rows are left out (a replica of half a
chip; no inf2 in the catalog), and Mini's fused-TKG row (patched libraries).

Nothing is fitted on them. Two things differ from the DeepSeek-V3 port whose constants the
stack carries: Trinity's MoE is NxD's ExpertMLPsV2, whose context encoding (SDK 2.28,
modules/moe/expert_mlps_v2.py) runs forward_blockwise once tokens x top_k reach the 512-token
block (128 x 4 for Large, 128 x 8 for Nano and Mini) where the DeepSeek-V3 port runs every
expert over every token, and Trinity gates its attention output (the `attention_gate` key).
The stack's every-expert prefill is what a user writing these rows as the port's stack gets.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TrinityRow", "TRINITY_ROWS", "SOURCE", "PROMPT_TOKENS", "OUTPUT_TOKENS",
           "CONTEXT_BUCKETS", "row_name"]

SOURCE = ("NxD Inference contrib models, Trinity port README (c8184dc, 2026-03-18; SDK 2.28), "
          "Performance Benchmarks")
PROMPT_TOKENS = 7  # "Hello, how are you?" with its BOS token (padded to 128 either way)
OUTPUT_TOKENS = 32  # generated per prompt; the TKG figure averages the last 28
CONTEXT_BUCKETS = (128, 256, 512, 1024, 2048)  # generate_buckets(128, seq_len 2,048)


@dataclass(frozen=True)
class TrinityRow:
    model: str
    tp: int
    batch: int
    ttft_ms: float
    tkg_ms: float  # ms per generated token of each sequence


TRINITY_ROWS: tuple[TrinityRow, ...] = (
    TrinityRow("trinity-nano", 4, 1, 476.0, 9.2),
    TrinityRow("trinity-nano", 4, 2, 600.0, 12.4),
    TrinityRow("trinity-nano", 4, 4, 817.0, 14.9),
    TrinityRow("trinity-mini", 4, 1, 371.0, 11.8),
    TrinityRow("trinity-mini", 4, 2, 598.0, 11.5),
    TrinityRow("trinity-mini", 4, 4, 805.0, 13.6),
    TrinityRow("trinity-large", 64, 1, 1161.0, 14.7),
    TrinityRow("trinity-large", 64, 2, 1657.0, 19.1),
    TrinityRow("trinity-large", 64, 4, 1980.0, 29.0),
)


def row_name(row: TrinityRow) -> str:
    """The row's scenario name (scenarios/calibration/serving/<name>.yaml)."""
    return f"trn2-{row.model}-tp{row.tp}-batch-{row.batch}-nxd-inference-contrib"
