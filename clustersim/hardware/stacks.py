"""Serving stacks (`serve[].stack`): the inference software a deployment runs, and what the
simulator copies of it (`catalog/stacks.yaml`).

A stack is fitted on its own published rows on some hardware: the serving constants of those
hardware entries (`serving:` in hardware.yaml) are that stack's, so a stack runs only on the
hardware it was fitted on, and each hardware entry has one default stack (the one its serving
constants come from). A stack also sets the default context-encoding buckets
(`server.buckets`): a prompt encoded whole runs padded to the smallest compiled bucket that
holds it (NxD Inference compiles one graph per bucket).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from clustersim.catalog import read_catalog
from clustersim.hardware.catalog import HardwareSpec

__all__ = ["Stack", "known_stacks", "stack_named", "default_stack", "with_stack", "stack_buckets",
           "padded_tokens", "MAX_BUCKETS", "MIN_BUCKET", "stack_token_buckets",
           "padded_kv_tokens"]

MAX_BUCKETS = 64  # compiled graphs a deployment may list
MIN_BUCKET = 128  # NxD Inference's smallest context-encoding bucket


@dataclass(frozen=True)
class Stack:
    name: str  # as a scenario writes it, with its release if it has one
    description: str
    hardware: tuple[str, ...]
    bucket_rule: str  # "powers-of-two-from-128" or "none"
    source: str
    # "powers-of-two-from-128": decode reads the KV cache padded to the compiled token
    # bucket holding its position (transformers-neuronx); "none": the tokens held.
    token_rule: str = "none"
    # "compiled": every decode iteration runs the compiled batch, idle lines included
    # (optimum-neuron's static token-generation graph); "active": the sequences it holds.
    decode_rule: str = "active"
    # The release's own serving constants over the hardware's (ServingConstants field
    # names): empty for the stack the hardware's constants were fitted on.
    serving: tuple[tuple[str, float | str], ...] = ()
    # The models the stack is a port of (a contrib model's own script); empty: any model.
    ports: tuple[str, ...] = ()


def _constant(value: object) -> float | str:
    """A stack's serving constant: a number, or a choice (`moe_prefill: every-expert`)."""
    return value if isinstance(value, str) else float(value)  # type: ignore[arg-type]


def _serving(data: dict, name: str) -> dict[str, float | str]:
    """A stack's own serving constants: its `base` stack's (a stack run another way, e.g.
    through vLLM), then its own over them."""
    entry = data[name]
    own = {key: _constant(value["value"]) for key, value in entry.get("serving", {}).items()}
    return {**(_serving(data, entry["base"]) if "base" in entry else {}), **own}


@cache
def _stacks() -> dict[str, Stack]:
    data = read_catalog("stacks")["stacks"]
    return {name: Stack(name, entry["description"], tuple(entry["hardware"]),
                        entry["buckets"]["value"], entry["constants"]["source"],
                        entry.get("token_buckets", {}).get("value", "none"),
                        entry.get("decode_batch", {}).get("value", "active"),
                        tuple(_serving(data, name).items()), _ports(data, name))
            for name, entry in data.items()}


def _ports(data: dict, name: str) -> tuple[str, ...]:
    """The models a stack is a port of: its own list, or its `base` stack's."""
    entry = data[name]
    if "ports" in entry:
        return tuple(entry["ports"]["value"])
    return _ports(data, entry["base"]) if "base" in entry else ()


def known_stacks() -> tuple[str, ...]:
    return tuple(sorted(_stacks()))


def stack_named(name: str) -> Stack | None:
    return _stacks().get(name)


def default_stack(hardware: str | None) -> Stack | None:
    """The stack whose rows a hardware entry's serving constants were fitted on (None for an
    entry no stack was fitted on): the one of its stacks with no constants of its own."""
    for stack in _stacks().values():
        if hardware in stack.hardware and not stack.serving:
            return stack
    return None


def with_stack(hardware: HardwareSpec, stack: Stack | None) -> HardwareSpec:
    """The hardware with the stack's own serving constants over its fitted ones."""
    if stack is None or not stack.serving:
        return hardware
    serving = hardware.serving.model_copy(update=dict(stack.serving))
    return hardware.model_copy(update={"serving": serving})


def stack_buckets(stack: Stack | None, longest_prompt: int) -> tuple[int, ...]:
    """The stack's default context-encoding buckets for prompts up to `longest_prompt`
    tokens (the deployment's maximum context): NxD Inference's powers of two from 128 below
    it, then it; () for a stack that pads nothing."""
    if stack is None or stack.bucket_rule == "none":
        return ()
    if longest_prompt <= MIN_BUCKET:
        return (MIN_BUCKET,)
    # generate_buckets: 2**i for i from log2(128) up to round(log2(maximum)), excluded, then
    # the maximum (so no power of two sits just under it).
    top = round(math.log2(longest_prompt))
    return (*(2**i for i in range(int(math.log2(MIN_BUCKET)), top)), longest_prompt)


def padded_tokens(tokens: int, buckets: tuple[int, ...]) -> int:
    """A prompt of `tokens` run whole in the smallest bucket that holds it; beyond the
    largest, in pieces of the largest, the last padded to its own bucket."""
    if not buckets or tokens <= 0:
        return tokens
    largest = buckets[-1]
    whole, rest = divmod(tokens, largest)
    if rest == 0:
        return tokens
    for bucket in buckets:
        if bucket >= rest:
            return whole * largest + bucket
    return tokens  # unreachable: rest < largest


def stack_token_buckets(stack: Stack | None, longest_sequence: int) -> tuple[int, ...]:
    """The token-generation buckets a stack compiles for sequences up to `longest_sequence`
    tokens (prompt and output: the deployment's compiled maximum): transformers-neuronx's
    powers of two from 128 below it, then it; () for a stack whose decode reads only the
    tokens held."""
    if stack is None or stack.token_rule == "none" or longest_sequence <= 0:
        return ()
    sizes = []
    size = MIN_BUCKET
    while size < longest_sequence:
        sizes.append(size)
        size *= 2
    return (*sizes, longest_sequence)


def padded_kv_tokens(buckets: tuple[int, ...], batch: int, context: float, growth: float,
                     n: int) -> float:
    """KV tokens read over n decode iterations of `batch` sequences holding `context` tokens
    in all, each adding `growth` a sequence per iteration, when every iteration reads each
    sequence's cache padded to the smallest bucket holding its length (the batch's mean
    length: exact for a static batch of equal requests); beyond the largest bucket, the
    tokens held. Closed form per bucket: O(buckets), nothing per iteration."""
    if n <= 0 or batch <= 0:
        return 0.0
    first = context / batch  # a sequence's tokens at the first iteration

    def reached(limit: float) -> int:  # iterations j < n with first + growth j <= limit
        if limit < first:
            return 0
        if growth <= 0:
            return n
        return min(n, math.floor((limit - first) / growth + 1e-9) + 1)

    total = 0.0
    below = 0
    for bucket in buckets:
        upto = reached(bucket)
        total += bucket * (upto - below)
        below = upto
    rest = n - below  # past the largest bucket: the tokens held, an arithmetic series
    if rest:
        total += rest * first + growth * (n * (n - 1) - below * (below - 1)) / 2.0
    return batch * total
