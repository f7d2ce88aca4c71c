"""The hardware description: units, spec types, the catalog of instances, failure rates and the
topology graph built from them. The lowest layer: it imports nothing else of clustersim.
"""

from clustersim.hardware.catalog import (
    ChipSpec,
    HardwareSpec,
    InstanceSpec,
    InterconnectSpec,
    UltraServerSpec,
    catalog_entry,
    catalog_names,
    catalog_source_refs,
    catalog_sources,
    catalog_values,
    neighbours_per_dimension,
    resolve_hardware_mapping,
)
from clustersim.hardware.constants import CollectiveConstants, Efficiency
from clustersim.hardware.precision import PRECISIONS

__all__ = [
    "PRECISIONS",
    "ChipSpec",
    "CollectiveConstants",
    "Efficiency",
    "InterconnectSpec",
    "InstanceSpec",
    "UltraServerSpec",
    "HardwareSpec",
    "catalog_names",
    "catalog_values",
    "catalog_sources",
    "catalog_source_refs",
    "catalog_entry",
    "resolve_hardware_mapping",
    "neighbours_per_dimension",
]
