"""Published GPU serving throughput: the TensorRT-LLM performance overview's max-throughput runs.

Fitted (the H100 rows of the page whose data was "generated using version 0.17"):
Llama 3.1 8B on one H100 (TP 1) and Llama 3.1 70B on two (TP 2), FP8 weights and FP8 KV
cache, `trtllm-bench throughput`: every request of a fixed input and output length queued at
once (30,000 for 128/128; 3,000 for 128/2048, 2048/128, 1000/1000, 500/2000; 1,500 for
128/4096, 2048/2048, 5000/500; 1,000 for 20000/2000), KV cache at 0.95 of the free memory.
The figure is the output tokens per second of the whole tensor-parallel group: all output
tokens over the time from the first request to the last completion.

The model runs the same thing through the serving simulator: one replica on p5 (H100), the
requests all arriving at once (a fixed count at the highest rate the scenario allows),
TensorRT-LLM's default in-flight batching limits (max_batch_size 2,048 and max_num_tokens
8,192, chunked context), and the throughput measured the same way (output tokens over the
time to the last completion). Request counts are the page's, scaled down to at most
`max_requests` (default 1,500; at least eight full batches' worth whenever the page had as
many) to keep a fit fast: with identical requests the steady state is reached long before.

Unseen (they judge, not fitted): the same page family's later tables (TensorRT-LLM 1.0,
PyTorch backend, the same methodology): H200 at TP 1 for Llama 3.1 8B and Llama 3.3 70B
(Llama 3.1 70B's shape), and the H100 TP 2 70B rows of that version beside the fitted ones;
then (`UNSEEN_GPU_OTHER`) Llama 3.1 405B at TP 8 on H200 and H100 and Llama 3.1 8B on one
H100 of that version; and (`UNSEEN_GPU_MIXTURES`) the page's later mixture tables, GPT-OSS
20B and 120B on one GPU and Qwen3-235B-A22B over four H200 or eight H100 with experts
parallel, which judge a stack with no fitted MoE time (docs/calibration.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ThroughputRow", "GPU_SERVING", "UNSEEN_GPU_SERVING", "UNSEEN_GPU_OTHER",
           "UNSEEN_GPU_MIXTURES",
           "predict_throughput",
           "NVLINK_ALL_REDUCE_US", "predict_tp_all_reduce", "scenario_dict", "requests_of",
           "bench_throughput"]

_V017 = "TensorRT-LLM performance overview (data generated with v0.17), FP8, max throughput"
_V10 = "TensorRT-LLM performance overview 1.0 (PyTorch backend), FP8, max throughput"

# (input, output): requests queued, as the page lists them.
REQUESTS = {(128, 128): 30000, (128, 2048): 3000, (128, 4096): 1500, (500, 2000): 3000,
            (1000, 1000): 3000, (2048, 128): 3000, (2048, 2048): 1500, (5000, 500): 1500,
            (20000, 2000): 1000, (1000, 2000): 1500, (1024, 1024): 3000, (1024, 8192): 1500,
            (8192, 1024): 1500, (32768, 1024): 1000}


@dataclass(frozen=True)
class ThroughputRow:
    model: str
    hardware: str
    tp: int
    input_tokens: int
    output_tokens: int
    output_tokens_per_s: float
    source: str = _V017
    ep: int = 1
    # fp8: ModelOpt FP8 checkpoints (W8A8, FP8 KV cache); mxfp4: MXFP4 expert weights read as
    # weights only (bf16 activations and KV cache), GPT-OSS's own checkpoint on Hopper
    precision: str = "fp8"


def _rows(model: str, hardware: str, tp: int, values: dict, source: str = _V017,
          ep: int = 1, precision: str = "fp8"):
    return tuple(ThroughputRow(model, hardware, tp, i, o, v, source, ep, precision)
                 for (i, o), v in values.items())


GPU_SERVING: tuple[ThroughputRow, ...] = _rows("llama3.1-8b", "p5", 1, {
    (128, 128): 28836.77, (128, 2048): 21109.38, (128, 4096): 13593.65,
    (500, 2000): 16500.69, (1000, 1000): 15244.78, (2048, 128): 3556.73,
    (2048, 2048): 9488.42, (5000, 500): 3559.36, (20000, 2000): 1401.31,
}) + _rows("llama3.1-70b", "p5", 2, {
    (128, 128): 6645.12, (128, 2048): 6169.58, (128, 4096): 3897.06,
    (500, 2000): 4972.57, (1000, 1000): 4390.53, (2048, 128): 772.66,
    (2048, 2048): 2898.16, (5000, 500): 919.73, (20000, 2000): 443.01,
})

UNSEEN_GPU_SERVING: tuple[ThroughputRow, ...] = _rows("llama3.1-8b", "p5en", 1, {
    (128, 128): 27911, (128, 2048): 26221, (128, 4096): 18027, (500, 2000): 20770,
    (1000, 1000): 17744, (1000, 2000): 16828, (2048, 128): 3538, (2048, 2048): 12194,
    (5000, 500): 3902, (20000, 2000): 1804,
}, _V10) + _rows("llama3.1-70b", "p5en", 1, {
    (128, 128): 3803, (128, 2048): 4336, (128, 4096): 2872, (500, 2000): 3666,
    (1000, 1000): 2909, (1000, 2000): 2994, (2048, 128): 442, (2048, 2048): 2003,
    (5000, 500): 566, (20000, 2000): 283,
}, _V10) + _rows("llama3.1-70b", "p5", 2, {
    (128, 128): 6378, (128, 2048): 6651, (128, 4096): 4199, (500, 2000): 5222,
    (1000, 1000): 4205, (1000, 2000): 4146, (2048, 128): 762, (2048, 2048): 3082,
    (5000, 500): 898, (20000, 2000): 437,
}, _V10)

# Unseen as well, the same TensorRT-LLM 1.0 page's other dense rows at H100/H200 FP8: Llama 3.1
# 405B at TP 8 (H200 and H100: a TP degree the fit never saw) and Llama 3.1 8B on one H100
# (the fitted rows' shape, a later version).
UNSEEN_GPU_OTHER: tuple[ThroughputRow, ...] = _rows("llama3.1-405b", "p5en", 8, {
    (128, 128): 3814, (128, 2048): 5348, (128, 4096): 4741, (500, 2000): 4724,
    (1000, 1000): 3330, (1000, 2000): 3722, (2048, 128): 456, (2048, 2048): 2948,
    (5000, 500): 650, (20000, 2000): 505,
}, _V10) + _rows("llama3.1-405b", "p5", 8, {
    (128, 128): 3627, (128, 2048): 4340, (128, 4096): 3116, (500, 2000): 3994,
    (1000, 1000): 2919, (1000, 2000): 2895, (2048, 128): 453, (2048, 2048): 2296,
    (5000, 500): 610, (20000, 2000): 345,
}, _V10) + _rows("llama3.1-8b", "p5", 1, {
    (128, 128): 28312, (128, 2048): 22714, (128, 4096): 14325, (500, 2000): 17660,
    (1000, 1000): 15220, (1000, 2000): 13899, (2048, 128): 3450, (2048, 2048): 9305,
    (5000, 500): 3459, (20000, 2000): 1351,
}, _V10)

# Unseen too, and of mixtures, where the tensorrt-llm stack has no fitted MoE time: the
# overview's later tables (NVIDIA/TensorRT-LLM docs/source/developer-guide/perf-overview.md at
# commit 03e27c7, PyTorch backend, the same trtllm-bench methodology), given per GPU and held
# here per group (times its GPUs). GPT-OSS 20B and 120B on one H200 or H100: the page's
# column says FP8, but its FP8 checkpoints list no GPT-OSS and its options run Hopper's MoE
# through Triton with the KV cache at "auto", so the rows run GPT-OSS's MXFP4 expert weights
# as weights only, bf16 activations and KV cache. Qwen3-235B-A22B (ModelOpt FP8) as "DEP4" on
# four H200 and "DEP8" on eight H100: attention data-parallel and experts parallel over the
# GPUs, which a deployment writes as tp = ep = the GPUs (its attention split by heads).
_MOE = ("TensorRT-LLM performance overview (docs at commit 03e27c7, PyTorch backend), "
        "max throughput, per GPU x GPUs")
UNSEEN_GPU_MIXTURES: tuple[ThroughputRow, ...] = _rows("gpt-oss-20b", "p5en", 1, {
    (1000, 1000): 13858, (1024, 1024): 13890, (1024, 8192): 12743, (8192, 1024): 4015,
    (32768, 1024): 915,
}, _MOE, precision="mxfp4") + _rows("gpt-oss-20b", "p5", 1, {
    (1000, 1000): 11557, (1024, 1024): 11403, (1024, 8192): 8617, (8192, 1024): 3366,
    (32768, 1024): 785,
}, _MOE, precision="mxfp4") + _rows("gpt-oss-120b", "p5en", 1, {
    (1000, 1000): 6868, (1024, 1024): 6798, (1024, 8192): 3543, (8192, 1024): 1828,
    (32768, 1024): 519,
}, _MOE, precision="mxfp4") + _rows("qwen3-235b-a22b", "p5en", 4, {
    (1000, 1000): 3288 * 4, (1024, 1024): 3268 * 4, (1024, 8192): 1417 * 4,
    (8192, 1024): 627 * 4, (32768, 1024): 134 * 4,
}, _MOE, ep=4) + _rows("qwen3-235b-a22b", "p5", 8, {
    (1000, 1000): 1932 * 8, (1024, 1024): 1935 * 8, (1024, 8192): 873 * 8,
}, _MOE, ep=8)

# TensorRT-LLM's custom all-reduce kernels on H100 (NVLink through NVSwitch), measured in
# sgl-project/sglang pull request 2904 without CUDA graphs: microseconds at TP 2, 4 and 8 by
# message size. The p5 entry's `serving.tp_link_efficiency` and `serving.tp_step_latency`
# are fitted to them (`scripts/calibrate_serving.py --fit-gpu`): the TP all-reduce of a
# decode step is one of these kernels, not NCCL's large-message ring.
_SGLANG = "sgl-project/sglang pull request 2904: TensorRT-LLM custom all-reduce on H100"
NVLINK_ALL_REDUCE_US: dict[int, tuple[float, float, float]] = {
    512: (3.7, 4.8, 5.9), 4096: (3.9, 3.7, 5.7), 32768: (4.5, 4.8, 7.8),
    262144: (7.9, 13.9, 16.7), 524288: (12.5, 20.2, 22.1), 1048576: (19.9, 31.1, 33.8),
}
ALL_REDUCE_TP = (2, 4, 8)


def predict_tp_all_reduce(hardware=None) -> list[tuple[int, int, float, float]]:
    """(bytes, tp, measured s, model s) of every point of NVLINK_ALL_REDUCE_US: the serving
    model's TP all-reduce of a replica on p5 (or on `hardware`, a HardwareSpec)."""
    from clustersim.hardware.build import build_topology
    from clustersim.hardware.catalog import catalog_entry
    from clustersim.serving.iteration import IterationModel, ReplicaShape
    from clustersim.training.transformer import TransformerShape, model_preset_values

    hardware = hardware or catalog_entry("p5")
    topology = build_topology(hardware, 1)
    model = TransformerShape(**model_preset_values("llama3.1-8b"))
    out = []
    for i, tp in enumerate(ALL_REDUCE_TP):
        replica = IterationModel(ReplicaShape(model, "bf16", tp, 1), topology)
        for size, times in NVLINK_ALL_REDUCE_US.items():
            out.append((size, tp, times[i] * 1e-6, replica.tp_all_reduce_s(size)))
    return out


MAX_BATCH = 2048  # TensorRT-LLM's default max_batch_size
MAX_TOKENS = 8192  # and max_num_tokens
KV_RESERVE = 0.05  # the KV cache takes 0.95 of the memory left


def requests_of(row: ThroughputRow, max_requests: int = 1500) -> int:
    """The requests a row's run queues: the page's count, at most `max_requests`."""
    return min(REQUESTS[(row.input_tokens, row.output_tokens)], max_requests)


def scenario_dict(row: ThroughputRow, requests: int, hardware: dict | str) -> dict:
    """The row as a scenario (`trtllm-bench throughput` as a user writes it): one replica
    of stack tensorrt-llm, every request queued at once (a fixed count at the highest rate
    a scenario allows), TensorRT-LLM's default in-flight batching limits."""
    precision = ({"weights": "mxfp4", "activations": "bf16", "kv_cache": "bf16"}
                 if row.precision == "mxfp4" else
                 # ModelOpt FP8 checkpoints: FP8 GEMMs on FP8 activations (W8A8), FP8 KV cache
                 {"weights": "fp8", "activations": "fp8", "kv_cache": "fp8"})
    return {
        "name": "trtllm-max-throughput", "seed": 0, "duration": "1h",
        "hardware": hardware, "cluster": {"instances": 1},
        "serve": [{
            "name": "row", "model": row.model, "stack": "tensorrt-llm",
            "precision": precision,
            "parallelism": {"tp": row.tp, **({"ep": row.ep} if row.ep > 1 else {})},
            "replicas": 1,
            "server": {"max_batch": MAX_BATCH, "max_tokens_per_iteration": MAX_TOKENS,
                       "chunked_prefill": True, "kv_precision": precision["kv_cache"],
                       "kv_reserve": KV_RESERVE},
            "workload": {"arrival": "poisson", "rate": "100000/s", "requests": requests,
                         "input_tokens": row.input_tokens,
                         "output_tokens": row.output_tokens},
            "slo": {"ttft": "1h", "tpot": "1h"},
        }],
    }


def bench_throughput(fleet) -> float:
    """trtllm-bench's figure from a run's requests (a `Fleet`, or requests.parquet's
    columns): all output tokens over the time from the first arrival to the last
    completion."""
    done = fleet.status == 1
    if not done.any():
        return 0.0
    span = float(fleet.finish_s[done].max() - fleet.arrival_s.min())
    return float(fleet.output_tokens[done].sum()) / span


def predict_throughput(rows: tuple[ThroughputRow, ...] = GPU_SERVING,
                       hardware: dict[str, dict | str] | None = None,
                       max_requests: int = 1500) -> list[float]:
    """Model output tokens/s of every row (its hardware, or `hardware[row.hardware]`: a
    catalog name or a `base:` mapping with trial constants), from the scenario its file
    holds (`scenario_dict`) run through the serving simulator."""
    from clustersim.scenario.loader import scenario_from_dict
    from clustersim.serving.simulate import simulate_serving

    out = []
    for row in rows:
        hw = (hardware or {}).get(row.hardware, row.hardware)
        scenario = scenario_from_dict(scenario_dict(row, requests_of(row, max_requests), hw))
        result = simulate_serving(scenario, np.random.SeedSequence(0))
        out.append(bench_throughput(result.fleets["row"]))
    return out
