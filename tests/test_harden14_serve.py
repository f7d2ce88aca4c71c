"""Serving keys under adversarial use (session 14): keys a run ignored and figures that
disagreed, found by trying them as a demanding user would."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import invoke, refused, write


def _deployment(**keys: object) -> dict:
    return {"name": "chat", "model": "llama3-8b", "parallelism": {"tp": 8}, "replicas": 1,
            "workload": {"arrival": "poisson", "rate": "1/s", "input_tokens": 512,
                         "output_tokens": 64}, **keys}


def _scenario(tmp_path: Path, *serve: dict, hardware: str = "trn2") -> Path:
    return write(tmp_path, {"name": "h14", "duration": "30s", "hardware": hardware,
                            "cluster": {"instances": 1}, "serve": list(serve)})


def test_a_routing_skew_on_a_dense_model_exits_2(tmp_path: Path) -> None:
    """A dense Llama 3 8B with `routing_skew: 0.5` ran exactly as without it."""
    out = tmp_path / "out"
    result = invoke("run", _scenario(tmp_path, _deployment(routing_skew=0.5)), "-o", out)
    refused(result, "serve.0.routing_skew = 0.5", "llama3-8b is dense")
    assert not out.exists()


def test_a_saturated_deployment_with_none_completed_prints_its_throughput(tmp_path: Path
                                                                          ) -> None:
    """With no request completed inside the horizon the run table left out the throughput
    line (summary.json's requests_per_s 0, output_tokens_per_s and slo_goodput 0) yet said
    'the throughput above is what the deployment sustains' under nothing."""
    import json

    long = _deployment(model="llama3.1-70b", parallelism={"tp": 16},
                       workload={"arrival": "poisson", "rate": "2/s", "input_tokens": 8192,
                                 "output_tokens": 256})
    out = tmp_path / "out"
    result = invoke("run", _scenario(tmp_path, long), "-o", out)
    assert result.exit_code == 0, result.output
    d = json.loads((out / "summary.json").read_text())["deployments"]["chat"]
    assert d["saturated"] and d["requests_completed"] == 0, d
    text = " ".join(result.output.replace("│", " ").split())
    line = (f"0 requests, 0.00/s, {d['output_tokens_per_s']:,.0f} output tokens/s within the "
            f"horizon; SLO goodput {d['slo_goodput']:.1%}")
    assert line in text, text
    assert text.index(line) < text.index("the throughput above")


def test_an_mx_kv_cache_exits_2_naming_its_key(tmp_path: Path) -> None:
    """`precision: {weights: mxfp4, kv_cache: mxfp4}` passed validation and the run died
    with 'internal error: KeyError: 'mxfp4'' (the KV cache has no MX format)."""
    out = tmp_path / "out"
    gpt = _deployment(model="gpt-oss-20b", parallelism={"tp": 4},
                      precision={"weights": "mxfp4", "kv_cache": "mxfp4"})
    result = invoke("run", _scenario(tmp_path, gpt), "-o", out)
    refused(result, "serve.0.precision.kv_cache = 'mxfp4'", "'fp8'")
    assert not out.exists()


def test_an_activation_format_without_a_peak_names_the_activations_key(tmp_path: Path
                                                                       ) -> None:
    """The user wrote `activations: mxfp4` and the message named `serve.0.precision`
    (which the user had written as a mapping), as if the weights were refused."""
    gpt = _deployment(model="gpt-oss-20b", parallelism={"tp": 4},
                      precision={"weights": "mxfp4", "activations": "mxfp4"})
    result = invoke("validate", _scenario(tmp_path, gpt))
    refused(result, "serve.0.precision.activations = 'mxfp4'", "'fp8'")


@pytest.mark.parametrize("command", ["validate", "run", "plan"])
def test_mx_activations_are_refused_where_the_chip_has_their_peak(tmp_path: Path,
                                                                  command: str) -> None:
    """`activations: mxfp8` on trn3 (which has an MXFP8 peak) passed the peak check and
    stopped validate, run and plan with 'internal error: KeyError: 'mxfp8''. MX formats
    are weights' formats (`precision: mxfp8` runs MXFP8 matmuls with 16-bit activations):
    the activations key is refused by name."""
    gpt = _deployment(model="gpt-oss-20b", parallelism={"tp": 4},
                      precision={"weights": "mxfp8", "activations": "mxfp8"})
    scenario = _scenario(tmp_path, gpt, hardware="trn3-gen2")  # (its MXFP8 peak)
    args = ["-o", tmp_path / "out"] if command == "run" else []
    result = invoke(command, scenario, *args)
    refused(result, "serve.0.precision.activations = 'mxfp8'", "'fp8'")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model, tp, max_batch", [("trinity-large", 64, 64),
                                                   ("trinity-mini", 4, 256),
                                                   ("gpt-oss-20b", 4, 256)])
def test_the_kv_cache_it_admits_fits_the_chip_with_its_sliding_window_layers(
        model: str, tp: int, max_batch: int) -> None:
    """Sliding-window layers' caches (window tokens a sequence) were left to the HBM
    reserve, and the KV capacity counted the global layers' alone. Trinity-Large at TP 64 on
    trn2 admitted 150 sequences of 9,216 tokens: 46 GiB of weights, 40 GiB of global KV and
    53 GiB of sliding-window KV on a 96 GiB chip. Now every sequence the capacity admits,
    with its window on each sliding layer, fits the chip's HBM less the reserve."""
    from clustersim.scenario.loader import scenario_from_dict
    from clustersim.serving.attention import layer_split
    from clustersim.serving.simulate import replica_models

    longest = 8192 + 1024
    serve = _deployment(model=model, parallelism={"tp": tp}, server={"max_batch": max_batch},
                        workload={"arrival": "poisson", "rate": "1/s", "input_tokens": 8192,
                                  "output_tokens": 1024})
    s = scenario_from_dict({"name": "h14", "duration": "1h", "hardware": "trn2",
                            "cluster": {"instances": 1}, "serve": [serve]})
    cost, capacity, _ = replica_models(s, s.serve[0])
    it, m = cost.target, s.serve[0].model
    global_layers, windowed = layer_split(m, longest)
    assert global_layers and windowed
    per_token = it.kv_bytes_per_token_per_chip()  # the global layers'
    window_per_sequence = per_token * windowed / global_layers * m.window
    held = min(max_batch, capacity // longest)
    assert held > 0
    needed = it.weight_bytes_per_chip() + held * (longest * per_token + window_per_sequence)
    assert needed <= it.usable_hbm_bytes(s.serve[0].server.kv_reserve)


def test_an_unknown_parallelism_key_of_a_deployment_is_named_as_one(tmp_path: Path) -> None:
    """`parallelism: {tp: 8, cp: 2}` said "serve.0.parallelism.cp.[key] = 'cp': expected
    'tp', 'pp' or 'ep'", pydantic's location of a mapping's key, not a key path."""
    moe = _deployment(model="qwen3-30b-a3b", parallelism={"tp": 8, "cp": 2})
    result = invoke("validate", _scenario(tmp_path, moe))
    refused(result, "serve.0.parallelism.cp: unknown key; expected 'tp', 'pp' or 'ep'")
    assert "[key]" not in result.stderr


@pytest.mark.parametrize("server, default", [({}, " (the default)"),
                                             ({"chunked_prefill": True}, "")])
def test_buckets_with_chunked_prefill_exit_2(tmp_path: Path, server: dict, default: str
                                             ) -> None:
    """`server: {buckets: [128, 1024]}` with chunked prefill (the default) ran exactly as
    without the list: a chunk's shape is compiled and no prompt is padded."""
    d = _deployment(server={"buckets": [128, 1024], **server})
    result = invoke("validate", _scenario(tmp_path, d))
    refused(result, "serve.0.server.buckets = [128, 1024]",
            f"chunked_prefill is true{default}", "chunked_prefill: false")
    for fine in ({"buckets": [128, 1024], "chunked_prefill": False}, {"buckets": []}):
        result = invoke("validate", _scenario(tmp_path, _deployment(server=fine)))
        assert result.exit_code == 0, (fine, result.output)


def test_a_disaggregated_prefill_sends_its_sliding_window_layers_too() -> None:
    """The KV transfer from a prefill to a decode replica sent the global layers' keys and
    values only: Trinity-Mini's 1,000-token prompt (inside its 2,048-token window on 24 of
    32 layers) sent 8 layers' worth, a quarter of the cache the decode replica needs. Sent
    bytes now equal a prompt of the same length on a model without the window."""
    from clustersim.scenario.loader import scenario_from_dict
    from clustersim.serving.simulate import replica_models

    def transfer(model: object):
        serve = _deployment(model=model, parallelism={"tp": 4}, replicas=2,
                            disaggregated={"prefill_replicas": 1, "decode_replicas": 1},
                            workload={"arrival": "poisson", "rate": "1/s",
                                      "input_tokens": 8192, "output_tokens": 1024})
        s = scenario_from_dict({"name": "h14", "duration": "1h", "hardware": "trn2",
                                "cluster": {"instances": 1}, "serve": [serve]})
        return replica_models(s, s.serve[0])[2]

    windowed = transfer("trinity-mini")
    whole = transfer({"base": "trinity-mini", "window": None})
    assert windowed(1000) == pytest.approx(whole(1000), rel=1e-12)
    # past the window the sliding layers send their last 2,048 tokens only
    assert windowed(2048) == pytest.approx(whole(2048), rel=1e-12)
    assert windowed(6000) < whole(6000)
