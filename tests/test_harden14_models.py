"""Model keys under adversarial use (session 14): written values the step model dropped or
capped without a word, found by trying them as a demanding user would."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import invoke, refused, write


def _moe_job(tmp_path: Path, ep: int, **keys: object) -> Path:
    job = {"name": "j", "model": "qwen3-30b-a3b", "seq_len": 4096, "global_batch": 64,
           "parallelism": {"tp": 8, "dp": 8, "ep": ep}, **keys}
    return write(tmp_path, {"name": "h14", "duration": "1h", "hardware": "trn2",
                                     "cluster": {"instances": 1}, "jobs": [job]})


@pytest.mark.parametrize("ep, keys, words", [
    # ep 8 ran a routing_imbalance of 9 (or 100) as 8: the same step as 8, no note
    (8, {"routing_imbalance": 9}, ("jobs.0.routing_imbalance = 9.0", "at most 8")),
    # ep 1 ran any imbalance as 1
    (1, {"routing_imbalance": 1.5}, ("jobs.0.routing_imbalance = 1.5", "ep 1")),
    # a capacity factor replaced a written imbalance
    (8, {"routing_imbalance": 1.5, "capacity_factor": 1.2},
     ("jobs.0.routing_imbalance = 1.5", "capacity_factor")),
])
def test_a_routing_imbalance_the_step_would_not_use_exits_2(tmp_path: Path, ep: int,
                                                             keys: dict, words: tuple) -> None:
    result = invoke("step", _moe_job(tmp_path, ep, **keys), "--json")
    refused(result, *words)


def test_a_routing_imbalance_up_to_ep_still_sets_the_step(tmp_path: Path) -> None:
    """The largest load ep allows is accepted and costs more than a balanced one."""
    import json

    times = []
    for imbalance in (1, 8):
        result = invoke("step", _moe_job(tmp_path, 8, routing_imbalance=imbalance), "--json")
        assert result.exit_code == 0, result.output
        times.append(json.loads(result.stdout)["jobs"][0]["step_time_s"])
    assert times[1] > times[0]


def _model_job(tmp_path: Path, model: object) -> Path:
    job = {"name": "j", "model": model, "seq_len": 4096, "global_batch": 64,
           "parallelism": {"tp": 8, "dp": 8}}
    return write(tmp_path, {"name": "h14", "duration": "1h", "hardware": "trn2",
                            "cluster": {"instances": 1}, "jobs": [job]})


SMALL = {"layers": 4, "hidden": 1024, "heads": 8, "vocab": 32000}


def test_a_window_kind_without_a_window_exits_2(tmp_path: Path) -> None:
    """`window_kind: chunked` without a window ran as a model with no window at all."""
    result = invoke("step", _model_job(tmp_path, {**SMALL, "window_kind": "chunked"}))
    refused(result, "jobs.0.model.window_kind = 'chunked'", "needs a window")


def test_window_null_takes_a_presets_window_kind_and_global_layers_away(tmp_path: Path
                                                                         ) -> None:
    """`{base: llama4-scout, window: null}` was refused for a global_every the user never
    wrote ('needs a window'); it is the preset without its chunked attention."""
    import json

    figures = []
    for window in (None, 1 << 20):  # no window, and one no sequence reaches
        result = invoke("step", _model_job(tmp_path, {"base": "llama4-scout",
                                                      "window": window}), "--json",
                        "--ignore-memory")
        assert result.exit_code == 0, result.output
        figures.append(json.loads(result.stdout)["jobs"][0])
    assert figures[0]["parameters"] == figures[1]["parameters"]
    assert figures[0]["step_time_s"] == pytest.approx(figures[1]["step_time_s"], rel=1e-12)


@pytest.mark.parametrize("every, words", [
    (1, "makes every layer global"),  # ran as if the window were not written
    (9, "leaves none of the 4 layers global"),  # ran as if global_every were not written
])
def test_a_global_every_that_leaves_the_window_or_itself_unused_exits_2(
        tmp_path: Path, every: int, words: str) -> None:
    model = {**SMALL, "window": 128, "global_every": every}
    result = invoke("step", _model_job(tmp_path, model))
    refused(result, f"jobs.0.model.global_every = {every}", words)


@pytest.mark.parametrize("key, value", [("head_dim", 64), ("kv_heads", 8)])
def test_a_head_dim_or_kv_heads_mla_does_not_use_exits_2(tmp_path: Path, key: str,
                                                          value: int) -> None:
    """`{base: deepseek-v3, head_dim: 64}` (or kv_heads: 8) gave the same parameters and
    step time as the preset: MLA's widths are its own ranks'."""
    model = {"base": "deepseek-v3", "layers": 4, "dense_layers": 1, key: value}
    result = invoke("validate", _model_job(tmp_path, model))
    refused(result, f"jobs.0.model.{key} = {value}", "unused with attention: mla")


def test_an_mla_model_needs_no_head_dim_when_heads_do_not_divide_hidden(tmp_path: Path
                                                                        ) -> None:
    """100 heads on DeepSeek-V3's 7,168 were refused 'give head_dim', a key MLA ignores."""
    model = {"base": "deepseek-v3", "layers": 4, "dense_layers": 1, "heads": 100,
             "kv_heads": None}
    result = invoke("validate", _model_job(tmp_path, model))
    assert result.exit_code == 0, result.output


def test_qk_norm_on_an_mla_model_exits_2(tmp_path: Path) -> None:
    """`{base: deepseek-v3, qk_norm: true}` added no weights (the count's norms are per
    GQA head) yet model FLOPs took 2 x head_dim a layer off for them."""
    model = {"base": "deepseek-v3", "layers": 4, "dense_layers": 1, "qk_norm": True}
    result = invoke("validate", _model_job(tmp_path, model))
    refused(result, "jobs.0.model.qk_norm = true", "only with attention: gqa")


@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_a_planned_scenario_keeps_a_routing_imbalance_run_accepts(tmp_path: Path) -> None:
    """`plan` chooses ep and costs a routing_imbalance capped at it (1 without expert
    parallelism); --write-scenario kept the written 3 beside the chosen ep 1, a scenario
    `run` refuses (routing_imbalance above ep)."""
    import yaml

    job = {"name": "j", "model": {"name": "tiny-moe", "layers": 4, "hidden": 1024,
                                  "heads": 8, "vocab": 32000, "experts": 8, "top_k": 2},
           "seq_len": 2048, "global_batch": 64, "routing_imbalance": 3}
    path = write(tmp_path, {"name": "h14", "duration": "1d", "hardware": "trn2",
                            "cluster": {"instances": 2}, "jobs": [job]})
    planned = tmp_path / "planned.yaml"
    result = invoke("plan", path, "-o", tmp_path / "plan", "--write-scenario", planned)
    assert result.exit_code == 0, result.output
    written = yaml.safe_load(planned.read_text())["jobs"][0]
    assert written["routing_imbalance"] == min(3, written["parallelism"]["ep"])
    assert invoke("validate", planned).exit_code == 0


def test_replicated_kv_heads_hold_whole_heads_of_activations():
    """4 KV heads at tp 8: each rank keeps a whole KV head's keys and values (replicated, as
    NxD and Megatron lay them out). The closed-form path counted half a head a rank, so a
    window no sequence reaches (which takes the per-layer path) changed the memory: 6.502
    against 6.534 GiB."""
    from clustersim.scenario.loader import scenario_from_dict
    from clustersim.training.memory import activation_bytes_per_layer

    def job(window):
        model = {"name": "gqa", "layers": 8, "hidden": 2048, "heads": 16, "kv_heads": 4,
                 "vocab": 32000}
        if window:
            model.update({"window": window, "global_every": 2})
        s = scenario_from_dict({
            "name": "m", "hardware": "trn2", "cluster": {"instances": 4},
            "jobs": [{"name": "j", "model": model, "seq_len": 4096, "global_batch": 64,
                      "parallelism": {"tp": 8, "dp": 8}}]})
        return s.jobs[0]

    plain, windowed = job(None), job(8192)
    assert activation_bytes_per_layer(plain) == pytest.approx(
        activation_bytes_per_layer(windowed), rel=1e-12)
