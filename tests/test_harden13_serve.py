"""Serving surfaces under adversarial use (session 13): answers that moved the wrong way,
crashes and lost data found by trying them as a demanding user would."""

from __future__ import annotations

import numpy as np
import pytest

from clustersim.scenario.loader import scenario_from_dict
from clustersim.serving.simulate import replica_models


def _replica(hardware: str, model: str, tp: int, **deployment: object):
    """The iteration model of one replica of a one-deployment scenario."""
    serve = {"name": "chat", "model": model, "parallelism": {"tp": tp}, "replicas": 1,
             "workload": {"arrival": "poisson", "rate": "1/s", "input_tokens": 512,
                          "output_tokens": 64}, **deployment}
    s = scenario_from_dict({"name": "h13", "duration": "1h", "hardware": hardware,
                            "cluster": {"instances": 1}, "serve": [serve]})
    return replica_models(s, s.serve[0])[0].target


@pytest.mark.parametrize("lengths", [range(2040, 2090), range(4090, 4130)])
def test_a_blockwise_prefill_does_not_get_faster_with_a_longer_prompt(lengths: range) -> None:
    """optimum-neuron's blockwise MoE context encoding subtracted the routed experts' work
    exactly where the iteration model had added it on its 32-token grid: at 2,049 tokens
    (each expert's 128 tokens crossing a tile) the whole step came off and a 2,049-token
    prompt encoded in 1,150.8 ms against 1,165.6 ms for 2,048."""
    it = _replica("trn2", "qwen3-30b-a3b", 4, stack="optimum-neuron@0.4")
    ttft = np.array([it.prefill_s(n) for n in lengths])
    assert (np.diff(ttft) >= 0).all(), [
        (lengths[i], lengths[i + 1]) for i in np.flatnonzero(np.diff(ttft) < 0)]
