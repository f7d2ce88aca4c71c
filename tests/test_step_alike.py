"""Steps simulated once for placements the step cannot tell apart (`shape.alike_shape`):
over several sites, small jobs in one site whose placements differ in their leaves or in
the order of their UltraServers; and pipelines run once for a spread job's splits. Each
profile handed out is checked against simulating that placement's canonical form afresh,
figure for figure, exactly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from year_helpers import year_slice

from clustersim.runner.api import topology_for
from clustersim.training.shape import alike_shape
from clustersim.training.step import StepModel


@pytest.fixture(scope="module")
def year():
    scenario = year_slice()
    return scenario, topology_for(scenario)


def _figures(profile) -> dict:
    figures = dataclasses.asdict(profile)
    figures.pop("name")
    return figures


def _in_site(rng, topology, n: int) -> np.ndarray:
    """n instances of one site: runs, single instances and whole UltraServers, shuffled."""
    first = topology.sites.first_instance
    site = int(rng.integers(len(first) - 1))
    start = int(first[site]) + 4 * int(rng.integers(8))
    kind = rng.integers(3)
    if kind == 0:  # a run from any offset
        start += int(rng.integers(4))
        placed = np.arange(start, start + n)
    elif kind == 1:  # scattered over a few leaves
        placed = rng.choice(np.arange(start, start + 4 * n), n, replace=False)
    else:  # whole UltraServers, then the rest, in another order
        placed = np.arange(start, start + n)[rng.permutation(n)]
    return np.asarray(placed, dtype=np.int64)


@pytest.mark.parametrize("template", ["tiny", "small"])
def test_steps_shared_by_alike_placements_are_those_simulated(year, template):
    scenario, topology = year
    model = StepModel(topology)
    assert model._alike_in_site
    rng = np.random.default_rng(5)
    jobs = [j for j in scenario.jobs if j.name.startswith(template)][:6]
    asked = 0
    for job in jobs:
        n = scenario.job_instances(job)
        for _ in range(12):
            placed = _in_site(rng, topology, n)
            profile = model.profile(job, "a", instances=placed)
            _, canonical = model._shape(job, placed)
            alone = StepModel(topology)._simulate(job, "a", canonical)
            assert _figures(profile) == _figures(alone)
            assert profile.name == "a"
            asked += 1
    # fewer simulations than shapes: placements were told apart by leaves they do not use
    assert len(model._alike) < len(model._cache) <= asked


def test_steps_over_sites_or_with_more_parallelism_are_not_alike(year):
    scenario, topology = year
    model = StepModel(topology)
    job = next(j for j in scenario.jobs if j.name.startswith("small"))
    n = scenario.job_instances(job)
    first = topology.sites.first_instance
    inside = np.arange(int(first[1]), int(first[1]) + n)
    assert alike_shape(model, job, inside) is not None
    across = np.arange(int(first[1]) - n // 2, int(first[1]) + n - n // 2)
    assert alike_shape(model, job, across) is None
    large = next(j for j in scenario.jobs if j.parallelism.tp > 64)  # TP over instances
    big = scenario.job_instances(large)
    assert alike_shape(model, large, np.arange(big)) is None
    piped = job.model_copy(update={"parallelism": job.parallelism.model_copy(
        update={"pp": 2, "dp": job.parallelism.dp // 2})})
    assert alike_shape(model, piped, inside) is None


def test_splits_of_a_spread_job_run_one_pipeline(year):
    """The pipeline's passes are kept by what they read (`StepModel._pipeline`): a large
    job's placements over two sites, split otherwise, run one pipeline, and each profile is
    what simulating its placement afresh gives."""
    scenario, topology = year
    model = StepModel(topology)
    job = next(j for j in scenario.jobs if j.parallelism.tp > 64)
    n = scenario.job_instances(job)
    first = topology.sites.first_instance
    for share in (n // 2, n // 4, n // 8):
        placed = np.concatenate([np.arange(int(first[0]), int(first[0]) + n - share),
                                 np.arange(int(first[1]), int(first[1]) + share)])
        profile = model.profile(job, "a", instances=placed)
        _, canonical = model._shape(job, placed)
        assert _figures(profile) == _figures(StepModel(topology)._simulate(job, "a", canonical))
    assert len(model._cache) == 3 and len(model._pipelines) == 1
    # another job, its own passes
    small = next(j for j in scenario.jobs if j.parallelism.tp < 64)
    placed = np.arange(scenario.job_instances(small))
    assert _figures(model.profile(small, "b", instances=placed)) == _figures(
        StepModel(topology)._simulate(small, "b", placed))
    assert len(model._pipelines) == 2
