"""The `serve:` section of a scenario: inference deployments beside training jobs.

A deployment is a model served by `replicas` copies, each on `tp x pp` ranks, with a
server policy (continuous batching, chunked prefill, a paged KV cache), optionally split into
prefill and decode pools (disaggregated) and with speculative decoding; a request workload
(Poisson, gamma-bursty or a trace file; lengths fixed, log-normal or from the trace); a
router; and latency objectives. Validated once here; the simulator trusts it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, PrivateAttr, field_validator, model_validator

from clustersim.hardware import limits
from clustersim.hardware.catalog import HardwareSpec
from clustersim.hardware.spec import (
    Duration,
    NonNegativeDuration,
    RequestRate,
    Spec,
    printable,
)
from clustersim.hardware.stacks import (
    Stack,
    default_stack,
    known_stacks,
    stack_buckets,
    stack_named,
    stack_token_buckets,
)
from clustersim.scenario.errors import KeyedError
from clustersim.scenario.fleetday import AutoscaleSpec, LoadCurveSpec
from clustersim.scenario.serving_server import MAX_REQUEST_TOKENS, ServerSpec
from clustersim.training.transformer import TransformerShape

__all__ = ["deployment_instances", "expert_parallel_issue", "resolve_serve_models",
           "serve_cross_checks", "serve_budget_checks", "expected_requests", "LengthSpec",
           "RequestWorkloadSpec", "ServerSpec", "DisaggregationSpec", "SpeculativeSpec",
           "SloSpec", "DeploymentSpec", "PrecisionSpec", "Precisions", "ServePrecision",
           "DEFAULT_ACCEPTANCE", "default_activations"]

# mxfp4 / mxfp8: weight-only microscaling formats (OCP MX; GPT-OSS's experts ship in mxfp4)
ServePrecision = Literal["bf16", "fp16", "fp8", "mxfp4", "mxfp8"]


class LengthSpec(Spec):
    """Token counts of requests: fixed, log-normal (median and spread sigma of the log), or
    read from the workload's trace file."""

    distribution: Literal["fixed", "lognormal", "trace"] = "fixed"
    value: int | None = Field(default=None, gt=0, le=MAX_REQUEST_TOKENS,
                              description="fixed: the token count")
    median: float | None = Field(default=None, gt=0, le=MAX_REQUEST_TOKENS, allow_inf_nan=False,
                                 description="lognormal: median tokens")
    sigma: float | None = Field(default=None, gt=0, le=5, allow_inf_nan=False,
                                description="lognormal: standard deviation of ln(tokens)")
    min: int = Field(default=1, gt=0, le=MAX_REQUEST_TOKENS,
                     description="draws are clipped to [min, max]")
    max: int = Field(default=131072, gt=0, le=MAX_REQUEST_TOKENS)

    @model_validator(mode="after")
    def _check(self) -> LengthSpec:
        if self.distribution == "fixed" and self.value is None:
            raise ValueError("fixed lengths need value (e.g. 512)")
        if self.distribution == "lognormal" and (self.median is None or self.sigma is None):
            raise ValueError("lognormal lengths need median and sigma (e.g. 512 and 0.8)")
        if self.min > self.max:
            raise KeyedError("min", f"above max {self.max}", self.min)
        if self.distribution == "lognormal" and not self.min <= self.median <= self.max:
            # (draws are clipped to [min, max]: most would be the one bound, not log-normal)
            raise KeyedError("median", f"outside [min {self.min}, max {self.max}], where "
                             "the draws are clipped; expected a median within them",
                             self.median)
        return self


def _length(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        return {"distribution": "fixed", "value": value}
    if value == "trace":
        return {"distribution": "trace"}
    return value


class RequestWorkloadSpec(Spec):
    """Requests arriving at the deployment: Poisson or gamma (bursty) at `rate`, or a trace
    (CSV or Parquet with arrival_s, input_tokens, output_tokens)."""

    arrival: Literal["poisson", "gamma", "trace"] = "poisson"
    rate_per_s: RequestRate | None = Field(default=None, alias="rate", description="requests per second")
    cv: float = Field(default=1.0, gt=0, le=100, allow_inf_nan=False,
                      description="gamma: coefficient of variation of the gaps (1: Poisson)")
    trace: str | None = Field(default=None, description="trace file, relative to the scenario")
    requests: int | None = Field(default=None, gt=0, le=limits.MAX_REQUESTS,
                                 description="stop after this many (default: to the horizon)")
    input_tokens: LengthSpec = Field(default=LengthSpec(value=512))
    output_tokens: LengthSpec = Field(default=LengthSpec(value=256))
    load: LoadCurveSpec | None = Field(default=None, description="the arrival rate over time "
                                       "(instead of rate; docs/fleet-day.md)")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: object) -> object:
        if isinstance(data, dict):
            data = dict(data)
            for key in ("input_tokens", "output_tokens"):
                if key in data:
                    data[key] = _length(data[key])
        return data

    @model_validator(mode="after")
    def _check(self) -> RequestWorkloadSpec:
        if self.arrival == "trace":
            if self.trace is None:
                raise ValueError("arrival trace needs trace: a CSV or Parquet file")
            if self.load is not None:
                raise ValueError("arrival trace replays the trace's arrival times; a load "
                                 "curve would be ignored: give one or the other")
        elif self.load is not None:
            if self.rate_per_s is not None:
                raise ValueError("give rate or load (a curve over time), not both")
        elif self.rate_per_s is None:
            raise ValueError(f"arrival {self.arrival} needs rate (requests per second, "
                             "e.g. 10/s)")
        uses_trace = "trace" in (self.input_tokens.distribution, self.output_tokens.distribution)
        if uses_trace and self.trace is None:
            raise ValueError("lengths from the trace need trace: a CSV or Parquet file")
        return self


class PrecisionSpec(Spec):
    """Precision per tensor: weights, activations (matmul inputs and outputs, and so the
    tensor-parallel all-reduce messages) and the KV cache. fp8 weights alone are weight-only
    quantisation (bf16 activations: weights stream from HBM at one byte, matmuls and
    messages stay bf16); `{weights: fp8, activations: fp8}` runs fp8 matmuls (W8A8), whose
    inputs are quantised just before each GEMM: the hidden state between them, and so the
    all-reduce messages, stays 16-bit (as TensorRT-LLM's FP8 checkpoints run)."""

    weights: ServePrecision = "bf16"
    activations: Literal["bf16", "fp16", "fp8"] | None = Field(  # (MX: weights' formats)
        default=None, description="defaults to the weights' (bf16 for fp8 or MX weights)")
    kv_cache: Literal["bf16", "fp16", "fp8"] | None = Field(
        default=None, description="defaults to server.kv_precision (MX: weights only)")

    @model_validator(mode="after")
    def _check(self) -> PrecisionSpec:
        # A matmul runs at its wider operand's precision: fp8 matmuls need fp8 weights too.
        if self.activations == "fp8" and self.weights != "fp8":
            raise KeyedError("activations", f"fp8 with {self.weights} weights: a matmul runs "
                             "at its wider operand's precision; expected bf16 or fp16 (or no "
                             "key: bf16), or weights: fp8 for fp8 matmuls (W8A8)", "fp8")
        return self


@dataclass(frozen=True)
class Precisions:
    """A deployment's (or its draft's) resolved precisions."""

    weights: str
    activations: str
    kv_cache: str


def default_activations(weights: str) -> str:
    """The activations' precision when only the weights' is given: the same, except fp8
    weights, which are a storage format (weight-only quantisation, as NxD Inference's fp8
    weight quantisation and most fp8 checkpoints run) with bf16 activations; fp8 matmuls
    and messages need `activations: fp8`."""
    return "bf16" if weights in ("fp8", "mxfp4", "mxfp8") else weights


def resolve_precision(precision: str | PrecisionSpec, kv_default: str) -> Precisions:
    if isinstance(precision, str):
        return Precisions(precision, default_activations(precision), kv_default)
    return Precisions(precision.weights,
                      precision.activations or default_activations(precision.weights),
                      precision.kv_cache or kv_default)


class DisaggregationSpec(Spec):
    """Separate prefill and decode replicas; the KV cache moves over the fabric."""

    prefill_replicas: int = Field(gt=0)
    decode_replicas: int = Field(gt=0)


# Default chance a proposed token is accepted. NVIDIA's TensorRT-LLM blog "Boost Llama 3.3
# 70B Inference Throughput 3x with NVIDIA TensorRT-LLM Speculative Decoding" (Dec 2024): Llama
# 3.3 70B with a Llama 3.2 1B draft on one H200, batch 1, 51.14 -> 181.74 output tokens/s
# (x3.55). The speed-up is at most the tokens each target pass emits, (1 - a^(k+1)) / (1 - a),
# less what the draft's steps cost: x3.55 needs a >= 0.75 at k = 7 proposals (the NxD
# Inference tutorial's), about 0.8 once a 1B draft's steps are paid for. Leviathan et al.
# (ICML 2023, table 3) measure 0.5 to 0.9 over their pairs. An inferred figure, not a
# measured one: give `acceptance` when the pair's is known (docs/serving.md).
DEFAULT_ACCEPTANCE = 0.8


class SpeculativeSpec(Spec):
    """Speculative decoding: a draft model proposes `tokens`, the target verifies them in one
    pass, each accepted with probability `acceptance` (independently). The draft has its own
    precision and tensor-parallel degree (default: the target's, on the target's group, as
    NxD Inference's fused speculation runs it)."""

    draft: TransformerShape
    tokens: int = Field(default=4, gt=0, le=32)
    acceptance: float = Field(default=DEFAULT_ACCEPTANCE, gt=0, lt=1, allow_inf_nan=False,
                              description="chance each proposed token is accepted (default "
                              "0.8: docs/serving.md)")
    precision: ServePrecision | PrecisionSpec | None = Field(
        default=None, description="the draft's; defaults to the target's")
    tp: int | None = Field(default=None, gt=0, le=limits.MAX_PARALLEL_DEGREE,
                           description="the draft's tensor parallelism, on the first ranks "
                           "of the target's group; defaults to the target's tp")
    fused: bool = Field(default=True, description="the draft runs inside the target's "
                        "compiled graph (one host overhead per iteration); false: each draft "
                        "step is a launch of its own")


class SloSpec(Spec):
    ttft_s: Duration = Field(default=1.0, alias="ttft", description="time to first token bound")
    tpot_s: Duration = Field(default=0.1, alias="tpot", description="time per output token bound")


def expert_parallel_issue(ep: int, tp: int, model: TransformerShape) -> str | None:
    """Why a replica of tensor parallelism `tp` cannot split `model`'s experts over `ep`
    groups of its ranks (serving.experts), or None: the deployment's rule, which the
    serving planner's ep candidates also follow."""
    if ep <= 1:
        return None
    if not model.moe:
        return "ep needs a mixture of experts (model.experts > 1)"
    if tp % ep or model.experts % ep:
        return f"ep must divide both tp ({tp}) and the model's {model.experts} experts"
    return None


class DeploymentSpec(Spec):
    name: Annotated[str, AfterValidator(printable)] = Field(min_length=1, max_length=128)
    model: TransformerShape
    precision: ServePrecision | PrecisionSpec = Field(
        default="bf16", description="the weights' (activations the same, bf16 for fp8 or MX "
        "weights), or a mapping {weights, activations, kv_cache}")
    parallelism: dict[Literal["tp", "pp", "ep"], int] = Field(
        default_factory=lambda: {"tp": 1}, description="tp, pp; ep (mixtures): groups of "
        "the tp ranks a MoE layer's experts are split over (serving.experts)")
    routing_skew: float = Field(default=0.0, ge=0, lt=1, allow_inf_nan=False,
                                description="mixtures only: routing concentrated on a "
                                "(1 - skew) share of the experts (0: uniform; docs/serving.md)")
    replicas: int = Field(default=1, gt=0, le=limits.MAX_REPLICAS)
    server: ServerSpec = ServerSpec()
    router: Literal["round_robin", "least_outstanding", "kv_aware"] = "round_robin"
    workload: RequestWorkloadSpec
    disaggregated: DisaggregationSpec | None = None
    speculative: SpeculativeSpec | None = None
    slo: SloSpec = SloSpec()
    start_s: NonNegativeDuration = Field(default=0.0, alias="start",
                                         description="when the deployment starts serving")
    fidelity: Literal["requests", "fluid", "auto"] | None = Field(
        default=None, description="requests: request by request; fluid: the fleet-level "
        "model (docs/fleet-day.md); auto: fluid with autoscale or past 2M requests, else "
        "requests and the two levels compared; default: fluid with autoscale, else requests")
    autoscale: AutoscaleSpec | None = None
    stack: str | None = Field(
        default=None, description="the serving stack (its overheads and default buckets: "
        "docs/serving.md), e.g. nxd-inference; default: the one the hardware's serving "
        "constants were fitted on")
    # why `auto` runs requests past their scale (serving.fidelity.settle_auto), or None
    _fluid_unchecked: str | None = PrivateAttr(default=None)

    @field_validator("stack")
    @classmethod
    def _check_stack(cls, value: str | None) -> str | None:
        if value is not None and stack_named(value) is None:
            raise ValueError(f"unknown stack {value!r}; known: {', '.join(known_stacks())}")
        return value

    def serving_stack(self, hardware: str) -> Stack | None:
        """The stack this deployment runs: as written, or the hardware's default."""
        if self.stack is not None:
            return stack_named(self.stack)
        return default_stack(hardware.split("+")[0])

    def context_buckets(self, hardware: str) -> tuple[int, ...]:
        """Compiled context-encoding buckets of a prompt encoded whole (() with chunked
        prefill: the stack compiles the chunk's shape)."""
        if self.server.chunked_prefill:
            return ()
        if self.server.buckets is not None:
            return tuple(self.server.buckets)
        lengths = self.workload.input_tokens
        longest = lengths.value if lengths.distribution == "fixed" else lengths.max
        return stack_buckets(self.serving_stack(hardware), int(longest or lengths.max))

    def token_buckets(self, hardware: str, longest_sequence: int) -> tuple[int, ...]:
        """Compiled token-generation buckets (decode reads each sequence's KV cache padded
        to the smallest that holds it): as written, or the stack's for the deployment's
        longest request (prompt and output), `longest_sequence` tokens."""
        if self.server.token_buckets is not None:
            return tuple(self.server.token_buckets)
        return stack_token_buckets(self.serving_stack(hardware), longest_sequence)

    def decode_lines(self, hardware: str) -> int:
        """Lines every decode iteration runs whatever the batch holds: max_batch when the
        stack (or `server.decode_batch`) runs the compiled batch, else 0 (the active ones)."""
        rule = self.server.decode_batch
        if rule is None:
            stack = self.serving_stack(hardware)
            rule = stack.decode_rule if stack is not None else "active"
        return self.server.max_batch if rule == "compiled" else 0

    @model_validator(mode="after")
    def _check(self) -> DeploymentSpec:
        for key, value in self.parallelism.items():
            if value < 1:
                raise KeyedError(f"parallelism.{key}", "expected at least 1", value)
        if self.model.layers % self.pp:
            raise KeyedError("parallelism.pp", f"the model's {self.model.layers} layers do "
                             f"not split into {self.pp} stages", self.pp)
        if (why := expert_parallel_issue(self.ep, self.tp, self.model)) is not None:
            raise KeyedError("parallelism.ep", why, self.ep)
        if self.routing_skew and not self.model.moe:  # serving.experts would ignore it
            raise KeyedError("routing_skew", f"needs a mixture; {self.model.name} is dense",
                             self.routing_skew)
        # A tp that does not divide the heads pads them, as NxD does (sharded_heads).
        if (isinstance(self.precision, PrecisionSpec) and self.precision.kv_cache is not None
                and "kv_precision" in self.server.model_fields_set
                and self.precision.kv_cache != self.server.kv_precision):
            raise KeyedError("server.kv_precision", f"precision.kv_cache "
                             f"{self.precision.kv_cache} disagrees: give one",
                             self.server.kv_precision)
        if self.speculative is not None and self.speculative.tp is not None:
            if self.speculative.tp > self.tp or self.tp % self.speculative.tp:
                raise KeyedError("speculative.tp", f"expected a divisor of the target's tp "
                                 f"{self.tp} (the draft runs on its ranks)", self.speculative.tp)
        if self.disaggregated is not None:
            pools = self.disaggregated.prefill_replicas + self.disaggregated.decode_replicas
            if pools != self.replicas:
                raise KeyedError("disaggregated", f"its pools ({pools} replicas) must add up "
                                 f"to replicas ({self.replicas})",
                                 self.disaggregated.model_dump())
        return self

    @property
    def tp(self) -> int:
        return self.parallelism.get("tp", 1)

    @property
    def precisions(self) -> Precisions:
        """Weights, activations and KV cache precisions, resolved."""
        return resolve_precision(self.precision, self.server.kv_precision)

    @property
    def draft_precisions(self) -> Precisions:
        """The speculative draft's precisions (the target's unless given)."""
        if self.speculative is None or self.speculative.precision is None:
            return self.precisions
        return resolve_precision(self.speculative.precision, self.precisions.kv_cache)

    @property
    def draft_tp(self) -> int:
        if self.speculative is None or self.speculative.tp is None:
            return self.tp
        return self.speculative.tp

    @property
    def pp(self) -> int:
        return self.parallelism.get("pp", 1)

    @property
    def ep(self) -> int:
        return self.parallelism.get("ep", 1)


def expected_requests(d: DeploymentSpec, duration_s: float) -> float:
    """Requests a rate-driven deployment simulated request by request is expected to receive
    over the horizon (a trace's are its rows, counted where it is read; a fluid one none)."""
    from clustersim.scenario.fleetday import resolved_fidelity

    if d.workload.arrival == "trace" or resolved_fidelity(d, duration_s) == "fluid":
        return 0.0  # a fluid deployment simulates no request one by one
    span = max(0.0, duration_s - d.start_s)
    load = getattr(d.workload, "load", None)
    rate = load.mean_per_s() if load is not None else float(d.workload.rate_per_s or 0.0)
    expected = rate * span
    return min(expected, d.workload.requests) if d.workload.requests is not None else expected


def serve_budget_checks(serve: list[DeploymentSpec], hardware: HardwareSpec, duration_s: float,
                        job_names: Iterable[str] = ()) -> Iterable[tuple]:
    """(path, message, value) for deployments that cannot run as written: starting at or after
    the horizon, a draft no smaller than its target, a name shared with a job or `cluster`
    (their figures would share the sweep's columns), and more requests in all than
    limits.MAX_SERVED_REQUESTS. (Weights that do not fit are checked by the runner, with
    the serving model's memory: serving.simulate.check_serving_fit.)"""
    jobs = set(job_names)
    for index, d in enumerate(serve):
        at = f"serve.{index}"
        if d.name in jobs or d.name == "cluster":
            yield (f"{at}.name", "a job or the cluster's figures have this name; expected a "
                   "deployment name of its own (figures are keyed by name)", d.name)
        if d.start_s >= duration_s:
            yield (f"{at}.start", f"at or after the end of the scenario ({duration_s:g} s); "
                   "expected an earlier start", d.start_s)
        if (d.speculative is not None
                and d.speculative.draft.parameter_count() >= d.model.parameter_count()):
            yield (f"{at}.speculative.draft", f"the draft has "
                   f"{d.speculative.draft.parameter_count():,} parameters, the target "
                   f"{d.model.parameter_count():,}; expected a smaller draft",
                   d.speculative.draft.name)
    counts = [expected_requests(d, duration_s) for d in serve]
    if sum(counts) > limits.MAX_SERVED_REQUESTS:
        worst = max(range(len(serve)), key=lambda i: counts[i])
        yield (f"serve.{worst}.workload", f"the deployments would receive about "
               f"{sum(counts):,.0f} requests (rate x time from start to the horizon, or "
               f"workload.requests); expected at most {limits.MAX_SERVED_REQUESTS:,} in a run "
               "(docs/limits.md): a lower rate, a shorter duration or workload.requests",
               serve[worst].workload.rate_per_s)


def resolve_serve_models(resolved: dict, resolve: Callable[[dict, str, str], list]) -> list:
    """Expand model preset names of the `serve:` entries (model, speculative draft) with the
    loader's resolver; returns its issues."""
    issues: list = []
    serve = resolved.get("serve")
    if not isinstance(serve, list):
        return issues
    for index, entry in enumerate(serve):
        if not isinstance(entry, dict):
            continue
        issues += resolve(entry, "model", f"serve.{index}.model")
        speculative = entry.get("speculative")
        if isinstance(speculative, dict):
            issues += resolve(speculative, "draft", f"serve.{index}.speculative.draft")
    return issues


def deployment_instances(deployment: DeploymentSpec, hardware: HardwareSpec) -> int:
    """Instances a deployment's replicas take: replicas smaller than an instance share one."""
    ranks = deployment.tp * deployment.pp * deployment.replicas
    return -(-ranks // hardware.ranks_per_instance)


def serve_cross_checks(serve: list[DeploymentSpec], hardware: HardwareSpec,
                       working_instances: int, job_instances: int,
                       job_ultraservers: int = 0) -> Iterable[tuple]:
    """(path, message, value) for deployments that do not fit the cluster or each other.
    `job_ultraservers`: whole UltraServers the largest job placed on whole UltraServers
    needs (the deployments take the first instances, and a partly used UltraServer is no
    use to it)."""
    seen: set[str] = set()
    used = 0
    for index, deployment in enumerate(serve):
        if deployment.name in seen:
            yield (f"serve.{index}.name", "deployment names must be unique", deployment.name)
        seen.add(deployment.name)
        ranks = deployment.tp * deployment.pp
        per_instance = hardware.ranks_per_instance
        if ranks > per_instance and ranks % per_instance:
            yield (f"serve.{index}.parallelism", f"tp x pp = {ranks} ranks spans instances: "
                   f"expected a multiple of {per_instance} ranks per instance",
                   dict(deployment.parallelism))
        if deployment.tp > per_instance * hardware.instances_per_ultraserver:
            yield (f"serve.{index}.parallelism.tp", f"tensor parallelism stays in one "
                   f"NeuronLink domain: expected at most "
                   f"{per_instance * hardware.instances_per_ultraserver} ranks", deployment.tp)
        used += deployment_instances(deployment, hardware)
        stack = stack_named(deployment.stack) if deployment.stack else None
        base = hardware.name.split("+")[0]
        if stack is not None and base not in stack.hardware:
            yield (f"serve.{index}.stack", f"stack {stack.name} runs on "
                   f"{', '.join(stack.hardware)} (its constants were fitted there), not on "
                   f"{hardware.name}", deployment.stack)
        spec = deployment.speculative
        checks = [("precision", deployment.precisions, deployment.precision)] + (
            [("speculative.precision", deployment.draft_precisions, spec.precision)]
            if spec is not None and spec.precision is not None else [])
        for path, p, written in checks:
            compute = p.activations  # written as a mapping: name the key that chose it
            path += ".activations" if isinstance(written, PrecisionSpec) else ""
            if compute not in hardware.chip.tflops:
                yield (f"serve.{index}.{path}", f"{hardware.chip.name} has no {compute} peak",
                       compute)
    if not serve:  # a job alone larger than the cluster is the job's own issue
        return
    if used + job_instances > working_instances:
        # (no value: the count is the deployments' together, not one written in the file)
        yield ("serve", f"the deployments' replicas need {used} instances and the jobs "
               f"{job_instances}; the cluster has {working_instances}", None)
    elif job_ultraservers:
        ipu = hardware.instances_per_ultraserver
        taken = -(-used // ipu)
        if taken + job_ultraservers > working_instances // ipu:
            yield ("serve", f"the deployments' replicas take {used} instances, touching "
                   f"{taken} UltraServer(s), and a job whose tensor parallelism spans "
                   f"instances needs {job_ultraservers} whole UltraServer(s); the cluster "
                   f"has {working_instances // ipu}", None)
