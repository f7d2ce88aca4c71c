"""Scenario files: the validated, immutable description of a simulation.

`models` holds the sections as pydantic specs, `rules` the checks that span sections,
`reading` the strict YAML reader and `--set` overrides, `errors` and `messages` the issues a
user sees, `schema` the JSON Schema for editors, `jobmix` the generated job mixes, and
`loader` puts them together in `load_scenario`.
"""

from clustersim.hardware.failures import StragglerSpec
from clustersim.hardware.topology import FabricSpec
from clustersim.scenario.errors import Issue, ScenarioError
from clustersim.scenario.loader import load_scenario, scenario_from_dict
from clustersim.scenario.models import (
    CheckpointSpec,
    ClusterSpec,
    FailuresSpec,
    JobSpec,
    Scenario,
    SchedulerSpec,
    TraceSpec,
)
from clustersim.scenario.reading import apply_override, parse_override
from clustersim.scenario.schema import scenario_json_schema
from clustersim.training.workload import ParallelismSpec

__all__ = [
    "Issue",
    "ScenarioError",
    "Scenario",
    "ClusterSpec",
    "FabricSpec",
    "JobSpec",
    "ParallelismSpec",
    "CheckpointSpec",
    "FailuresSpec",
    "SchedulerSpec",
    "StragglerSpec",
    "TraceSpec",
    "load_scenario",
    "scenario_from_dict",
    "apply_override",
    "parse_override",
    "scenario_json_schema",
]
