"""The hardware catalog and specs: published figures, sources, link split and derived mappings."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from clustersim.hardware.catalog import (
    HardwareSpec,
    catalog_entry,
    catalog_names,
    catalog_source_refs,
    catalog_sources,
    catalog_values,
    neighbours_per_dimension,
    resolve_hardware_mapping,
)
from clustersim.hardware.precision import PRECISIONS

GiB = 2.0**30
Gbps = 1e9 / 8  # bytes/s in one Gbit/s

TRAINIUM = ["trn1", "trn1n", "trn2", "trn2u", "trn3-gen1", "trn3-gen2"]
GPUS = ["p4d", "p4de", "p5", "p5e", "p5en"]

# ---------------------------------------------------------------------------------------------
# The published figures (the catalog's sources: AWS Neuron docs, AWS and NVIDIA pages),
# written out again by hand.
#
# Keys: bf16/fp8/fp32 (dense TFLOPS), hbm (bytes), hbm_bw (bytes/s), chips (per instance),
# ranks (per chip), link (per-chip interconnect bandwidth inside the instance, bytes/s, as the
# vendor quotes it), efa (per instance, bytes/s), topology, cores, ultraserver figures.

TRN2_CHIP = {"bf16": 667, "fp8": 1299, "fp32": 181, "hbm": 96 * GiB, "hbm_bw": 2.9e12,
             "ranks": 4, "cores": 8}
TRN3_CHIP = {"bf16": 671, "fp8": 2517, "fp32": 183, "hbm": 144 * GiB, "hbm_bw": 4.9e12,
             "cores": 8}
TRN1_CHIP = {"bf16": 190, "fp8": 190, "fp32": 47.5, "hbm": 32 * GiB, "hbm_bw": 820 * GiB,
             "ranks": 2, "cores": 2}

PUBLISHED: dict[str, dict[str, Any]] = {
    "trn1": {**TRN1_CHIP, "chips": 16, "topology": "torus2d", "shape": (4, 4),
             "link": 384 * GiB, "efa": 800 * Gbps, "efa_devices": 8, "ranks_per_instance": 32,
             "vcpus": 128, "host_memory": 512 * GiB, "ultraserver": None},
    "trn1n": {**TRN1_CHIP, "chips": 16, "topology": "torus2d", "shape": (4, 4),
              "link": 768 * GiB, "efa": 1600 * Gbps, "efa_devices": 16,
              "ranks_per_instance": 32, "ultraserver": None},
    "trn2": {**TRN2_CHIP, "chips": 16, "topology": "torus2d", "shape": (4, 4), "link": 1024e9,
             "efa": 3200 * Gbps, "efa_per_chip": 200 * Gbps, "ranks_per_instance": 64,
             "vcpus": 192, "host_memory": 2 * 2**40, "ultraserver": None},
    "trn2u": {**TRN2_CHIP, "chips": 16, "topology": "torus2d", "shape": (4, 4), "link": 1024e9,
              "efa": 3200 * Gbps, "efa_per_chip": 200 * Gbps, "ranks_per_instance": 64,
              "ultraserver": {"instances": 4, "chips": 64, "topology": "ring",
                              "link": 256e9, "efa": 12800 * Gbps}},
    # Trn3 EFA is published per UltraServer only: per server it is that over the servers.
    "trn3-gen1": {**TRN3_CHIP, "chips": 16, "topology": "switch", "link": 2.56e12,
                  "efa": 12800 * Gbps / 4,
                  "ultraserver": {"instances": 4, "chips": 64, "topology": "switch",
                                  "link": None, "efa": 12800 * Gbps}},
    "trn3-gen2": {**TRN3_CHIP, "chips": 4, "topology": "switch", "link": 2.56e12,
                  "efa": 28800 * Gbps / 36,
                  "ultraserver": {"instances": 36, "chips": 144, "topology": "switch",
                                  "link": None, "efa": 28800 * Gbps}},
    # GPU comparators: 8 GPUs, dense BF16, HBM per GPU (as nvidia-smi reports it, MiB: the
    # datasheets' 40/80/141 GB are rounded), HBM bandwidth, NVLink per GPU, EFA per instance.
    "p4d": {"chips": 8, "bf16": 312, "hbm": 40960 * 2**20, "hbm_bw": 1.555e12, "topology": "switch",
            "link": 600e9, "efa": 400 * Gbps, "ranks": 1, "ultraserver": None},
    "p4de": {"chips": 8, "bf16": 312, "hbm": 81920 * 2**20, "hbm_bw": 2.039e12, "topology": "switch",
             "link": 600e9, "efa": 400 * Gbps, "ranks": 1, "ultraserver": None},
    "p5": {"chips": 8, "bf16": 989, "fp8": 1979, "hbm": 81559 * 2**20, "hbm_bw": 3.35e12,
           "topology": "switch", "link": 900e9, "efa": 3200 * Gbps, "ranks": 1,
           "ultraserver": None},
    "p5e": {"chips": 8, "bf16": 989, "hbm": 143771 * 2**20, "hbm_bw": 4.8e12, "topology": "switch",
            "link": 900e9, "efa": 3200 * Gbps, "ranks": 1, "ultraserver": None},
    "p5en": {"chips": 8, "bf16": 989, "hbm": 143771 * 2**20, "hbm_bw": 4.8e12, "topology": "switch",
             "link": 900e9, "efa": 3200 * Gbps, "ranks": 1, "ultraserver": None},
}

# Published instance / UltraServer totals (bf16 and fp8 in TFLOPS, HBM in bytes, HBM
# bandwidth in bytes/s), checked against chips x per-chip figures within the rounding of
# the published totals.
PUBLISHED_TOTALS = [
    # name, chips counted, figure, published total
    ("trn1", "instance", "bf16", 3040),
    ("trn1", "instance", "hbm", 512 * GiB),
    ("trn1", "instance", "hbm_bw", 13120 * GiB),
    ("trn2", "instance", "fp8", 20.8e3),
    ("trn2", "instance", "bf16", 10.7e3),
    ("trn2", "instance", "hbm", 1536 * GiB),
    ("trn2", "instance", "hbm_bw", 46.4e12),
    ("trn2u", "ultraserver", "fp8", 83.2e3),
    ("trn2u", "ultraserver", "bf16", 42.8e3),
    ("trn2u", "ultraserver", "hbm", 6144 * GiB),
    ("trn2u", "ultraserver", "hbm_bw", 185.6e12),
    ("trn3-gen1", "ultraserver", "fp8", 161e3),
    ("trn3-gen1", "ultraserver", "hbm", 9216 * GiB),
    ("trn3-gen1", "ultraserver", "hbm_bw", 313.6e12),
    ("trn3-gen2", "ultraserver", "fp8", 362e3),
    ("trn3-gen2", "ultraserver", "hbm", 20736 * GiB),
    ("trn3-gen2", "ultraserver", "hbm_bw", 705.6e12),
]


def close(a: float | None, b: float | None, rel: float = 1e-9) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=rel)


# ---------------------------------------------------------------------------------------------
# Every entry validates


def test_catalog_lists_every_published_entry() -> None:
    names = catalog_names()
    assert set(PUBLISHED) <= set(names)
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name", catalog_names())
def test_catalog_entry_validates(name: str) -> None:
    spec = catalog_entry(name)
    assert isinstance(spec, HardwareSpec)
    assert spec.name == name
    assert spec.chip.tflops["bf16"] > 0
    assert set(spec.chip.tflops) <= set(PRECISIONS)
    assert spec.instance.chips > 0
    # The values the catalog gives are a valid scenario mapping by themselves.
    HardwareSpec.model_validate({**catalog_values(name), "sources": catalog_sources(name)})
    # Specs are frozen.
    with pytest.raises(ValidationError):
        spec.instance.chips = 1  # type: ignore[misc]


def test_unknown_catalog_name_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        catalog_entry("trn9")
    with pytest.raises(KeyError):
        resolve_hardware_mapping("trn9")
    with pytest.raises(KeyError):
        resolve_hardware_mapping({"base": "trn9"})


# ---------------------------------------------------------------------------------------------
# Published figures


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_catalog_matches_published_figures(name: str) -> None:
    want = PUBLISHED[name]
    spec = catalog_entry(name)
    chip, instance = spec.chip, spec.instance
    for precision in ("bf16", "fp8", "fp32"):
        if precision in want:
            assert chip.tflops[precision] == want[precision], precision
            assert chip.peak_flops(precision) == want[precision] * 1e12
    assert close(chip.hbm_bytes, want["hbm"]), "hbm"
    assert close(chip.hbm_bandwidth_bytes_per_s, want["hbm_bw"]), "hbm bandwidth"
    assert instance.chips == want["chips"]
    assert spec.chips_per_instance == want["chips"]
    assert instance.interconnect.topology == want["topology"]
    if "shape" in want:
        assert tuple(instance.interconnect.shape) == want["shape"]
    assert close(instance.interconnect.bandwidth_bytes_per_s, want["link"]), "interconnect"
    assert close(instance.efa_bytes_per_s, want["efa"]), "efa"
    for key, actual in [
        ("ranks", chip.ranks),
        ("cores", chip.cores),
        ("ranks_per_instance", spec.ranks_per_instance),
        ("efa_devices", instance.efa_devices),
        ("vcpus", instance.vcpus),
    ]:
        if key in want:
            assert actual == want[key], key
    if "host_memory" in want:
        assert close(instance.host_memory_bytes, want["host_memory"])
    if "efa_per_chip" in want:
        assert close(spec.efa_per_chip_bytes_per_s, want["efa_per_chip"])


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_ultraserver_figures(name: str) -> None:
    want = PUBLISHED[name]["ultraserver"]
    spec = catalog_entry(name)
    if want is None:
        assert spec.ultraserver is None
        assert spec.instances_per_ultraserver == 1
        assert spec.chips_per_ultraserver == spec.instance.chips
        assert not spec.switch_spans_ultraserver
        return
    us = spec.ultraserver
    assert us is not None
    assert us.instances == want["instances"]
    assert spec.instances_per_ultraserver == want["instances"]
    assert spec.chips_per_ultraserver == want["chips"]
    assert us.interconnect.topology == want["topology"]
    assert spec.switch_spans_ultraserver == (want["topology"] == "switch")
    assert close(us.interconnect.bandwidth_bytes_per_s, want["link"])
    # EFA is quoted per instance in the catalog, per UltraServer in the published tables.
    assert close(spec.instance.efa_bytes_per_s * us.instances, want["efa"])


def test_trn2_headline_figures() -> None:
    """The figures most results depend on, spelt out once more."""
    trn2 = catalog_entry("trn2")
    assert trn2.chip.tflops == {"bf16": 667, "fp8": 1299, "fp32": 181}
    assert trn2.chip.hbm_bytes == 96 * 2**30
    assert trn2.chip.hbm_bandwidth_bytes_per_s == 2.9e12
    assert trn2.instance.chips == 16
    assert trn2.chip.ranks == 4
    assert trn2.ranks_per_instance == 64
    assert trn2.instance.efa_bytes_per_s == 400e9
    assert trn2.instance.interconnect.bandwidth_bytes_per_s == 1024e9
    trn2u = catalog_entry("trn2u")
    assert trn2u.instances_per_ultraserver == 4
    assert trn2u.chips_per_ultraserver == 64
    assert trn2u.ultraserver is not None
    assert trn2u.ultraserver.interconnect.bandwidth_bytes_per_s == 256e9
    # trn2u is trn2 plus the UltraServer: same chip.
    assert trn2u.chip == trn2.chip


@pytest.mark.parametrize(("name", "scope", "figure", "total"), PUBLISHED_TOTALS)
def test_published_totals(name: str, scope: str, figure: str, total: float) -> None:
    spec = catalog_entry(name)
    chips = spec.chips_per_instance if scope == "instance" else spec.chips_per_ultraserver
    per_chip = {
        "bf16": spec.chip.tflops["bf16"],
        "fp8": spec.chip.tflops.get("fp8", 0),
        "hbm": spec.chip.hbm_bytes,
        "hbm_bw": spec.chip.hbm_bandwidth_bytes_per_s,
    }[figure]
    assert math.isclose(chips * per_chip, total, rel_tol=0.005)


# ---------------------------------------------------------------------------------------------
# Sources

SOURCED_FIGURES = [
    "chip.tflops.bf16",
    "chip.tflops.fp8",
    "chip.tflops.fp32",
    "chip.hbm",
    "chip.hbm_bandwidth",
    "chip.ranks",
    "instance.chips",
    "instance.interconnect.bandwidth",
    "instance.efa",
]


@pytest.mark.parametrize("name", TRAINIUM)
def test_trainium_figures_have_sources(name: str) -> None:
    spec = catalog_entry(name)
    for path in SOURCED_FIGURES:
        assert spec.source_of(path), f"{name}: {path} has no source"
    if spec.ultraserver is not None:
        assert spec.source_of("ultraserver.instances")
        if spec.ultraserver.interconnect.topology == "ring":
            assert spec.source_of("ultraserver.interconnect.bandwidth")


@pytest.mark.parametrize("name", TRAINIUM)
def test_every_trainium_value_has_a_source(name: str) -> None:
    """Every leaf of the entry except names, descriptions and the torus shape is cited."""
    sources = catalog_entry(name).sources
    unsourced = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else key)
        elif path.rsplit(".", 1)[-1] not in {"name", "description", "shape"}:
            if not sources.get(path):
                unsourced.append(path)

    walk(catalog_values(name), "")
    assert unsourced == []


@pytest.mark.parametrize("name", GPUS)
def test_gpu_table_figures_have_sources(name: str) -> None:
    spec = catalog_entry(name)
    for path in ["chip.tflops.bf16", "chip.hbm", "chip.hbm_bandwidth",
                 "instance.interconnect.bandwidth", "instance.efa"]:
        assert spec.source_of(path), f"{name}: {path} has no source"


@pytest.mark.parametrize("name", catalog_names())
def test_sources_cite_known_references(name: str) -> None:
    refs = catalog_source_refs()
    assert {"T1", "T2", "T2I", "T3", "CC", "NV"} <= set(refs)
    for path, cited in catalog_sources(name).items():
        key = cited.split(":", 1)[0].strip()
        assert key in refs, f"{name}: {path} cites {cited!r}"


def test_specific_citations() -> None:
    assert catalog_sources("trn2")["chip.tflops.bf16"].startswith("T2")
    assert catalog_sources("trn2")["instance.interconnect.bandwidth"].startswith("T2I")
    assert catalog_sources("trn2")["instance.efa"].startswith("CC")
    assert catalog_sources("trn2u")["ultraserver.interconnect.bandwidth"].startswith("T2I")
    assert catalog_sources("trn1")["chip.hbm"].startswith("T1")
    assert catalog_sources("trn3-gen1")["chip.tflops.fp8"].startswith("T3")
    assert catalog_sources("p5")["instance.interconnect.bandwidth"].startswith("NVLINK")
    # Derived entries inherit their base's citations and replace the ones they override.
    assert catalog_sources("trn2u")["chip.hbm"] == catalog_sources("trn2")["chip.hbm"]
    assert catalog_sources("trn2u")["instance.price_per_hour"].startswith("ASSUMED")
    # Where sources disagree the note says which figure was taken.
    assert "655" in catalog_sources("trn2")["chip.tflops.bf16"]


# ---------------------------------------------------------------------------------------------
# Link split: per_chip / links_per_chip / 2 (duplex counted)


def test_neighbours_per_dimension() -> None:
    assert [neighbours_per_dimension(n) for n in (1, 2, 3, 4, 36)] == [0, 1, 2, 2, 2]


def test_trn2_torus_link() -> None:
    ic = catalog_entry("trn2").instance.interconnect
    assert ic.duplex_counted
    assert ic.links_per_chip(16) == 4
    assert ic.link_bandwidth_per_direction(16) == 1024e9 / 4 / 2 == 128e9


def test_trn2u_z_link() -> None:
    spec = catalog_entry("trn2u")
    assert spec.ultraserver is not None
    ring = spec.ultraserver.interconnect
    assert ring.links_per_chip(4) == 2
    assert ring.link_bandwidth_per_direction(4) == 256e9 / 2 / 2 == 64e9
    # The torus inside each instance is unchanged.
    assert spec.instance.interconnect.link_bandwidth_per_direction(16) == 128e9


def test_switch_links() -> None:
    p5 = catalog_entry("p5").instance.interconnect
    assert p5.links_per_chip(8) == 1
    assert p5.link_bandwidth_per_direction(8) == 450e9
    assert catalog_entry("p4d").instance.interconnect.link_bandwidth_per_direction(8) == 300e9
    trn3 = catalog_entry("trn3-gen1").instance.interconnect
    assert trn3.link_bandwidth_per_direction(16) == 2.56e12 / 2


def test_trn1_torus_link() -> None:
    ic = catalog_entry("trn1").instance.interconnect
    assert ic.link_bandwidth_per_direction(16) == 384 * GiB / 4 / 2


def test_link_split_without_duplex_counting() -> None:
    spec = HardwareSpec.model_validate(resolve_hardware_mapping(
        {"base": "trn2", "instance": {"interconnect": {"duplex_counted": False}}}
    ))
    assert spec.instance.interconnect.link_bandwidth_per_direction(16) == 256e9


def test_small_rings_and_tori() -> None:
    # A ring of 2 has one neighbour; a 2x1 torus one link; a lone chip none.
    spec = HardwareSpec.model_validate(resolve_hardware_mapping({
        "base": "trn2",
        "instance": {"chips": 2, "interconnect": {"shape": [2, 1]}},
        "ultraserver": {"instances": 2,
                        "interconnect": {"topology": "ring", "bandwidth": "100GB/s",
                                         "latency": "1us"}},
    }))
    assert spec.instance.interconnect.links_per_chip(2) == 1
    assert spec.instance.interconnect.link_bandwidth_per_direction(2) == 1024e9 / 2
    assert spec.ultraserver is not None
    assert spec.ultraserver.interconnect.link_bandwidth_per_direction(2) == 50e9


# ---------------------------------------------------------------------------------------------
# Derived and whole mappings


def test_override_one_figure_of_a_catalog_entry() -> None:
    mapping = resolve_hardware_mapping({"base": "trn2", "chip": {"hbm": "64GiB"}})
    spec = HardwareSpec.model_validate(mapping)
    trn2 = catalog_entry("trn2")
    assert spec.chip.hbm_bytes == 64 * GiB
    assert spec.name != "trn2"
    assert spec.chip.model_dump(exclude={"hbm_bytes"}) == trn2.chip.model_dump(
        exclude={"hbm_bytes"}
    )
    assert spec.instance == trn2.instance
    assert spec.ultraserver is None
    # Sources mark the override and keep the catalog's citations for the rest.
    assert "scenario" in spec.sources["chip.hbm"]
    assert spec.sources["chip.hbm"] != trn2.sources["chip.hbm"]
    assert spec.sources["chip.tflops.bf16"] == trn2.sources["chip.tflops.bf16"]
    assert spec.sources["instance.efa"] == trn2.sources["instance.efa"]


def test_override_merges_nested_mappings() -> None:
    spec = HardwareSpec.model_validate(resolve_hardware_mapping(
        {"base": "trn2", "name": "trn2-lnc1", "chip": {"ranks": 8, "tflops": {"bf16": 700}}}
    ))
    assert spec.name == "trn2-lnc1"
    assert spec.chip.tflops == {"bf16": 700, "fp8": 1299, "fp32": 181}
    assert spec.ranks_per_instance == 128
    assert "scenario" in spec.sources["chip.tflops.bf16"]
    assert "scenario" not in spec.sources["chip.tflops.fp8"]


def test_override_does_not_touch_the_catalog() -> None:
    before = catalog_values("trn2")
    mapping = resolve_hardware_mapping({"base": "trn2", "chip": {"hbm": "64GiB"}})
    mapping["chip"]["tflops"]["bf16"] = 1
    resolved = resolve_hardware_mapping("trn2")
    resolved["instance"]["chips"] = 3
    assert catalog_values("trn2") == before
    assert catalog_entry("trn2").chip.hbm_bytes == 96 * GiB
    assert catalog_entry("trn2").chip.tflops["bf16"] == 667


def test_removing_the_ultraserver() -> None:
    spec = HardwareSpec.model_validate(
        resolve_hardware_mapping({"base": "trn2u", "ultraserver": None})
    )
    assert spec.ultraserver is None
    assert spec.instances_per_ultraserver == 1
    assert spec.chips_per_ultraserver == 16
    assert "scenario" in spec.sources["ultraserver"]
    assert spec.chip == catalog_entry("trn2u").chip


def test_adding_an_ultraserver() -> None:
    spec = HardwareSpec.model_validate(resolve_hardware_mapping({
        "base": "trn2",
        "ultraserver": {"instances": 4,
                        "interconnect": {"topology": "ring", "bandwidth": "256GB/s",
                                         "latency": "1.5us"}},
    }))
    assert spec.chips_per_ultraserver == 64
    assert spec.ultraserver is not None
    assert spec.ultraserver.interconnect.link_bandwidth_per_direction(4) == 64e9


FULL_MAPPING: dict[str, Any] = {
    "name": "my-trn2",
    "chip": {
        "name": "Trainium2",
        "tflops": {"bf16": 667, "fp8": 1299, "fp32": 181},
        "hbm": "96GiB",
        "hbm_bandwidth": "2.9TB/s",
        "ranks": 4,
        "power": "500W",
        "efficiency": {"matmul": 0.6, "vector": 0.7},
    },
    "instance": {
        "name": "trn2.48xlarge",
        "chips": 16,
        "interconnect": {"topology": "torus2d", "shape": [4, 4], "bandwidth": "1024GB/s",
                         "latency": "1.5us"},
        "efa": "3200Gbps",
        "price_per_hour": 0,
    },
    "ultraserver": {
        "instances": 4,
        "interconnect": {"topology": "ring", "bandwidth": "256GB/s", "latency": "1.5us"},
    },
}


def test_full_mapping_from_scratch() -> None:
    mapping = resolve_hardware_mapping(copy.deepcopy(FULL_MAPPING))
    spec = HardwareSpec.model_validate(mapping)
    trn2u = catalog_entry("trn2u")
    assert spec.name == "my-trn2"
    assert spec.chip.tflops == trn2u.chip.tflops
    assert spec.chip.hbm_bytes == trn2u.chip.hbm_bytes
    assert spec.chip.hbm_bandwidth_bytes_per_s == trn2u.chip.hbm_bandwidth_bytes_per_s
    assert spec.chip.power_w == 500.0
    assert spec.instance.efa_bytes_per_s == trn2u.instance.efa_bytes_per_s
    assert spec.instance.price_per_hour_usd == 0
    assert spec.chips_per_ultraserver == 64
    assert spec.ultraserver is not None
    assert spec.ultraserver.interconnect.link_bandwidth_per_direction(4) == 64e9
    # Every figure of a hand-written mapping is cited as coming from the scenario.
    assert spec.sources["chip.hbm"] == "scenario"
    assert spec.sources["instance.interconnect.bandwidth"] == "scenario"


def test_contract_example_mapping_without_base() -> None:
    contract_example = {
        "chip": {
            "name": "Trainium2",
            "tflops": {"bf16": 667, "fp8": 1299, "fp32": 181},
            "hbm": "96GiB",
            "hbm_bandwidth": "2.9TB/s",
            "ranks": 4,
            "power": "500W",
        },
        "instance": {
            "chips": 16,
            "interconnect": {"topology": "torus2d", "shape": [4, 4], "bandwidth": "1024GB/s"},
            "efa": "3200Gbps",
            "price_per_hour": 0,
        },
        "ultraserver": {
            "instances": 4,
            "interconnect": {"topology": "ring", "bandwidth": "256GB/s"},
        },
    }
    HardwareSpec.model_validate(resolve_hardware_mapping(contract_example))


def test_spec_is_json_serialisable() -> None:
    spec = catalog_entry("trn2u")
    dumped = json.loads(spec.model_dump_json(by_alias=True))
    assert dumped["chip"]["hbm"] == 96 * GiB
    assert HardwareSpec.model_validate(dumped) == spec


def _without_bf16() -> dict[str, Any]:
    mapping = copy.deepcopy(FULL_MAPPING)
    mapping["chip"]["tflops"] = {"fp8": 1299}
    return mapping


# What is wrong -> (mapping, words the error must contain).
BAD_MAPPINGS: dict[str, tuple[dict[str, Any], str]] = {
    "torus shape not matching chips": (
        {"base": "trn2", "instance": {"chips": 8}}, "16 chips"),
    "torus shape of one dimension": (
        {"base": "trn2", "instance": {"interconnect": {"shape": [16]}}}, "shape"),
    "shape on a switch": (
        {"base": "p5", "instance": {"interconnect": {"shape": [2, 4]}}}, "torus2d only"),
    "ultraserver ring without bandwidth": (
        {"base": "trn2",
         "ultraserver": {"instances": 4,
                         "interconnect": {"topology": "ring", "latency": "1us"}}},
        "bandwidth is required"),
    "switch UltraServer over a torus instance": (
        {"base": "trn2",
         "ultraserver": {"instances": 4,
                         "interconnect": {"topology": "switch", "latency": "1us"}}},
        "must be switch"),
    "torus UltraServer": (
        {"base": "trn2u",
         "ultraserver": {"interconnect": {"topology": "torus2d", "shape": [2, 2]}}},
        "ring or switch"),
    "switch UltraServer with its own bandwidth": (
        {"base": "trn3-gen1", "ultraserver": {"interconnect": {"bandwidth": "1TB/s"}}},
        "not used with a switch"),
    "UltraServer of one instance": (
        {"base": "trn2u", "ultraserver": {"instances": 1}}, "greater than 1"),
    "unknown precision in tflops": (
        {"base": "trn2", "chip": {"tflops": {"int8": 2000}}}, "unknown precision 'int8'"),
    "no bf16 figure": (_without_bf16(), "bf16"),
    "zero tflops": ({"base": "trn2", "chip": {"tflops": {"fp8": 0}}}, "greater than zero"),
    "negative hbm": ({"base": "trn2", "chip": {"hbm": "-96GiB"}}, "greater than zero"),
    "zero hbm": ({"base": "trn2", "chip": {"hbm": 0}}, "greater than zero"),
    "hbm with a bad unit": ({"base": "trn2", "chip": {"hbm": "96GiBs"}}, "GiBs"),
    "hbm bandwidth in bytes": (
        {"base": "trn2", "chip": {"hbm_bandwidth": "2.9TB"}}, "bandwidth unit"),
    "efa as a duration": ({"base": "trn2", "instance": {"efa": "5s"}}, "bandwidth unit"),
    "zero chips": ({"base": "trn2", "instance": {"chips": 0}}, "greater than 0"),
    "zero ranks": ({"base": "trn2", "chip": {"ranks": 0}}, "greater than 0"),
    "efficiency above one": (
        {"base": "trn2", "chip": {"efficiency": {"matmul": 1.5}}}, "less than or equal to 1"),
    "prefill overhead of seconds": (
        {"base": "trn2", "serving": {"prefill_overhead": "5s"}}, "less than or equal to 1"),
    "serving matmul near zero": (
        {"base": "trn2", "serving": {"matmul": 0.001}}, "greater than or equal to 0.01"),
    "negative price": (
        {"base": "trn2", "instance": {"price_per_hour": -1}}, "greater than or equal to 0"),
    "negative latency": (
        {"base": "trn2", "instance": {"interconnect": {"latency": "-1us"}}}, "negative"),
    "unknown topology": (
        {"base": "trn2", "instance": {"interconnect": {"topology": "mesh"}}}, "torus2d"),
    "unknown key": ({"base": "trn2", "chip": {"hbm_size": "96GiB"}}, "hbm_size"),
    "several chips with no interconnect bandwidth": (
        {"base": "p5", "instance": {"interconnect": {"bandwidth": None}}},
        "bandwidth is required"),
}


@pytest.mark.parametrize(("mapping", "words"), list(BAD_MAPPINGS.values()), ids=list(BAD_MAPPINGS))
def test_bad_mappings_are_refused(mapping: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError) as info:
        HardwareSpec.model_validate(resolve_hardware_mapping(copy.deepcopy(mapping)))
    assert words in str(info.value)
