"""The EFA fabric between instances (a two-tier Clos of leaf and spine switches), and how
large a topology graph of it would be, counted before it is built."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from clustersim.hardware import limits
from clustersim.hardware.catalog import HardwareSpec
from clustersim.hardware.spec import Duration, Spec

__all__ = ["FabricSpec", "TopologyTooLarge", "topology_elements", "check_topology_size"]


class FabricSpec(Spec):
    """The EFA fabric between instances: a two-tier Clos of leaf and spine switches."""

    topology: Literal["clos"] = "clos"
    oversubscription: float = Field(
        default=1.0, ge=limits.MIN_OVERSUBSCRIPTION, le=limits.MAX_OVERSUBSCRIPTION,
        description="leaf downlink over uplink bandwidth; 1 is non-blocking"
    )
    instances_per_leaf: int | None = Field(
        default=None, gt=0, le=limits.MAX_INSTANCES_PER_LEAF,
        description="default: 16, or whole UltraServers of at least 16"
    )
    spines: int = Field(default=16, gt=0, le=limits.MAX_SPINES,
                        description="spine switches; each leaf uplinks to all")
    latency_s: Duration = Field(
        default=15e-6, alias="latency", le=limits.MAX_LATENCY_S,
        description="one EFA message HBM to HBM"
    )

    def leaf_size(self, instances_per_ultraserver: int = 1) -> int:
        """Instances under one leaf switch; by default 16, rounded up to whole UltraServers."""
        if self.instances_per_leaf is not None:
            return self.instances_per_leaf
        return math.ceil(16 / instances_per_ultraserver) * instances_per_ultraserver


class TopologyTooLarge(ValueError):
    """A topology beyond what one machine builds in reasonable memory (docs/limits.md)."""


def topology_elements(hardware: HardwareSpec, instances: int,
                      fabric: FabricSpec | None = None) -> int:
    """Nodes plus links the graph of `instances` instances would have (about 420 bytes each
    in memory), counted without building it."""
    fabric = fabric or FabricSpec()
    hw = hardware
    ipu = hw.instances_per_ultraserver
    chips = instances * hw.chips_per_instance
    link = hw.instance.interconnect
    leaves = math.ceil(instances / fabric.leaf_size(ipu))
    spines = fabric.spines if leaves > 1 else 0
    switches = 0
    if link.topology == "switch":
        switches = instances // ipu if hw.switch_spans_ultraserver else instances
        intra = chips
    else:
        intra = chips * link.links_per_chip(hw.chips_per_instance) // 2
    zring = chips if hw.ultraserver is not None and hw.ultraserver.interconnect.topology == (
        "ring") else 0
    return chips + switches + leaves + spines + intra + zring + chips + leaves * spines


def check_topology_size(hardware: HardwareSpec, instances: int,
                        fabric: FabricSpec | None = None) -> None:
    """Refuse a topology of more than limits.MAX_CHIPS chips or limits.MAX_TOPOLOGY_ELEMENTS
    nodes and links."""
    chips = instances * hardware.chips_per_instance
    if chips > limits.MAX_CHIPS:
        raise TopologyTooLarge(
            f"{instances:,} {hardware.instance.name} instances hold {chips:,} chips; expected "
            f"at most {limits.MAX_CHIPS:,} (docs/limits.md)")
    elements = topology_elements(hardware, instances, fabric)
    if elements > limits.MAX_TOPOLOGY_ELEMENTS:
        raise TopologyTooLarge(
            f"{instances:,} {hardware.instance.name} instances would make a graph of "
            f"{elements:,} nodes and links (about {elements * 420 / 2**30:,.0f} GiB); expected "
            f"at most {limits.MAX_TOPOLOGY_ELEMENTS:,} (docs/limits.md): fewer instances or "
            "spines")
