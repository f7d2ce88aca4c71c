"""The 2026 model surfaces under adversarial use (session 16), found by trying them as a
demanding user would: a capacity factor past every token, disaggregated pools the
outputs did not show, a model on another model's port stack, a draft of another
tokenizer, and (beside, in
tests/test_harden14_serve.py and tests/test_mixture_fit_flag.py) MX activations on Trn3 and
the planner's note on hardware without a stack."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import invoke, refused, write


def _job(**keys: object) -> dict:
    return {"name": "q30", "model": "qwen3-30b-a3b", "global_batch": 1024, "seq_len": 4096,
            "parallelism": {"tp": 4, "pp": 4, "dp": 64, "ep": 16, "order": "tp-cp-ep-pp-dp",
                            "zero": 1}, **keys}


def _scenario(tmp_path: Path, job: dict) -> Path:
    return write(tmp_path, {"name": "h16", "duration": "1d", "hardware": "trn2",
                            "cluster": {"instances": 16}, "jobs": [job]})


@pytest.mark.parametrize("command", ["step", "validate"])
def test_a_capacity_factor_past_every_token_is_refused(tmp_path: Path, command: str) -> None:
    """capacity_factor 17 on Qwen3-30B-A3B (128 experts, top 8) was accepted and padded
    every expert to 17x its mean tokens, past the 16x that is every token (128.5 GiB a
    chip): an expert's capacity beyond every routed token is padding none fills."""
    result = invoke(command, _scenario(tmp_path, _job(capacity_factor=17)))
    refused(result, "jobs.0.capacity_factor = 17", "at most 16", "128 experts over top_k 8")


def test_a_capacity_factor_of_every_token_is_accepted(tmp_path: Path) -> None:
    result = invoke("validate", _scenario(tmp_path, _job(capacity_factor=16)))
    assert result.exit_code == 0, result.output


def _serving(tmp_path: Path, **deployment: object) -> Path:
    serve = {"name": "m", "model": "llama3.1-8b", "parallelism": {"tp": 4}, "replicas": 2,
             "workload": {"arrival": "poisson", "rate": "2/s", "input_tokens": 512,
                          "output_tokens": 32}, **deployment}
    return write(tmp_path, {"name": "h16s", "duration": "1min", "hardware": "trn2",
                            "cluster": {"instances": 1}, "serve": [serve]})


def test_disaggregated_pools_are_in_the_run_table_and_the_summary(tmp_path: Path) -> None:
    """Separate prefill and decode pools ran (their TPOT differed from one pool's) but
    neither the run table nor summary.json said so: '2 replicas of tp 64' either way."""
    import json

    out = tmp_path / "out"
    scenario = _serving(tmp_path, disaggregated={"prefill_replicas": 1, "decode_replicas": 1})
    result = invoke("run", scenario, "-o", out)
    assert result.exit_code == 0, result.output
    table = " ".join(result.output.replace("│", " ").split())
    assert "disaggregated: a prefill pool of 1 replica and a decode pool of 1 replica" in table
    pools = json.loads((out / "summary.json").read_text())["deployments"]["m"]["disaggregated"]
    assert pools["prefill_replicas"] == 1 and pools["decode_replicas"] == 1
    # over the instance's own chips: well under the prefill of the 1,024 tokens it moves
    assert 0 < pools["kv_transfer_s_per_1k_tokens"] < 0.1
    together = tmp_path / "together"
    result = invoke("run", _serving(tmp_path), "-o", together)
    assert result.exit_code == 0, result.output
    assert "prefill pool" not in " ".join(result.output.replace("│", " ").split())
    summary = json.loads((together / "summary.json").read_text())
    assert summary["deployments"]["m"]["disaggregated"] is None


def test_a_model_on_another_models_port_stack_is_warned(tmp_path: Path) -> None:
    """Llama 3.1 70B on nxd-inference-contrib (the DeepSeek-V3 port's script) ran with the
    port's 1.5 ms host time an iteration, its TPOT 30% under NxD Inference's, with no word."""
    scenario = _serving(tmp_path, model="llama3.1-70b", parallelism={"tp": 16}, replicas=1,
                        stack="nxd-inference-contrib")
    result = invoke("run", scenario, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    table = " ".join(result.output.replace("│", " ").split())
    assert "warning: nxd-inference-contrib is the script of NxD Inference's contrib ports" \
        in table
    ported = _serving(tmp_path, model="trinity-nano", stack="nxd-inference-contrib-vllm")
    result = invoke("run", ported, "-o", tmp_path / "ported")
    assert result.exit_code == 0, result.output
    assert "contrib ports" not in " ".join(result.output.replace("│", " ").split())


def test_a_draft_of_another_tokenizer_is_refused(tmp_path: Path) -> None:
    """A Qwen3-8B draft (151,936 tokens) for a Llama 3.1 70B target (128,256) was accepted:
    its proposals could never be the target's tokens."""
    spec = {"draft": "qwen3-8b", "tokens": 4}
    scenario = _serving(tmp_path, model="llama3.1-70b", parallelism={"tp": 16}, replicas=1,
                        speculative=spec)
    refused(invoke("validate", scenario), "serve.0.speculative.draft = 'qwen3-8b'",
            "151,936 tokens, the target's 128,256")
    same = _serving(tmp_path, model="llama3.1-70b", parallelism={"tp": 16}, replicas=1,
                    speculative={"draft": "llama3.2-1b", "tokens": 4})
    assert invoke("validate", same).exit_code == 0
