"""scripts/bench.py's benchmarks of serving, fleet days, the HTML report and the topology command."""

from __future__ import annotations

# name -> (python code run in a subprocess that sets a dict `figures`, in --quick?); the code
# may call run_cli(scenario) -> (summary, wall_s), defined in bench.py's run_one wrapper.
SERVING: dict[str, tuple[str, bool]] = {
    "serving: 1,000,000 requests over 64 replicas, per-request Parquet (run, CLI)": (
        """
summary, wall = run_cli("scenarios/serving-1m-requests.yaml")
d = summary["deployments"]["chat"]
figures = {"run_wall_s": round(wall, 1), "requests": d["requests"],
           "requests_completed": d["requests_completed"],
           "requests_simulated_per_s": round(d["requests"] / wall),
           "ttft_p99_s": round(d["ttft_p99_s"], 3), "tpot_p99_s": round(d["tpot_p99_s"], 4),
           "slo_goodput": round(d["slo_goodput"], 4)}
""",
        False,
    ),
    "serving: Llama 3.1 70B and 405B on trn2, 10 minutes (run, CLI)": (
        """
summary, wall = run_cli("scenarios/serving-llama-trn2.yaml")
figures = {"run_wall_s": round(wall, 1), **{
    name: {"requests": d["requests"], "tpot_p50_s": round(d["tpot_p50_s"], 4)}
    for name, d in summary["deployments"].items()}}
""",
        True,
    ),
    "fleet day: 7 days of rainier-serving-day.yaml, 131,072 Trn2 chips (run, CLI)": (
        """
import resource, subprocess, sys, tempfile, time
out = tempfile.mkdtemp() + "/run"
t0 = time.perf_counter()
subprocess.run([sys.executable, "-m", "clustersim", "run", "scenarios/rainier-serving-day.yaml",
                "--set", "duration=7d", "-o", out], capture_output=True, text=True, check=True)
wall = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
summary = json.load(open(out + "/summary.json"))
day = summary["fleet_day"]
total = day["chip_hours_total"]
figures = {"run_wall_s": round(wall, 1), "run_cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
           "peak_load_per_s": round(day["peak_load_per_s"]),
           "chip_hours_share": {k: round(v / total, 3) for k, v in day["chip_hours"].items()},
           "serving_usd_per_m_output_tokens": day["serving_cost_per_million_output_tokens_usd"],
           "training_usd_per_m_tokens": day["training_cost_per_million_tokens_usd"],
           "worst_slo_goodput": min(d["slo_goodput"] for d in summary["deployments"].values()),
           "preemptions": sum(j["preemptions"] for j in summary["jobs"].values())}
""",
        False,
    ),
    "fleet day: fluid vs request level, a day of 8 Llama 3.1 8B replicas at 8-32 requests/s": (
        """
import pathlib, resource, subprocess, sys, tempfile, time
folder = pathlib.Path(tempfile.mkdtemp())
lengths = {"distribution": "lognormal", "sigma": 0.8}
scenario = {  # JSON is YAML
    "name": "serving-day-levels", "duration": "1d", "hardware": "trn2",
    "cluster": {"instances": 1},
    "serve": [{"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4},
               "replicas": 8, "router": "least_outstanding", "fidelity": "auto",
               "workload": {"load": {"sinusoid": {"peak": "32/s", "trough": "8/s",
                                                  "peak_at": "14h"}, "noise": 0.1},
                            "input_tokens": {**lengths, "median": 512, "max": 4096},
                            "output_tokens": {**lengths, "median": 200, "max": 1024}},
               "slo": {"ttft": "1s", "tpot": "50ms"}}]}
(folder / "levels.yaml").write_text(json.dumps(scenario))
t0 = time.perf_counter()
subprocess.run([sys.executable, "-m", "clustersim", "run", str(folder / "levels.yaml"),
                "-o", str(folder / "run")], capture_output=True, text=True, check=True)
wall = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
d = json.load(open(folder / "run" / "summary.json"))["deployments"]["chat"]
figures = {"run_wall_s": round(wall, 1), "run_cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
           "requests": d["requests"],
           "requests_level": {k: d[k] for k in d["fluid_check"]["fluid"]},
           "fluid_level": d["fluid_check"]["fluid"],
           "fluid_vs_requests": {k: f"{v:+.2%}" for k, v in
                                 d["fluid_check"]["relative_difference"].items()
                                 if v is not None}}
""",
        False,
    ),
    "report --html of scenarios/trn2-512k-month.yaml (524,288 chips, 30 days), opened in Chromium": (
        """
import importlib.util
spec = importlib.util.spec_from_file_location("html_open", "scripts/html_open.py")
html_open = importlib.util.module_from_spec(spec)
spec.loader.exec_module(html_open)
out = tempfile.mkdtemp() + "/run"
subprocess.run([sys.executable, "-m", "clustersim", "run", "scenarios/trn2-512k-month.yaml",
                "-o", out], capture_output=True, text=True, check=True)
t0 = time.perf_counter()
subprocess.run([sys.executable, "-m", "clustersim", "report", out, "--html"],
               capture_output=True, text=True, check=True)
report_s = time.perf_counter() - t0
opened = html_open.open_report(out + "/report/report.html")
figures = {"report_wall_s": round(report_s, 1),
           "html_mib": round(opened["size_bytes"] / 2**20, 2),
           "chromium_open_s": round(opened["open_s"], 1),
           "scripts_done_s": round(opened["drawn_ms"] / 1e3, 2),
           "plots": opened["plots"], "console_errors": len(opened["errors"])}
""",
        False,
    ),
    "clustersim topology (CLI) of scenarios/trn2-524k-topology.yaml": (
        """
import subprocess, sys, json
done = subprocess.run([sys.executable, "-m", "clustersim", "topology",
                       "scenarios/trn2-524k-topology.yaml", "--json"],
                      capture_output=True, text=True, check=True)
shown = json.loads(done.stdout)
figures = {k: shown[k] for k in ("chips", "instances", "ultraservers", "build_s")}
""",
        False,
    ),
}
