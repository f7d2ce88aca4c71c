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
    bare = [a / (r.ttft_ms * 1e-3) - 1 for r in on.ROWS if r not in on.FITTED
            for a, _ in (on.blockwise_ttft_line(r),)]
    fitted = f"{itl['llama3.1-8b']:+.1%} (8B) and {itl['qwen3-32b']:+.1%} (32B)"
    judged = f"{ttft['llama3.1-8b']:+.1%} and {ttft['qwen3-32b']:+.1%}"
    spread = (f"{min(itl[m] for m in moe):+.1%} (Scout) to "
              f"{max(itl[m] for m in moe):+.1%} (Qwen3-235B-A22B")
    element = f"{own['blockwise_element_s'] * 1e12:.1f} ps per element"
    qwen = (f"-{-ttft['qwen3-30b-a3b']:.1%} (Qwen3-30B-A3B) and {ttft['qwen3-235b-a22b']:+.1%}"
            " (Qwen3-235B-A22B)")
    llama = f"{ttft['llama4-scout']:+.1%} (Llama 4 Scout) and "\
        f"{ttft['llama4-maverick']:+.1%} (Llama 4 Maverick)"
    blocks = "191 for both Qwen3-MoE models, 23 for Scout, 135 for Maverick"
    overhead = f"{own['iteration_overhead_s'] * 1e3:.2f} ms"
    assert min(itl, key=lambda m: itl[m] if m in moe else 9) == "llama4-scout"
    assert own["moe_prefill"] == "blockwise"
    calibration = _flat("calibration.md")
    for quoted in (f"inter-token {fitted}", f"their TTFTs, {judged}", spread, overhead,
                   element, f"TTFT {qwen}", f"TTFT {llama}", blocks,
                   f"leaves the TTFTs at {round(max(bare) * 100)}% to "
                   f"{round(min(bare) * 100)}%"):
        assert quoted in calibration, quoted
    serving = _flat("serving.md")
    for quoted in (f"are {itl['llama3.1-8b']:+.1%} and {itl['qwen3-32b']:+.1%}",
                   f"judge at {ttft['llama3.1-8b']:+.1%} and {ttft['qwen3-32b']:+.1%}",
                   spread.replace("(Scout)", "(Llama 4 Scout)") + ")", overhead, element,
                   qwen, f"{ttft['llama4-scout']:+.1%} (Scout) and "
                   f"{ttft['llama4-maverick']:+.1%} (Maverick)",
                   "191 a layer for the Qwen3 mixtures, 23 for Scout, 135 for Maverick"):
        assert quoted in serving, quoted


def test_the_rows_run_forward_blockwise_and_the_constant_is_linear():
    """Each mixture row's 4,096-token graph takes NxD's blockwise path, and its TTFT grows
    by moe_layers x blocks x 512 x hidden times the stack's `blockwise_element` (closed
    form, the blocks from the source's formula)."""
    from clustersim.serving.experts import blockwise_blocks, context_moe_path, moe_layer_count
    for row in on.ROWS:
        if row in on.FITTED:
            continue
        m = TransformerShape(**model_preset_values(row.model))
        assert context_moe_path(row.sequence_length, m.top_k, m.experts) == "blockwise"
        _, slope = on.blockwise_ttft_line(row)
        blocks = blockwise_blocks(row.sequence_length, m.top_k, m.experts)
        assert slope == pytest.approx(moe_layer_count(m) * blocks * 512 * m.hidden,
                                      rel=1e-6), row.model
        # the line is what the scenario file gives at the catalog constant
        zero, slope = on.blockwise_ttft_line(row)
        own = dict(stack_named(on.STACK).serving)
        assert on.run_row(row)[0] == pytest.approx(
            zero + slope * own["blockwise_element_s"], rel=1e-9)


def test_blockwise_element_reproduces_its_fit():
    """`calibrate_serving.py --fit-optimum`'s blockwise_element (the two Qwen3-MoE rows'
    TTFTs) is the catalog's; fails if the constant is moved off its fit. The fitted rows
    are within 10%."""
    own = dict(stack_named(on.STACK).serving)
    assert on.fit_blockwise_element() == pytest.approx(own["blockwise_element_s"], rel=1e-4)
    assert on.BLOCKWISE_FITTED == ("qwen3-30b-a3b", "qwen3-235b-a22b")
    for row in on.ROWS:
        if row.model in on.BLOCKWISE_FITTED:
            assert abs(on.run_row(row)[0] * 1e3 / row.ttft_ms - 1) < 0.10, row.model


_JUDGED = {r.model: r for r in on.ROWS if r.model in ("llama4-scout", "llama4-maverick")}


def test_llama4_scout_ttft_judges_within_20_percent():
    """Llama 4 Scout (ExpertMLPsV2 with a shared expert, 23 blocks a layer) judges the
    Qwen3-MoE fit: -16.8% at the catalog constant."""
    row = _JUDGED["llama4-scout"]
    assert abs(on.run_row(row)[0] * 1e3 / row.ttft_ms - 1) < 0.20


@pytest.mark.xfail(strict=True, reason="Llama 4 Maverick's TTFT judges the Qwen3-MoE fit at "
                   "-29.7%: its 135 blocks a layer take about 1.5 times the fitted element "
                   "time; nothing here says why")
def test_llama4_maverick_ttft_judges_within_20_percent():
    row = _JUDGED["llama4-maverick"]
    assert abs(on.run_row(row)[0] * 1e3 / row.ttft_ms - 1) < 0.20


def test_the_port_row_against_the_constant():
    """docs/calibration.md's figure: the DeepSeek-V3 port's TTFT were its 512-token graph to
    run forward_blockwise at this stack's constant (263 blocks a layer by the formula)."""
    from clustersim.calibration import models_serving as ms
    from clustersim.serving.experts import blockwise_blocks
    assert blockwise_blocks(512, 8, 256) == 263
    own = dict(stack_named(on.STACK).serving)
    ttft = on.port_blockwise_ttft_s(own["blockwise_element_s"])
    error = ttft * 1e3 / ms.DEEPSEEK_TRN2.ttft_ms - 1
    quoted = (f"TTFT would be {error:+.0%} ({ttft:.2f} s against "
              f"{ms.DEEPSEEK_TRN2.ttft_ms:,.0f} ms published)")
    assert quoted in _flat("calibration.md"), quoted
