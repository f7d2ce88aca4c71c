"""Figures the documentation quotes, computed from the tree, for tests/test_docs.py to
compare with what the pages say (a figure that drifts fails the doc tests)."""

from __future__ import annotations

import math
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SWEEP = ROOT / "scenarios" / "sweeps" / "inter-site-bandwidth.yaml"


def _sets(variant: dict, bandwidth_bit_per_s: float | str) -> list[str]:
    value = (bandwidth_bit_per_s if isinstance(bandwidth_bit_per_s, str)
             else f"{bandwidth_bit_per_s:.6g}bps")
    return [f"cluster.inter_site.links.0.bandwidth={value}"] + [
        f"{key}={yaml.safe_dump(item, default_flow_style=True).strip()}"
        for key, item in variant["set"].items()]


def spread_ratio(variant: str, bandwidth: float | str) -> float:
    """Tokens/s of the sweep's `variant` over the one-site job's, at `bandwidth` (bit/s or
    a text such as 10Gbps), from the step model (what the sweep's runs report)."""
    from clustersim.runner.api import step_profiles
    from clustersim.scenario.loader import load_scenario

    variants = {v["name"]: v for v in yaml.safe_load(SWEEP.read_text("utf-8"))["variants"]}
    scenario = ROOT / "scenarios" / "sites-spread.yaml"

    def tokens(name: str) -> float:
        spec = load_scenario(scenario, _sets(variants[name], bandwidth))
        return step_profiles(spec)["pretrain"].tokens_per_s

    return tokens(variant) / tokens("one-site")


def spread_table() -> dict[str, tuple[float, float]]:
    """The sweep's bandwidths -> (spread, spread averaging every 16 steps) over one site."""
    grid = yaml.safe_load(SWEEP.read_text("utf-8"))["grid"]
    return {bw: (spread_ratio("spread", bw), spread_ratio("spread-sync-16", bw))
            for bw in grid["cluster.inter_site.links.0.bandwidth"]}


def bandwidth_for(variant: str, ratio: float, low: float = 1e9, high: float = 1e14) -> float:
    """The inter-site bandwidth (bit/s) at which `variant` reaches `ratio` (bisection in
    log bandwidth: the ratio grows with it), to 1%."""
    while high / low > 1.01:
        middle = math.sqrt(low * high)
        if spread_ratio(variant, middle) < ratio:
            low = middle
        else:
            high = middle
    return math.sqrt(low * high)


def quickstart_steps() -> dict[str, float]:
    """The step figures scenarios/quickstart.yaml's comment quotes: its job as written, and
    the same job at TP 32 (two instances' Z links)."""
    from clustersim.runner.api import step_profiles
    from clustersim.scenario.loader import load_scenario

    path = ROOT / "scenarios" / "quickstart.yaml"
    best = step_profiles(load_scenario(path))["pretrain"]
    wide = step_profiles(load_scenario(path, [
        "jobs.0.parallelism={tp: 32, pp: 1, dp: 64, zero: 1, sequence_parallel: true}"]))
    wide = wide["pretrain"]
    return {"step_s": best.step_time_s, "mfu": best.mfu,
            "memory_gib": best.memory.per_chip / 2**30,
            "tp32_step_s": wide.step_time_s, "tp32_mfu": wide.mfu}
