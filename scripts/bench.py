"""Benchmarks: print the figures the issues ask for, with wall time and peak memory.

    python scripts/bench.py            # everything
    python scripts/bench.py --quick    # a subset that runs in seconds

Each benchmark runs in a fresh subprocess so its peak memory (max RSS) is its own. Results
are printed as a table and written to results/bench.json. No test asserts these figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_cluster import CLUSTER
from bench_serving import SERVING

ROOT = Path(__file__).resolve().parent.parent

# The benchmarks, each a name -> (code, in --quick?), live beside this file by side.
BENCHMARKS: dict[str, tuple[str, bool]] = {**CLUSTER, **SERVING}


def run_one(code: str) -> dict[str, Any]:
    wrapper = f"""
import json, resource, subprocess, sys, tempfile, time


def run_cli(scenario, *more):
    # `clustersim run` end to end, as a user runs it: (summary, wall seconds).
    out = tempfile.mkdtemp() + "/run"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "clustersim", "run", scenario, "-o", out, *more],
                   capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    run_cli.last_out = out  # its folder, for a benchmark reading more than the summary
    with open(out + "/summary.json") as file:
        return json.load(file), wall


start = time.perf_counter()
{code}
wall = time.perf_counter() - start
peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
           resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) * 1024
print(json.dumps({{"wall_s": wall, "peak_rss_bytes": peak, "figures": figures}}))
"""
    done = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True,
                          cwd=ROOT, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the fast subset")
    parser.add_argument("--only", help="only the benchmarks whose name contains this text")
    parser.add_argument("-o", "--out", type=Path, default=ROOT / "results" / "bench.json")
    args = parser.parse_args()
    results = {}
    print(f"{'benchmark':<68} {'wall s':>8} {'peak MiB':>9}  figures")
    for name, (code, quick) in BENCHMARKS.items():
        if (args.quick and not quick) or (args.only and args.only not in name):
            continue
        result = run_one(code)
        results[name] = result
        if "error" in result:
            print(f"{name:<68} {'failed':>8} {'':>9}  {result['error']}")
            continue
        print(f"{name:<68} {result['wall_s']:8.2f} {result['peak_rss_bytes'] / 2**20:9.0f}  "
              f"{json.dumps(result['figures'])}")
    report = {"python": platform.python_version(), "machine": platform.machine(),
              "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
