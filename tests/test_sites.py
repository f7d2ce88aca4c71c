"""Multi-site clusters: topology, the site level of collectives, closed forms, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from clustersim.cli.app import app
from clustersim.collectives.contention import simultaneous
from clustersim.collectives.model import CollectiveModel, Group
from clustersim.runner.api import topology_for
from clustersim.scenario.loader import scenario_from_dict

runner = CliRunner()


def two_sites(link: str = "1TB/s", latency: str = "2ms", **cluster) -> dict:
    raw = {
        "name": "two-sites", "hardware": "trn2u", "duration": "1d",
        "cluster": {
            "fabric": {"spines": 4},
            "sites": [{"name": "east", "ultraservers": 8}, {"name": "west", "ultraservers": 8}],
            "inter_site": {"links": [{"sites": ["east", "west"], "bandwidth": link,
                                      "latency": latency}]},
        },
    }
    raw["cluster"].update(cluster)
    return raw


@pytest.fixture(scope="module")
def topo():
    return topology_for(scenario_from_dict(two_sites()))


def test_sites_make_their_own_fabric(topo):
    assert topo.site_count == 2
    assert topo.chips == 1024 and topo.leaves == 4 and topo.spines == 8
    assert topo.edge_counts["intersite"] == 1 and topo.edge_counts["gateway"] == 8
    # A site's leaves uplink only to its own spines.
    for leaf in range(topo.leaves):
        site = leaf // 2
        spines = {n - topo.first_spine for n in topo.graph[topo.leaf_node(leaf)]
                  if topo.graph.nodes[n]["kind"] == "spine"}
        assert spines == set(range(site * 4, site * 4 + 4))
    assert [s["name"] for s in topo.summary()["sites"]] == ["east", "west"]


def test_path_crosses_the_intersite_link(topo):
    path = topo.path(0, 600)
    assert path.kinds == ("efa", "uplink", "gateway", "intersite", "gateway", "uplink", "efa")
    assert path.latency_s == pytest.approx(topo.fabric.latency_s + 2e-3)
    same = topo.path(0, 300)
    assert "intersite" not in same.kinds


def test_bisection_across_sites_is_the_intersite_capacity(topo):
    assert topo.bisection_bytes_per_s() == pytest.approx(1e12)
    # Narrower than the link: the halves' NICs limit.
    wide = topology_for(scenario_from_dict(two_sites(link="100TB/s")))
    assert wide.bisection_bytes_per_s() == pytest.approx(32 * wide.hardware.instance.efa_bytes_per_s)


def test_backbone_bisection_is_the_smaller_sides_access():
    raw = two_sites()
    raw["cluster"]["sites"] += [{"name": "north", "ultraservers": 8},
                                {"name": "south", "ultraservers": 8}]
    raw["cluster"]["inter_site"] = {"backbone": {"bandwidth": "400GB/s", "latency": "4ms"}}
    topo = topology_for(scenario_from_dict(raw))
    assert topo.bisection_bytes_per_s() == pytest.approx(2 * 400e9)
    path = topo.path(0, 1024 + 600)
    assert path.kinds.count("backbone") == 2
    assert path.latency_s == pytest.approx(topo.fabric.latency_s + 4e-3)


def test_cross_site_all_reduce_is_the_hierarchical_formula(topo):
    """The site level on top: the stages below within a site, then a ring over the sites on
    the inter-site link with its latency, then back down."""
    model = CollectiveModel(topo)
    size = 1e9
    whole = model.cost("all-reduce", Group(np.arange(1024), 4), size)
    one_site = model.cost("all-reduce", Group(np.arange(512), 4), size)
    site = [s for s in whole.stages if s.level == "site"]
    assert len(site) == 1
    c = topo.hardware.collectives
    rate = min(1e12 * c.efa_efficiency,
               512 * topo.hardware.efa_per_chip_bytes_per_s * c.efa_efficiency)
    sites = 2
    assert site[0].transfer_s == pytest.approx(2 * (sites - 1) / sites * size / rate)
    assert site[0].latency_s == pytest.approx(
        2 * (sites - 1) * (c.efa_step_latency_s + topo.fabric.latency_s + 2e-3))
    # Below the site level: one site's reduce-scatter and all-gather (the top of one site
    # is its all-reduce, which the cross-site plan replaces by the two halves).
    below = sum(s.time_s for s in whole.stages if s.level != "site")
    inside = [s for s in one_site.stages if s.level != "fabric"]
    fabric_rs_ag = [s for s in whole.stages if s.level == "fabric"]
    assert below == pytest.approx(sum(s.time_s for s in inside) + sum(
        s.time_s for s in fabric_rs_ag))
    assert whole.time_s == pytest.approx(below + site[0].time_s)


def test_two_jobs_sharing_an_intersite_link_each_get_half():
    size = 4e9
    # Eight chips in each site, one group per job, both across the same link: the link, not
    # the chips' NICs, is the narrowest part.
    slow = topology_for(scenario_from_dict(two_sites(link="10GB/s")))
    model = CollectiveModel(slow)
    a = model.cost("all-reduce", Group(np.array([0, 512]), 1), size)
    b = model.cost("all-reduce", Group(np.array([16, 528]), 1), size)
    assert [s.level for s in a.stages if s.transfer_s > 0] == ["site"]
    together = simultaneous(model, [a, b])
    for alone, shared in zip((a, b), together, strict=True):
        assert shared.transfer_s == pytest.approx(2 * alone.transfer_s)
        assert shared.latency_s == pytest.approx(alone.latency_s)
    # Jobs in one site each: no shared link, no slowdown.
    c = model.cost("all-reduce", Group(np.array([0, 16]), 1), size)
    d = model.cost("all-reduce", Group(np.array([512, 528]), 1), size)
    for alone, shared in zip((c, d), simultaneous(model, [c, d]), strict=True):
        assert shared.time_s == pytest.approx(alone.time_s)


@pytest.mark.parametrize("op", ["all-reduce", "reduce-scatter", "all-gather"])
def test_groups_over_the_same_instances_of_two_sites_share_alike_on_each(op, monkeypatch):
    """Groups of different chips of the same instances in two sites: solving their shares
    on the first instance only (links and HBM; EFA and the inter-site link whole) gives the
    speeds that solving them on every instance gives, to the bit."""
    from clustersim.collectives import contention

    topo = topology_for(scenario_from_dict(two_sites(link="100GB/s")))
    model = CollectiveModel(topo)
    cpi = topo.hardware.chips_per_instance
    per_site = topo.chips // 2
    instances = [0, 1, per_site // cpi, per_site // cpi + 3]
    groups = [Group(np.array(sorted(i * cpi + c for i in instances
                                    for c in (t, (t + 5) % 16, (t + 10) % 16, (t + 15) % 16))), 2)
              for t in range(4)]
    costs = [model.cost(op, g, 3e8) for g in groups]
    assert any(s.level == "site" for s in costs[0].stages)
    fast = [c.transfer_s for c in simultaneous(model, costs)]
    assert contention._common_instance(model, costs) == 0
    monkeypatch.setattr(contention, "_common_instance", lambda model, costs: None)
    full = [c.transfer_s for c in simultaneous(model, costs)]
    assert fast == full
    assert fast[0] > costs[0].transfer_s  # they do share


def test_single_site_list_builds_like_no_sites():
    plain = scenario_from_dict({"name": "one", "hardware": "trn2u", "duration": "1d",
                                "cluster": {"ultraservers": 8, "fabric": {"spines": 4}}})
    listed = scenario_from_dict({"name": "one", "hardware": "trn2u", "duration": "1d",
                                 "cluster": {"fabric": {"spines": 4},
                                             "sites": [{"name": "only", "ultraservers": 8}]}})
    a, b = topology_for(plain), topology_for(listed)
    assert a.chips == b.chips
    for x, y in ((0, 300), (0, 5), (3, 100)):
        assert a.path(x, y) == b.path(x, y)
    ma, mb = CollectiveModel(a), CollectiveModel(b)
    g = Group(np.arange(a.chips), 4)
    assert ma.cost("all-reduce", g, 1e8).time_s == pytest.approx(mb.cost("all-reduce", g, 1e8).time_s)


BAD = [
    ({"inter_site": {"links": [{"sites": ["east", "mars"], "bandwidth": "1TB/s"}]}},
     "unknown site mars"),
    ({"inter_site": {"links": [{"sites": ["east", "west"], "bandwidth": "1TB/s",
                                "latency": "-1ms"}]}}, "must not be negative"),
    ({"sites": [{"name": "east", "ultraservers": 8}, {"name": "west", "ultraservers": 0}]},
     "has no hardware"),
    ({"inter_site": None}, "not joined"),
    ({"ultraservers": 8}, "not the cluster's"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_malformed_sites_exit_2_and_write_nothing(tmp_path: Path, change: dict, message: str):
    raw = two_sites()
    raw["cluster"].update(change)
    if raw["cluster"].get("inter_site") is None:
        raw["cluster"].pop("inter_site")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(path), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output.replace("\n", " ")
    assert not out.exists()
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", ["trn2u", "trn2", "trn1", "p5en", "trn3-gen2"])
def test_links_from_the_arrays_are_the_graphs(name):
    """Routes, rings and collectives read links from the arrays (the graph is built only
    when asked for): every link must read as the graph holds it."""
    from clustersim.hardware.build import build_topology
    from clustersim.hardware.catalog import catalog_entry
    from clustersim.hardware.topology import FabricSpec

    hw = catalog_entry(name)
    instances = 8 * hw.instances_per_ultraserver if hw.ultraserver else 40
    lazy = build_topology(hw, instances, FabricSpec(spines=2, instances_per_leaf=(
        hw.instances_per_ultraserver * 2)))
    assert not lazy.graph_built
    eager = build_topology(hw, instances, lazy.fabric)
    graph = eager.graph
    for u, v, data in graph.edges(data=True):
        assert lazy.edge(u, v) == data
        assert lazy.edge(v, u) == data
    for chip in range(eager.chips):
        assert sorted((b, d["kind"]) for _, b, d in lazy.chip_edges(chip)) == sorted(
            (b, d["kind"]) for _, b, d in graph.edges(chip, data=True))
    assert not lazy.graph_built


def test_site_links_from_the_arrays_are_the_graphs():
    raw = two_sites()
    raw["cluster"]["sites"].append({"name": "north", "ultraservers": 8})
    raw["cluster"]["inter_site"]["backbone"] = {"bandwidth": "200GB/s", "latency": "6ms"}
    lazy = topology_for(scenario_from_dict(raw))
    eager = topology_for(scenario_from_dict(raw))
    for u, v, data in eager.graph.edges(data=True):
        assert lazy.edge(u, v) == data
    assert not lazy.graph_built
    assert lazy.path(0, 1100) == eager.path(0, 1100)


def small_sites(**failures) -> dict:
    """Two sites of 8 trn2u instances (2 UltraServers) each; a job spread over both and one
    kept in one site."""
    return {
        "name": "small-sites", "hardware": "trn2u", "duration": "3d", "seed": 3,
        "cluster": {
            "fabric": {"spines": 2, "instances_per_leaf": 8},
            "sites": [{"name": "east", "ultraservers": 2}, {"name": "west", "ultraservers": 2}],
            "inter_site": {"links": [{"sites": ["east", "west"], "bandwidth": "100Gbps",
                                      "latency": "5ms"}]},
        },
        "jobs": [
            {"name": "spread", "model": "llama3-8b", "global_batch": 48, "instances": 12,
             "recompute": "selective",
             "parallelism": {"tp": 32, "pp": 1, "dp": 24, "zero": 1, "sequence_parallel": True}},
            {"name": "local", "model": "llama3-8b", "global_batch": 16, "instances": 4,
             "recompute": "selective",
             "parallelism": {"tp": 32, "pp": 1, "dp": 8, "zero": 1, "sequence_parallel": True}},
        ],
        "failures": {"preset": "none", **failures},
        "trace": {"enabled": False},
    }


def test_placement_keeps_a_job_in_one_site_when_it_fits():
    from clustersim.cluster.sites import SitePlacer

    bounds = np.array([0, 8, 16, 24])
    placer = SitePlacer(4, 6, 8, np.arange(24) // 8, True, bounds, np.zeros(3, dtype=np.int64))
    free = np.ones(24, dtype=bool)
    free[0:4] = False  # site 0 holds 4 free, the others 8
    chosen = placer.place(4, True, free)
    assert set(chosen // 8) == {0}  # the tightest site that fits
    chosen = placer.place(8, True, free)
    assert len(set(chosen // 8)) == 1
    spread = placer.place(12, True, free)
    assert len(spread) == 12 and len(set(spread // 8)) == 2  # the fewest sites
    assert placer.place(21, True, free) is None
    # A site cut off by a partition takes no share of a spread job.
    placer.partitioned[1] = 1
    spread = placer.place(12, True, free)
    assert set(spread // 8) == {0, 2}
    # Replacements come from the sites the job holds.
    held = np.zeros(24, dtype=bool)
    held[16:20] = True
    assert set(placer.place(4, True, free, held) // 8) == {2}


def test_a_partition_stops_cross_site_jobs_only():
    from clustersim.runner.api import simulate

    raw = small_sites(site_events=[{"kind": "partition", "rate": "1/12h", "duration": "2h"}])
    summary = simulate(scenario_from_dict(raw)).summary
    spread, local = summary["jobs"]["spread"], summary["jobs"]["local"]
    assert spread["interruptions_by_cause"].get("site-partition", 0) >= 2
    assert "site-partition" not in local.get("interruptions_by_cause", {})
    assert summary["cluster"]["repairs_completed"] == 0  # no hardware went down
    assert spread["ettr"] < local["ettr"]


def test_a_power_event_downs_part_of_a_site():
    from clustersim.runner.api import simulate

    # The spread job holds all of east (the placement fills the site with most free first);
    # the local job sits in west.
    raw = small_sites(site_events=[{"kind": "power", "site": "east", "rate": "1/1d",
                                    "share": 0.5, "duration": "3h"}])
    summary = simulate(scenario_from_dict(raw)).summary
    assert summary["cluster"]["failures"].get("site-power", 0) >= 1
    assert "site-power" in summary["jobs"]["spread"]["interruptions_by_cause"]
    assert "site-power" not in summary["jobs"]["local"].get("interruptions_by_cause", {})


def test_less_frequent_cross_site_sync_mean_step_and_saving():
    from clustersim.runner.api import simulate

    raw = small_sites()
    raw["jobs"][0]["cross_site_sync"] = {"every": 8, "convergence_factor": 1.5}
    summary = simulate(scenario_from_dict(raw)).summary
    cross = summary["jobs"]["spread"]["cross_site"]
    assert cross["step_time_sync_s"] > cross["step_time_local_s"]
    assert cross["step_time_mean_s"] == pytest.approx(
        (cross["step_time_sync_s"] + 7 * cross["step_time_local_s"]) / 8)
    assert summary["jobs"]["spread"]["step_time_s"] == pytest.approx(cross["step_time_mean_s"])
    assert cross["cross_site_bytes_saved_fraction"] == pytest.approx(7 / 8)
    assert cross["tokens_per_s_at_equal_loss"] == pytest.approx(cross["tokens_per_s"] / 1.5)
    # 2 (S - 1) / S of the gradients (bf16 gradients: 2 bytes) leave a site per average.
    params = scenario_from_dict(raw).jobs[0].model.parameter_count()
    assert cross["cross_site_bytes_per_site_per_step"] * 8 == pytest.approx(params * 2, rel=0.01)
    assert "cross_site" not in summary["jobs"]["local"]


def test_unknown_site_in_an_event_exits_2(tmp_path: Path):
    raw = small_sites(site_events=[{"kind": "power", "site": "mars", "rate": "1/1d",
                                    "duration": "1h"}])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = runner.invoke(app, ["run", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "unknown site" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_plan_reports_spreading_a_job_larger_than_a_site():
    from clustersim.planning.planner import plan

    raw = small_sites()
    raw["jobs"] = [{"name": "pretrain", "model": "llama3-8b", "global_batch": 48,
                    "instances": 12, "recompute": "selective"}]
    result = plan(scenario_from_dict(raw, planning=True))
    sites = result.as_json()["sites"]
    assert sites["sites"] == 2 and not sites["fits_one_site"]
    options = {row["option"]: row for row in sites["options"]}
    one = options["largest single site"]
    sync = options["spread, synchronous"]
    rare = options["spread, cross-site average every 16 steps"]
    assert one["chips"] <= 8 * 16 and sync["chips"] == 12 * 16
    assert rare["step_time_s"] < sync["step_time_s"]
    assert one["dp"] < sync["dp"] == rare["dp"]
    # The one-site cut trains fewer tokens per step: the same batch per replica.
    assert one["tokens_per_s"] * one["step_time_s"] < sync["tokens_per_s"] * sync["step_time_s"]


def test_max_min_speeds_share_links_fairly():
    from clustersim.cluster.sites import max_min_speeds

    assert max_min_speeds([{"a"}, {"a"}]) == pytest.approx([0.5, 0.5])
    assert max_min_speeds([{"a"}, {"a", "b"}, {"b"}]) == pytest.approx([0.5, 0.5, 0.5])
    assert max_min_speeds([{"a"}, {"b"}, set()]) == pytest.approx([1.0, 1.0, 1.0])
    # Three on one link, one of them also alone on another: a third each.
    assert max_min_speeds([{"a"}, {"a"}, {"a", "c"}]) == pytest.approx([1 / 3] * 3)


def test_two_spread_jobs_share_the_backbone_on_the_timeline():
    from clustersim.runner.api import simulate

    raw = small_sites()
    raw["cluster"]["sites"].append({"name": "north", "ultraservers": 2})
    raw["cluster"]["inter_site"] = {"backbone": {"bandwidth": "100Gbps", "latency": "5ms"}}
    job = raw["jobs"][0]
    raw["jobs"] = [
        {**job, "name": "a", "instances": 10, "global_batch": 40,
         "parallelism": {"tp": 32, "pp": 1, "dp": 20, "zero": 1, "sequence_parallel": True}},
        {**job, "name": "b", "instances": 10, "global_batch": 40,
         "parallelism": {"tp": 32, "pp": 1, "dp": 20, "zero": 1, "sequence_parallel": True}},
    ]
    summary = simulate(scenario_from_dict(raw)).summary
    for name in ("a", "b"):
        job = summary["jobs"][name]
        cross = job["cross_site"]
        extra = cross["step_time_sync_s"] - cross["step_time_local_s"]
        assert job["uplink_contention"] == pytest.approx(2.0)  # half of site 1's access
        # Alone its step is the synchronous one; sharing adds its cross-site part once more.
        assert job["slowdown"] == pytest.approx(
            (cross["step_time_sync_s"] + extra) / cross["step_time_sync_s"], rel=1e-3)


def test_ring_across_sites_is_not_the_cached_ring_inside_one(topo):
    inside = topo.ring(np.arange(0, 512, 16))  # two leaves of east
    across = topo.ring(np.concatenate([np.arange(0, 256, 16), np.arange(512, 768, 16)]))
    assert "intersite" not in inside.link_kinds
    assert "intersite" in across.link_kinds
    assert across.max_hop_latency_s >= 2e-3


def test_one_site_placement_on_its_slice_is_the_placement_on_a_copy_of_that_site():
    """SitePlacer places a job in one site on that site's slice of the free mask: the same
    instances as placing it on a whole-cluster copy that keeps only that site (the old way),
    whole UltraServers or not, on Z rings or not, for random pools."""
    from clustersim.cluster.sites import SitePlacer

    rng = np.random.default_rng(5)
    for ipu, per_leaf, bounds in [(4, 16, [0, 256, 512, 1024]), (2, 8, [0, 40, 80])]:
        n = bounds[-1]
        for ring in (True, False):
            placer = SitePlacer(ipu, n // ipu, per_leaf, np.arange(n) // per_leaf, ring,
                                np.array(bounds), np.zeros(len(bounds) - 1, dtype=np.int64))
            assert placer._slices
            for _ in range(400):
                free = rng.random(n) < rng.choice([0.05, 0.5, 0.95])
                free |= np.repeat(rng.random(n // per_leaf) < 0.2, per_leaf)
                site = int(rng.integers(len(bounds) - 1))
                count = int(rng.choice([1, 3, 4, 8, 12, 16, 17, 32, 100]))
                whole = bool(rng.random() < 0.4)
                sliced = placer._in_site(count, whole, free, site)
                placer._slices = False
                copied = placer._in_site(count, whole, free, site)
                placer._slices = True
                assert (sliced is None) == (copied is None)
                if sliced is not None:
                    assert sliced.dtype == copied.dtype
                    assert np.array_equal(sliced, copied)
                    assert free[sliced].all() and bounds[site] <= sliced.min()
                    assert sliced.max() < bounds[site + 1] and len(sliced) == count


def test_a_share_of_the_inter_site_links_skipped_as_unchanged_would_change_nothing(monkeypatch):
    """share_site_links does nothing while `site_changed` is unset: forced to share at every
    call instead, on spread jobs placed, struck by power events and done, it finds the same
    jobs on the same links and sets no job's slowdown (the skip loses nothing)."""
    import clustersim.cluster.uplinks as uplinks
    from clustersim.runner.api import simulate

    real = uplinks.share_site_links
    checked = []

    def forced(t):
        if t.site_network is not None and not t.site_changed and t.site_speeds is not None:
            key = t.site_speeds[0]
            before = {i: getattr(t.jobs[i], "site_slowdown", 1.0) for i in t.site_spread}
            t.site_changed = True
            real(t)
            assert t.site_speeds[0] == key
            assert {i: getattr(t.jobs[i], "site_slowdown", 1.0) for i in before} == before
            checked.append(t.env.now)
            return
        real(t)

    monkeypatch.setattr(uplinks, "share_site_links", forced)
    raw = small_sites(site_events=[{"kind": "power", "rate": "1/6h", "share": 0.5,
                                    "duration": "1h"}])
    raw["cluster"]["sites"].append({"name": "north", "ultraservers": 2})
    raw["cluster"]["inter_site"] = {"backbone": {"bandwidth": "100Gbps", "latency": "5ms"}}
    job = raw["jobs"][0]
    raw["jobs"] = [{**job, "name": f"j{i}", "instances": 10, "global_batch": 40,
                    "submit": f"{2 * i}h", "steps": 2000,
                    "parallelism": {"tp": 32, "pp": 1, "dp": 20, "zero": 1,
                                    "sequence_parallel": True}} for i in range(4)]
    simulate(scenario_from_dict(raw))
    assert checked
