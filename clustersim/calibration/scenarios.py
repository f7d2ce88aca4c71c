"""Calibration rows as scenario files, run through the code `clustersim run` and `clustersim
step` run.

Every published row the model is fitted on or judged by is written as a scenario under
`scenarios/calibration/` (`serving/` and `training/`) by `python
scripts/calibration_scenarios.py`, the way a user would write it: the hardware, the model,
the layout, the serving stack with its compiled buckets, and the published run's requests (a
trace file beside the scenario: one request, or one static batch, at a time, far enough
apart that none waits). `run_serving_row` and `run_training_row` run those files and read
the figures the fits compare (TTFT and TPOT p50 from `summary.json`'s deployment; a job's
step time or throughput from `clustersim step`), so what the calibration reports is what a
user running the same file gets.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["CALIBRATION_DIR", "ScenarioFile", "trn2_serving_files", "trn1_serving_files",
           "model_serving_files", "optimum_neuron_files", "trinity_files",
           "trn1_file", "training_files", "gpu_serving_files", "gpu_name",
           "trn1_token_latency_files",
           "run_throughput_row",
           "all_files", "write_files", "run_serving_row", "run_training_row", "file_for"]

CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "scenarios" / "calibration"
_GAP_S = 600.0  # between the trace's requests: each runs alone
_REQUESTS = 3  # the p50 of identical requests run alone is any one's


@dataclass(frozen=True)
class ScenarioFile:
    """One calibration row as a scenario (`text`) and, for serving, its trace (`trace`)."""

    path: Path  # relative to CALIBRATION_DIR
    text: str
    trace: str | None = None


def _slug(name: str) -> str:
    keep = [c if c.isalnum() or c in ".-" else "-" for c in name.lower()]
    return "-".join(part for part in "".join(keep).split("-") if part)


def _trace(input_tokens: int, output_tokens: int, batch: int = 1) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["arrival_s", "input_tokens", "output_tokens"])
    for i in range(_REQUESTS):
        for _ in range(batch):
            writer.writerow([f"{i * _GAP_S:g}", input_tokens, output_tokens])
    return out.getvalue()


def _header(lines: Iterable[str]) -> str:
    return "".join(f"# {line}\n" if line else "#\n" for line in lines)


def _dump(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=100)


# ------------------------------------------------------------------------------- serving

def _serving_file(folder: str, name: str, comment: list[str], hardware: str,
                  deployment: dict[str, Any], input_tokens: int, output_tokens: int,
                  batch: int = 1) -> ScenarioFile:
    slug = _slug(name)
    deployment = {"name": "row", **deployment}
    deployment["workload"] = {"arrival": "trace", "trace": f"{slug}.csv",
                              "input_tokens": "trace", "output_tokens": "trace"}
    data = {"name": f"calibration-{slug}", "seed": 0,
            "duration": f"{int(_REQUESTS * _GAP_S)}s", "hardware": hardware,
            "cluster": {"instances": 1}, "serve": [deployment]}
    text = _header(comment) + _dump(data)
    return ScenarioFile(Path(folder) / f"{slug}.yaml", text, _trace(input_tokens,
                                                                     output_tokens, batch))


def trn2_serving_files() -> list[ScenarioFile]:
    """The NxD Inference rows on one trn2.48xlarge (clustersim.calibration.trn2)."""
    from clustersim.calibration.trn2 import TRN2_SERVING, UNFITTED, UNSEEN_TRN2_SERVING

    out = []
    for row in TRN2_SERVING + UNSEEN_TRN2_SERVING:
        fitted = row in TRN2_SERVING and row.name not in UNFITTED
        kind = "fitted" if fitted else ("set apart" if row in TRN2_SERVING else "unseen")
        if row.input_tokens == 10000 and "405b" in row.model:
            buckets = [2048, 4096, 10240, 12288]  # the 405B tutorials compile these
        elif row.input_tokens == 10000:
            # --max-context-length 12288 --enable-bucketing: generate_buckets(128, 12288)
            buckets = [128, 256, 512, 1024, 2048, 4096, 8192, 12288]
        else:  # the prefix-caching tutorial: context-encoding buckets 512 to 8,192
            buckets = [512, 1024, 2048, 4096, 8192]
        server = {"max_batch": 1 if row.input_tokens == 10000 else 4,
                  "max_tokens_per_iteration": 16384, "chunked_prefill": False,
                  "buckets": buckets}
        model = "llama3.3-70b" if row.model == "llama3.1-70b" else row.model
        deployment: dict[str, Any] = {"model": model, "stack": "nxd-inference",
                                      "precision": row.precision,
                                      "parallelism": {"tp": row.tp}, "server": server}
        if row.draft:
            deployment["speculative"] = {"draft": row.draft, "tokens": row.speculative_tokens,
                                         "precision": "bf16", "fused": True}
        comment = [f"{row.name} ({kind} row): {row.source}.",
                   f"Published TTFT p50 {row.ttft_ms} ms"
                   + (f", TPOT p50 {row.tpot_ms} ms." if row.tpot_ms else "."),
                   "One request at a time (the trace beside this file); NxD Inference's "
                   "compiled context-encoding buckets.",
                   "Written by scripts/calibration_scenarios.py; run by "
                   "scripts/calibrate_serving.py."]
        out.append(_serving_file("serving", f"trn2-{row.name}", comment, "trn2", deployment,
                                 row.input_tokens, max(row.output_tokens, 2)))
    return out


def model_serving_files() -> list[ScenarioFile]:
    """2025's models (clustersim.calibration.models_serving) on one trn2.48xlarge: the
    DeepSeek-V3 port with its own stack and its one 512-token context graph (its row and its
    vLLM batches, each batch one group of requests arriving together), Qwen3-32B with NxD
    Inference's; on one p5en.48xlarge: DeepSeek-V3 through SGLang at batch 1, 8 and 32."""
    from clustersim.calibration import models_serving as ms

    note = "Written by scripts/calibration_scenarios.py; run by scripts/calibrate_serving.py."
    port = {"model": "deepseek-v3", "stack": ms.CONTRIB_STACK, "precision": "bf16",
            "parallelism": {"tp": 64}}
    row = ms.DEEPSEEK_TRN2
    out = [_serving_file(
        "serving", "trn2-deepseek-v3-256-256-nxd-inference-contrib",
        [f"{row.name} (fitted row: its TPOT and TTFT, and the port's stack): {row.source}.",
         f"Published TTFT p50 {row.ttft_ms} ms, TPOT p50 {row.tpot_ms} ms.",
         "One request at a time (the trace beside this file), padded to the port's one "
         "context graph (seq_len 512, no bucketing).", note], "trn2",
        {**port, "server": {"max_batch": 1, "chunked_prefill": False,
                            "buckets": [row.prefill_tokens]}},
        row.input_tokens, row.output_tokens)]
    for batch in ms.DEEPSEEK_VLLM_BATCHES:
        out.append(_serving_file(
            "serving", f"trn2-deepseek-v3-vllm-batch-{batch.batch}",
            [f"{batch.name} (judging row, the port's stack through vLLM): {batch.source}.",
             f"Published inter-token latency {batch.tpot_ms} ms at batch {batch.batch}.",
             "Each group of requests arrives together and decodes as one batch (the trace "
             "beside this file).", note], "trn2",
            {**port, "stack": batch.stack,
             "server": {"max_batch": batch.batch, "chunked_prefill": False,
                                "max_tokens_per_iteration": 16384,
                                "buckets": [row.prefill_tokens]}},
            batch.input_tokens, batch.output_tokens, batch.batch))
    for batch in ms.SGLANG_H200:
        out.append(_serving_file(
            "serving", f"p5en-deepseek-v3-sglang-batch-{batch.batch}",
            [f"{batch.name} ({'fitted' if batch is ms.SGLANG_H200[0] else 'judging'} row, "
             f"stack {batch.stack}): {batch.source}.",
             f"Published {1000 * batch.batch / batch.tpot_ms:.2f} output tokens/s at batch "
             f"{batch.batch} (TPOT {batch.tpot_ms:.2f} ms); read as 8 x H200 (p5en).",
             "Each group of requests arrives together and decodes as one batch (the trace "
             "beside this file).", note], batch.hardware,
            {"model": batch.model, "stack": batch.stack,
             "precision": {"weights": batch.precision, "activations": batch.activations,
                           "kv_cache": "bf16"},
             "parallelism": {"tp": batch.tp},
             "server": {"max_batch": batch.batch, "max_tokens_per_iteration": 16384}},
            batch.input_tokens, batch.output_tokens, batch.batch))
    row = ms.QWEN3_TRN2
    out.append(_serving_file(
        "serving", "trn2-qwen3-32b-128-512-nxd-inference",
        [f"{row.name} (judging row, stack nxd-inference: nothing fitted on it): "
         f"{row.source}.",
         f"Published TTFT {row.ttft_ms} ms (p99), TPOT {row.tpot_ms:.2f} ms: the p99 "
         f"end-to-end {ms.QWEN3_E2E_MS:,.1f} ms less the TTFT over 511 tokens (LLMPerf "
         "counted the 512 Qwen3 tokens as 558 with its default Llama 2 tokenizer).",
         "One request at a time (the trace beside this file).", note], "trn2",
        {"model": "qwen3-32b", "stack": "nxd-inference", "precision": "bf16",
         "parallelism": {"tp": 64}, "server": {"max_batch": 1, "chunked_prefill": False}},
        row.input_tokens, row.output_tokens))
    return out


def trinity_files() -> list[ScenarioFile]:
    """Arcee Trinity through NxD Inference's contrib port (clustersim.calibration.trinity):
    each compiled batch of the test's short prompt encoded and decoded together, on the
    port's stack with its context and token-generation buckets (judging rows)."""
    from clustersim.calibration import trinity as tr

    out = []
    for row in tr.TRINITY_ROWS:
        buckets = list(tr.CONTEXT_BUCKETS)
        instance = "trn2.48xlarge" if row.tp == 64 else "trn2.3xlarge (one chip)"
        comment = [f"{row.model} on {instance}, TP {row.tp}, batch {row.batch} (judging row, "
                   f"stack nxd-inference-contrib: nothing fitted on it): {tr.SOURCE}.",
                   f"Published TTFT {row.ttft_ms:g} ms, {row.tkg_ms:g} ms per generated token.",
                   f"Each group of {row.batch} request(s) arrives together: its prompts, "
                   f"{tr.PROMPT_TOKENS} tokens, run padded to the 128-token context bucket.",
                   "Written by scripts/calibration_scenarios.py; run by "
                   "scripts/stack_tables.py."]
        out.append(_serving_file(
            "serving", tr.row_name(row), comment, "trn2",
            {"model": row.model, "stack": "nxd-inference-contrib", "precision": "bf16",
             "parallelism": {"tp": row.tp},
             "server": {"max_batch": row.batch, "chunked_prefill": False,
                        "max_tokens_per_iteration": 16384, "buckets": buckets,
                        "token_buckets": buckets}},
            tr.PROMPT_TOKENS, tr.OUTPUT_TOKENS, row.batch))
    return out


def optimum_neuron_files() -> list[ScenarioFile]:
    """optimum-neuron's own vLLM benchmark rows on Trainium2 (clustersim.calibration.
    optimum_neuron), stack optimum-neuron@0.4: one request at a time (guidellm's
    synchronous rows)."""
    from clustersim.calibration import optimum_neuron as on

    out = []
    for row in on.ROWS:
        kind = "fitted: its inter-token latency" if row in on.FITTED else "judging"
        comment = [f"{row.model} on {row.instance}, TP {row.tp}, compiled batch {row.batch}, "
                   f"sequence length {row.sequence_length} ({kind}; stack {on.STACK}): "
                   f"{row.source}.",
                   f"Published TTFT {row.ttft_ms:.1f} ms, inter-token latency {row.itl_ms:.2f} "
                   f"ms ({row.input_tokens} in / {row.output_tokens} out, the benchmark's means).",
                   "One request at a time (the trace beside this file).",
                   "Written by scripts/calibration_scenarios.py; run by "
                   "scripts/calibrate_serving.py."]
        out.append(_serving_file("serving", on.row_name(row), comment, "trn2",
                                 on.row_scenario(row), row.input_tokens, row.output_tokens))
    return out


def trn1_serving_files() -> list[ScenarioFile]:
    """The transformers-neuronx rows on one trn1.32xlarge (clustersim.calibration.serving),
    each with its release's stack; a batch of 4 is one static batch, as the benchmark ran."""
    from clustersim.calibration.serving import SERVING_MEASUREMENTS, UNSEEN_SERVING_218

    out = []
    for row in SERVING_MEASUREMENTS + UNSEEN_SERVING_218:
        stack = f"transformers-neuronx@{row.sdk}"
        kind = "fitted" if row in SERVING_MEASUREMENTS or row.sdk == "2.18.1" else "unseen"
        server = {"max_batch": row.batch,
                  "max_tokens_per_iteration": max(row.batch * row.input_tokens, 8192),
                  "chunked_prefill": False, "static_batch": row.batch > 1}
        deployment = {"model": row.model, "stack": stack, "precision": "bf16",
                      "parallelism": {"tp": 32}, "server": server}
        name = f"trn1-{row.model}-sdk{row.sdk}-b{row.batch}-{row.input_tokens}-{row.output_tokens}"
        comment = [f"{row.model} batch {row.batch}, {row.input_tokens} in / {row.output_tokens} "
                   f"out, SDK {row.sdk} ({kind} row of stack {stack}): {row.source}.",
                   f"Published TTFT p50 {row.ttft_ms} ms, TPOT p50 {row.tpot_ms} ms.",
                   "One request (or one static batch) at a time (the trace beside this file).",
                   "Written by scripts/calibration_scenarios.py; run by "
                   "scripts/calibrate_serving.py."]
        out.append(_serving_file("serving", name, comment, "trn1", deployment,
                                 row.input_tokens, row.output_tokens, row.batch))
    return out


def trn1_token_latency_files() -> list[ScenarioFile]:
    """The SDK 2.14 and 2.16 transformers-neuronx rows (clustersim.calibration.serving:
    latency per token over input and output tokens) on one trn1.32xlarge, each with its
    release's stack (clustersim.calibration.serving_stacks)."""
    from clustersim.calibration.serving import UNSEEN_SERVING
    from clustersim.calibration.serving_stacks import release_rows

    out = []
    for row in UNSEEN_SERVING:
        stack = f"transformers-neuronx@{row.sdk}"
        kind = ("fitted" if row in release_rows(stack)[0]
                else "withdrawn" if row.withdrawn else "unseen")
        server = {"max_batch": 1, "max_tokens_per_iteration": max(row.input_tokens, 8192),
                  "chunked_prefill": False, "static_batch": False}
        deployment = {"model": row.model, "stack": stack, "precision": "bf16",
                      "parallelism": {"tp": 32}, "server": server}
        name = f"trn1-{row.model}-sdk{row.sdk}-b1-{row.input_tokens}-{row.output_tokens}"
        comment = [f"{row.model} batch 1, {row.input_tokens} in / {row.output_tokens} out, SDK "
                   f"{row.sdk} ({kind} row of stack {stack}): {row.source}.",
                   f"Published: {row.ms_per_token} ms per token (the request's time over its "
                   "input plus output tokens: TTFT + TPOT x (output - 1), over both).",
                   "One request at a time (the trace beside this file).",
                   "Written by scripts/calibration_scenarios.py; run by "
                   "scripts/calibrate_serving.py."]
        if row.withdrawn:
            comment.insert(2, f"Withdrawn: {row.withdrawn}.")
        out.append(_serving_file("serving", name, comment, "trn1", deployment,
                                 row.input_tokens, row.output_tokens))
    return out


def trn1_file(row) -> Path:
    return file_for("serving", f"trn1-{row.model}-sdk{row.sdk}-b{row.batch}-"
                               f"{row.input_tokens}-{row.output_tokens}")


# --------------------------------------------------------------------------- GPU serving

def gpu_name(row) -> str:
    """A TensorRT-LLM max-throughput row's file name (without the folder and suffix)."""
    version = ("0.17" if "v0.17" in row.source else "1.0" if "overview 1.0" in row.source
               else "-moe")
    ep = f"-ep{row.ep}" if row.ep > 1 else ""
    return (f"gpu-{row.model}-{row.hardware}-tp{row.tp}{ep}-{row.input_tokens}-"
            f"{row.output_tokens}-trtllm{version}")


def gpu_serving_files() -> list[ScenarioFile]:
    """TensorRT-LLM's max-throughput rows (clustersim.calibration.gpu_serving) on p5 (H100)
    and p5en (H200): every request queued at once, stack tensorrt-llm."""
    from clustersim.calibration.gpu_serving import (
        GPU_SERVING,
        REQUESTS,
        UNSEEN_GPU_MIXTURES,
        UNSEEN_GPU_OTHER,
        UNSEEN_GPU_SERVING,
        requests_of,
        scenario_dict,
    )

    out = []
    for row in GPU_SERVING + UNSEEN_GPU_SERVING + UNSEEN_GPU_OTHER + UNSEEN_GPU_MIXTURES:
        kind = "fitted" if row in GPU_SERVING else "unseen"
        requests = requests_of(row)
        page = REQUESTS[(row.input_tokens, row.output_tokens)]
        data = scenario_dict(row, requests, row.hardware)
        data["name"] = f"calibration-{_slug(gpu_name(row))}"
        shape = f"TP {row.tp}" + (f", EP {row.ep}" if row.ep > 1 else "")
        comment = [f"{row.model} on {row.hardware}, {shape}, {row.input_tokens} in / "
                   f"{row.output_tokens} out ({kind} row of stack tensorrt-llm): {row.source}.",
                   f"Published: {row.output_tokens_per_s:,g} output tokens/s of the TP group "
                   "(trtllm-bench: all output tokens over the time to the last completion).",
                   f"{requests:,} requests queued at once (the page queued {page:,}: identical "
                   "requests reach the steady state long before).",
                   "Written by scripts/calibration_scenarios.py; run by "
                   "scripts/calibrate_serving.py (the figure from the run's requests)."]
        if row in UNSEEN_GPU_MIXTURES:
            comment[1:1] = [
                "A mixture: the page's figure per GPU times the GPUs; the stack has no fitted "
                "MoE time (docs/calibration.md)." + (
                    " MXFP4 expert weights read as weights only, bf16 activations and KV "
                    "cache (GPT-OSS's own checkpoint on Hopper)." if row.precision == "mxfp4"
                    else " Attention data-parallel on the page (DEP), split by heads here.")]
        out.append(ScenarioFile(Path("serving") / f"{_slug(gpu_name(row))}.yaml",
                                _header(comment) + _dump(data)))
    return out


# ------------------------------------------------------------------------------ training

def training_files() -> list[ScenarioFile]:
    """Every training row (clustersim.calibration.step) with its schedule as the model runs
    it (published, or chosen by the fastest-that-fits rule and written down)."""
    from clustersim.calibration.step import STEP_MEASUREMENTS, _model, choose_schedule

    out = []
    for m in STEP_MEASUREMENTS:
        micro, interleave = choose_schedule(m)
        raw_job: dict[str, Any] = {
            "name": "row", "model": _model(m.model), "seq_len": m.seq_len,
            "global_batch": m.global_batch,
            "micro_batch": micro, "parallelism": {**m.parallelism, **(
                {"interleave": interleave} if interleave > 1 else {})},
            "precision": "bf16", "recompute": m.recompute, "attention": m.attention}
        kind = "fitted" if m.visible else "unseen"
        metric = {"sequences_per_s": "sequences/s", "hfu": "hardware FLOPs utilisation",
                  "step_time_s": "seconds a step"}[m.metric]
        comment = [f"{m.name} ({kind} row, {m.family} family): {m.source}.",
                   f"Published: {m.measured:g} {metric}." + (f" {m.notes}." if m.notes else ""),
                   "Written by scripts/calibration_scenarios.py; run by "
                   "scripts/validate_model.py (clustersim step)."]
        data = {"name": f"calibration-{_slug(m.name)}", "hardware": m.hardware,
                "cluster": {"instances": m.instances}, "jobs": [raw_job]}
        out.append(ScenarioFile(Path("training") / f"{_slug(m.name)}.yaml",
                                _header(comment) + _dump(data)))
    return out


def all_files() -> list[ScenarioFile]:
    return trn2_serving_files() + model_serving_files() + optimum_neuron_files() \
        + trinity_files() \
        + trn1_serving_files() + trn1_token_latency_files() \
        + gpu_serving_files() + training_files()


def write_files(root: Path = CALIBRATION_DIR) -> list[Path]:
    written = []
    for f in all_files():
        path = root / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f.text, encoding="utf-8")
        written.append(path)
        if f.trace is not None:
            trace = path.with_suffix(".csv")
            trace.write_text(f.trace, encoding="utf-8")
            written.append(trace)
    return written


def file_for(kind: str, name: str, root: Path = CALIBRATION_DIR) -> Path:
    """The scenario file of a row (`kind` serving or training; `name` the row's name, with
    the `trn2-` prefix for Trn2 serving rows)."""
    return root / kind / f"{_slug(name)}.yaml"


# ----------------------------------------------------------------------------------- runs

def run_serving_row(path: Path) -> tuple[float, float | None]:
    """(TTFT p50 s, TPOT p50 s or None) of the scenario's deployment, as `clustersim run`
    computes them (the same loader and simulator, nothing written)."""
    import math

    from clustersim.runner.api import simulate
    from clustersim.scenario.loader import load_scenario

    summary = simulate(load_scenario(path), seed=0).summary
    figures = summary["deployments"]["row"]
    tpot = figures.get("tpot_p50_s")
    return figures["ttft_p50_s"], (None if tpot is None or not math.isfinite(tpot) else tpot)


def run_throughput_row(path: Path) -> float:
    """The scenario's deployment's output tokens/s as trtllm-bench counts them (all output
    tokens over the time to the last completion), from the requests `clustersim run`
    simulates (requests.parquet's columns), nothing written."""
    from clustersim.calibration.gpu_serving import bench_throughput
    from clustersim.runner.api import simulate
    from clustersim.scenario.loader import load_scenario

    result = simulate(load_scenario(path), seed=0)
    return bench_throughput(result.serving.fleets["row"])


def run_training_row(path: Path, metric: str) -> float:
    """The scenario's job in `metric` (sequences_per_s, hfu or step_time_s), as `clustersim
    step` computes it."""
    from clustersim.runner.api import step_profiles
    from clustersim.scenario.loader import load_scenario

    scenario = load_scenario(path)
    (profile,) = step_profiles(scenario).values()
    return getattr(profile, metric)
