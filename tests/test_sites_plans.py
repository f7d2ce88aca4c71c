"""`plan` on a cluster of several sites writes a scenario `run` takes, and the serving
planner plans a deployment on one (issue 34: both wrote `cluster.instances` beside
`sites`, which `run` refuses)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clustersim.cli.app import app
from tests.test_serving_plan import SMALL
from tests.test_sites import small_sites

runner = CliRunner()


def _write(tmp_path: Path, name: str, raw: dict) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.slow  # a training plan over 23,000 candidates: about 5 s of CPU
def test_training_plan_on_sites_writes_a_scenario_run_accepts(tmp_path: Path):
    raw = small_sites(site_events=[{"kind": "power", "rate": "1/10d", "duration": "1h"}])
    raw["jobs"] = [{"name": "pretrain", "model": "llama3-8b", "global_batch": 48,
                    "instances": 12, "recompute": "selective"}]
    written = tmp_path / "best.yaml"
    result = runner.invoke(app, ["plan", str(_write(tmp_path, "sites.yaml", raw)), "-o",
                                 str(tmp_path / "plan"), "--write-scenario", str(written)])
    assert result.exit_code == 0, result.output
    best = yaml.safe_load(written.read_text())
    assert best["cluster"]["sites"] == raw["cluster"]["sites"]
    assert "instances" not in best["cluster"] and "spares" not in best["cluster"]
    assert best["failures"]["site_events"] == raw["failures"]["site_events"]
    checked = runner.invoke(app, ["validate", str(written)])
    assert checked.exit_code == 0, checked.output


@pytest.mark.slow  # a serving plan: about 6 s of CPU
def test_serving_plan_on_a_multi_site_cluster_finds_a_configuration(tmp_path: Path):
    raw = yaml.safe_load(yaml.safe_dump(SMALL))
    raw["hardware"] = "trn2u"
    raw["cluster"] = {
        "fabric": {"spines": 2, "instances_per_leaf": 4},
        "sites": [{"name": "east", "ultraservers": 1}, {"name": "west", "ultraservers": 1}],
        "inter_site": {"links": [{"sites": ["east", "west"], "bandwidth": "100Gbps",
                                  "latency": "5ms"}]}}
    raw["failures"] = {"preset": "none", "site_events": [
        {"kind": "partition", "rate": "1/1d", "duration": "1h"}]}
    written = tmp_path / "best.yaml"
    result = runner.invoke(app, ["plan", str(_write(tmp_path, "serve.yaml", raw)), "-o",
                                 str(tmp_path / "plan"), "--write-scenario", str(written)])
    assert result.exit_code == 0, result.output
    checked = runner.invoke(app, ["validate", str(written)])
    assert checked.exit_code == 0, checked.output
