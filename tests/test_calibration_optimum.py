"""vLLM on Neuron as optimum-neuron ships it (`stack: optimum-neuron@0.4`,
clustersim.calibration.optimum_neuron): its compiled decode batch (`server.decode_batch`) in
closed form and through `clustersim run`, its rows' scenario files, and its two constants
reproducing their fit."""

from __future__ import annotations

import pytest
import yaml

from clustersim.calibration import optimum_neuron as on
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.hardware.stacks import default_stack, stack_named
from clustersim.runner.api import simulate
from clustersim.scenario.loader import scenario_from_dict
from clustersim.serving.decode_cost import DecodeCost
from clustersim.serving.iteration import IterationModel, ReplicaShape
from clustersim.training.transformer import TransformerShape, model_preset_values


def _cost(model: str = "llama3.1-8b", tp: int = 4) -> DecodeCost:
    shape = TransformerShape(**model_preset_values(model))
    return DecodeCost(IterationModel(ReplicaShape(shape, "bf16", tp, 1),
                                     build_topology(catalog_entry("trn2"), 1)))


@pytest.mark.parametrize("batch, context, n", [(1, 1500, 249), (3, 4500, 10), (8, 800, 1)])
def test_compiled_decode_batch_in_closed_form(batch, context, n):
    """A decode run of `batch` sequences on a graph compiled for 32 lines: every iteration
    costs the 32 lines' base and reads 32/batch times the batch's own KV (idle lines read
    as far as the active ones)."""
    cost = _cost()
    kv = cost.kv_s * (n * context + batch * n * (n - 1) / 2.0)
    cost.decode_lines = 32
    assert cost.run_s(batch, context, n) == pytest.approx(
        n * cost.base_s(32) + 32 / batch * kv, rel=1e-12)
    # a full batch has no idle lines: the same as without the key
    full = cost.run_s(32, 32 * context, n)
    cost.decode_lines = 0
    assert full == pytest.approx(cost.run_s(32, 32 * context, n), rel=1e-12)


def test_interrupted_run_inverts_the_compiled_run():
    cost = _cost()
    cost.decode_lines = 16
    cost.token_buckets = (4096,)
    for elapsed in (0.0, 0.004, 0.3, 2.0, 11.1):
        j = cost.iterations_within(2, 3000, elapsed)
        assert cost.run_s(2, 3000, j) <= elapsed < cost.run_s(2, 3000, j + 1)


def _scenario(server: dict, stack: str = on.STACK) -> dict:
    return {"name": "o", "seed": 0, "duration": "1h", "hardware": "trn2",
            "cluster": {"instances": 1},
            "serve": [{"name": "d", "model": "llama3.1-8b", "stack": stack,
                       "parallelism": {"tp": 4},
                       "server": {"max_batch": 32, "chunked_prefill": False,
                                  "max_tokens_per_iteration": 4096, **server},
                       "workload": {"arrival": "poisson", "rate": "0.001/s", "requests": 1,
                                    "input_tokens": 1500, "output_tokens": 250}}]}


def _tpot(raw: dict) -> float:
    return simulate(scenario_from_dict(raw), seed=0).summary["deployments"]["d"]["tpot_p50_s"]


def test_the_stack_runs_its_compiled_batch_unless_the_key_says_otherwise():
    stack = stack_named(on.STACK)
    assert stack.decode_rule == "compiled" and stack.hardware == ("trn2", "trn2u")
    assert default_stack("trn2").name == "nxd-inference"  # trn2's default is unchanged
    compiled = _tpot(_scenario({}))
    assert _tpot(_scenario({"decode_batch": "compiled"})) == pytest.approx(compiled, rel=1e-12)
    active = _tpot(_scenario({"decode_batch": "active"}))
    assert active < compiled
    # another stack runs its active lines unless told
    nxd = _scenario({}, "nxd-inference")
    assert _tpot(nxd) < _tpot(_scenario({"decode_batch": "compiled"}, "nxd-inference"))


def test_a_bad_decode_batch_is_refused(tmp_path):
    from typer.testing import CliRunner

    from clustersim.cli.app import app
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_scenario({"decode_batch": "padded"})))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "decode_batch" in result.output and "padded" in result.output


def test_rows_as_published():
    """The benchmark's synchronous figures, as its CSV files give them."""
    by_model = {r.model: r for r in on.ROWS}
    assert by_model["llama3.1-8b"].itl_ms == pytest.approx(22.1356, abs=1e-3)
    assert by_model["qwen3-32b"].ttft_ms == pytest.approx(770.859, abs=1e-2)
    assert [r.tp for r in on.ROWS] == [4, 4, 4, 64, 64, 64]
    assert on.FITTED == tuple(r for r in on.ROWS if r.model in ("llama3.1-8b", "qwen3-32b"))


def test_trial_path_is_the_scenario_run_at_the_catalog_constants():
    """The fit's trial runs (trn2 with the constants, the compiled shapes written out) give
    what the scenario file gives with the stack's catalog constants."""
    own = dict(stack_named(on.STACK).serving)
    for row in on.FITTED:
        assert on.run_row(row, {k: own[k] for k in on.FIT_KEYS}) == pytest.approx(
            on.run_row(row), rel=1e-9)


@pytest.mark.slow
def test_catalog_constants_reproduce_their_fit():
    """`calibrate_serving.py --fit-optimum` from the trn2 entry's NxD Inference values
    lands on the catalog's constants (hbm_efficiency at its bound 1.0), and the fitted rows'
    inter-token latencies are within 10%; fails if a constant is moved off its fit."""
    trn2 = catalog_entry("trn2").serving
    fit = on.fit_stack({"hbm_efficiency": trn2.hbm_efficiency,
                        "iteration_overhead_s": trn2.iteration_overhead_s})
    own = dict(stack_named(on.STACK).serving)
    for key in on.FIT_KEYS:
        assert fit[key] == pytest.approx(own[key], rel=0.01), key
    for row in on.FITTED:
        _, itl = on.run_row(row)
        assert abs(itl * 1e3 / row.itl_ms - 1) < 0.10


def _flat(name: str) -> str:
    from pathlib import Path
    page = Path(__file__).resolve().parent.parent / "docs" / name
    return " ".join(page.read_text(encoding="utf-8").split())


def test_the_pages_quote_the_scenario_runs():
    """docs/calibration.md's and docs/serving.md's optimum-neuron figures are the scenario
    runs' errors (model / published - 1) and the stack's catalog constants."""
    runs = {r.model: on.run_row(r) for r in on.ROWS}
    ttft = {m: runs[m][0] * 1e3 / r.ttft_ms - 1 for m, r in zip(runs, on.ROWS, strict=True)}
    itl = {m: runs[m][1] * 1e3 / r.itl_ms - 1 for m, r in zip(runs, on.ROWS, strict=True)}
    moe = [r.model for r in on.ROWS if r not in on.FITTED]
    own = dict(stack_named(on.STACK).serving)
    every = [on.run_row(r, {**{k: own[k] for k in on.FIT_KEYS},
                            "moe_prefill": "every-expert"})[0] * 1e3 / r.ttft_ms - 1
             for r in on.ROWS if r not in on.FITTED]
    fitted = f"{itl['llama3.1-8b']:+.1%} (8B) and {itl['qwen3-32b']:+.1%} (32B)"
    judged = f"{ttft['llama3.1-8b']:+.1%} and {ttft['qwen3-32b']:+.1%}"
    spread = (f"{min(itl[m] for m in moe):+.1%} (Scout) to "
              f"{max(itl[m] for m in moe):+.1%} (Qwen3-235B-A22B")
    prefill = (f"{round(max(ttft[m] for m in moe) * 100)}% to "
               f"{round(min(ttft[m] for m in moe) * 100)}%")  # nearest first
    overhead = f"{own['iteration_overhead_s'] * 1e3:.2f} ms"
    assert min(itl, key=lambda m: itl[m] if m in moe else 9) == "llama4-scout"
    calibration = _flat("calibration.md")
    for quoted in (f"inter-token {fitted}", f"their TTFTs, {judged}", spread,
                   f"their TTFTs, {prefill}", overhead,
                   f"brings them to {round(max(every) * 100)}% to {round(min(every) * 100)}%"):
        assert quoted in calibration, quoted
    serving = _flat("serving.md")
    for quoted in (f"are {itl['llama3.1-8b']:+.1%} and {itl['qwen3-32b']:+.1%}",
                   f"judge at {ttft['llama3.1-8b']:+.1%} and {ttft['qwen3-32b']:+.1%}",
                   spread.replace("(Scout)", "(Llama 4 Scout)") + ")",
                   f"TTFTs are {prefill}", overhead):
        assert quoted in serving, quoted
