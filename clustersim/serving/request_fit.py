"""Requests a deployment could never serve, refused up front (exit 2) where the scenario
alone decides it: every request longer than a replica's KV cache (each would be rejected),
and a token budget below the longest prompt without chunked prefill (vLLM refuses such a
budget: a prompt longer than it can never be scheduled). Lengths read from a trace are
not checked here (the run rejects requests past the cache one by one, and runs a prompt
past the budget alone), nor distributions reaching past the cache only in part (those
requests are rejected)."""

from __future__ import annotations

import math

from clustersim.scenario.errors import Issue
from clustersim.scenario.models import Scenario
from clustersim.scenario.serving import DeploymentSpec, LengthSpec

__all__ = ["request_fit_issues", "least_request_kv_tokens"]


def _least(lengths: LengthSpec) -> int | None:
    """The fewest tokens a request's length can be (None: from a trace)."""
    if lengths.distribution == "fixed":
        return lengths.value
    return lengths.min if lengths.distribution == "lognormal" else None


def _most(lengths: LengthSpec) -> tuple[int, str] | None:
    """The most tokens a length can be, and the key that says so (None: from a trace)."""
    if lengths.distribution == "fixed":
        return lengths.value, "input_tokens"
    return (lengths.max, "input_tokens.max") if lengths.distribution == "lognormal" else None


def least_request_kv_tokens(d: DeploymentSpec) -> int | None:
    """The KV cache tokens the deployment's shortest request takes as the replica admits it
    (its prompt and, with kv_full: queue, its whole output, else one token, in whole
    blocks), or None where a trace gives the lengths."""
    prompt, output = _least(d.workload.input_tokens), _least(d.workload.output_tokens)
    if prompt is None or output is None:
        return None
    block = d.server.kv_block_tokens
    return math.ceil((prompt + (output if d.server.kv_full == "queue" else 1)) / block) * block


def request_fit_issues(scenario: Scenario, d: DeploymentSpec, capacity: int) -> list[Issue]:
    """The deployment's issues (none when its requests can be served)."""
    index = scenario.serve.index(d)
    issues = []
    prompt, output = _least(d.workload.input_tokens), _least(d.workload.output_tokens)
    need = least_request_kv_tokens(d)
    if prompt is not None and output is not None and need is not None:
        # as the replica admits a request: its prompt and (kv_full: queue) its whole output,
        # or one token of it, in whole blocks; more than the whole cache is rejected
        queue = d.server.kv_full == "queue"
        block = d.server.kv_block_tokens
        if need > capacity:
            alone = math.ceil((prompt + 1) / block) * block > capacity
            key = "input_tokens" if alone or not queue else "output_tokens"
            held = (f"its prompt ({prompt:,} tokens at least) and its output ({output:,} at "
                    "least; kv_full: queue holds both)" if queue
                    else f"its prompt ({prompt:,} tokens at least) and one output token")
            issues.append(Issue(
                f"serve.{index}.workload.{key}",
                f"no request can fit a replica's KV cache: each needs {need:,} tokens of it "
                f"for {held}, and a replica of {d.model.name} (tp {d.tp}, pp {d.pp}) holds "
                f"{capacity:,} tokens; every request would be rejected. Expected shorter "
                "requests, or more HBM per replica (a larger tp or pp, a smaller precision)",
                prompt if key == "input_tokens" else output, True))
    longest = _most(d.workload.input_tokens)
    budget = d.server.max_tokens_per_iteration
    if not d.server.chunked_prefill and longest is not None and longest[0] > budget:
        issues.append(Issue(
            f"serve.{index}.server.max_tokens_per_iteration",
            f"below the longest prompt, {longest[0]:,} tokens (serve.{index}.workload."
            f"{longest[1]}), with chunked_prefill false: a prompt longer than the token "
            "budget could never be scheduled (vLLM refuses such a budget too); expected at "
            f"least {longest[0]:,}, or chunked_prefill: true", budget, True))
    return issues
