"""scripts/bench.py's benchmarks of the cluster side: topology, collectives, steps, timelines,
the scheduler and fleets, sweeps and the training planner."""

from __future__ import annotations

# name -> (python code run in a subprocess that sets a dict `figures`, in --quick?); the code
# may call run_cli(scenario) -> (summary, wall_s), defined in bench.py's run_one wrapper.
CLUSTER: dict[str, tuple[str, bool]] = {
    "topology: 1 Trn2 UltraServer (64 chips)": (
        """
from clustersim import catalog_entry, build_topology
topo = build_topology(catalog_entry("trn2u"), 4)
figures = {"chips": topo.chips, "edges": topo.graph.number_of_edges()}
""",
        True,
    ),
    "topology: 128 trn2.48xlarge (2,048 chips)": (
        """
from clustersim import catalog_entry, build_topology
topo = build_topology(catalog_entry("trn2"), 128)
figures = {"chips": topo.chips, "edges": topo.graph.number_of_edges()}
""",
        True,
    ),
    "topology: 8,192 Trn2 UltraServers (524,288 chips)": (
        """
from clustersim import catalog_entry, build_topology
topo = build_topology(catalog_entry("trn2u"), 8192 * 4)
figures = {"chips": topo.chips, "instances": topo.instances, "ultraservers": topo.ultraservers,
           "nodes": topo.graph.number_of_nodes(), "edges": topo.graph.number_of_edges(),
           "links": topo.edge_counts}
""",
        False,
    ),
    "topology queries: path + ring of 4,096 chips on 524,288": (
        """
from clustersim import catalog_entry, build_topology
import time
topo = build_topology(catalog_entry("trn2u"), 8192 * 4)
t0 = time.perf_counter()
ring = topo.ring(range(4096))
t1 = time.perf_counter()
again = topo.ring(range(4096, 8192))
t2 = time.perf_counter()
path = topo.path(0, 524287)
figures = {"ring_first_ms": round((t1 - t0) * 1e3, 1), "ring_cached_ms": round((t2 - t1) * 1e3, 1),
           "ring_bottleneck_gbyte_per_s": ring.bottleneck_bytes_per_s / 1e9, "path_hops": path.hops,
           "query_only": True}
""",
        False,
    ),
    "collective: all-reduce 1 GB over 524,288 chips x 4 ranks (eval only)": (
        """
import time
import numpy as np
from clustersim import catalog_entry, build_topology
from clustersim.collectives.model import CollectiveModel, Group
topo = build_topology(catalog_entry("trn2u"), 8192 * 4)
model = CollectiveModel(topo)
t0 = time.perf_counter()
group = Group(np.arange(topo.chips), 4)
cost = model.cost("all-reduce", group, 1e9)
t1 = time.perf_counter()
again = model.cost("all-reduce", Group(np.arange(topo.chips), 4), 1e9)
t2 = time.perf_counter()
figures = {"eval_first_ms": round((t1 - t0) * 1e3, 1), "eval_cached_ms": round((t2 - t1) * 1e3, 2),
           "ranks": cost.ranks, "algorithm": cost.algorithm,
           "time_ms": round(cost.time_s * 1e3, 2),
           "busbw_gbyte_per_s": round(cost.busbw_bytes_per_s / 1e9, 1), "query_only": True}
""",
        False,
    ),
    "collective: nccom-test sweep, 64 ranks on 2 trn1 (28 sizes)": (
        """
import time
from clustersim import catalog_entry, build_topology
from clustersim.collectives.model import CollectiveModel, place_ranks
topo = build_topology(catalog_entry("trn1"), 2)
model = CollectiveModel(topo)
group = place_ranks(topo, 64, 2)
t0 = time.perf_counter()
costs = model.sweep("all-reduce", group, [8 * 2 ** i for i in range(28)])
figures = {"sweep_ms": round((time.perf_counter() - t0) * 1e3, 1),
           "busbw_1gib_gbyte_per_s": round(costs[-1].busbw_bytes_per_s / 1e9, 1)}
""",
        True,
    ),
    "step: 1T parameters on 3,072 A100 (PP 64, 512 micro-batches)": (
        """
import time
from clustersim.calibration.step import STEP_MEASUREMENTS, step_scenario
from clustersim.runner.api import topology_for
from clustersim.training.step import StepModel
case = [m for m in STEP_MEASUREMENTS if m.model == "megatron-1t"][0]
scenario = step_scenario(case)
topology = topology_for(scenario)
t0 = time.perf_counter()
profile = StepModel(topology).profile(scenario.jobs[0])
figures = {"simulate_s": round(time.perf_counter() - t0, 3),
           "microbatches": profile.microbatches, "step_time_s": round(profile.step_time_s, 2),
           "hfu": round(profile.hfu, 3), "query_only": True}
""",
        True,
    ),
    "step: 1T parameters on Trn2, PP 64 interleaved x2, 512 micro-batches": (
        """
import time
from clustersim.scenario.loader import scenario_from_dict
from clustersim.runner.api import topology_for
from clustersim.training.step import StepModel
raw = {"name": "b", "hardware": "trn2", "cluster": {"instances": 256},
       "jobs": [{"name": "j", "model": "megatron-1t", "global_batch": 4096,
                 "parallelism": {"tp": 32, "pp": 64, "dp": 8, "interleave": 2,
                                 "sequence_parallel": True, "zero": 1},
                 "recompute": "selective"}]}
scenario = scenario_from_dict(raw)
topology = topology_for(scenario)
t0 = time.perf_counter()
profile = StepModel(topology).profile(scenario.jobs[0])
figures = {"simulate_s": round(time.perf_counter() - t0, 3),
           "microbatches": profile.microbatches, "step_time_s": round(profile.step_time_s, 2),
           "mfu": round(profile.mfu, 3), "fits_memory": profile.fits_memory, "query_only": True}
""",
        True,
    ),
    "timeline: 30 days, 524,288 chips, one 512,000-chip job, llama3 failures (run, CLI)": (
        """
summary, wall = run_cli("scenarios/trn2-512k-month.yaml")
job = summary["jobs"]["pretrain"]
figures = {"run_wall_s": round(wall, 1), "interruptions": job["interruptions"],
           "ettr": round(job["ettr"], 4), "checkpoints": job["checkpoints_completed"],
           "discrete_events": summary["cluster"]["discrete_events"]}
""",
        False,
    ),
    "traces of the 524,288-chip month: size and cost (with vs without traces)": (
        """
import pathlib, tempfile, time
from clustersim import load_scenario
from clustersim.runner.api import run_to
scenario = load_scenario("scenarios/trn2-512k-month.yaml")
quiet = load_scenario("scenarios/trn2-512k-month.yaml", ["trace.enabled=false"])
t0 = time.perf_counter()
run_to(quiet, tempfile.mkdtemp() + "/q")
without = time.perf_counter() - t0
out = pathlib.Path(tempfile.mkdtemp()) / "t"
t0 = time.perf_counter()
run_to(scenario, out)
with_traces = time.perf_counter() - t0
sizes = {p.stem: p.stat().st_size for p in out.glob("*.parquet")}
figures = {"trace_mib": round(sum(sizes.values()) / 2**20, 2),
           "largest": max(sizes, key=sizes.get),
           "run_without_traces_s": round(without, 1), "run_with_traces_s": round(with_traces, 1),
           "trace_cost_s": round(with_traces - without, 1)}
""",
        False,
    ),
    "scheduler: a week of 120 jobs on 128 trn2 with failures (run, CLI)": (
        """
summary, wall = run_cli("scenarios/mix-128-trn2.yaml")
cluster = summary["cluster"]
figures = {"run_wall_s": round(wall, 1), "jobs": cluster["jobs_by_status"],
           "mean_queue_wait_h": round(cluster["mean_queue_wait_s"] / 3600, 1),
           "utilisation": round(cluster["utilisation"], 3)}
""",
        True,
    ),
    "scheduler: a week of 2,000 jobs on 8,192 Trn2 UltraServers (run, CLI)": (
        """
summary, wall = run_cli("scenarios/rainier-2000-jobs.yaml")
usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # CPU: fair on a shared machine
cluster = summary["cluster"]
figures = {"run_wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
           "done": cluster["jobs_by_status"].get("done"),
           "preemptions": sum(j["preemptions"] for j in summary["jobs"].values()),
           "mean_queue_wait_h": round(cluster["mean_queue_wait_s"] / 3600, 1),
           "utilisation": round(cluster["utilisation"], 3),
           "fragmentation": round(cluster["fragmentation"], 3)}
""",
        False,
    ),
    "timeline: 365 days, 524,288 chips, one 512,000-chip job, llama3 failures (run, CLI)": (
        """
summary, wall = run_cli("scenarios/trn2-512k-month.yaml", "--set", "duration=365d")
job = summary["jobs"]["pretrain"]
figures = {"run_wall_s": round(wall, 1), "interruptions": job["interruptions"],
           "ettr": round(job["ettr"], 4), "discrete_events": summary["cluster"]["discrete_events"]}
""",
        False,
    ),
    "timeline: 365 days, 524,288 chips, one 512,000-chip job, auto 10 s async checkpoints (run, CLI)": (
        """
summary, wall = run_cli("scenarios/trn2-512k-year.yaml")
usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # CPU: fair on a shared machine
job = summary["jobs"]["pretrain"]
figures = {"run_wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
           "interruptions": job["interruptions"], "ettr": round(job["ettr"], 4),
           "checkpoints": job["checkpoints_completed"],
           "discrete_events": summary["cluster"]["discrete_events"]}
""",
        False,
    ),
    "fleet: 30 days of 100,000 jobs from 12 teams with quotas, 8,192 Trn2 UltraServers (run, CLI)": (
        """
summary, wall = run_cli("scenarios/fleet-100k-month.yaml")
usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # CPU: fair on a shared machine
cluster = summary["cluster"]
teams = summary["teams"]
figures = {"run_wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
           "jobs": cluster["jobs"],
           "done": cluster["jobs_by_status"].get("done"),
           "mean_queue_wait_h": round(cluster["mean_queue_wait_s"] / 3600, 2),
           "utilisation": round(cluster["utilisation"], 3),
           "chip_time_share_pretrain": round(teams["pretrain"]["chip_time_share"], 3),
           "p95_wait_h_interns": round((teams["interns"]["p95_queue_wait_s"] or 0) / 3600, 2)}
""",
        False,
    ),
    "topology: 16,384 Trn2 UltraServers over four sites (1,048,576 chips), arrays and graph": (
        """
import resource, time
from clustersim import load_scenario
from clustersim.runner.api import topology_for
scenario = load_scenario("scenarios/rainier-1m-4-sites.yaml")
t0 = time.perf_counter()
topo = topology_for(scenario)
arrays = time.perf_counter() - t0
edges = topo.graph.number_of_edges()  # the networkx graph, built on first use
usage = resource.getrusage(resource.RUSAGE_SELF)
figures = {"chips": topo.chips, "sites": topo.site_count, "edges": edges,
           "arrays_s": round(arrays, 2), "with_graph_s": round(time.perf_counter() - t0, 2),
           "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
           "bisection_tbit_per_s": topo.bisection_bytes_per_s() * 8 / 1e12}
""",
        False,
    ),
    "timeline: 30 days, 1,048,576 chips over four sites, one 1,000,000-chip job (run, CLI)": (
        """
import resource
summary, wall = run_cli("scenarios/rainier-1m-4-sites.yaml")
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
job = summary["jobs"]["pretrain"]
figures = {"run_wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
           "interruptions": job["interruptions"], "ettr": round(job["ettr"], 4),
           "site_events": {k: v for k, v in summary["cluster"]["failures"].items()
                           if k.startswith("site-")}}
""",
        False,
    ),
    "scheduler: a month of mixed jobs on 1,048,576 chips over four sites (run, CLI)": (
        """
import resource
summary, wall = run_cli("scenarios/rainier-1m-4-sites-mix.yaml")
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
cluster = summary["cluster"]
figures = {"run_wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
           "jobs": cluster["jobs_by_status"], "utilisation": round(cluster["utilisation"], 3),
           "spread_jobs": sum(1 for j in summary["jobs"].values() if "cross_site" in j),
           "site_events": {k: v for k, v in cluster["failures"].items()
                           if k.startswith("site-")}}
""",
        False,
    ),
    "fleet year: 1,000,000 jobs from 12 teams, 365 days, 1,048,576 chips over four sites (run, CLI)": (
        """
import resource
import pyarrow.parquet as pq
summary, wall = run_cli("scenarios/rainier-year.yaml")
out = run_cli.last_out
usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # CPU: fair on a shared machine
cluster = summary["cluster"]
figures = {"run_wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
           "jobs": cluster["jobs"], "job_summary_rows": pq.read_metadata(
               out + "/job_summary.parquet").num_rows,
           "done": cluster["jobs_by_status"].get("done"),
           "utilisation": round(cluster["utilisation"], 3),
           "useful_utilisation": round(cluster["useful_utilisation"], 3),
           "mean_queue_wait_h": round(cluster["mean_queue_wait_s"] / 3600, 2),
           "site_events": {k: v for k, v in cluster["failures"].items()
                           if k.startswith("site-")}}
""",
        False,
    ),
    "fleet year replications on Ray: 4 seeds of its first 30 days (run --engine ray, CLI)": (
        """
import resource
summary, wall = run_cli("scenarios/rainier-year.yaml", "--set", "duration=30d", "--set",
                        "workload.arrivals.until=30d", "--replications", "4", "--engine", "ray")
usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # this process's CPU, not Ray's workers
cluster = summary["cluster"]
figures = {"run_wall_s": round(wall, 1), "driver_cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
           "replications": summary["replications"], "jobs": cluster["jobs"],
           "utilisation": cluster["utilisation"]}
""",
        False,
    ),
    "sweep: checkpoint-interval study, 6 intervals x 4 seeds of a 4,096-chip month (local)": (
        """
import time
from clustersim.runner.sweep import run_sweep
t0 = time.perf_counter()
rows, summary = run_sweep("scenarios/sweeps/checkpoint-interval.yaml")
wall = time.perf_counter() - t0
best = summary.sort_values("train.ettr").iloc[-1]
figures = {"runs": len(rows), "runs_per_minute": round(60 * len(rows) / wall, 1),
           "best_interval": str(best["jobs.0.checkpoint.interval"]),
           "best_ettr": round(float(best["train.ettr"]), 4)}
""",
        True,
    ),
    "plan: Llama 3.1 405B on 16,384 Trn2 chips, 16M-token batch, full space (CLI, local)": (
        """
import subprocess, sys, json, tempfile, time
t0 = time.perf_counter()
done = subprocess.run([sys.executable, "-m", "clustersim", "plan",
                       "scenarios/plan-llama3-405b.yaml", "--chips", "16384",
                       "--global-batch", "16M", "--json", "-o", tempfile.mkdtemp() + "/plan"],
                      capture_output=True, text=True, check=True)
wall = time.perf_counter() - t0
shown = json.loads(done.stdout)
best = shown["best"]
figures = {"plan_wall_s": round(wall, 1), "considered": shown["considered"],
           "pruned": shown["pruned"], "simulated": shown["simulated"],
           "best": f"tp {best['tp']} cp {best['cp']} pp {best['pp']} dp {best['dp']} "
                   f"v {best['interleave']} mb {best['micro_batch']} {best['recompute']}"
                   f"{' sp' if best['sequence_parallel'] else ''}"
                   f"{(' zero' + str(best['zero'])) if best['zero'] else ''}",
           "step_time_s": round(best["step_time_s"], 3), "mfu": round(best["mfu"], 3)}
""",
        False,
    ),
    "plan: a newcomer's question, 405B on trn2 and trn2u, 4,096-32,768 chips, 15T tokens, "
    "30-day deadline, cheapest (CLI, local)": (
        """
import subprocess, sys, json, tempfile, time
t0 = time.perf_counter()
done = subprocess.run([sys.executable, "-m", "clustersim", "plan",
                       "scenarios/plan-405b-trn2-cost.yaml", "--hardware", "trn2,trn2u",
                       "--chips", "4096:32768", "--tokens", "15T", "--deadline", "30d",
                       "--objective", "cost", "--json", "-o", tempfile.mkdtemp() + "/plan"],
                      capture_output=True, text=True, check=True)
wall = time.perf_counter() - t0
shown = json.loads(done.stdout)
best = shown["best"]
figures = {"plan_wall_s": round(wall, 1), "considered": shown["considered"],
           "pruned": shown["pruned"], "simulated": shown["simulated"],
           "meets_constraints": shown["meets_constraints"],
           "best": f"{best['hardware']} x {best['chips']}: tp {best['tp']} cp {best['cp']} "
                   f"pp {best['pp']} dp {best['dp']} v {best['interleave']} "
                   f"mb {best['micro_batch']} {best['recompute']} zero {best['zero']}",
           "days": round(best["time_to_train_s"] / 86400, 1),
           "cost_usd": round(best["cost_usd"]), "mfu": round(best["mfu"], 3)}
""",
        False,
    ),
    "plan (serving): Llama 3.1 70B at 40 requests/s on trn2 and p5en, 2 workers (CLI, local)": (
        """
import resource, subprocess, sys, json, tempfile, time
t0 = time.perf_counter()
done = subprocess.run([sys.executable, "-m", "clustersim", "plan",
                       "scenarios/serving-llama-trn2.yaml", "--hardware", "trn2,p5en",
                       "--set", "serve.0.workload.rate=40/s", "--workers", "2", "--json",
                       "-o", tempfile.mkdtemp() + "/plan"],
                      capture_output=True, text=True, check=True)
wall = time.perf_counter() - t0
used = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command and its workers
shown = json.loads(done.stdout)
best = {name: f"tp {r['tp']} pp {r['pp']} batch {r['max_batch']} x {r['replicas']}, "
              f"${r['cost_per_million_output_tokens_usd']:.3f}/M"
        for name, r in shown["best_per_hardware"].items()}
figures = {"plan_wall_s": round(wall, 1), "cpu_s": round(used.ru_utime + used.ru_stime, 1),
           "considered": shown["considered"], "pruned": shown["pruned"],
           "simulated": shown["simulated"], "best": best}
""",
        False,
    ),
    "plan: the calibration rows (Trn1 rows; Megatron 1T on 3,072 A100 p4de, 1600 Gbps)": (
        """
from clustersim.calibration.step import STEP_MEASUREMENTS, step_scenario
from clustersim.planning import PlanOptions, plan
figures = {}
for m in STEP_MEASUREMENTS:
    if not m.visible or not (m.hardware == "trn1" or m.model == "megatron-1t"):
        continue
    result = plan(step_scenario(m), PlanOptions(top=3))
    ref = result.rows[result.rows["reference"]].iloc[0]
    best = result.best
    figures[m.name] = {
        "published_config_s": round(float(ref["step_time_s"]), 3),
        "published_fits": not ref["why"],
        "best_s": round(best["step_time_s"], 3),
        "faster_by": f"{1 - best['step_time_s'] / float(ref['step_time_s']):.1%}",
        "best": f"tp {best['tp']} cp {best['cp']} pp {best['pp']} dp {best['dp']} "
                f"v {best['interleave']} mb {best['micro_batch']} {best['recompute']}"
                f"{' sp' if best['sequence_parallel'] else ''}"
                f"{(' zero' + str(best['zero'])) if best['zero'] else ''}",
        "simulated": result.simulated}
""",
        False,
    ),
}
