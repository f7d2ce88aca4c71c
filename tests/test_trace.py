"""Traces: schema and metadata, utilisation by interval arithmetic, conservation, job
intervals, load_run, DuckDB, the report's plots and determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import clustersim
from clustersim.analysis.report import first_failure_window, write_report
from clustersim.analysis.runs import compare, load_run
from clustersim.analysis.topology import draw_topology
from clustersim.analysis.trace import JOB_STATES, SCHEMA_VERSION, SCHEMAS, TABLES, UTILISATION_STATES
from clustersim.cli.app import app
from clustersim.hardware.build import build_topology
from clustersim.runner.api import run_to
from clustersim.scenario.loader import ScenarioError, scenario_from_dict

SCENARIO = {
    "name": "traced", "hardware": "trn2", "seed": 3, "duration": "6d",
    "cluster": {"instances": 8, "spares": 2},
    "jobs": [
        {"name": "big", "model": "llama2-7b", "seq_len": 2048, "global_batch": 64,
         "parallelism": {"tp": 8, "pp": 1, "dp": 32}, "recompute": "selective",
         "checkpoint": {"interval": "2h", "write": "2min", "restore": "5min"}},
        {"name": "late", "model": "llama2-7b", "seq_len": 2048, "global_batch": 64,
         "parallelism": {"tp": 8, "pp": 1, "dp": 16}, "recompute": "selective",
         "submit": "1d", "steps": 20000},
    ],
    "failures": {"preset": "llama3", "scale": 300, "repair": "6h"},
    "trace": {"bin": "30min", "levels": ["cluster", "job", "instance"]},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "traced"
    run_to(scenario_from_dict(SCENARIO), out)
    return out


def test_every_table_matches_its_schema_and_carries_metadata(run: Path):
    for table in TABLES:
        schema = pq.read_schema(run / f"{table}.parquet")
        assert schema.remove_metadata().equals(SCHEMAS[table]), table
        metadata = schema.metadata
        assert metadata[b"clustersim.version"] == clustersim.__version__.encode()
        assert metadata[b"clustersim.seed"] == b"3"
        assert metadata[b"clustersim.schema"] == SCHEMA_VERSION.encode()
        assert metadata[b"clustersim.table"] == table.encode()
        assert b"name: traced" in metadata[b"clustersim.scenario"]


def test_utilisation_rows_add_up_to_one(run: Path):
    frame = load_run(run).utilisation
    totals = frame[list(UTILISATION_STATES)].sum(axis=1)
    assert np.allclose(totals, 1.0)
    assert (frame[list(UTILISATION_STATES)] >= -1e-12).all().all()
    assert set(frame["level"]) == {"cluster", "job", "instance"}
    assert len(frame[frame["level"] == "instance"]["key"].unique()) == 10


def test_chip_time_is_conserved(run: Path):
    """The state fractions x chips x bin length add up to the simulated chip-time, and the
    chip-time held by jobs equals the chip-time the timeline counted."""
    r = load_run(run)
    cluster = r.utilisation[r.utilisation["level"] == "cluster"]
    chips = r.summary["cluster"]["chips"]
    chip_seconds = (cluster[list(UTILISATION_STATES)].sum(axis=1) * chips * cluster["bin_s"]).sum()
    assert chip_seconds == pytest.approx(chips * r.summary["simulated_s"])
    held_states = [s for s in JOB_STATES if s != "done"]
    held = (cluster[held_states].sum(axis=1) * chips * cluster["bin_s"]).sum()
    assert held == pytest.approx(r.summary["cluster"]["utilisation"] * chips
                                 * r.summary["simulated_s"], rel=1e-9)
    # per instance the same holds
    instances = r.utilisation[r.utilisation["level"] == "instance"]
    per_instance = (instances[held_states].sum(axis=1) * 16 * instances["bin_s"]).sum()
    assert per_instance == pytest.approx(held, rel=1e-9)


def test_job_intervals_do_not_overlap_and_cover_the_life(run: Path):
    r = load_run(run)
    horizon = r.summary["simulated_s"]
    for job in r.jobs.itertuples():
        spans = r.intervals[(r.intervals["entity"] == "job")
                            & (r.intervals["entity_id"] == job.job_id)].sort_values("start_s")
        assert set(spans["state"]) <= set(JOB_STATES)
        starts, ends = spans["start_s"].to_numpy(), spans["end_s"].to_numpy()
        assert np.all(ends > starts)
        assert np.allclose(starts[1:], ends[:-1])  # contiguous: no gap, no overlap
        assert starts[0] == pytest.approx(job.submit_s)
        assert ends[-1] == pytest.approx(horizon)


def test_downed_instances_have_failed_then_repairing_chip_intervals(run: Path):
    """Every chip of a downed instance is `failed` for the detection delay from the failure,
    then `repairing` for the rest of the repair time; no job holds it meanwhile."""
    r = load_run(run)
    detect_s = scenario_from_dict(SCENARIO).failures.detect_s
    repair_s, horizon = 6 * 3600.0, r.summary["simulated_s"]
    down = r.intervals[r.intervals["entity"] == "chip"].copy()
    assert set(down["state"]) == {"failed", "repairing"}
    down["instance"] = down["entity_id"] // 16
    per_instance = down.groupby(["instance", "state", "start_s"])["entity_id"].nunique()
    assert (per_instance == 16).all()  # the instance is the unit of repair
    failed = down[down["state"] == "failed"].drop_duplicates(["instance", "start_s"])
    repairing = down[down["state"] == "repairing"].drop_duplicates(["instance", "start_s"])
    assert len(failed) == len(repairing) > 0
    assert np.allclose(failed["end_s"] - failed["start_s"], detect_s)
    merged = failed.merge(repairing, left_on=["instance", "end_s"],
                          right_on=["instance", "start_s"], suffixes=("_f", "_r"))
    assert len(merged) == len(failed)  # repairing starts where failed ends
    assert np.allclose(np.minimum(merged["start_s_f"] + repair_s, horizon), merged["end_s_r"])
    # Each failed interval starts at a failure event (one event may down several instances).
    times = set(r.events[r.events["kind"] == "failure"]["time_s"].round(6))
    assert set(failed["start_s"].round(6)) <= times
    # No job holds a chip while it is failed or repairing.
    alloc = r.allocations
    for row in failed.itertuples():
        held = alloc[(alloc["instance_id"] == row.instance) & (alloc["start_s"] < row.end_s - 1e-9)
                     & (alloc["end_s"] > row.start_s + 1e-9)]
        assert held.empty
    cluster = r.utilisation[r.utilisation["level"] == "cluster"]
    chips = r.summary["cluster"]["chips"]
    for state in ("failed", "repairing"):
        in_state = down[down["state"] == state]
        assert (cluster[state] * chips * cluster["bin_s"]).sum() == pytest.approx(
            (in_state["end_s"] - in_state["start_s"]).sum())


def test_traces_of_another_schema_are_refused_with_a_message(run: Path, tmp_path: Path):
    """Schema 2 traces (job state `waiting`, now `waiting_for_hardware`) are refused when
    loaded, by the API and by `clustersim report` (exit 2, no traceback)."""
    import shutil

    from clustersim.analysis.runs import TraceSchemaError

    old = tmp_path / "old"
    shutil.copytree(run, old)
    table = pq.read_table(old / "intervals.parquet")
    metadata = {**table.schema.metadata, b"clustersim.schema": b"2"}
    pq.write_table(table.replace_schema_metadata(metadata), old / "intervals.parquet")
    with pytest.raises(TraceSchemaError, match="trace schema 2.*re-run"):
        load_run(old)
    result = CliRunner().invoke(app, ["report", str(old)])
    assert result.exit_code == 2 and "trace schema 2" in result.output
    assert "Traceback" not in result.output


def test_allocations_never_double_book_an_instance(run: Path):
    allocations = load_run(run).allocations.sort_values(["instance_id", "start_s"])
    for _, group in allocations.groupby("instance_id"):
        assert np.all(group["start_s"].to_numpy()[1:] >= group["end_s"].to_numpy()[:-1] - 1e-9)


def test_load_run_round_trips(run: Path):
    r = load_run(run)
    assert r.summary["scenario"] == "traced"
    for table in TABLES:
        direct = pq.read_table(run / f"{table}.parquet").to_pandas()
        loaded = r.table(table)
        assert len(direct) == len(loaded)
        assert list(direct.columns) == list(loaded.columns)
    jobs = r.jobs.set_index("name")
    assert jobs.loc["late", "submit_s"] == pytest.approx(86400)
    assert jobs.loc["big", "steps_completed"] == r.summary["jobs"]["big"]["steps_completed"]
    failures = r.failure_stats()
    assert failures["count"].sum() == sum(r.summary["cluster"]["failures"].values())
    goodput = r.goodput().set_index("job")
    lost = goodput.filter(like="lost_").sum(axis=1)
    assert (goodput["useful_h"] + lost - goodput["lost_queued_h"]).to_numpy() == pytest.approx(
        goodput["wall_h"].to_numpy())


def test_every_table_is_an_attribute_read_once(run: Path):
    """run.<table> for every table (cluster_state too), equal to run.table(name), and read
    from disk only the first time."""
    r = load_run(run)
    for table in TABLES:
        frame = getattr(r, table)
        assert frame.equals(r.table(table)), table
        assert getattr(r, table) is frame, table
    states = r.cluster_state
    assert list(states.columns) == SCHEMAS["cluster_state"].names
    assert len(states) > 0 and (states["free_instances"] >= 0).all()
    assert states["time_s"].is_monotonic_increasing


def test_utilisation_at_any_bin_and_per_chip(run: Path):
    r = load_run(run)
    stored = r.utilisation[r.utilisation["level"] == "cluster"]
    again = r.utilisation_at("cluster")
    assert np.allclose(again[list(UTILISATION_STATES)].to_numpy(),
                       stored[list(UTILISATION_STATES)].to_numpy())
    daily = r.utilisation_at("cluster", bin_s=86400)
    assert len(daily) == 6
    # coarse bins are the averages of fine ones
    fine = stored["running"].to_numpy().reshape(6, 48).mean(axis=1)
    assert daily["running"].to_numpy() == pytest.approx(fine)
    chips = r.utilisation_at("chip", chips=[0, 17, 150], bin_s=86400)
    assert set(chips["key"]) == {"0", "17", "150"}
    assert np.allclose(chips[list(UTILISATION_STATES)].sum(axis=1), 1.0)


def test_tables_read_in_duckdb(run: Path):
    duckdb = pytest.importorskip("duckdb")
    count = duckdb.sql(f"select count(*) from '{run / 'events.parquet'}' "
                       "where kind = 'failure'").fetchall()[0][0]
    assert count == int((load_run(run).events["kind"] == "failure").sum())
    rows = duckdb.sql(f"select level, avg(running) from '{run / 'utilisation.parquet'}' "
                      "group by level order by level").fetchall()
    assert [level for level, _ in rows] == ["cluster", "instance", "job"]


def test_identical_runs_give_identical_tables(tmp_path: Path):
    scenario = scenario_from_dict(SCENARIO)
    run_to(scenario, tmp_path / "a")
    run_to(scenario, tmp_path / "b")
    for table in TABLES:
        a = pd.read_parquet(tmp_path / "a" / f"{table}.parquet")
        b = pd.read_parquet(tmp_path / "b" / f"{table}.parquet")
        pd.testing.assert_frame_equal(a, b)


def test_compare_runs(run: Path):
    table = compare([run, run])
    assert len(table) == 4
    assert {"ettr", "steps_completed", "mfu"} <= set(table.columns)


@pytest.mark.slow  # (about a second: the fast suite stays under 3 minutes)
def test_report_draws_its_plots(run: Path):
    report = write_report(run)
    text = report.read_text()
    for name in ("utilisation.png", "jobs.png", "first_failure.png", "failures.png",
                 "hours.png", "step.png"):
        png = report.parent / name
        assert png.exists() and png.stat().st_size > 10_000, name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"({name})" in text


@pytest.mark.slow  # (about a second: the fast suite stays under 3 minutes)
def test_the_report_reads_traces_without_the_failed_column(run: Path, tmp_path: Path):
    """Runs written before the `failed` state (trace schema 1) still get their report."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(run, old, ignore=shutil.ignore_patterns("report"))
    table = pq.read_table(old / "utilisation.parquet")
    pq.write_table(table.drop_columns(["failed"]), old / "utilisation.parquet")
    assert (write_report(old).parent / "utilisation.png").stat().st_size > 10_000


def test_the_zoomed_timeline_spans_the_first_failure_and_the_recovery(run: Path):
    r = load_run(run)
    lo, hi, job_id = first_failure_window(r)
    hits = r.events[(r.events["kind"] == "failure") & (r.events["job_id"] >= 0)]
    first = hits.sort_values("time_s").iloc[0]
    assert lo == pytest.approx(first["time_s"] - 1800)
    assert job_id == first["job_id"]
    job = r.intervals[(r.intervals["entity"] == "job")
                      & (r.intervals["entity_id"] == first["job_id"])]
    resumed = job[(job["state"] == "running") & (job["start_s"] > first["time_s"])]
    assert hi == pytest.approx(resumed["start_s"].min() + 1800)
    down = job[(job["state"] == "down") & (job["start_s"] >= first["time_s"] - 1e-9)]
    assert lo < down["start_s"].min() < hi  # the minute-long detection is inside the zoom


def test_topology_drawing(tmp_path: Path):
    for name, instances in (("trn2u", 4), ("p5", 1), ("trn2", 1)):
        path = draw_topology(build_topology(clustersim.catalog_entry(name), instances),
                             tmp_path / f"{name}.png")
        assert path.stat().st_size > 5_000


def test_oversized_traces_are_refused():
    raw = dict(SCENARIO, duration="30d")
    raw["cluster"] = {"instances": 20000}
    raw["trace"] = {"bin": "1min", "levels": ["instance"]}
    raw["jobs"] = []
    with pytest.raises(ScenarioError, match="trace.levels"):
        run_to(scenario_from_dict(raw), Path("/nonexistent/never-written"))


def test_the_docs_page_lists_every_column():
    page = (Path(__file__).resolve().parent.parent / "docs" / "traces.md").read_text()
    for table, schema in SCHEMAS.items():
        assert f"`{table}`" in page
        for name in schema.names:
            assert f"`{name}`" in page, (table, name)


def test_bins_do_not_leave_a_sliver_at_the_horizon():
    """1.1 h in 30 s bins is 132 whole bins: floating point must not add a 133rd of width
    ~0 (its fractions would not add up to 1)."""
    from clustersim.analysis.trace import _rows_to_table
    from clustersim.analysis.utilisation import utilisation_rows

    table = utilisation_rows(
        horizon_s=1.1 * 3600, bin_s=30.0, levels=["cluster"], n_instances=2,
        chips_per_instance=16, instances_per_ultraserver=1, job_ids=[0], job_names=["a"],
        intervals=_rows_to_table("intervals", [("job", 0, "running", 0.0, 1.1 * 3600)]),
        allocations=_rows_to_table("allocations", [(0, 0, 0.0, 1.1 * 3600)])).to_pandas()
    assert len(table) == 132 and (table["bin_s"] > 29.999).all()
    assert np.allclose(table[list(UTILISATION_STATES)].sum(axis=1), 1.0)
    assert table["running"].iloc[0] == pytest.approx(0.5)


@pytest.mark.slow  # (about a second: the fast suite stays under 3 minutes)
def test_a_run_with_no_utilisation_levels_still_reports(tmp_path: Path):
    """`trace.levels: []` writes an empty utilisation table; utilisation is recomputed from
    the intervals at the scenario's bin."""
    out = tmp_path / "bare"
    run_to(scenario_from_dict({**SCENARIO, "trace": {"bin": "1h", "levels": []}}), out)
    r = load_run(out)
    assert r.utilisation.empty
    cluster = r.utilisation_at("cluster")
    assert (cluster["bin_s"] == 3600).all() and len(cluster) == 6 * 24
    assert (write_report(out).parent / "utilisation.png").exists()


def test_utilisation_is_the_same_whatever_jobs_are_worked_on_at_a_time(tmp_path: Path):
    """Utilisation read from the trace files a range of job ids at a time (the Rainier
    year's million jobs in ranges of JOBS_PER_PASS) is exactly the one of all jobs at once,
    and of the tables in memory: jobs are added in id order whatever the ranges."""
    from clustersim.analysis.utilisation import utilisation_rows
    from clustersim.scenario.loader import load_scenario

    scenario = load_scenario(Path(__file__).resolve().parent.parent / "scenarios"
                             / "mix-128-trn2.yaml")
    out = tmp_path / "mix"
    run_to(scenario, out)
    r = load_run(out)
    hardware = r.summary["cluster"]
    jobs = r.jobs.sort_values("job_id")
    assert len(jobs) > 100

    def table(jobs_per_pass: int, from_files: bool = True):
        sources = {name: out / f"{name}.parquet" for name in ("intervals", "allocations")}
        if not from_files:
            sources = {name: pq.read_table(path) for name, path in sources.items()}
        return utilisation_rows(
            horizon_s=float(r.summary["simulated_s"]), bin_s=6 * 3600.0,
            levels=["cluster", "ultraserver", "instance", "job"],
            n_instances=int(hardware["instances"]),
            chips_per_instance=int(hardware["chips_per_instance"]),
            instances_per_ultraserver=int(hardware["instances_per_ultraserver"]),
            job_ids=jobs["job_id"].tolist(), job_names=jobs["name"].tolist(),
            jobs_per_pass=jobs_per_pass, **sources)

    whole = table(len(jobs))
    held = whole.to_pandas()
    assert held[held["level"] == "cluster"]["running"].max() > 0.3  # the jobs did run
    for jobs_per_pass in (1, 7, 64):
        assert table(jobs_per_pass).equals(whole), jobs_per_pass
    assert table(7, from_files=False).equals(whole)
    import clustersim.analysis.utilisation as utilisation

    for held_jobs in (1, 5):  # the cluster's chip-time a few jobs at a time: the same
        original, utilisation.HELD_JOBS = utilisation.HELD_JOBS, held_jobs
        try:
            assert table(len(jobs)).equals(whole), held_jobs
        finally:
            utilisation.HELD_JOBS = original
    # The run's own table (the cluster level in 10-minute bins) is the same read either way.
    written = pq.read_table(out / "utilisation.parquet")
    ranged = utilisation_rows(
        horizon_s=float(r.summary["simulated_s"]), bin_s=600.0, levels=["cluster"],
        n_instances=int(hardware["instances"]),
        chips_per_instance=int(hardware["chips_per_instance"]),
        instances_per_ultraserver=int(hardware["instances_per_ultraserver"]),
        job_ids=jobs["job_id"].tolist(), job_names=jobs["name"].tolist(), jobs_per_pass=3,
        intervals=out / "intervals.parquet", allocations=out / "allocations.parquet")
    assert ranged.equals(written.replace_schema_metadata(None))
    with pytest.raises(ValueError, match="jobs_per_pass"):
        table(0)


def test_fact_rows_make_the_table_of_their_encoded_columns():
    """A row group's rows made a column at a time, a dictionary column straight from its
    strings: the table of the string columns dictionary-encoded (dictionary in order of first
    appearance, nulls kept), and a row of the wrong width refused."""
    import pyarrow as pa
    import pytest

    from clustersim.analysis.trace import SCHEMAS, _rows_to_table

    rows = [("job", 3, "running", 0.0, 1.5), ("chip", 7, None, 1.0, 2.0),
            ("job", 3, "queued", 1.5, 2.5), ("chip", 8, "repairing", 2.0, None)]
    made = _rows_to_table("intervals", rows)
    schema = SCHEMAS["intervals"]
    for k, field_ in enumerate(schema):
        values = [row[k] for row in rows]
        if pa.types.is_dictionary(field_.type):
            expected = pa.array(values, pa.string()).dictionary_encode().cast(field_.type)
            assert made.column(k).chunk(0).dictionary.to_pylist() == list(
                dict.fromkeys(v for v in values if v is not None))
        else:
            expected = pa.array(values, field_.type)
        assert made.column(k).chunk(0).equals(expected)
    with pytest.raises(ValueError, match="intervals"):
        _rows_to_table("intervals", rows + [("job", 1, "running", 0.0)])
