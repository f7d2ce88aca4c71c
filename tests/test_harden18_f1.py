"""Session 18, helper f1: the serving plan's cost at capacity for a replica spanning
instances (findings 1 and 12), and `--find-rate`'s answer robust to the seed (finding 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from clustersim.hardware.catalog import catalog_entry
from clustersim.planning import serving_plan
from clustersim.planning.serving_plan import ServingPlanOptions, ServingPlanResult
from clustersim.scenario.loader import load_scenario

ROOT = Path(__file__).resolve().parent.parent


class _FixedCapacity:
    """An engine whose capacity searches all answer (rate, output tokens/s)."""

    kind = "local"
    workers = 1

    def __init__(self, found: tuple[float, float]) -> None:
        self.found = found

    def map(self, fn: Any, tasks: list[Any]) -> list[Any]:
        return [self.found for _ in tasks]


def _p5_row(tp: int, pp: int) -> dict[str, Any]:
    """The planner's row of a p5 shape (pruned: no figures)."""
    from clustersim.planning.serving_space import _Shape

    shape = _Shape("p5", "p5", catalog_entry("p5"), tp, pp, 256)
    return {**serving_plan._row(shape, None, "pruned"), "replicas": 1}


def test_a_replica_on_two_instances_is_charged_both_at_capacity() -> None:
    """Llama 405B on p5 at TP 8 x PP 2 is 16 GPUs, two p5.48xlarge: at capacity it costs
    both instances per hour (the plan charged one, $75.58 against run --find-rate's $148.99),
    and one of TP 4 half an instance."""
    scenario = load_scenario(ROOT / "scenarios" / "serving-llama-trn2.yaml")
    rows = [_p5_row(8, 2), _p5_row(4, 1)]
    result = ServingPlanResult(scenario, "llama405b", ServingPlanOptions(), 0.5, 256.0,
                               pd.DataFrame(rows), rows, {})
    tokens_per_s = 100.0
    serving_plan._capacities(result, ROOT / "scenarios", _FixedCapacity((0.5, tokens_per_s)))
    price = catalog_entry("p5").instance.price_per_hour_usd
    per_million = price / 3600.0 / tokens_per_s * 1e6
    assert rows[0]["cost_per_million_output_tokens_at_capacity_usd"] == pytest.approx(
        2 * per_million)
    assert rows[1]["cost_per_million_output_tokens_at_capacity_usd"] == pytest.approx(
        0.5 * per_million)


def test_the_table_shows_a_replica_spanning_instances_as_a_fraction() -> None:
    """`per inst` read 0 for the 16-GPU replica: it is half a replica per instance."""
    from clustersim.cli.plan_tables import _per_instance

    spanning, fitting = _p5_row(8, 2), _p5_row(4, 1)
    assert spanning["replicas_per_instance"] == 0.5
    assert spanning["instances_per_replica"] == 2
    assert _per_instance(spanning) == "1/2"
    assert _per_instance(fitting) == "2"
