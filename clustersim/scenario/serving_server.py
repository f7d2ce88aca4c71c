"""The `server:` block of a deployment (`serve[].server`): the serving engine's policy on each
replica (batching, chunked prefill, the paged KV cache) and the shapes the stack compiled
(context-encoding and token-generation buckets, static batches)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from clustersim.hardware import limits
from clustersim.hardware.spec import Spec
from clustersim.hardware.stacks import MAX_BUCKETS
from clustersim.scenario.errors import KeyedError

# Token counts of one request (prompt or output): the longest sequence the loader takes
# (a count of 3e9 overflowed the int32 columns of requests.parquet).
MAX_REQUEST_TOKENS = limits.MAX_SEQ_LEN

__all__ = ["ServerSpec", "MAX_REQUEST_TOKENS"]


def _checked_buckets(value: list[int] | None) -> list[int] | None:
    """A bucket list: at most MAX_BUCKETS token counts, each from 1 to MAX_REQUEST_TOKENS,
    increasing."""
    if value is None:
        return value
    if len(value) > MAX_BUCKETS:
        raise ValueError(f"at most {MAX_BUCKETS} buckets, got {len(value)}")
    for bucket in value:
        if isinstance(bucket, bool) or not 0 < bucket <= MAX_REQUEST_TOKENS:
            raise ValueError(f"a bucket is a token count from 1 to {MAX_REQUEST_TOKENS:,}, "
                             f"got {bucket}")
    if any(b <= a for a, b in zip(value, value[1:], strict=False)):
        raise ValueError(f"buckets must increase, got {value}")
    return value


class ServerSpec(Spec):
    """The serving engine's policy on each replica."""

    max_batch: int = Field(default=64, gt=0, le=4096, description="sequences per iteration")
    max_tokens_per_iteration: int = Field(default=8192, gt=0, le=1_048_576,
                                          description="token budget of one iteration "
                                          "(without chunked_prefill at least the longest "
                                          "prompt, as vLLM requires)")
    chunked_prefill: bool = Field(default=True, description="split long prompts over "
                                  "iterations, mixed with decodes")
    kv_block_tokens: int = Field(default=16, gt=0, le=4096, description="paged KV block size")
    kv_full: Literal["preempt", "queue"] = Field(
        default="queue", description="queue: admit only when the whole request's KV fits; "
        "preempt: admit on the prompt's blocks, evict the newest (recomputed later) when full")
    kv_reserve: float = Field(default=0.1, ge=0, lt=1, allow_inf_nan=False,
                              description="share of HBM kept for activations and the runtime")
    kv_precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    static_batch: bool = Field(
        default=False, description="the prompts admitted together are encoded as one "
        "static batch, one graph holding their attention scores in one tensor "
        "(transformers-neuronx's batch; matters with unfused attention)")
    buckets: list[int] | None = Field(
        default=None, description="compiled context-encoding buckets (tokens, increasing): a "
        "prompt encoded whole (chunked_prefill false, which a list needs) runs padded to the "
        "smallest that holds it; default: the stack's (NxD Inference: powers of two from 128 "
        "up to the longest prompt; none for the others); [] pads nothing")
    token_buckets: list[int] | None = Field(
        default=None, description="compiled token-generation buckets (tokens, increasing): "
        "each decode step reads a sequence's KV cache padded to the smallest that holds its "
        "length (beyond the largest, the tokens held); default: the stack's "
        "(transformers-neuronx: powers of two from 128 up to the deployment's longest "
        "request, prompt and output; none for the others); [] pads nothing")

    decode_batch: Literal["active", "compiled"] | None = Field(
        default=None, description="active: a decode iteration runs the sequences in the "
        "batch; compiled: it runs all max_batch lines of the compiled graph, idle ones "
        "included (static shapes: their weights' work and KV reads at the active lines' "
        "length); default: the stack's (optimum-neuron: compiled; active for the others)")

    @field_validator("buckets", "token_buckets")
    @classmethod
    def _check_buckets(cls, value: list[int] | None) -> list[int] | None:
        return _checked_buckets(value)

    @model_validator(mode="after")
    def _buckets_need_whole_prompts(self) -> ServerSpec:
        # With chunked prefill the stack compiles the chunk's shape: the list would be unused.
        if self.buckets and self.chunked_prefill:
            default = "" if "chunked_prefill" in self.model_fields_set else " (the default)"
            raise KeyedError("buckets", f"pad a prompt encoded whole, and chunked_prefill is "
                             f"true{default}: nothing would be padded; expected "
                             "chunked_prefill: false, or no buckets", self.buckets)
        return self
