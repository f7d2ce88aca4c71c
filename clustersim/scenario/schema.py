"""The JSON Schema of scenario files as users write them (catalog names, or partial mappings
that derive from a catalog entry with `base:`), for editors' completion and checks.
"""

from __future__ import annotations

import copy
from typing import Any

from clustersim.hardware.catalog import catalog_names
from clustersim.hardware.failures import failure_preset_names
from clustersim.scenario.models import Scenario
from clustersim.training.transformer import model_preset_names

__all__ = ["scenario_json_schema"]


def scenario_json_schema() -> dict[str, Any]:
    """JSON Schema of scenario files, as users write them (catalog names or mappings)."""
    schema = Scenario.model_json_schema(by_alias=True)
    defs = schema.setdefault("$defs", {})
    properties = schema["properties"]
    # Users write a catalog name, or a partial mapping with `base:` (a full one without).
    hardware_mapping = _partial(defs, "HardwareSpec")
    hardware_mapping["properties"]["base"] = {"enum": catalog_names()}
    hardware_mapping["properties"].pop("sources", None)
    defs["HardwareMapping"] = hardware_mapping
    properties["hardware"] = {
        "anyOf": [{"enum": catalog_names()}, {"$ref": "#/$defs/HardwareMapping"}],
        "description": "a catalog name, or a mapping (with base: to derive from an entry)",
    }
    model_mapping = _partial(defs, "TransformerShape")
    model_mapping["properties"]["base"] = {"enum": model_preset_names()}
    defs["ModelMapping"] = model_mapping
    defs["JobSpec"]["properties"]["model"] = {
        "anyOf": [{"enum": model_preset_names()}, {"$ref": "#/$defs/ModelMapping"}],
        "description": "a model preset name, or a mapping of the shape",
    }
    for name, key in (("DeploymentSpec", "model"), ("SpeculativeSpec", "draft")):
        defs[name]["properties"][key] = dict(defs["JobSpec"]["properties"]["model"])
    for key in ("input_tokens", "output_tokens"):  # a count or `trace` as shorthand
        defs["RequestWorkloadSpec"]["properties"][key] = {"anyOf": [
            {"type": "integer", "minimum": 1}, {"const": "trace"},
            {"$ref": "#/$defs/LengthSpec"}]}
    defs["FailuresSpec"]["properties"]["preset"]["enum"] = failure_preset_names()
    schema["title"] = "clustersim scenario"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def _partial(defs: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of a definition with nothing required and every nested spec partial too."""
    partial = copy.deepcopy(defs[name])
    partial.pop("required", None)
    partial["title"] = f"{name} (partial)"
    for prop in partial.get("properties", {}).values():
        _point_to_partials(prop, defs)
    return partial


def _point_to_partials(node: Any, defs: dict[str, Any]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = ref.removeprefix("#/$defs/")
            partial_name = f"{target}Partial"
            if partial_name not in defs and target in defs:
                defs[partial_name] = {}
                defs[partial_name] = _partial(defs, target)
            node["$ref"] = f"#/$defs/{partial_name}"
        for value in node.values():
            _point_to_partials(value, defs)
    elif isinstance(node, list):
        for value in node:
            _point_to_partials(value, defs)
