"""The Python API behind the command line: simulate a scenario, write its outputs."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import clustersim
from clustersim.analysis.trace import MemoryRecorder, ParquetRecorder, columns_table
from clustersim.analysis.utilisation import utilisation_rows
from clustersim.cluster.fleet import (
    LARGEST_JOBS,
    SUMMARY_JOBS,
    largest_jobs,
    team_figures,
)
from clustersim.cluster.timeline import (
    Timeline,
    TimelineResult,
    collector_paused,
    freeze_heap,
    heap_frozen,
)
from clustersim.hardware import limits
from clustersim.hardware.build import build_topology
from clustersim.hardware.topology import Topology
from clustersim.runner.budget import (
    check_request_traces,
    check_run_budget,
    check_trace_size,
    fit_remedies,
    job_profiles,
)
from clustersim.runner.earlier_runs import run_settings
from clustersim.runner.figures import (
    JobFigures,
    _job_figures,
    capped_workers,
    cluster_figures,
    combine_replications,
    effective_figures,
    largest_of_columns,
)
from clustersim.runner.fleetday import (
    add_fluid_figures,
    compare_levels,
    holdings_of,
    run_fleet_day,
)
from clustersim.runner.interrupts import raise_if_interrupted, worker_pool
from clustersim.runner.job_columns import ArrowRows, arrow_job_columns
from clustersim.runner.outputs import atomic_output_dir, write_serving_table
from clustersim.scenario.fleetday import in_event_fleet, is_fleet_day
from clustersim.scenario.loader import with_seed
from clustersim.scenario.models import Scenario
from clustersim.serving import (
    ServingResult,
    check_serving_fit,
    deployment_figures,
    replica_series_table,
    requests_table,
    simulate_serving,
)
from clustersim.serving.fidelity import settle_auto
from clustersim.serving.fluid_plan import fluid_plans
from clustersim.training.profile import JobDoesNotFit, StepProfile
from clustersim.training.sites import cross_site_step
from clustersim.training.step import StepModel

__all__ = ["RunResult", "simulate", "run_to", "write_run", "topology_for", "step_profiles",
           "run_timelines", "check_fit", "write_traces", "check_run_arguments",
           "check_serving_fit"]


@dataclass
class RunResult:
    """What a run produced: the scenario it ran, the cluster it built, and the summary."""

    scenario: Scenario
    topology: Topology
    summary: dict[str, Any]
    steps: dict[str, StepProfile]
    timelines: list[TimelineResult] = field(default_factory=list)
    serving: ServingResult | None = None
    jobs: Mapping[str, dict[str, Any]] = field(default_factory=dict)  # every job's figures
    # job_summary.parquet's columns, when made with the figures (a run of many jobs)
    job_columns: dict[str, pa.Array] | None = None
    fleet_day: Any = None  # a FleetDayResult, for a fleet-day run


def topology_for(scenario: Scenario) -> Topology:
    """The topology of a scenario's whole cluster, hot spares included."""
    return build_topology(scenario.hardware, scenario.total_instances, scenario.cluster.fabric,
                          scenario.site_network)


def step_profiles(scenario: Scenario, topology: Topology | None = None
                  ) -> dict[str, StepProfile]:
    """One step of each job, as if it ran alone from the cluster's first instance."""
    topology = topology or topology_for(scenario)
    return job_profiles(scenario, StepModel(topology), named=True)


def check_fit(scenario: Scenario, steps: dict[str, StepProfile]) -> None:
    """Refuse a run with a job that does not fit in its chips' HBM."""
    for index, job in enumerate(scenario.jobs):
        profile = steps[job.name]
        if not profile.fits_memory:
            gib = profile.memory.as_gib()
            raise JobDoesNotFit(
                f"{scenario.source}: jobs.{index} (job {job.name!r}) does not fit: it needs "
                f"{gib['total']:.1f} GiB per "
                f"{scenario.hardware.chip.name} chip, which has {gib['hbm']:.0f} GiB (weights "
                f"{gib['weights']:.1f}, gradients {gib['gradients']:.1f}, optimizer "
                f"{gib['optimizer']:.1f}, activations {gib['activations']:.1f}, logits "
                f"{gib['logits']:.1f}); use {fit_remedies(job)}"
            )


def _one_timeline(args: tuple) -> TimelineResult:
    scenario, steps, seed_sequence, *held = args
    model = StepModel(topology_for(scenario)) if len(scenario.jobs) > 1 else None
    return Timeline(scenario, steps, seed_sequence, step_model=model,
                    holdings=held[0] if held else None).run()


def run_timelines(scenario: Scenario, steps: dict[str, StepProfile], seed: int,
                  replications: int, workers: int | None = None,
                  progress: Callable[[float, float], None] | None = None,
                  recorder: MemoryRecorder | None = None,
                  step_model: StepModel | None = None, engine: str = "local",
                  address: str | None = None, holdings: list | None = None
                  ) -> list[TimelineResult]:
    """Run the timeline once per replication, each with its own spawned seed stream. The
    first runs here (with the recorder and the progress display) while the others run in
    parallel local processes, or as Ray tasks (`engine` ray; on the cluster at `address`, or
    a local one): the same seeds, so the same results either way. With several jobs, step
    times follow each job's placement."""
    children = np.random.SeedSequence(seed).spawn(replications)
    # (`holdings`: fluid deployments' plans, the same in every replication)
    rest = [(scenario, steps, child) + ((holdings,) if holdings else ())
            for child in children[1:]]
    if engine == "ray" and rest:
        from clustersim.planning.engine import Engine

        with Engine("ray", address=address) as remote:
            ray = remote.start()
            # Submitted before the first runs here: they run while it does.
            pending = remote.submit(_one_timeline, rest)
            head = Timeline(scenario, steps, children[0], progress_check(progress), recorder,
                            step_model if len(scenario.jobs) > 1 else None,
                            holdings=holdings).run()
            return [head] + ray.get(pending)
    workers = capped_workers(workers, replications)
    model = step_model if len(scenario.jobs) > 1 else None

    def first() -> TimelineResult:
        return Timeline(scenario, steps, children[0], progress_check(progress), recorder,
                        model, holdings=holdings).run()

    if not rest or workers <= 1:
        return [first()] + [_one_timeline(args) for args in rest]
    # The first replication runs here while workers - 1 processes run the rest; Ctrl-C or
    # SIGTERM terminates them (no queued replication runs on after the parent stopped).
    with worker_pool(max(1, workers - 1)) as pool:
        others = pool.map_async(_one_timeline, rest)
        head = first()
        return [head] + others.get()


def progress_check(progress: Callable[[float, float], None] | None
                   ) -> Callable[[float, float], None]:
    """What the timeline calls every 1% of the horizon: a signal whose KeyboardInterrupt
    simpy swallowed (it fails the process it landed in) still stops the run."""
    def checked(now: float, horizon: float) -> None:
        raise_if_interrupted()
        if progress is not None:
            progress(now, horizon)

    return checked


def check_run_arguments(seed: int | None, replications: int) -> str | None:
    """What is wrong with a run's seed or replications (their limits), or None."""
    if seed is not None and not 0 <= seed <= limits.MAX_SEED:
        return f"--seed {seed}: expected 0 to {limits.MAX_SEED:,} (docs/limits.md)"
    if not 1 <= replications <= limits.MAX_REPLICATIONS:
        return (f"--replications {replications}: expected 1 to {limits.MAX_REPLICATIONS:,} "
                "(docs/limits.md)")
    return None


def simulate(scenario: Scenario, seed: int | None = None, replications: int = 1,
             workers: int | None = None,
             progress: Callable[[float, float], None] | None = None,
             trace_dir: Path | None = None, serving_trial: Any = None, engine: str = "local",
             address: str | None = None) -> RunResult:
    """Run a scenario: build the cluster, simulate a step of each job, then the timeline of
    failures, repairs and checkpoints over the horizon, `replications` times (the second
    on in local processes or, with `engine` ray, as Ray tasks: `run_timelines`). With
    `trace_dir`, the first replication's Parquet traces are streamed there. `serving_trial`
    (serving.trials.SloTrial) may stop the serving run early (the serving planner's trials:
    the summary's deployment figures are then those of the run so far).

    Raises JobDoesNotFit for a job that does not fit in memory.
    """
    # `auto` outside the fluid level's checked range: the request level where it can run;
    # `seed` in the effective scenario its outputs record (with_seed)
    scenario = settle_auto(with_seed(scenario, seed))
    if scenario.serve or is_fleet_day(scenario):
        # (the serving simulators' garbage was not measured: the collector stays on there,
        # but for the timeline's own run)
        with heap_frozen():  # (the objects made so far: the scenario's jobs)
            return _simulate(scenario, seed, replications, workers, progress, trace_dir,
                             serving_trial, engine=engine, address=address)
    # Paused from the step profiles to the summary: a training run's figures and traces
    # leave no more cyclic garbage than its timeline (`collector_paused`).
    with collector_paused():
        return _simulate(scenario, seed, replications, workers, progress, trace_dir,
                         engine=engine, address=address)


def _simulate(scenario: Scenario, seed: int | None, replications: int, workers: int | None,
              progress: Callable[[float, float], None] | None,
              trace_dir: Path | None, serving_trial: Any = None, engine: str = "local",
              address: str | None = None) -> RunResult:
    problem = check_run_arguments(seed, replications)
    if problem:
        raise ValueError(problem.removeprefix("--"))
    started = time.perf_counter()
    seed = scenario.seed if seed is None else seed
    if trace_dir is not None:
        check_trace_size(scenario)
    check_run_budget(scenario, replications)
    check_request_traces(scenario)
    check_serving_fit(scenario)
    topology = topology_for(scenario)
    model = StepModel(topology)
    # The cached profile of each job's shape, shared (its name is whichever job's solved it
    # first; only its figures are read): a copy under each job's name was 2.2 KiB a job,
    # 2.2 GiB of a year's million.
    steps = job_profiles(scenario, model, named=False)
    check_fit(scenario, steps)
    plans = None
    if in_event_fleet(scenario):  # fluid deployments held in the timeline beside its jobs
        freeze_heap()  # (the topology and the step profiles, built above)
        plans = fluid_plans(scenario, seed)
    elif is_fleet_day(scenario):
        if replications > 1:
            raise ValueError("replications: a fleet-day run (docs/fleet-day.md) runs once")
        return _fleet_day_run(scenario, seed, topology, steps, trace_dir, started)
    recorder = None
    if trace_dir is not None and scenario.trace.enabled:
        recorder = ParquetRecorder(Path(trace_dir), {
            "version": clustersim.__version__, "seed": seed,
            "scenario_yaml": scenario.source_yaml})
    timelines = run_timelines(scenario, steps, seed, replications, workers, progress, recorder,
                              model, engine, address, holdings=holdings_of(scenario, plans))
    if recorder is not None:
        write_traces(recorder, scenario, topology, steps, timelines[0])
    with_teams = uses_teams(scenario)
    job_columns = None
    if replications == 1 and len(scenario.jobs) > SUMMARY_JOBS:
        # Every job's figures straight into job_summary.parquet's columns, one job at a
        # time; the summary's team figures and largest jobs read the columns.
        result = timelines[0]
        all_jobs: Any = JobFigures(scenario, steps, model, result.jobs, result.horizon_s,
                                   with_teams)
        job_columns = arrow_job_columns(all_jobs, {name: outcome.team for name, outcome
                                                   in result.jobs.items()})
        rows = ArrowRows(job_columns)
        combined = {"jobs": largest_of_columns(all_jobs, rows, LARGEST_JOBS),
                    "cluster": result.cluster_figures()}
        if with_teams:
            combined["teams"] = team_figures(
                rows, {t.name: t.quota for t in scenario.teams},
                {t.name: t.share for t in scenario.teams})
        del rows  # (its columns as Python lists)
    else:
        combined = _job_summaries(scenario, steps, model, topology, timelines, with_teams)
        all_jobs = combined["jobs"]
        if len(all_jobs) > SUMMARY_JOBS:  # every job is in job_summary.parquet
            combined["jobs"] = largest_jobs(all_jobs, LARGEST_JOBS)
    cluster = cluster_figures(scenario, topology)
    cluster.update(combined["cluster"])
    summary: dict[str, Any] = {
        "clustersim_version": clustersim.__version__,
        "scenario": scenario.name,
        "seed": seed,
        "replications": replications,
        "chips": topology.chips,
        "simulated_s": scenario.duration_s,
        "wall_s": 0.0,
        "jobs": combined["jobs"],
        "cluster": cluster,
    }
    if scenario.trace_rows is not None:
        summary["trace_rows"] = scenario.trace_rows
    if len(all_jobs) > SUMMARY_JOBS:
        summary["jobs_listed"] = (f"the {len(combined['jobs']):,} largest of "
                                  f"{len(all_jobs):,} jobs; every job is in job_summary.parquet")
    if with_teams:
        summary["teams"] = combined["teams"]
    serving = None
    if plans is not None:  # the first replication's holdings
        add_fluid_figures(scenario, plans, timelines, summary)
    elif scenario.serve:
        # The first replication's failures of serving instances: one failure history for
        # training and serving.
        serving = run_serving(scenario, seed, trace_dir, timelines[0].serving_outages,
                              serving_trial)
        if replications > 1:  # (served once, on the first replication's failures)
            summary["serving_replication"] = 0
        summary["deployments"] = deployment_figures(scenario, serving)
        for name, check in compare_levels(scenario, seed, summary["deployments"],
                                          serving).items():
            summary["deployments"][name]["fluid_check"] = check
    summary["wall_s"] = round(time.perf_counter() - started, 3)
    return RunResult(scenario=scenario, topology=topology, summary=summary, steps=steps,
                     timelines=timelines, serving=serving, jobs=all_jobs,
                     job_columns=job_columns)


def _job_summaries(scenario: Scenario, steps: dict[str, StepProfile], model: StepModel,
                   topology: Topology, timelines: list[TimelineResult], with_teams: bool
                   ) -> dict[str, Any]:
    """Every job's figures, the cluster's and the teams', means over the replications."""
    shapes = _job_figures(scenario, steps)
    if topology.site_count > 1:  # each job's step over the sites, synchronous and not
        for job in scenario.jobs:
            crossing = cross_site_step(model, job, job.name)
            if crossing is not None:
                shapes[job.name]["cross_site"] = crossing.figures()
    per_replication = []
    for result in timelines:
        jobs = {}
        for name, outcome in result.jobs.items():
            jobs[name] = {**shapes[name], **outcome.figures(result.horizon_s)}
            jobs[name].update(effective_figures(scenario, jobs[name]))
            if with_teams:
                jobs[name]["team"] = outcome.team
        per_replication.append({"jobs": jobs, "cluster": result.cluster_figures()})
        if with_teams:
            per_replication[-1]["teams"] = team_figures(
                jobs, {t.name: t.quota for t in scenario.teams},
                {t.name: t.share for t in scenario.teams})
    return combine_replications(per_replication)


def _fleet_day_run(scenario: Scenario, seed: int, topology: Topology,
                   steps: dict[str, StepProfile], trace_dir: Path | None,
                   started: float) -> RunResult:
    """A run of the fleet-level model (docs/fleet-day.md): serving and training on one
    fleet, stepped at `fluid.interval`, in place of the timeline (one replication)."""
    metadata = {"version": clustersim.__version__, "seed": seed,
                "scenario_yaml": scenario.source_yaml}
    result, figures = run_fleet_day(scenario, seed, steps, trace_dir, metadata)
    shapes = _job_figures(scenario, steps)
    summary: dict[str, Any] = {
        "clustersim_version": clustersim.__version__, "scenario": scenario.name, "seed": seed,
        "replications": 1, "chips": topology.chips, "simulated_s": scenario.duration_s,
        "wall_s": 0.0,
        "jobs": {name: {**shapes[name], **job} for name, job in figures["jobs"].items()},
        "cluster": cluster_figures(scenario, topology),
        "deployments": figures["deployments"], "fleet_day": figures["fleet_day"],
    }
    summary["cluster"]["serving_instances"] = None  # they vary: fleet.parquet
    summary["wall_s"] = round(time.perf_counter() - started, 3)
    return RunResult(scenario=scenario, topology=topology, summary=summary, steps=steps,
                     jobs=summary["jobs"], fleet_day=result)


# The serving fleets' own seed stream: fixed apart from the timeline's replications.
SERVING_STREAM = 16


def run_serving(scenario: Scenario, seed: int, trace_dir: Path | None = None,
                outages: Sequence[tuple[float, int, int, float]] | None = None,
                trial: Any = None) -> ServingResult:
    """Simulate the scenario's deployments; with `trace_dir`, write `requests.parquet` and
    `replicas.parquet` there (the first replication's seed; serving is not replicated).
    `outages`: the timeline's hardware failures of serving instances (else drawn apart)."""
    source = Path(scenario.source)
    base_dir = source.parent if source.is_file() else None
    stream = np.random.SeedSequence(seed, spawn_key=(SERVING_STREAM,))
    result = simulate_serving(scenario, stream, base_dir, outages, trial)
    if trace_dir is not None and scenario.trace.enabled:
        metadata = {"version": clustersim.__version__, "seed": seed,
                    "scenario_yaml": scenario.source_yaml}
        write_serving_table(Path(trace_dir), "requests", requests_table(scenario, result),
                            metadata)
        write_serving_table(Path(trace_dir), "replicas",
                            replica_series_table(scenario, result), metadata)
    return result


def write_traces(recorder: ParquetRecorder, scenario: Scenario, topology: Topology,
                 steps: dict[str, StepProfile], result: TimelineResult) -> None:
    """Close the streamed tables and write the dimension tables and utilisation."""
    recorder.close_facts()
    hw = scenario.hardware
    recorder.write_table("chips", pa.table({
        "chip_id": np.arange(topology.chips, dtype=np.int32),
        "instance_id": topology.chip_instance, "ultraserver_id": topology.chip_ultraserver,
        "leaf_id": topology.chip_leaf, "x": topology.chip_x.astype(np.int16),
        "y": topology.chip_y.astype(np.int16), "z": topology.chip_z.astype(np.int16),
    }))
    # A column at a time (a year's million jobs: no tuple per job to take apart again)
    jobs = scenario.jobs
    outcomes = [result.jobs[job.name] for job in jobs]
    pars = [job.parallelism for job in jobs]
    recorder.write_table("jobs", columns_table("jobs", {
        "job_id": range(len(jobs)), "name": [job.name for job in jobs],
        "model": [job.model.name for job in jobs], "ranks": [par.ranks for par in pars],
        "chips": [o.chips for o in outcomes], "instances": [o.instances for o in outcomes],
        **{degree: [getattr(par, degree) for par in pars] for degree in ("tp", "pp", "dp", "cp", "ep")},
        "submit_s": [job.submit_s for job in jobs],
        "start_s": [o.start_s for o in outcomes], "end_s": [o.end_s for o in outcomes],
        "status": [o.status for o in outcomes],
        "steps_completed": [o.steps_completed for o in outcomes],
        "step_time_s": [steps[job.name].step_time_s for job in jobs],
        "team": [o.team for o in outcomes]}))
    recorder.write_table("utilisation", utilisation_rows(
        horizon_s=scenario.duration_s, bin_s=scenario.trace.bin_s,
        levels=scenario.trace.levels, n_instances=scenario.total_instances,
        chips_per_instance=hw.chips_per_instance,
        instances_per_ultraserver=hw.instances_per_ultraserver,
        job_ids=list(range(len(scenario.jobs))), job_names=[j.name for j in scenario.jobs],
        intervals=recorder.folder / "intervals.parquet",
        allocations=recorder.folder / "allocations.parquet"))


def run_to(scenario: Scenario, out: str | Path, force: bool = False, seed: int | None = None,
           replications: int = 1, workers: int | None = None,
           progress: Callable[[float, float], None] | None = None, engine: str = "local",
           address: str | None = None) -> RunResult:
    """Simulate and write OUT whole or not at all: traces stream into a temporary sibling,
    summary.json and the effective scenario join them, then the folder is renamed."""
    from clustersim.scenario.loader import input_files

    with atomic_output_dir(Path(out), force=force,
                           replaces=run_settings(scenario, seed, replications),
                           inputs=input_files(scenario)) as staging, heap_frozen():
        result = simulate(scenario, seed=seed, replications=replications, workers=workers,
                          progress=progress, trace_dir=staging, engine=engine,
                          address=address)
        freeze_heap()  # (the run's figures, written below)
        _write_summary(result, staging)
    return result


def write_run(result: RunResult, out: str | Path, force: bool = False) -> Path:
    """Write a finished run's summary (no traces) to `out` atomically."""
    out = Path(out)
    with atomic_output_dir(out, force=force) as staging:
        _write_summary(result, staging)
    return out


def _write_summary(result: RunResult, folder: Path) -> None:
    # Strict JSON: a NaN or an infinity here is a bug (inputs are bounded and finite), and a
    # bare `Infinity` would make summary.json unreadable to strict parsers.
    text = json.dumps(result.summary, indent=2, sort_keys=False, allow_nan=False) + "\n"
    (folder / "summary.json").write_text(text, encoding="utf-8")
    (folder / "scenario.yaml").write_text(result.scenario.source_yaml, encoding="utf-8")
    if result.jobs:
        write_job_summary(result, folder / "job_summary.parquet")


def uses_teams(scenario: Scenario) -> bool:
    """Per-team figures when the scenario has teams or a job names one."""
    return bool(scenario.teams) or any(job.team is not None for job in scenario.jobs)


def write_job_summary(result: RunResult, path: Path) -> None:
    """Every job's figures (the summary's per-job figures, means over replications), one
    row a job and one column a figure, with its team, as Parquet (zstd)."""
    import pyarrow.parquet as pq

    from clustersim.analysis.trace import table_metadata

    columns = result.job_columns
    if columns is None:
        if result.timelines:
            teams = {name: outcome.team for name, outcome in result.timelines[0].jobs.items()}
        else:  # a fleet-day run: no timeline, the scenario's teams
            teams = {job.name: job.team or "-" for job in result.scenario.jobs}
        columns = arrow_job_columns(result.jobs, teams)
    table = pa.table(columns)
    table = table.replace_schema_metadata(table_metadata(
        "job_summary", version=clustersim.__version__, seed=result.summary["seed"],
        scenario_yaml=result.scenario.source_yaml))
    pq.write_table(table, path, compression="zstd")
