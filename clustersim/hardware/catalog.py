"""Hardware specs and the catalog of Trainium and GPU instances.

The catalog is data (`catalog/hardware.yaml`): every figure has a value and a source, and
where sources disagree the note says which was taken. A scenario names an entry
(`hardware: trn2`), derives from one (`hardware: {base: trn2, chip: {hbm: 64GiB}}`) or writes
a whole mapping; all three end as one validated, immutable :class:`HardwareSpec`.

How per-chip bandwidth becomes links (documented here once, used by the topology):
vendors quote a chip's interconnect bandwidth as the sum over all its links and, unless
``duplex_counted: false``, over both directions (NVIDIA's "900 GB/s" NVLink4 is 450 GB/s each
way). So one link carries, in each direction,

    per_chip_bandwidth / links_per_chip / (2 if duplex_counted else 1)

where links_per_chip is 4 on a 4x4 torus (two neighbours per dimension), 2 on the Z ring of
a 4-instance UltraServer, and 1 for a chip attached to a switch. Trn2's 1,024 GB/s inside the
instance is therefore 128 GB/s per torus link per direction, and its 256 GB/s between
instances 64 GB/s per Z link per direction. AWS does not publish per-link figures; this
reading is an inference (docs/models.md) and can be changed per scenario.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from clustersim.catalog import read_catalog
from clustersim.hardware import limits
from clustersim.hardware.constants import CollectiveConstants, Efficiency, Framework, ServingConstants
from clustersim.hardware.paths import flatten
from clustersim.hardware.precision import PRECISIONS
from clustersim.hardware.spec import Bandwidth, Bytes, NonNegativeDuration, Power, Spec

__all__ = [
    "custom_base",
    "ChipSpec",
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


def neighbours_per_dimension(size: int) -> int:
    """Distinct neighbours a node has along one periodic dimension of this size."""
    return 0 if size <= 1 else (1 if size == 2 else 2)


class ChipSpec(Spec):
    """One accelerator chip (a Trainium chip or a GPU)."""

    name: str
    cores: int | None = Field(default=None, gt=0, le=1_000_000,
                              description="NeuronCores (or SMs) per chip")
    tflops: dict[str, float] = Field(description="dense peak TFLOPS per precision")
    hbm_bytes: Bytes = Field(alias="hbm")
    hbm_bandwidth_bytes_per_s: Bandwidth = Field(alias="hbm_bandwidth")
    sram_bytes: Bytes | None = Field(default=None, alias="sram", description="on-chip SRAM")
    ranks: int = Field(default=1, gt=0, le=limits.MAX_RANKS_PER_CHIP,
                       description="ranks per chip (Trn2 at LNC=2: 4)")
    power_w: Power | None = Field(default=None, alias="power", description="chip power")
    efficiency: Efficiency = Field(
        default=Efficiency(matmul=0.583, vector=0.369, pass_overhead=0.01228),
        description="default: the catalog's Trn1 fit (scripts/calibrate_collectives.py "
        "--joint)",
    )
    framework: Framework = Field(
        default=Framework(), description="the family's usual training stack (attention kernel, "
        "gradient precision)",
    )

    @model_validator(mode="after")
    def _check_tflops(self) -> ChipSpec:
        for precision, value in self.tflops.items():
            if precision not in PRECISIONS:
                raise ValueError(
                    f"tflops: unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}"
                )
            if value <= 0:
                raise ValueError(f"tflops.{precision}: must be greater than zero, got {value:g}")
            if value > limits.MAX_TFLOPS:
                raise ValueError(f"tflops.{precision}: at most {limits.MAX_TFLOPS:g} per chip "
                                 f"(docs/limits.md), got {value:g}")
        if "bf16" not in self.tflops:
            raise ValueError("tflops: needs at least a bf16 figure")
        return self

    def peak_flops(self, precision: str) -> float:
        """Dense peak in FLOP/s for a precision the chip has."""
        return self.tflops[precision] * 1e12


class InterconnectSpec(Spec):
    """Chip-to-chip links: inside an instance, or between the instances of an UltraServer."""

    topology: Literal["torus2d", "ring", "switch"]
    shape: tuple[Annotated[int, Field(gt=0, le=limits.MAX_CHIPS_PER_INSTANCE)], ...] | None = Field(
        default=None, description="torus2d only: chips along each dimension, e.g. [4, 4]"
    )
    bandwidth_bytes_per_s: Bandwidth | None = Field(
        default=None, alias="bandwidth", description="per chip, summed over its links"
    )
    duplex_counted: bool = Field(
        default=True, description="the per-chip bandwidth counts both directions"
    )
    latency_s: NonNegativeDuration = Field(
        default=1.5e-6, alias="latency", le=limits.MAX_LATENCY_S,
        description="per hop; default 1.5 us, the midpoint of Neuron's 1-2 us per NeuronLink hop",
    )

    @model_validator(mode="after")
    def _check_shape(self) -> InterconnectSpec:
        if self.topology == "torus2d":
            if self.shape is None or len(self.shape) != 2 or min(self.shape) < 1:
                raise ValueError("torus2d needs shape: [X, Y] with X, Y at least 1")
        elif self.shape is not None:
            raise ValueError(
                f"shape applies to torus2d only, not to {self.topology}; set shape: null"
            )
        return self

    def links_per_chip(self, members: int) -> int:
        """Links of one chip in this interconnect joining `members` chips (or instances)."""
        if self.topology == "switch":
            return 1
        if self.topology == "ring":
            return neighbours_per_dimension(members)
        assert self.shape is not None
        return sum(neighbours_per_dimension(size) for size in self.shape)

    def link_bandwidth_per_direction(self, members: int) -> float:
        """Bytes/s one link carries in one direction (see the module docstring)."""
        links = self.links_per_chip(members)
        if links == 0 or self.bandwidth_bytes_per_s is None:
            return 0.0
        return self.bandwidth_bytes_per_s / links / (2 if self.duplex_counted else 1)


class InstanceSpec(Spec):
    """One server: its chips, their interconnect, its EFA bandwidth and its price."""

    name: str = "custom instance"
    chips: int = Field(gt=0, le=limits.MAX_CHIPS_PER_INSTANCE)
    interconnect: InterconnectSpec
    efa_bytes_per_s: Bandwidth = Field(alias="efa", description="EFA bandwidth per instance")
    efa_devices: int | None = Field(default=None, gt=0, le=1_024)
    vcpus: int | None = Field(default=None, gt=0, le=1_000_000)
    host_memory_bytes: Bytes | None = Field(default=None, alias="host_memory")
    price_per_hour_usd: float | None = Field(
        default=None,
        ge=0,
        le=limits.MAX_PRICE_PER_HOUR_USD,
        alias="price_per_hour",
        description="on-demand USD per instance-hour: an assumption, override it",
    )

    @model_validator(mode="after")
    def _check_interconnect(self) -> InstanceSpec:
        shape = self.interconnect.shape
        if shape is not None and shape[0] * shape[1] != self.chips:
            raise ValueError(
                f"interconnect.shape {list(shape)} holds {shape[0] * shape[1]} chips, "
                f"but the instance has {self.chips}"
            )
        if self.interconnect.bandwidth_bytes_per_s is None and self.chips > 1:
            raise ValueError("interconnect.bandwidth is required for an instance of several chips")
        return self


class UltraServerSpec(Spec):
    """Instances joined by chip-to-chip links (Trn2 UltraServer: a Z ring; Trn3: NeuronSwitch)."""

    name: str | None = None
    instances: int = Field(gt=1, le=limits.MAX_INSTANCES_PER_ULTRASERVER)
    interconnect: InterconnectSpec


class HardwareSpec(Spec):
    """A complete hardware description: chip, instance and optional UltraServer."""

    name: str = "custom"
    description: str = ""
    chip: ChipSpec
    instance: InstanceSpec
    ultraserver: UltraServerSpec | None = None
    collectives: CollectiveConstants = CollectiveConstants()
    serving: ServingConstants = ServingConstants()
    sources: dict[str, str] = Field(
        default_factory=dict, description="dotted field path -> where the figure comes from"
    )

    @model_validator(mode="after")
    def _check_ultraserver(self) -> HardwareSpec:
        us = self.ultraserver
        if us is None:
            return self
        link = us.interconnect
        if link.topology == "torus2d":
            raise ValueError("ultraserver.interconnect.topology must be ring or switch")
        if link.topology == "switch":
            if self.instance.interconnect.topology != "switch":
                raise ValueError(
                    "a switch UltraServer joins all its chips on one NeuronSwitch, so "
                    "instance.interconnect.topology must be switch too"
                )
            if link.bandwidth_bytes_per_s is not None:
                raise ValueError(
                    "ultraserver.interconnect.bandwidth is not used with a switch: a chip's "
                    "link to the switch is instance.interconnect.bandwidth"
                )
        elif link.bandwidth_bytes_per_s is None:
            raise ValueError("ultraserver.interconnect.bandwidth is required for a ring")
        return self

    # Derived figures used across the package.
    @property
    def chips_per_instance(self) -> int:
        return self.instance.chips

    @property
    def ranks_per_instance(self) -> int:
        return self.instance.chips * self.chip.ranks

    def whole_ultraservers(self, tp: int) -> bool:
        """Whether a job of this tensor parallelism is placed on whole UltraServers: its TP
        group spans instances joined by a ring UltraServer's Z rings."""
        return (self.ultraserver is not None
                and self.ultraserver.interconnect.topology == "ring"
                and tp > self.ranks_per_instance)

    @property
    def instances_per_ultraserver(self) -> int:
        return self.ultraserver.instances if self.ultraserver else 1

    @property
    def chips_per_ultraserver(self) -> int:
        return self.instances_per_ultraserver * self.instance.chips

    @property
    def switch_spans_ultraserver(self) -> bool:
        us = self.ultraserver
        return us is not None and us.interconnect.topology == "switch"

    @property
    def efa_per_chip_bytes_per_s(self) -> float:
        """EFA bandwidth shared evenly by the chips of an instance (Trn2: one 200 Gbps NIC each)."""
        return self.instance.efa_bytes_per_s / self.instance.chips

    def source_of(self, path: str) -> str | None:
        return self.sources.get(path)


# ---------------------------------------------------------------------------------------------
# Catalog data


def _catalog_document() -> dict[str, Any]:
    return read_catalog("hardware")


def _is_sourced(node: Any) -> bool:
    return isinstance(node, Mapping) and "value" in node and set(node) <= {"value", "source", "note"}


def _split_sources(node: Any, path: str, sources: dict[str, str]) -> Any:
    """Strip `{value, source, note}` leaves down to their values, collecting the citations."""
    if _is_sourced(node):
        cited = str(node.get("source", ""))
        if node.get("note"):
            cited = f"{cited}: {node['note']}" if cited else str(node["note"])
        if cited:
            sources[path] = cited
        return node["value"]
    if isinstance(node, Mapping):
        return {
            key: _split_sources(value, f"{path}.{key}" if path else key, sources)
            for key, value in node.items()
        }
    return node


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists, scalars, null) replaces."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def catalog_names() -> list[str]:
    """Names of the catalog entries, in catalog order."""
    return list(_catalog_document()["entries"])


def catalog_source_refs() -> dict[str, str]:
    """Short source keys used in the catalog (e.g. `T2`) and what each names."""
    return dict(_catalog_document()["sources"])


@cache
def _resolved_entry(name: str) -> tuple[dict[str, Any], dict[str, str]]:
    entries = _catalog_document()["entries"]
    if name not in entries:
        raise KeyError(name)
    raw = dict(entries[name])
    sources: dict[str, str] = {}
    values = _split_sources({k: v for k, v in raw.items() if k != "base"}, "", sources)
    if "base" in raw:
        base_values, base_sources = _resolved_entry(raw["base"])
        sources = {**base_sources, **sources}
        values = deep_merge(base_values, values)
    values["name"] = name
    return values, sources


def catalog_values(name: str) -> dict[str, Any]:
    """The plain values of a catalog entry (its `base` chain applied), as a scenario mapping."""
    values, _ = _resolved_entry(name)
    return copy.deepcopy(values)


def catalog_sources(name: str) -> dict[str, str]:
    """Field path -> citation for a catalog entry."""
    return dict(_resolved_entry(name)[1])


def resolve_hardware_mapping(hardware: str | Mapping[str, Any]) -> dict[str, Any]:
    """Turn a catalog name or a (`base:`-derived) mapping into the full mapping to validate.

    Raises KeyError for an unknown catalog name (the caller reports it with its key path).
    """
    if isinstance(hardware, str):
        values, sources = _resolved_entry(hardware)
        return {**copy.deepcopy(values), "sources": dict(sources)}
    mapping = dict(hardware)
    base = mapping.pop("base", None)
    if base is None:
        mapping.setdefault("sources", {p: "scenario" for p in flatten(mapping)})
        return mapping
    if not isinstance(base, str):
        raise KeyError(base)
    values, sources = _resolved_entry(base)
    merged = deep_merge(values, mapping)
    if "name" not in mapping:
        merged["name"] = f"{base}+custom"
    overridden = {p: "scenario override" for p in flatten(mapping) if p != "name"}
    removed = [p for p in flatten(mapping) if _get(mapping, p) is None]
    kept = {
        path: cited for path, cited in sources.items()
        if not any(path == r or path.startswith(r + ".") for r in removed)
    }
    merged["sources"] = {**kept, **overridden}
    return merged


def _get(mapping: Mapping[str, Any], path: str) -> Any:
    node: Any = mapping
    for part in path.split("."):
        node = node[part]
    return node


def catalog_entry(name: str) -> HardwareSpec:
    """A catalog entry as a validated spec."""
    return HardwareSpec.model_validate(resolve_hardware_mapping(name))


def custom_base(name: str) -> str | None:
    """The catalog entry a scenario's hardware mapping (`{base: ..., ...}`) changed, from the
    name the loader gives it (`trn3-gen2+custom`), or None."""
    return name.removesuffix("+custom") if name.endswith("+custom") else None
