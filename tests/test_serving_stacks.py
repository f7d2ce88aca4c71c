"""Serving stacks and compiled context-encoding buckets (`serve[].stack`,
`serve[].server.buckets`): the stack's default buckets as it ships them, a prompt padded to
its bucket through the same code `clustersim run` runs, and bad values refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cli_helpers import refused, set_key
from typer.testing import CliRunner

from clustersim.cli.app import app
from clustersim.hardware.stacks import (
    default_stack,
    known_stacks,
    padded_tokens,
    stack_buckets,
    stack_named,
)
from clustersim.runner.api import simulate
from clustersim.scenario.loader import scenario_from_dict

runner = CliRunner()
NXDI = stack_named("nxd-inference")


def _scenario(server: dict, stack: str | None = "nxd-inference", hardware: str = "trn2",
              prompt: int = 10000) -> dict:
    deployment = {"name": "l70", "model": "llama3.1-70b", "parallelism": {"tp": 64},
                  "server": {"max_batch": 1, "max_tokens_per_iteration": 16384, **server},
                  "workload": {"arrival": "poisson", "rate": "0.001/s", "requests": 1,
                               "input_tokens": prompt, "output_tokens": 2}}
    if stack:
        deployment["stack"] = stack
    return {"name": "buckets", "seed": 0, "duration": "2h", "hardware": hardware,
            "cluster": {"instances": 1}, "serve": [deployment]}


@pytest.mark.parametrize("longest, expected", [
    (128, (128,)), (512, (128, 256, 512)), (1000, (128, 256, 512, 1000)),
    # the 70B tutorial's --max-context-length 12288: 10,000 tokens run the 12,288 bucket
    (12288, (128, 256, 512, 1024, 2048, 4096, 8192, 12288)),
    (10000, (128, 256, 512, 1024, 2048, 4096, 10000)),
])
def test_nxd_inference_buckets_as_generate_buckets_makes_them(longest, expected):
    assert stack_buckets(NXDI, longest) == expected


def test_padding_to_the_next_bucket_and_beyond_the_largest():
    buckets = (2048, 4096, 10240, 12288)  # the 405B tutorial's
    assert padded_tokens(10000, buckets) == 10240
    assert padded_tokens(2048, buckets) == 2048
    assert padded_tokens(100, buckets) == 2048
    assert padded_tokens(30000, buckets) == 2 * 12288 + 10240
    assert padded_tokens(777, ()) == 777


def test_default_stack_per_hardware():
    assert default_stack("trn2").name == default_stack("trn2u").name == "nxd-inference"
    assert default_stack("trn1").name == "transformers-neuronx@2.18.0"
    assert default_stack("p5en").name == "tensorrt-llm"
    assert default_stack("trn3-gen1") is None


def _ttft(raw: dict) -> float:
    result = simulate(scenario_from_dict(raw), seed=0)
    return result.summary["deployments"]["l70"]["ttft_p50_s"]


def test_a_prompt_encoded_whole_costs_its_bucket():
    """10,000 tokens in the 12,288 bucket cost what 12,288 tokens cost unpadded, more than
    10,000 unpadded; with chunked prefill nothing is padded (the chunk's shape is
    compiled: a bucket list there is refused, tests/test_harden14_serve.py); the stack's
    default (buckets up to the longest prompt) pads nothing here."""
    tutorial = [128, 256, 512, 1024, 2048, 4096, 8192, 12288]
    padded = _ttft(_scenario({"chunked_prefill": False, "buckets": tutorial}))
    bare = _ttft(_scenario({"chunked_prefill": False, "buckets": []}))
    whole = _ttft(_scenario({"chunked_prefill": False, "buckets": []}, prompt=12288))
    assert padded == pytest.approx(whole, rel=1e-9)
    assert padded > 1.15 * bare
    chunked = _ttft(_scenario({"chunked_prefill": True}))  # (with buckets: exit 2)
    assert chunked < padded
    assert _ttft(_scenario({"chunked_prefill": False})) == pytest.approx(bare, rel=1e-9)


@pytest.mark.parametrize("path, value, needle", [
    ("serve.0.server.buckets", [256, 128], "must increase"),
    ("serve.0.server.buckets", [0, 128], "token count"),
    ("serve.0.server.buckets", [128, 128], "must increase"),
    ("serve.0.server.buckets", list(range(1, 100)), "at most 64"),
    ("serve.0.server.buckets", [10**9], "token count"),
    ("serve.0.server.buckets", "many", "expected a list"),
    ("serve.0.server.token_buckets", [4096, 2048], "must increase"),
    ("serve.0.server.token_buckets", [-1], "token count"),
    ("serve.0.server.buckets", [True, 256], "not true or false"),  # True is not 1 token
    ("serve.0.server.token_buckets", [128, False], "not true or false"),
    ("serve.0.stack", "vllm-gpu", "known: " + ", ".join(known_stacks())),
    ("serve.0.stack", "tensorrt-llm", "runs on p5"),
])
def test_bad_bucket_and_stack_values_exit_2_with_the_key(tmp_path: Path, path, value, needle):
    raw = _scenario({"chunked_prefill": False})
    set_key(raw, path, value)
    file = tmp_path / "bad.yaml"
    file.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(file), "-o", str(out)])
    refused(result, path.rsplit(".", 1)[0] if path.endswith("buckets") else path, needle)
    if path.endswith("buckets"):
        assert path.rsplit(".", 1)[1] in result.output
    assert not out.exists()


def test_transformers_neuronx_releases_are_two_stacks_each_on_its_own_rows():
    """SDK 2.18.1's six Llama 3 70B rows within 10% on TTFT and TPOT with its release's
    stack (they were up to +49% on TTFT with 2.18.0's constants); trn1's default stays
    2.18.0, whose constants are the trn1 entry's own."""
    from clustersim.calibration.serving import predict_serving
    from clustersim.calibration.serving_stacks import (
        RELEASE_2181,
        predict_release,
        release_rows,
    )
    rows, unseen = release_rows(RELEASE_2181)
    assert len(rows) == 6 and not unseen and all(r.sdk == "2.18.1" for r in rows)
    for row, (ttft, tpot) in zip(rows, predict_release(RELEASE_2181, rows), strict=True):
        assert abs(ttft * 1e3 / row.ttft_ms - 1) < 0.10, (row, ttft)
        assert abs(tpot * 1e3 / row.tpot_ms - 1) < 0.10, (row, tpot)
    old = predict_serving(rows=rows)
    assert max(t * 1e3 / r.ttft_ms - 1 for r, (t, _) in zip(rows, old, strict=True)) > 0.4
    assert default_stack("trn1").name == "transformers-neuronx@2.18.0"
    assert not default_stack("trn1").serving and stack_named(RELEASE_2181).serving


def test_release_constants_reproduce_their_fit():
    """The catalog's 2.18.1 constants are the fit's minimum (`python
    scripts/calibrate_serving.py --fit-release` prints them): 3% either way (inside the
    bounds) raises the rows' summed squared log errors."""
    from clustersim.calibration.serving_stacks import (
        _BOUNDS,
        RELEASE_2181,
        RELEASE_FITTED,
        _loss,
        release_rows,
    )
    rows, _ = release_rows(RELEASE_2181)
    values = dict(stack_named(RELEASE_2181).serving)
    assert set(values) == set(RELEASE_FITTED)
    best = _loss(RELEASE_2181, rows, values)
    for key in RELEASE_FITTED:
        for factor in (0.97, 1.03):
            trial = values[key] * factor
            if _BOUNDS[key][0] <= trial <= _BOUNDS[key][1]:
                assert _loss(RELEASE_2181, rows, {**values, key: trial}) > best, (key, factor)


def test_a_release_stack_runs_its_constants_through_clustersim_run():
    """Llama 3 70B at TP 32 on trn1, a 2,048-token prompt: the 2.18.1 stack encodes it
    faster than the default 2.18.0, as its rows do."""
    def raw(stack):
        data = _scenario({"chunked_prefill": False}, stack=stack, hardware="trn1", prompt=2048)
        data["serve"][0].update(model="llama3-70b", parallelism={"tp": 32})
        return data
    assert _ttft(raw("transformers-neuronx@2.18.1")) < 0.85 * _ttft(raw(None))
    assert _ttft(raw("transformers-neuronx@2.18.0")) == pytest.approx(_ttft(raw(None)))


def test_the_stack_is_in_summary_json_and_the_run_table(tmp_path: Path):
    """The deployment's stack (the hardware's default when the scenario gives none) is
    written in summary.json and printed beside the model in the run table."""
    import json

    for stack, expected in ((None, "nxd-inference"), ("nxd-inference", "nxd-inference")):
        raw = _scenario({"chunked_prefill": False}, stack=stack)
        file = tmp_path / f"s-{stack}.yaml"
        file.write_text(yaml.safe_dump(raw))
        out = tmp_path / f"out-{stack}"
        result = runner.invoke(app, ["run", str(file), "-o", str(out)],
                               env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert f"llama3.1-70b on {expected}" in result.output
        summary = json.loads((out / "summary.json").read_text())
        assert summary["deployments"]["l70"]["stack"] == expected
    raw = _scenario({}, stack=None, hardware="trn3-gen1")
    raw["cluster"] = {"instances": 4}
    raw["serve"][0]["server"] = {"max_batch": 1}
    summary = simulate(scenario_from_dict(raw), seed=0).summary
    assert summary["deployments"]["l70"]["stack"] is None


def test_a_static_batch_encodes_its_prompts_as_one_graph():
    """transformers-neuronx's batch of four 1,024-token Llama 2 70B prompts at TP 32 on trn1:
    as one static batch the unfused scores of the four share the SRAM and spill (the
    published batch-4 rows), encoded one by one they fit; the key changes nothing else."""
    def raw(static):
        data = _scenario({"chunked_prefill": False, "static_batch": static, "max_batch": 4},
                         stack=None, hardware="trn1", prompt=1024)
        data["serve"][0].update(model="llama2-70b", parallelism={"tp": 32})
        data["serve"][0]["workload"] = {"arrival": "poisson", "rate": "0.001/s",
                                        "requests": 1, "input_tokens": 1024,
                                        "output_tokens": 2}
        return data
    assert _ttft(raw(True)) == pytest.approx(_ttft(raw(False)))  # one prompt: the same
    from clustersim.serving.simulate import replica_models
    for static in (True, False):
        s = scenario_from_dict(raw(static))
        cost, _, _ = replica_models(s, s.serve[0])
        assert cost.static_batch is static
    s = scenario_from_dict(raw(True))
    cost, _, _ = replica_models(s, s.serve[0])
    together = cost.prefill_s([(1024, 0)] * 4, 0, 0.0, 4)
    cost.static_batch = False
    assert together > 1.1 * cost.prefill_s([(1024, 0)] * 4, 0, 0.0, 4)


def _tpot(raw: dict) -> float:
    result = simulate(scenario_from_dict(raw), seed=0)
    return result.summary["deployments"]["l70"]["tpot_p50_s"]


def _trn1_decode(server: dict, stack: str | None = None) -> dict:
    """Llama 2 13B at TP 32 on trn1: a 128-token prompt decoding 8,064 tokens, so most of
    its steps read a long KV cache."""
    raw = _scenario(server, stack=stack, hardware="trn1", prompt=128)
    raw["serve"][0].update(model="llama2-13b", parallelism={"tp": 32})
    raw["serve"][0]["workload"]["output_tokens"] = 8064
    raw["duration"] = "4h"
    return raw


def test_token_buckets_as_written_or_the_stacks():
    """`server.token_buckets`: transformers-neuronx's own list written out runs as its
    default; [] reads only the tokens held (a faster decode); one bucket of the compiled
    length reads it at every step (slower than the stack's powers of two)."""
    from clustersim.hardware.stacks import stack_token_buckets

    default = _tpot(_trn1_decode({}))
    tnx = list(stack_token_buckets(default_stack("trn1"), 128 + 8064))
    assert tnx == [128, 256, 512, 1024, 2048, 4096, 8192]
    assert _tpot(_trn1_decode({"token_buckets": tnx})) == pytest.approx(default, rel=1e-12)
    bare = _tpot(_trn1_decode({"token_buckets": []}))
    one = _tpot(_trn1_decode({"token_buckets": [8192]}))
    assert bare < default < one
    # a stack without token buckets (NxD Inference on trn2) pads when the key says so
    assert _tpot(_scenario({"token_buckets": [16384]})) > _tpot(_scenario({}))
