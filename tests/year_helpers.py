"""The Rainier year's scenario cut down to what a test runs in seconds: the same file with
its four sites of 256 UltraServers each (16 instances hot spares), its twelve teams, a day
of arrivals at a twentieth of its rate, more large jobs at 256 and 512 instances, frontier
ones at 1,200 (over sites), failures scaled up so that jobs are interrupted and their
instances replaced, and its serving deployments' loads (and minimum replicas) at a
sixteenth, as the cluster is."""

from __future__ import annotations

from pathlib import Path

import yaml

from clustersim.scenario.loader import load_scenario
from clustersim.scenario.models import Scenario

YEAR = Path(__file__).resolve().parent.parent / "scenarios" / "rainier-year.yaml"

def _serving_at(share: float) -> list[str]:
    """Overrides putting each deployment's load curve and minimum replicas at `share`."""
    raw = yaml.safe_load(YEAR.read_text())
    out = []
    for i, d in enumerate(raw.get("serve") or []):
        load = d["workload"]["load"]
        at = f"serve.{i}.workload.load"
        if "sinusoid" in load:
            for key in ("peak", "trough"):
                rate = float(str(load["sinusoid"][key]).removesuffix("/s")) * share
                out.append(f"{at}.sinusoid.{key}={rate:g}/s")
        else:
            out.append(f"{at}.hourly=[{', '.join(f'{r * share:g}' for r in load['hourly'])}]")
        out.append(f"serve.{i}.autoscale.min={max(1, round(d['autoscale']['min'] * share))}")
    return out


SLICE = [
    "duration=1d", "workload.arrivals.until=1d", "workload.arrivals.rate=140/d",
    "trace.enabled=false",
    *(f"cluster.sites.{i}.ultraservers=252" for i in range(4)),
    *(f"cluster.sites.{i}.spares=16" for i in range(4)),
    "workload.templates.2.instances=[256, 512]",
    "workload.templates.2.weight=4",
    "workload.templates.3.instances=[1200]",
    "workload.templates.3.weight=0.05",
    "failures.scale=40",
    *_serving_at(252 / 4080),
]


def year_slice(*more: str) -> Scenario:
    """The cut-down scenario, with `more` overrides after the slice's own."""
    return load_scenario(YEAR, [*SLICE, *more])
