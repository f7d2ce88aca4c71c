"""The fuzz's 2025-model surface (scripts/fuzz.py `models`): mixtures of experts with expert
parallelism, multi-head latent attention and sliding windows, trained and served through
the serving stacks with their buckets and decode batching, keys mutated, run from the
command line as a user would. `make_model_surfaces(mutate, dump)` gives fuzz.py's SURFACES
entry; the generator takes fuzz.py's key mutation and YAML dump so both files mutate alike.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

# Small shapes of each 2025 variant: a training step of them simulates in milliseconds.
SMALL_MOE = {"name": "small-moe", "layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 4,
             "head_dim": 64, "ffn_hidden": 2816, "vocab": 32000, "experts": 16, "top_k": 2,
             "shared_experts": 1, "expert_ffn_hidden": 512, "dense_layers": 1}
SMALL_MLA = {**SMALL_MOE, "name": "small-mla", "kv_heads": 16, "attention": "mla",
             "q_lora_rank": 256, "kv_lora_rank": 128, "qk_rope_head_dim": 32,
             "qk_nope_head_dim": 64, "v_head_dim": 64}
SMALL_WINDOW = {"name": "small-window", "layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 4,
                "ffn_hidden": 2816, "vocab": 32000, "window": 128, "window_kind": "sliding",
                "global_every": 2, "tied_embeddings": True}
MODELS = {
    "name": "models", "hardware": "trn2", "duration": "6h", "cluster": {"instances": 3},
    "jobs": [{"name": "moe", "model": SMALL_MLA, "global_batch": 64, "seq_len": 2048,
              "parallelism": {"tp": 4, "dp": 32, "ep": 8, "zero": 3},
              "checkpoint": {"interval": "auto", "write": "30s"}}],
    "serve": [{"name": "chat", "model": "qwen3-30b-a3b", "stack": "nxd-inference",
               "parallelism": {"tp": 16, "ep": 4}, "replicas": 1,
               "server": {"max_batch": 16, "buckets": [128, 512, 1024]},
               "workload": {"arrival": "poisson", "rate": "2/s", "requests": 100,
                            "input_tokens": {"distribution": "lognormal", "median": 64,
                                             "sigma": 0.5, "max": 512},
                            "output_tokens": 16},
               "slo": {"ttft": "1s", "tpot": "100ms"}}],
    "failures": {"preset": "llama3", "scale": 10},
    "trace": {"enabled": True, "bin": "1h"},
}
# (dotted key, value) replacing the base's before the mutations.
MODEL_EXTRA = [
    ("jobs.0.model", SMALL_MOE), ("jobs.0.model", SMALL_WINDOW), ("jobs.0.model", "qwen3-8b"),
    ("jobs.0.model", "gpt-oss-20b"), ("jobs.0.model", "mixtral-8x7b"),
    ("jobs.0.parallelism", {"tp": 4, "dp": 32, "ep": 4, "zero": 1, "order": "tp-cp-ep-pp-dp"}),
    ("jobs.0.parallelism", {"tp": 4, "pp": 2, "dp": 16, "ep": 16, "zero": 1}),
    ("jobs.0.parallelism", {"tp": 8, "cp": 2, "dp": 8, "ep": 8, "zero": 3}),
    ("serve.0.model", "qwen3-8b"), ("serve.0.model", "gpt-oss-20b"),
    ("serve.0.model", "qwen3-32b"), ("serve.0.model", SMALL_MLA), ("serve.0.model", SMALL_WINDOW),
    ("serve.0.stack", "optimum-neuron@0.4"), ("serve.0.stack", "nxd-inference-contrib"),
    ("serve.0.stack", "transformers-neuronx@2.18.1"), ("serve.0.stack", "tensorrt-llm"),
    ("serve.0.parallelism", {"tp": 64, "ep": 8}), ("serve.0.parallelism", {"tp": 4}),
    ("serve.0.server", {"max_batch": 8, "decode_batch": "compiled",
                        "token_buckets": [256, 1024]}),
    ("serve.0.server", {"max_batch": 4, "buckets": [], "chunked_prefill": False}),
    ("serve.0.precision", "fp8"), ("hardware", "trn2u"), ("hardware", "trn3-gen2"),
    ("hardware", "p5en"),
]


def _put(raw: dict[str, Any], dotted: str, value: Any) -> None:
    node: Any = raw
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[parts[-1]] = copy.deepcopy(value)


def models_case(mutate: Callable, dump: Callable) -> Any:
    @st.composite
    def case(draw: Any) -> dict[str, Any]:
        """The 2025-model scenario with up to two variants put in and keys of its job or
        deployment mutated; validate, run (with traces) or step."""
        raw = copy.deepcopy(MODELS)
        for _ in range(draw(st.integers(0, 2))):
            key, value = draw(st.sampled_from(MODEL_EXTRA))
            _put(raw, key, value)
        mutate(draw, raw, (draw(st.sampled_from(["jobs", "serve"])),), (0, 3),
               keys=("extra", "ep", "window", "experts", "buckets", "stack", "1"))
        command = draw(st.sampled_from(["validate", "run", "run", "step"]))
        args = [command, "scenario.yaml"] + (["-o", "out"] if command == "run" else [])
        if command == "step" and draw(st.booleans()):
            args.append("--json")
        return {"files": {"scenario.yaml": dump(raw)}, "args": args}
    return case()


def make_model_surfaces(mutate: Callable, dump: Callable) -> dict[str, Callable[[], Any]]:
    return {"models": lambda: models_case(mutate, dump)}
