"""`plan` (training and serving) refuses what it cannot plan with exit 2 and the reason, never
an internal error (issue 34)."""

from __future__ import annotations

from pathlib import Path

import yaml
from cli_helpers import refused
from typer.testing import CliRunner

from clustersim.cli.app import app
from tests.test_serving_plan import SMALL
from tests.test_sites import small_sites

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent


def test_plan_chips_beyond_a_multi_site_cluster_exits_2(tmp_path: Path):
    raw = small_sites()
    raw["jobs"] = raw["jobs"][:1]
    path = tmp_path / "sites.yaml"
    path.write_text(yaml.safe_dump(raw))
    # two sites of 8 instances x 16 chips: 256 working chips
    result = runner.invoke(app, ["plan", str(path), "--chips", "1024", "-o", str(tmp_path / "p")])
    refused(result, "--chips 1,024", "256 working chips")
    assert not (tmp_path / "p").exists()


def test_serving_plan_on_a_missing_request_trace_exits_2_as_run_does(tmp_path: Path):
    raw = yaml.safe_load(yaml.safe_dump(SMALL))
    raw["serve"][0]["workload"] = {"arrival": "trace", "trace": "absent.csv"}
    path = tmp_path / "traced.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = runner.invoke(app, ["plan", str(path), "-o", str(tmp_path / "p")])
    refused(result, "serve.0.workload.trace", "absent.csv")
    assert not (tmp_path / "p").exists()
    ran = runner.invoke(app, ["run", str(path), "-o", str(tmp_path / "r")])
    refused(ran, "serve.0.workload.trace")


def test_a_job_larger_than_the_cluster_is_not_blamed_on_serve(tmp_path: Path):
    result = runner.invoke(app, ["validate", str(ROOT / "scenarios" / "quickstart.yaml"),
                                 "--set", "jobs.0.instances=1000"])
    refused(result, "jobs.0.instances = 1000")
    assert "serve" not in result.stderr


def test_a_serving_plan_nothing_holds_says_why_in_its_message(tmp_path: Path):
    raw = yaml.safe_load(yaml.safe_dump(SMALL))
    raw["serve"][0]["slo"] = {"ttft": "1ms", "tpot": "50ms"}  # no prefill is that fast
    path = tmp_path / "strict.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = runner.invoke(app, ["plan", str(path), "-o", str(tmp_path / "p"), "--json"])
    refused(result, "candidates")
    assert "--json" not in result.stderr  # it wrote nothing there to see
    assert not (tmp_path / "p").exists()
