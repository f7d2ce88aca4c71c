"""The serving plan's figures at SLO capacity: each shown configuration's highest rate one
replica holds (`--find-rate`'s search, on the planning engine), and the cost per million
output tokens there, a replica charged its share of an instance or, when it is larger than
one, every instance it spans; a row without a capacity says why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from clustersim.hardware.catalog import catalog_entry
from clustersim.planning.serving_space import _instances_for, _raw_variant
from clustersim.scenario.loader import scenario_from_dict
from clustersim.serving.capacity import find_rate

__all__ = ["capacities", "instances_charged", "instances_per_replica", "replicas_per_instance"]


def _ep_text(ep: int | None) -> str:
    """`, ep 4` after a mixture's tp and pp (nothing for a dense model's shape)."""
    return "" if ep is None else f", ep {ep}"


def _capacity(task: tuple[dict[str, Any], str, Path | None, float]
              ) -> tuple[float, float] | str:
    """(the highest rate one replica holds, its output tokens per second there), or why no
    rate holds: `--find-rate`'s search of one replica (an engine's task)."""
    mapping, source, base_dir, goodput = task
    one = scenario_from_dict(mapping, source, base_dir=base_dir)
    search = find_rate(one, None, goodput, None, bisections=4, base_dir=base_dir,
                       stop_early=True)
    if search.rate_per_s is not None and search.figures:
        return search.rate_per_s, search.figures["output_tokens_per_s"]
    d = one.serve[0]
    if search.idle is not None and search.idle.share < goodput:
        return (f"even on an idle replica only about {search.idle.share:.1%} of its requests "
                f"could meet the SLO ({search.idle.why(d.slo.ttft_s, d.slo.tpot_s)}), so no "
                "rate can in expectation: its trial at the load met it by the draw of its "
                "requests")
    best = search.best()
    return "no rate tried held" + ("" if best is None else
                                   f" (best goodput {best[1]:.1%} at {best[0]:,.3g}/s)")


def instances_per_replica(ranks: int, spec: Any) -> int:
    """Whole instances a replica of `ranks` spans (1 when it fits in one)."""
    return max(1, -(-ranks // spec.ranks_per_instance))


def replicas_per_instance(ranks: int, spec: Any) -> float:
    """Replicas of `ranks` one instance holds: a whole number when a replica fits in one,
    else 1 / the instances a replica spans (0.5 for a replica on two)."""
    if ranks <= spec.ranks_per_instance:
        return spec.ranks_per_instance // ranks
    return 1.0 / instances_per_replica(ranks, spec)


def instances_charged(ranks: int, spec: Any) -> float:
    """The instances a replica of `ranks` is charged at capacity: its share of one when it
    fits in one (the rest of the instance serves other replicas), else every instance it
    spans (a replica of 16 GPUs holds two p5 instances, not one)."""
    if ranks <= spec.ranks_per_instance:
        return ranks / spec.ranks_per_instance
    return float(instances_per_replica(ranks, spec))


def capacities(result: Any, base_dir: Path | None, runner: Any,
               progress: Any = None) -> None:
    """Each hardware's best, and the shown candidates, at their SLO capacity: the highest
    rate one replica holds, and the cost per million output tokens there (a replica charged
    its share of an instance, or every instance it spans: instances_charged). The searches
    run on the engine, in the ranking's order."""
    shown = {id(r) for r in result.ranked[: result.options.top]}
    shown |= {id(r) for r in result.best_per_hardware().values()}
    index = [d.name for d in result.scenario.serve].index(result.deployment)
    if result.scenario.serve[index].workload.arrival == "trace":
        return  # a trace's rate is the trace's
    raw = yaml.safe_load(result.scenario.source_yaml)
    rows, tasks = [], []
    for row in result.ranked:
        if id(row) not in shown:
            continue
        spec = (result.scenario.hardware if row["hardware"] == result.scenario.hardware.name
                else catalog_entry(row["hardware"]))
        hw_value = (raw.get("hardware") if row["hardware"] == result.scenario.hardware.name
                    else row["hardware"])
        per_replica = result.load_rate_per_s / row["replicas"]
        mapping = _raw_variant(raw, raw["serve"][index], hw_value, row["tp"], row["pp"], 1,
                               row["max_batch"], _instances_for(row["tp"] * row["pp"], 1, spec),
                               row.get("ep"))
        mapping["serve"][0]["workload"]["rate"] = float(per_replica)
        rows.append((row, spec))
        tasks.append((mapping, f"{result.scenario.source} (capacity)", base_dir,
                      result.options.goodput))
    if progress is not None and tasks:
        progress(0, len(tasks), "each best at its SLO capacity")
    for (row, spec), found in zip(rows, runner.map(_capacity, tasks), strict=True):
        if isinstance(found, str):
            row["capacity_why"] = found
            result.notes.append(
                f"{row['hardware']} tp {row['tp']} pp {row['pp']}{_ep_text(row.get('ep'))} "
                f"max_batch {row['max_batch']}: no SLO capacity: {found}")
            continue
        row["capacity_rate_per_s"], tokens = found
        price = spec.instance.price_per_hour_usd
        if price is not None and tokens > 0:
            row["cost_per_million_output_tokens_at_capacity_usd"] = (
                instances_charged(row["tp"] * row["pp"], spec) * price / 3600.0 / tokens * 1e6)
    frame = result.rows
    for row in result.ranked:
        match = ((frame["hardware"] == row["hardware"]) & (frame["tp"] == row["tp"])
                 & (frame["pp"] == row["pp"]) & (frame["max_batch"] == row["max_batch"]))
        if "ep" in row:
            match &= frame["ep"] == row["ep"]
        for key in ("capacity_rate_per_s", "cost_per_million_output_tokens_at_capacity_usd",
                    "capacity_why"):
            frame.loc[match, key] = row.get(key)
