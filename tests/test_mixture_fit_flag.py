"""A mixture served on a stack and hardware with no fitted MoE time says so: its MoE layers
then cost only their reads, FLOPs and all-to-all (DeepSeek-V3 on 8 x H200 at batch 1: a
tenth of the published TPOT), and the user must not read that as a fitted figure."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from cli_helpers import invoke

ROOT = Path(__file__).resolve().parent.parent
ROW = ROOT / "scenarios" / "calibration" / "serving" / "p5en-deepseek-v3-sglang-batch-1"


def _row_run(tmp_path: Path, stack: str | None) -> tuple[dict, str]:
    """The SGLang DeepSeek-V3 row's scenario with `stack` (None: the hardware's default)."""
    raw = yaml.safe_load(ROW.with_suffix(".yaml").read_text("utf-8"))
    if stack is None:
        del raw["serve"][0]["stack"]
    else:
        raw["serve"][0]["stack"] = stack
    shutil.copy(ROW.with_suffix(".csv"), tmp_path / ROW.with_suffix(".csv").name)
    scenario = tmp_path / f"row-{stack}.yaml"
    scenario.write_text(yaml.safe_dump(raw), "utf-8")
    out = tmp_path / f"out-{stack}"
    result = invoke("run", scenario, "-o", out)
    assert result.exit_code == 0, result.output
    return json.loads((out / "summary.json").read_text())["deployments"]["row"], result.output


def test_deepseek_v3_on_p5ens_default_stack_is_flagged_and_the_docs_quote_it(tmp_path: Path
                                                                             ) -> None:
    bare, table = _row_run(tmp_path, None)
    fitted, fitted_table = _row_run(tmp_path, "sglang@0.4.1")
    assert bare["stack"] == "tensorrt-llm" and bare["mixture_overheads_fitted"] is False
    assert "no mixture row is fitted" in " ".join(table.split())
    assert fitted["mixture_overheads_fitted"] is True
    assert "no mixture row is fitted" not in " ".join(fitted_table.split())
    # the unfitted figure is several times fast: why the warning is there
    assert fitted["tpot_p50_s"] > 5 * bare["tpot_p50_s"]
    page = " ".join((ROOT / "docs" / "calibration.md").read_text("utf-8").split())
    quoted = re.search(r"TPOT ([\d.]+) ms on the default `tensorrt-llm`, ([\d.]+) ms on "
                       r"`sglang@0.4.1`", page)
    assert quoted, "docs/calibration.md no longer quotes the two TPOTs"
    assert float(quoted.group(1)) == pytest.approx(bare["tpot_p50_s"] * 1e3, abs=0.006)
    assert float(quoted.group(2)) == pytest.approx(fitted["tpot_p50_s"] * 1e3, abs=0.006)


@pytest.mark.parametrize(("model", "hardware", "expected"), [
    ("llama3.1-8b", "p5en", None), ("qwen3-30b-a3b", "trn2", True),
    ("qwen3-30b-a3b", "p5en", False), ("qwen3-30b-a3b", "trn3-gen2", False),
    ("qwen3-30b-a3b", "trn1", False)])
def test_the_flag_follows_the_hardware_and_stack(model: str, hardware: str,
                                                 expected: bool | None) -> None:
    from clustersim.hardware.catalog import catalog_entry
    from clustersim.hardware.stacks import default_stack, with_stack
    from clustersim.serving.layers import mixture_overheads_fitted
    from clustersim.training.transformer import TransformerShape, model_preset_values

    shape = TransformerShape(**model_preset_values(model))
    hw = with_stack(catalog_entry(hardware), default_stack(hardware))
    assert mixture_overheads_fitted(shape, hw) is expected


@pytest.mark.parametrize(("model", "stack", "hardware", "said"), [
    ("qwen3-30b-a3b", None, "p5en", True), ("qwen3-30b-a3b", None, "trn2", False),
    ("deepseek-v3", "sglang@0.4.1", "p5en", False),
    # a stack that does not run there is planned with the hardware's default: unfitted
    ("deepseek-v3", "sglang@0.4.1", "p5", True),
    ("llama3.1-8b", None, "p5en", False)])
def test_the_serving_planner_notes_a_hardware_without_a_mixture_fit(
        model: str, stack: str | None, hardware: str, said: bool) -> None:
    from clustersim.hardware.catalog import catalog_entry
    from clustersim.planning.serving_space import unfitted_mixture
    from clustersim.training.transformer import TransformerShape, model_preset_values

    shape = TransformerShape(**model_preset_values(model))
    deployment = {"model": model, **({"stack": stack} if stack else {})}
    note = unfitted_mixture(deployment, shape, hardware, catalog_entry(hardware))
    assert (note is not None) is said
    if said:
        assert note.startswith(f"{hardware}: {model} is a mixture") and "calibration.md" in note


def test_a_fluid_deployment_of_a_mixture_warns_too(tmp_path: Path) -> None:
    """The fleet-day level's table and summary carry the flag as the request level's do."""
    from cli_helpers import write

    scenario = write(tmp_path, {
        "name": "fluid-moe", "duration": "1min", "hardware": "p5en", "cluster": {"instances": 1},
        "serve": [{"name": "chat", "model": "qwen3-30b-a3b", "parallelism": {"tp": 8},
                   "fidelity": "fluid", "replicas": 1,
                   "workload": {"arrival": "poisson", "rate": "1/s", "input_tokens": 512,
                                "output_tokens": 64}}]})
    out = tmp_path / "out"
    result = invoke("run", scenario, "-o", out)
    assert result.exit_code == 0, result.output
    assert "no mixture row is fitted" in " ".join(result.output.replace("│", " ").split())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["deployments"]["chat"]["mixture_overheads_fitted"] is False



def test_the_planners_note_on_a_custom_hardware_mapping_names_its_stack() -> None:
    """A scenario's `hardware: {base: p5en, ...}` is planned as 'p5en+custom': the note said
    '{'base': 'p5en'}: ... no stack on it' where `run` uses tensorrt-llm (review of
    session 15)."""
    from clustersim.planning.serving_space import unfitted_mixture
    from clustersim.scenario.loader import scenario_from_dict

    scenario = scenario_from_dict({
        "name": "x", "duration": "1min", "cluster": {"instances": 1},
        "hardware": {"base": "p5en", "serving": {"iteration_overhead": "1ms"}},
        "serve": [{"name": "a", "model": "qwen3-30b-a3b", "parallelism": {"tp": 8},
                   "workload": {"rate": "1/s", "input_tokens": 100, "output_tokens": 10}}]})
    note = unfitted_mixture({"model": "qwen3-30b-a3b"}, scenario.serve[0].model,
                            {"base": "p5en"}, scenario.hardware)
    assert note.startswith("p5en+custom: qwen3-30b-a3b is a mixture and its stack "
                           "tensorrt-llm has no fitted MoE time there")


def test_the_planners_note_on_hardware_without_a_stack_reads_as_a_sentence() -> None:
    """On trn3-gen2 (no serving stack) the note read 'no stack on it has no fitted MoE
    time' (harden16)."""
    from clustersim.hardware.catalog import catalog_entry
    from clustersim.planning.serving_space import unfitted_mixture
    from clustersim.training.transformer import TransformerShape, model_preset_values

    model = TransformerShape(**model_preset_values("qwen3-30b-a3b"))
    note = unfitted_mixture({"model": "qwen3-30b-a3b"}, model, "trn3-gen2",
                            catalog_entry("trn3-gen2"))
    assert note.startswith("trn3-gen2: qwen3-30b-a3b is a mixture and it has no serving "
                           "stack there, so no fitted MoE time: ")
    assert "no stack on it" not in note
