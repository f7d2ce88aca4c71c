"""Serving keys under adversarial use (session 14): keys a run ignored and figures that
disagreed, found by trying them as a demanding user would."""

from __future__ import annotations

from pathlib import Path

from cli_helpers import invoke, refused, write


def _deployment(**keys: object) -> dict:
    return {"name": "chat", "model": "llama3-8b", "parallelism": {"tp": 8}, "replicas": 1,
            "workload": {"arrival": "poisson", "rate": "1/s", "input_tokens": 512,
                         "output_tokens": 64}, **keys}


def _scenario(tmp_path: Path, *serve: dict) -> Path:
    return write(tmp_path, {"name": "h14", "duration": "30s", "hardware": "trn2",
                            "cluster": {"instances": 1}, "serve": list(serve)})


def test_a_routing_skew_on_a_dense_model_exits_2(tmp_path: Path) -> None:
    """A dense Llama 3 8B with `routing_skew: 0.5` ran exactly as without it."""
    out = tmp_path / "out"
    result = invoke("run", _scenario(tmp_path, _deployment(routing_skew=0.5)), "-o", out)
    refused(result, "serve.0.routing_skew = 0.5", "dense")
    assert not out.exists()
