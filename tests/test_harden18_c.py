"""A pipeline stage's step time is that of the layers it holds (training.layer_mix): a stage
of MoE layers in a model whose first layers are dense, or of global layers in a model of
windowed ones, takes longer than the model's mean layer implies, and the pipeline waits for
it. Stages alike give what the mean layer gives."""

from __future__ import annotations

from unittest import mock

import pytest

from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.planning import planner
from clustersim.planning.planner import PlanError, PlanOptions, plan
from clustersim.planning.simulate import quick_bound, step_lower_bound
from clustersim.scenario.loader import scenario_from_dict
from clustersim.scenario.models import JobSpec
from clustersim.training.layer_mix import LayerMix, chunk_mixes
from clustersim.training.step import StepModel
from clustersim.training.transformer import TransformerShape, model_preset_values
from clustersim.training.workload import stage_work

SHAPE = dict(layers=8, hidden=2048, heads=16, kv_heads=16, ffn_hidden=8192, vocab=32000,
             seq_len=2048, gated=True)
EXPERTS = dict(experts=16, top_k=2, expert_ffn_hidden=8192)
PARALLEL = {"tp": 4, "pp": 2, "dp": 4, "ep": 4}


@pytest.fixture(scope="module")
def steps() -> StepModel:
    return StepModel(build_topology(catalog_entry("trn2"), 8))


def _job(model: TransformerShape, **parallelism) -> JobSpec:
    return JobSpec(name="j", model=model, global_batch=64, seq_len=2048,
                   parallelism=parallelism or PARALLEL)


def test_a_stage_of_moe_layers_paces_the_pipeline(steps) -> None:
    """4 dense then 4 MoE layers at pp 2: stage 0 holds the dense ones, stage 1 the MoE
    ones. With 16 micro-batches and stage 1 the slower, 1F1B gives stage 0's forward, 16 of
    stage 1's forward and backward back to back, then stage 0's backward, its exposed
    gradient reduction and its optimizer (and two transfers between the stages). Stage 0
    is a dense model's first chunk of 4 layers, stage 1 an all-MoE model's last: the step
    is what those imply, and longer than the model's mean layer on both stages implies."""
    mixed = TransformerShape(**SHAPE, **EXPERTS, dense_layers=4)
    job = _job(mixed)
    dense = steps.chunk_times(_job(TransformerShape(**SHAPE), tp=4, pp=2, dp=4), True, False,
                              layers=4)
    moe = steps.chunk_times(_job(TransformerShape(**SHAPE, **EXPERTS)), False, True,
                            layers=4)
    profile = steps.profile(job)
    m = profile.microbatches
    assert m == 16
    reduce_s, gather_s = steps.data_parallel_times(job)[0]

    def step(first, last) -> float:
        return (first.forward_s + m * (last.forward_s + last.backward_s) + first.backward_s
                + max(0.0, reduce_s - first.backward_s) + gather_s + profile.optimizer_s)

    expected = step(dense, moe)
    assert dense.forward_and_backward_s < moe.forward_and_backward_s
    assert moe.forward_ep_s > 0.0 and dense.forward_ep_s == 0.0
    assert expected <= profile.step_time_s <= expected * 1.001  # the transfers
    # The mean layer (4 of 8 MoE) on both stages: what every stage stepped as before.
    mean_first = steps.chunk_times(job, True, False, layers=4)
    mean_last = steps.chunk_times(job, False, True, layers=4)
    assert profile.step_time_s > step(mean_first, mean_last) * 1.05
    # The slower stage holds its 4 MoE layers' all-to-alls: 2 per layer and pass.
    assert len(stage_work(job, 4, False, True, mix=LayerMix(4, 4, 0)).ep_collectives_forward) == 8
    assert stage_work(job, 4, True, False, mix=LayerMix(4, 0, 0)).ep_collectives_forward == ()


def test_stages_alike_step_as_the_mean_layer(steps) -> None:
    """Every other layer MoE (moe_every 2), 8 layers at pp 2: each stage holds 2 dense and
    2 MoE layers, the model's mean; its chunks are the mean layer's, as before."""
    model = TransformerShape(**SHAPE, **EXPERTS, moe_every=2)
    job = _job(model)
    assert chunk_mixes(model, 2) == (None, None)
    placed = steps._placement(job)
    assert steps.stage_chunks(job, placed) == (steps.chunk_times(job, True, False),
                                               steps.chunk_times(job, False, True))
    # A uniform mixture and a dense model have no mix on any split.
    for name in ("mixtral-8x7b", "llama3-70b"):
        shape = TransformerShape(**model_preset_values(name))
        assert set(chunk_mixes(shape, 8)) == {None}


def test_llama4_maverick_stages_of_one_and_two_moe_layers(steps) -> None:
    """Llama 4 Maverick at pp 16: 3 layers a stage, MoE every other layer, so stages hold
    1 or 2 MoE layers; every 4th layer is global (chunked attention elsewhere)."""
    model = TransformerShape(**model_preset_values("llama4-maverick"))
    mixes = chunk_mixes(model, 16)
    assert [mix.moe for mix in mixes] == [1, 2] * 8
    assert sum(mix.windowed for mix in mixes) == 36
    held = [mix.moe_windowed for mix in mixes]
    assert sum(held) == sum(1 for i in range(48) if i % 2 == 1 and (i + 1) % 4 != 0)


def test_a_stage_of_global_layers_attends_over_the_whole_sequence(steps) -> None:
    """A dense model of 8 layers, windowed but for its last (global_every 8), at pp 2:
    stage 0's 4 layers attend to 128 keys, stage 1's 3 windowed ones too and its last to
    all 2,048 (flash attention: 4 b heads s span d FLOPs per layer and rank)."""
    model = TransformerShape(**SHAPE, window=128, global_every=8)
    job = _job(model, tp=4, pp=2, dp=4)
    mixes = chunk_mixes(model, 2)
    assert mixes == (LayerMix(4, 0, 4), LayerMix(4, 0, 3))
    b, s, heads, d = 1, 2048, 16 // 4, 128

    def attention_flops(mix) -> float:
        work = stage_work(job, 4, False, False, "flash", mix)
        return sum(op.flops for op in work.forward if op.name == "attention")

    per_layer = 4.0 * b * heads * s * d
    assert attention_flops(mixes[0]) == pytest.approx(4 * per_layer * 128)
    assert attention_flops(mixes[1]) == pytest.approx(per_layer * (3 * 128 + 2048))
    # The step runs each stage's own chunk; the mean layer's (7 of 8 windowed) lies between.
    first, last = steps.stage_chunks(job, steps._placement(job))
    assert first == steps.chunk_times(job, True, False, mix=mixes[0])
    assert last == steps.chunk_times(job, False, True, mix=mixes[1])
    mean = steps.chunk_times(job, False, True)
    assert last.forward_compute_s > mean.forward_compute_s


def test_the_bounds_hold_for_stages_that_differ(steps) -> None:
    """The planner's bounds stay below the step when stages differ (DeepSeek-V3-like: the
    first layers dense), at several pipeline splits, interleaved too."""
    model = TransformerShape(**SHAPE, **EXPERTS, dense_layers=3)
    cache: dict = {}
    for pp, interleave in ((2, 1), (4, 1), (2, 2), (8, 1)):
        job = _job(model, tp=4, pp=pp, dp=4, ep=2, interleave=interleave)
        assert any(mix is not None for mix in chunk_mixes(model, pp * interleave))
        step_s = steps.profile(job).step_time_s
        fallback = step_lower_bound(steps, job, cache)
        assert fallback <= quick_bound(steps, job, fallback) <= step_s


def _mixture_scenario():
    raw = {"name": "mixture", "hardware": "trn2", "cluster": {"instances": 2, "spares": 0},
           "jobs": [{"name": "train", "global_batch": 32, "seq_len": 2048,
                     "model": {"name": "tiny-moe", "layers": 6, "hidden": 512, "heads": 8,
                               "kv_heads": 4, "vocab": 8000, "seq_len": 2048, "gated": True,
                               "experts": 8, "top_k": 2, "expert_ffn_hidden": 512,
                               "dense_layers": 2}}],
           "failures": {"preset": "llama3"}}
    return scenario_from_dict(raw, planning=True)


@pytest.mark.slow
def test_the_plan_of_a_mixture_finds_the_exhaustive_best() -> None:
    """Planning a mixture whose stages differ runs, its bounds stay below the steps they
    bound and prune nothing the exhaustive search would pick."""
    scenario = _mixture_scenario()
    options = PlanOptions(top=3)
    try:
        pruned = plan(scenario, options)
    except PlanError:  # pragma: no cover - the job is feasible
        pytest.fail("the mixture's plan found nothing")
    with mock.patch.object(planner, "step_lower_bound", lambda *a, **k: 0.0), \
            mock.patch.object(planner, "quick_bound", lambda model, job, fallback: 0.0):
        full = plan(scenario, options)
    assert pruned.best["step_time_s"] == full.best["step_time_s"]
    rows, every = pruned.rows, full.rows
    known = every["step_time_s"].notna() & rows["bound_s"].notna()
    assert known.any()
    assert (rows.loc[known, "bound_s"] <= every.loc[known, "step_time_s"]).all()
    assert (rows["pp"] > 1).any()
