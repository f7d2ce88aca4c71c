"""Scenario files: the validated, immutable description of a simulation, its loader and rules.
"""

from clustersim.scenario.loader import (
    CheckpointSpec,
    ClusterSpec,
    FabricSpec,
    FailuresSpec,
    Issue,
    JobSpec,
    ParallelismSpec,
    Scenario,
    ScenarioError,
    SchedulerSpec,
    StragglerSpec,
    TraceSpec,
    apply_override,
    load_scenario,
    parse_override,
    scenario_from_dict,
    scenario_json_schema,
)

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
