"""The timeline's collaborators see it through their ports (clustersim.cluster.ports): each
port names only what the Timeline has, and each collaborator reads of its timeline only what
its port names (so the port stays the whole of what it uses)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from clustersim.cluster import ports
from clustersim.cluster.timeline import Timeline
from clustersim.runner.api import step_profiles
from clustersim.scenario.loader import scenario_from_dict

CLUSTER = Path(__file__).resolve().parents[1] / "clustersim" / "cluster"

# module -> the port its timeline is seen through (UplinkPacing, in uplinks, is a part of
# JobRun: its `self.t` is the job's port)
PORT_OF = {
    "faults": [ports.FaultsTimeline],
    "jobrun": [ports.JobTimeline],
    "job_accounting": [ports.JobTimeline],
    "job_recovery": [ports.JobTimeline],
    "scheduler": [ports.SchedulerTimeline],
    "sites": [ports.SitesTimeline],
    "uplinks": [ports.UplinksTimeline, ports.JobTimeline],
}
TIMELINE_PORTS = [ports.FaultsTimeline, ports.SitesTimeline, ports.UplinksTimeline,
                  ports.JobTimeline, ports.SchedulerTimeline]


def members(protocol: type) -> set[str]:
    """The attributes and methods a protocol names, its bases' too."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls.__module__ != ports.__name__:
            continue
        names |= set(cls.__dict__.get("__annotations__", {}))
        names |= {n for n, v in cls.__dict__.items()
                  if (callable(v) or isinstance(v, property))
                  and (not n.startswith("_") or n == "__len__")}
    return names


def timeline_reads(module: str) -> set[str]:
    """The attributes a module reads of its timeline: `self.t.x`, `t.x`, `timeline.x`."""
    tree = ast.parse((CLUSTER / f"{module}.py").read_text(encoding="utf-8"))
    reads = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in ("t", "timeline"):
            reads.add(node.attr)
        elif (isinstance(base, ast.Attribute) and base.attr == "t"
              and isinstance(base.value, ast.Name) and base.value.id == "self"):
            reads.add(node.attr)
    return reads


@pytest.mark.parametrize("module", sorted(PORT_OF))
def test_each_collaborator_reads_only_what_its_port_names(module: str):
    reads = timeline_reads(module)
    assert reads, f"{module} reads nothing of its timeline: the scan has gone stale"
    named = set().union(*(members(p) for p in PORT_OF[module]))
    assert reads <= named, f"{module} reads {sorted(reads - named)} outside its port"


def test_the_scan_sees_a_read_outside_the_port():
    assert "free_mask" in timeline_reads("faults")
    assert "free_mask" not in members(ports.JobTimeline)


def test_the_timeline_has_what_every_port_names():
    scenario = scenario_from_dict({
        "name": "t", "hardware": "trn2", "seed": 0, "duration": "1d",
        "cluster": {"instances": 4}, "failures": {"preset": "none"},
        "jobs": [{"name": "train", "model": "llama2-7b", "seq_len": 2048, "global_batch": 64,
                  "parallelism": {"tp": 8, "pp": 1, "dp": 8}, "recompute": "selective"}]})
    timeline = Timeline(scenario, step_profiles(scenario), np.random.SeedSequence(0))
    for port in TIMELINE_PORTS:
        missing = sorted(n for n in members(port) if not hasattr(timeline, n))
        assert not missing, f"{port.__name__} names what the Timeline lacks: {missing}"
    for port, book in [(ports.Scheduling, timeline.scheduler),
                       (ports.FaultCounts, timeline.faults),
                       (ports.UplinkDemand, timeline.uplinks),
                       (ports.ActiveSet, timeline.active),
                       (ports.TeamRules, timeline.teams)]:
        missing = sorted(n for n in members(port) if not hasattr(book, n))
        assert not missing, f"{port.__name__} names what {type(book).__name__} lacks: {missing}"
    timeline.run()
    for port in (ports.Member, ports.StruckJob, ports.SiteJob, ports.UplinkJob):
        missing = sorted(n for n in members(port) if not hasattr(timeline.jobs[0], n))
        assert not missing, f"{port.__name__} names what a JobRun lacks: {missing}"
