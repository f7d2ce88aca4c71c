"""The Rainier year (scenarios/rainier-year.yaml), cut down to a slice a test runs
(tests/year_helpers.py): a row of job_summary.parquet a job, chip-time conserved, the same
seed the same bytes; and what makes the year fast, each against the exact computation it
stands in for: a replacement that keeps the job's UltraServers' fill keeps the last exactly
solved step (within REPLACED_SHARE of replaced instances), the reduction's cache keyed by
domain shape inside one site, that key computed by one sort, caches bounded."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from year_helpers import YEAR, year_slice

from clustersim.cluster import uplinks
from clustersim.hardware.lru import LruCache
from clustersim.runner.api import run_to, simulate, topology_for
from clustersim.scenario.loader import load_scenario
from clustersim.training.reduction import GradientReduction
from clustersim.training.sites import site_profile
from clustersim.training.step import StepModel


def test_the_year_file_is_a_million_jobs_on_a_million_chips_over_four_sites():
    year = load_scenario(YEAR, ["workload.arrivals.count=1000"])  # the rest as written
    assert year.total_instances * year.hardware.chips_per_instance == 1_048_576
    assert len(year.cluster.sites) == 4 and len(year.teams) == 12
    assert year.duration_s == 365 * 86400
    assert year.failures.site_events and year.failures.preset == "llama3"
    assert all(job.team is not None for job in year.jobs)
    # a million arrivals at its rate come before the horizon (its count ends them): five
    # standard deviations of the Poisson count short of it
    text = yaml.safe_load(YEAR.read_text())
    assert text["workload"]["arrivals"]["count"] == 1_000_000
    expected = float(text["workload"]["arrivals"]["rate"].removesuffix("/d")) * 365
    assert expected - 5 * expected ** 0.5 > 1_000_000


@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_the_slice_writes_a_row_a_job_and_conserves_chip_time(tmp_path: Path):
    scenario = year_slice()
    result = run_to(scenario, tmp_path / "run")
    rows = pd.read_parquet(tmp_path / "run" / "job_summary.parquet")
    assert len(rows) == len(scenario.jobs) == result.summary["cluster"]["jobs"]
    assert set(rows["team"]) <= {t.name for t in scenario.teams}
    # chip-time: each job held at most its chips from its submission to the horizon, and
    # the cluster's utilisation is what they held over all its chips' time
    chips = scenario.hardware.chips_per_instance
    by_name = {job.name: job for job in scenario.jobs}
    for name, job in result.jobs.items():
        span = scenario.duration_s - by_name[name].submit_s
        assert 0 <= job["held_chip_s"] <= scenario.job_instances(by_name[name]) * chips * span
    held = sum(job["held_chip_s"] for job in result.jobs.values())
    assert held > 0
    assert result.summary["cluster"]["utilisation"] == pytest.approx(
        held / (result.summary["chips"] * scenario.duration_s), rel=1e-9)
    assert rows["held_chip_s"].sum() == pytest.approx(held, rel=1e-9)


@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_the_slice_is_the_same_bytes_from_the_same_seed(tmp_path: Path):
    scenario = year_slice()
    run_to(scenario, tmp_path / "a")
    run_to(scenario, tmp_path / "b")
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    b = json.loads((tmp_path / "b" / "summary.json").read_text())
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b
    assert ((tmp_path / "a" / "job_summary.parquet").read_bytes()
            == (tmp_path / "b" / "job_summary.parquet").read_bytes())


@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_a_replacement_keeps_a_step_within_a_tiny_error_of_the_exact_solve(monkeypatch):
    """Each time a replacement keeps the last exact step, the exact step of the new
    placement is solved beside it: the largest relative difference is printed, and bounded."""
    kept = []
    original = uplinks.UplinkPacing.replacement_profile

    def compared(self, model, replaced):
        profile = original(self, model, replaced)
        if profile is not None:
            exact = site_profile(StepModel(model.topology), self.job, None,
                                 instances=self.held)
            kept.append(profile.step_time_s / exact.step_time_s - 1)
        return profile

    monkeypatch.setattr(uplinks.UplinkPacing, "replacement_profile", compared)
    # Twice the year's share: the slice's jobs of 64, 256 and 512 instances keep the step
    # through 4, 16 and 32 replaced instances when their UltraServers' fill is kept.
    monkeypatch.setattr(uplinks, "REPLACED_SHARE", 1 / 16)
    simulate(year_slice())
    print(f"{len(kept)} replacements kept the exact step; largest |error| "
          f"{max(map(abs, kept), default=0):.2e}")
    assert len(kept) >= 3  # the slice exercises it
    assert max(map(abs, kept)) <= 1e-3


def _domain_shape_reference(reduction: GradientReduction, chips: np.ndarray):
    """The domain's size and the multiset of each domain's (group, chip within) pairs, as
    the key was first computed (a lexsort and a Counter of each domain's bytes). The domain
    is the UltraServer where the groups run Z-ring stages (or a switch spans it), else the
    instance: two single-instance placements one instance apart are then one shape."""
    hw = reduction.hardware
    unit = hw.chips_per_instance * hw.instances_per_ultraserver
    if not hw.switch_spans_ultraserver and not reduction._on_z_rings(
            chips // hw.chips_per_instance):
        unit = hw.chips_per_instance
    group = np.broadcast_to(np.arange(chips.shape[0])[:, None], chips.shape).ravel()
    domain, within = np.divmod(chips.ravel(), unit)
    order = np.lexsort((within, group, domain))
    domain = domain[order]
    pairs = np.stack([group[order], within[order]], axis=1)
    cuts = np.flatnonzero(domain[1:] != domain[:-1]) + 1
    return unit, Counter(part.tobytes() for part in np.split(pairs, cuts))


@pytest.fixture(scope="module")
def two_site_model() -> StepModel:
    scenario = year_slice("cluster.sites.2.ultraservers=12", "cluster.sites.3.ultraservers=12")
    return StepModel(topology_for(scenario))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_domain_key_is_equal_exactly_when_the_multisets_are(two_site_model, data):
    reduction = two_site_model.reduction
    groups = data.draw(st.integers(1, 4))
    size = data.draw(st.integers(1, 12))
    pool = data.draw(st.sampled_from([256, 512]))  # few domains: equal multisets happen
    draw = st.lists(st.integers(0, pool - 1), min_size=groups * size,
                    max_size=groups * size, unique=True)
    a = np.array(data.draw(draw), dtype=np.int64).reshape(groups, size)
    b = np.array(data.draw(draw), dtype=np.int64).reshape(groups, size)
    same = _domain_shape_reference(reduction, a) == _domain_shape_reference(reduction, b)
    assert (reduction._domain_shape(a) == reduction._domain_shape(b)) == same
    # a renaming of the domains is the same shape
    c = (a // 64 * 64 + 64 * 3) % pool + a % 64
    if len(np.unique(c)) == c.size:
        assert reduction._domain_shape(c) == reduction._domain_shape(a) or not np.array_equal(
            np.sort(np.unique(a // 64)), np.unique(a // 64))


def test_single_chips_one_instance_apart_are_one_domain_shape(two_site_model):
    """No Z-ring stage on one chip: the domain is the instance, so chip 0 and chip 16 (the
    first of the next instance) are one shape; chip 0 and chip 1 are not (hypothesis once
    drew [0] against [16] with the UltraServer as the reference's domain)."""
    reduction = two_site_model.reduction
    first, next_instance, neighbour = (np.array([[c]], dtype=np.int64) for c in (0, 16, 1))
    assert reduction._domain_shape(first) == reduction._domain_shape(next_instance)
    assert _domain_shape_reference(reduction, first) == _domain_shape_reference(
        reduction, next_instance)
    assert reduction._domain_shape(first) != reduction._domain_shape(neighbour)


def test_one_site_placements_of_one_domain_shape_reduce_as_solved_exactly(two_site_model):
    """Inside one site the reduction is cached by domain shape: each cached answer is the
    exact solve of that placement (a fresh model with the chips as the key)."""
    rng = np.random.default_rng(3)
    job = year_slice().jobs[0]
    scenario = year_slice()
    big = next(j for j in scenario.jobs if scenario.job_instances(j) >= 128)
    n = scenario.job_instances(big)
    site = two_site_model.topology.sites.first_instance
    moved = 0
    for trial in range(4):
        start = int(site[trial % 2])
        placed = start + rng.permutation(int(site[trial % 2 + 1]) - start)[:n]
        cached = two_site_model.profile(big, None, instances=np.sort(placed)).step_time_s
        exact_model = StepModel(two_site_model.topology)
        exact_model.reduction._site_chips = None  # key by the chips themselves
        exact = exact_model.profile(big, None, instances=np.sort(placed)).step_time_s
        moved = max(moved, abs(cached / exact - 1))
    assert job is not None
    assert moved <= 1e-12


def test_the_bounded_cache_drops_the_least_recently_used():
    cache = LruCache(2)
    cache["a"], cache["b"] = 1, 2
    assert cache.get("a") == 1  # now the most recent
    cache["c"] = 3
    assert list(cache) == ["a", "c"] and "b" not in cache and cache.get("b") is None
    cache["a"] = 4
    cache["d"] = 5
    assert dict(cache) == {"a": 4, "d": 5}
    with pytest.raises(ValueError):
        LruCache(0)


def test_a_step_model_with_a_tiny_bound_gives_the_same_steps(two_site_model):
    """Dropping shapes changes the time, not the figures: every profile asked again after
    its shape was dropped is the one first computed."""
    scenario = year_slice()
    jobs = [j for j in scenario.jobs if scenario.job_instances(j) <= 64][:6]
    bounded = StepModel(two_site_model.topology)
    bounded._cache = LruCache(1)
    bounded.reduction._cache = LruCache(1)
    first = [bounded.profile(job, None).step_time_s for job in jobs]
    again = [bounded.profile(job, None).step_time_s for job in jobs]
    assert first == again
    assert first == [two_site_model.profile(job, None).step_time_s for job in jobs]


def test_a_spread_placement_is_keyed_by_a_digest_not_its_chips(two_site_model):
    """Over several sites the reduction's key for a spread job's chips is a 16-byte digest:
    the same chips the same key, other chips another."""
    reduction = two_site_model.reduction
    site = two_site_model.topology.sites.first_instance
    chips = np.array([[int(site[0]) * 16, int(site[1]) * 16]], dtype=np.int64)
    key = reduction._groups_shape(chips)
    assert key == reduction._groups_shape(chips.copy())
    assert key != reduction._groups_shape(chips + 1)
    assert sum(len(part) for part in key if isinstance(part, bytes)) == 16


@pytest.mark.slow  # a million jobs: about a minute
def test_the_whole_year_file_validates():
    from typer.testing import CliRunner

    from clustersim.cli.app import app

    result = CliRunner().invoke(app, ["validate", str(YEAR)])
    assert result.exit_code == 0, result.stdout + result.stderr
