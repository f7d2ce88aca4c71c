"""The Rainier year's caches (tests/test_year10_caches.py) change no output: small fleets
that exercise them (preemption, team quotas with borrowing, site power, cooling and
partition events, jobs spread over sites sharing inter-site links, failures with spares,
repairs or none, whole UltraServers, fluid deployments held in the fleet, every policy)
write the same summary.json, job_summary.parquet and traces, byte for byte, with the caches
as with them bypassed (tests/cache_bypass.py: each cache swapped for what it stands for)."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from cache_bypass import caches_bypassed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clustersim.cluster import sites
from clustersim.cluster.timeline import Timeline
from clustersim.runner.api import run_to
from clustersim.scenario.loader import scenario_from_dict
from clustersim.training import shape

_CHECKPOINT = {"interval": "auto", "write": "30s", "restore": "2min"}


def _job(tp: int, priority: int) -> dict[str, Any]:
    return {"model": "llama3-8b", "seq_len": 4096, "priority": priority,
            "parallelism": {"tp": tp, "pp": 1, "zero": 1}, "checkpoint": _CHECKPOINT}


def _fleet(seed: int = 5, policy: str = "backfill", preemption: bool = True,
           borrowing: bool = True, site_us: tuple[int, ...] = (2, 1, 2), quotas=(6, None, 9),
           scale: float = 500.0, repair: str = "2h", events: bool = True,
           fluid: int | None = None, rate: int = 150) -> dict[str, Any]:
    """A two-day fleet of 4-instance UltraServers (one site, or a site each of `site_us`),
    4 instances a leaf: small jobs, whole-UltraServer jobs, jobs of over 32 instances where
    a site holds them (a replacement keeps their solved step: `replacement_profile`) and,
    over several sites, jobs larger than any site; `fluid`: a fluid deployment of that
    priority beside them."""
    names = ["east", "west", "north"]
    teams = [{"name": f"t{i}", **({"quota": q} if q is not None else {})}
             for i, q in enumerate(quotas)]
    templates = [
        {"name": "tiny", "weight": 60, "instances": {"min": 1, "max": 4},
         "run_for": {"median": "1h", "sigma": 1.0}, "teams": {"t1": 1, "t2": 2},
         "job": _job(8, 0)},
        {"name": "whole", "weight": 25, "instances": [2, 4],
         "run_for": {"median": "4h", "sigma": 1.0}, "teams": {"t0": 1, "t1": 1, "t2": 1},
         "job": _job(128, 1)}]
    if max(site_us) >= 9:  # (128 instances: a whole UltraServer replaced is 1/32 of them)
        templates.append({"name": "big", "weight": 4,
                          "instances": [128] if max(site_us) >= 33 else [33, 36],
                          "run_for": {"median": "8h", "sigma": 0.5}, "teams": {"t1": 1},
                          "job": _job(128 if max(site_us) >= 33 else 8, 1)})
    raw: dict[str, Any] = {
        "name": "bypass", "seed": seed, "hardware": "trn2u", "duration": "2d",
        "scheduler": {"policy": policy, "preemption": preemption, "borrowing": borrowing},
        "teams": teams,
        "workload": {"arrivals": {"rate": f"{rate}/d", "until": "1d"}, "templates": templates},
        "failures": {"preset": "llama3", "scale": scale, "detect": "2min", "restart": "5min",
                     "repair": repair},
        "trace": {"bin": "1h", "levels": ["cluster", "job", "ultraserver", "instance"]},
    }
    if len(site_us) == 1:
        raw["cluster"] = {"ultraservers": site_us[0], "spares": 4,
                          "fabric": {"instances_per_leaf": 4}}
    else:
        used = names[: len(site_us)]
        raw["cluster"] = {
            "fabric": {"instances_per_leaf": 4},
            "sites": [{"name": n, "ultraservers": u, "spares": 4 * (i % 2)}
                      for i, (n, u) in enumerate(zip(used, site_us, strict=True))],
            "inter_site": {"links": [{"sites": [a, b], "bandwidth": "400Gbps", "latency": "5ms"}
                                     for i, a in enumerate(used) for b in used[i + 1:]]}}
        largest = 4 * max(site_us)
        spread = [n for n in (largest + 2, largest + 4) if n <= 4 * sum(site_us) - 2]
        if spread:
            templates.append({"name": "spread", "weight": 10, "instances": spread,
                              "run_for": {"median": "5h", "sigma": 0.5}, "teams": {"t0": 1},
                              "job": _job(128, 2)})
        if events:
            raw["failures"]["site_events"] = [
                {"kind": "power", "rate": "1/4h", "share": 0.5, "duration": "1h"},
                {"kind": "cooling", "rate": "1/6h", "share": 0.3, "duration": "30min"},
                {"kind": "partition", "rate": "1/3h", "duration": "40min"}]
    if fluid is not None:
        raw["fluid"] = {"interval": "5min", "curve_requests": 500}
        raw["serve"] = [{
            "name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4},
            "router": "least_outstanding",
            "workload": {
                "load": {"sinusoid": {"peak": "800/s", "trough": "50/s", "peak_at": "14h"},
                         "noise": 0.05},
                "input_tokens": {"distribution": "lognormal", "median": 512, "sigma": 0.8,
                                 "max": 4096},
                "output_tokens": {"distribution": "lognormal", "median": 200, "sigma": 0.8,
                                  "max": 1024}},
            "slo": {"ttft": "1s", "tpot": "50ms"},
            "autoscale": {"min": 2, "max": 400, "target": 0.7, "warmup": "2min",
                          "priority": fluid}}]
    return raw


def _strip_wall(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_wall(v) for k, v in node.items() if k != "wall_s"}
    if isinstance(node, list):
        return [_strip_wall(v) for v in node]
    return node


def _outputs(folder: Path) -> dict[str, bytes]:
    """Every file of a run folder, summary.json without its wall times."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "summary.json":
                data = json.dumps(_strip_wall(json.loads(data)), sort_keys=True).encode()
            files[str(path.relative_to(folder))] = data
    return files


def _both(raw: dict[str, Any], folder: Path) -> tuple[dict, dict]:
    """The outputs of a run with the caches and of one with them bypassed."""
    scenario = scenario_from_dict(raw, "<bypass>")
    run_to(scenario, folder / "cached")
    with caches_bypassed():
        run_to(scenario, folder / "bypassed")
    return _outputs(folder / "cached"), _outputs(folder / "bypassed")


def _differing(cached: dict, bypassed: dict) -> list[str]:
    return sorted(k for k in set(cached) | set(bypassed) if cached.get(k) != bypassed.get(k))


def _counting(monkeypatch, owner: Any, name: str, counts: dict[str, int]) -> None:
    found = getattr(owner, name)

    def counted(*args, **kwargs):
        counts[name] = counts.get(name, 0) + 1
        return found(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


@pytest.mark.parametrize(("raw", "kept"), [
    # three sites: preemption, borrowing, site events, spread jobs, a 128-instance job
    (_fleet(site_us=(34, 1, 3), scale=50.0), ("place", "_placement_shape", "max_min_speeds")),
    (_fleet(seed=8, policy="priority", site_us=(2, 2), quotas=(3, 5, None), repair="never"),
     ("place",)),
    (_fleet(seed=2, policy="fifo", site_us=(10,), quotas=(4, None, 8), fluid=3), ("place",)),
], ids=["three-sites", "two-sites-no-repair", "one-site-fluid"])
def test_outputs_are_the_same_with_the_caches_bypassed(raw, kept, tmp_path, monkeypatch):
    """And the caches were in play: the bypassed run asked more often for what they keep
    (`kept`: placements, placements' shapes, inter-site speeds)."""
    counts: dict[str, dict[str, int]] = {"cached": {}, "bypassed": {}}
    scenario = scenario_from_dict(raw, "<bypass>")
    for side in ("cached", "bypassed"):
        with monkeypatch.context() as patched:
            _counting(patched, Timeline, "place", counts[side])
            _counting(patched, shape, "_placement_shape", counts[side])
            _counting(patched, sites, "max_min_speeds", counts[side])
            with caches_bypassed() if side == "bypassed" else contextlib.nullcontext():
                run_to(scenario, tmp_path / side)
    cached, bypassed = _outputs(tmp_path / "cached"), _outputs(tmp_path / "bypassed")
    assert "job_summary.parquet" in cached and "intervals.parquet" in cached
    assert _differing(cached, bypassed) == []
    for name in kept:
        assert counts["bypassed"].get(name, 0) > counts["cached"].get(name, 0), (name, counts)


@pytest.mark.slow  # about 1 s a fleet, twice
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 999), policy=st.sampled_from(["fifo", "priority", "backfill",
                                                          "fairshare"]),
       preemption=st.booleans(), borrowing=st.booleans(),
       site_us=st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple),
       quotas=st.lists(st.one_of(st.none(), st.integers(2, 24)), min_size=3, max_size=3)
       .map(tuple),
       scale=st.sampled_from([50.0, 500.0, 2000.0]),
       repair=st.sampled_from(["30min", "3h", "never"]), events=st.booleans(),
       fluid=st.one_of(st.none(), st.integers(0, 3)), rate=st.integers(40, 250))
def test_random_fleets_write_the_same_outputs_with_the_caches_bypassed(
        seed, policy, preemption, borrowing, site_us, quotas, scale, repair, events, fluid,
        rate):
    if len(site_us) == 1:
        site_us = (site_us[0] + 1,)  # (room beside a fluid deployment's first replicas)
    raw = _fleet(seed, policy, preemption, borrowing, site_us, quotas, scale, repair, events,
                 fluid, rate)
    with tempfile.TemporaryDirectory() as folder:
        cached, bypassed = _both(raw, Path(folder))
    assert _differing(cached, bypassed) == []
