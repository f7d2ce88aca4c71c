"""The fleet surfaces of scripts/fuzz.py: sites, job traces in all five formats, serving days
(fluid deployments on load curves) and the serving planner, each called through the command
line as a user would. `make_surfaces(mutate, dump)` gives fuzz.py's SURFACES entries; the
generators take fuzz.py's key mutation and YAML dump so both files mutate alike.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

SITES = {
    "name": "sites", "hardware": "trn2u", "duration": "1d", "seed": 0,
    "cluster": {"fabric": {"instances_per_leaf": 4},
                "sites": [{"name": "east", "ultraservers": 2}, {"name": "west", "ultraservers": 2},
                          {"name": "north", "ultraservers": 1}],
                "inter_site": {"links": [{"sites": ["east", "west"], "bandwidth": "400Gbps",
                                          "latency": "5ms"},
                                         {"sites": ["west", "north"], "bandwidth": "100Gbps",
                                          "latency": "20ms"},
                                         {"sites": ["east", "north"], "bandwidth": "100Gbps",
                                          "latency": "20ms"}]}},
    "jobs": [{"name": "train", "model": "llama3-8b", "global_batch": 64, "instances": 8,
              "parallelism": {"tp": 8, "dp": 64, "zero": 1},
              "checkpoint": {"interval": "auto", "write": "30s"}}],
    "failures": {"preset": "llama3", "scale": 5,
                 "site_events": [{"kind": "power", "rate": "1/2d", "share": 0.25,
                                  "duration": "1h"},
                                 {"kind": "partition", "rate": "1/3d", "duration": "30min"}]},
    "trace": {"enabled": False},
}
SITE_EXTRA = [
    ("cluster.sites", [{"name": f"s{i}", "ultraservers": 1} for i in range(16)]),
    ("cluster.sites", [{"name": "east", "ultraservers": 2}, {"name": "east", "ultraservers": 2}]),
    ("cluster.inter_site", None), ("failures.site_events",
                                   [{"kind": "partition", "rate": "1/s", "duration": "1s"}]),
    ("failures.site_events", [{"kind": "cooling", "rate": "1/h", "share": 1.0,
                               "duration": "1h", "site": "west"}]),
    ("jobs.0.cross_site_sync", {"every": 10, "convergence_factor": 1.1}),
    ("jobs.0.instances", 20), ("duration", "30d"),
]


def _put(raw: dict[str, Any], dotted: str, value: Any) -> None:
    node = raw
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if value is None:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = copy.deepcopy(value)


def sites_case(mutate: Callable, dump: Callable) -> Any:
    @st.composite
    def case(draw: Any) -> dict[str, Any]:
        """The sites scenario with a feature changed and keys of cluster/failures mutated;
        validate, run, topology (--draw), step or plan --write-scenario."""
        raw = copy.deepcopy(SITES)
        if draw(st.booleans()):
            key, value = draw(st.sampled_from(SITE_EXTRA))
            _put(raw, key, value)
        mutate(draw, raw, (draw(st.sampled_from(["cluster", "failures", "jobs"])),), (0, 2))
        command = draw(st.sampled_from(["validate", "run", "run", "topology", "step", "plan"]))
        args = [command, "scenario.yaml"]
        if command == "run":
            args += ["-o", draw(st.sampled_from(["out", "out", ".", "precious"]))]
        elif command == "topology" and draw(st.booleans()):
            args += ["--draw", draw(st.sampled_from(["t.png", "precious/thesis.png"]))]
        elif command == "plan":
            args += ["--chips", draw(st.sampled_from(["64", "64,128", "1024", "100000"])),
                     "-o", "p", "--write-scenario", "best.yaml"]
        if draw(st.integers(0, 3)) == 0:
            args.append("--force")
        return {"files": {"scenario.yaml": dump(raw), "precious/thesis.png": "years of work"},
                "args": args}
    return case()


# A job trace's odd cells: what the published files hold ("None", empty) and what they
# should not (booleans, digits of other scripts, huge or negative numbers, far dates).
CELLS = ["0", "1", "8", "16", "2.5", "-1", "", "None", "nan", "inf", "true", "x", "1e300",
         "\u0668", "1_000", "0001-01-01 00:00:00", "9999-12-31 23:59:59",
         "2020-06-09 18:41:01", "2020-06-09 18:41:01+08:00", "4550879.0", "007", "1e3"]
HELIOS_COLUMNS = ["job_id", "user", "vc", "gpu_num", "cpu_num", "node_num", "state",
                  "submit_time", "start_time", "end_time", "duration", "queue"]
ACME_COLUMNS = ["job_id", "user", "node_num", "gpu_num", "cpu_num", "state", "submit_time",
                "start_time", "end_time", "fail_time"]
PAI_JOB = ["job{i}", "inst{i}", "user{u}", "Terminated", "{t0}", "{t1}"]
PAI_TASK = ["job{i}", "worker", "{n}", "Terminated", "{t0}", "{t1}", "600", "29.3", "{g}",
            "V100"]


def _rows(draw: Any, count: int, make: Callable[[int], list[str]]) -> list[list[str]]:
    rows = [make(i) for i in range(count)]
    for row in rows:  # a few odd cells
        for column in range(len(row)):
            if draw(st.integers(0, 9)) == 0:
                row[column] = draw(st.sampled_from(CELLS))
    return rows


def _csv(columns: list[str] | None, rows: list[list[str]]) -> str:
    lines = ([",".join(columns)] if columns else []) + [",".join(r) for r in rows]
    return "\n".join(lines) + "\n"


def _philly(draw: Any, count: int) -> str:
    jobs = []
    for i in range(count):
        start = f"2017-10-07 0{i % 10}:00:00"
        attempts = [{"start_time": start, "end_time": f"2017-10-08 0{i % 10}:00:00",
                     "detail": [{"ip": "m1", "gpus": [f"gpu{g}" for g in range(8)]}]}]
        kind = draw(st.integers(0, 9))
        if kind == 0:
            attempts = []
        elif kind == 1:
            attempts[0]["start_time"] = "None"
        elif kind == 2:
            attempts[0]["end_time"] = "None"
        elif kind == 3:
            attempts[0]["detail"][0]["gpus"] = draw(st.sampled_from(
                ["gpu0,gpu1", [], None, 8, [[1]]]))
        elif kind == 4:
            attempts[0][draw(st.sampled_from(["start_time", "end_time"]))] = draw(
                st.sampled_from([True, 1e300, -1, "x", None, [], "0001-01-01 00:00:00"]))
        job = {"status": "Pass", "vc": f"vc{i % 3}", "jobid": f"application_{i}",
               "attempts": attempts, "submitted_time": f"2017-10-07 0{i % 10}:00:00",
               "user": f"u{i % 2}"}
        if draw(st.integers(0, 9)) == 0:
            job[draw(st.sampled_from(list(job)))] = draw(st.sampled_from(
                [True, None, "None", [], {}, 10**30, "x"]))
        jobs.append(job)
    choice = draw(st.integers(0, 19))
    if choice == 0:
        return "[" * 50_000 + "]" * 50_000  # nested deeper than the parser's stack
    if choice == 1:
        return json.dumps({"jobs": jobs})
    return json.dumps(jobs)


def fleet_trace_case(mutate: Callable, dump: Callable) -> Any:
    @st.composite
    def case(draw: Any) -> dict[str, Any]:
        """A job trace in one of the five formats with odd cells and mapping, replayed with
        or without templates; validate or run."""
        fmt = draw(st.sampled_from(["philly", "helios", "pai", "acme", "native"]))
        count = draw(st.integers(0, 6))
        files: dict[str, Any] = {}
        trace = {"philly": "cluster_job_log", "helios": "cluster_log.csv",
                 "acme": "trace_seren.csv", "pai": "pai_job_table.csv",
                 "native": "jobs.csv"}[fmt]
        if fmt == "philly":
            files[trace] = _philly(draw, count)
        elif fmt == "helios":
            files[trace] = _csv(HELIOS_COLUMNS, _rows(draw, count, lambda i: [
                str(1000 + i), f"u{i % 2}", f"vc{i % 3}", "8", "16", "1", "COMPLETED",
                f"2020-06-09 1{i}:00:00", f"2020-06-09 1{i}:00:00", f"2020-06-10 0{i}:00:00",
                "3600", "0"]))
        elif fmt == "acme":
            files[trace] = _csv(ACME_COLUMNS, _rows(draw, count, lambda i: [
                f"dlc{i}", f"u{i % 2}", "1", "8", "96", "COMPLETED",
                f"2023-05-17 1{i}:00:00+00:00", f"2023-05-17 1{i}:00:10+00:00",
                f"2023-05-18 0{i}:00:00+00:00", ""]))
        elif fmt == "pai":
            files[trace] = _csv(None, _rows(draw, count, lambda i: [
                c.format(i=i, u=i % 2, t0=4550000 + 1000 * i, t1=4560000 + 1000 * i)
                for c in PAI_JOB]))
            if draw(st.integers(0, 5)):
                files["pai_task_table.csv"] = _csv(None, _rows(draw, count, lambda i: [
                    c.format(i=i, n=1 + i % 4, t0=4550100 + 1000 * i, t1=4560000 + 1000 * i,
                             g=100) for c in PAI_TASK]))
        else:
            files[trace] = _csv(["name", "submit", "instances", "template", "run_for", "team"],
                                _rows(draw, count, lambda i: [
                                    f"n{i}", f"{i * 10}min", "1", "research", "1h",
                                    f"t{i % 2}"]))
        if fmt == "pai" and draw(st.booleans()):
            files = {f"pai/{name}": text for name, text in files.items()}
            trace = "pai"
        elif draw(st.integers(0, 19)) == 0:
            trace = draw(st.sampled_from(["missing.csv", "/dev/zero", "/proc/self/status",
                                          "."]))
        workload: dict[str, Any] = {"trace": trace, "format": fmt, "mapping": {
            "rule": draw(st.sampled_from(["instances", "compute"])),
            "team": draw(st.sampled_from(["user", "vc", "none", None]))}}
        if workload["mapping"]["team"] is None:
            del workload["mapping"]["team"]
        if fmt == "native" or draw(st.booleans()):
            workload["templates"] = [{"name": "research", "instances": [1], "job": {
                "model": "llama3-8b", "seq_len": 4096,
                "parallelism": {"tp": 4, "pp": 1, "zero": 1}}}]
        raw = {"name": "fleet-trace", "hardware": "trn2u", "duration": "4d",
               "cluster": {"ultraservers": 4}, "scheduler": {"policy": "fairshare"},
               "workload": workload, "failures": {"preset": "llama3"},
               "trace": {"enabled": draw(st.booleans()), "levels": ["cluster"]}}
        mutate(draw, raw, ("workload",), (0, 2), keys=("extra", "template", "gpu", "1"))
        files["scenario.yaml"] = dump(raw)
        command = draw(st.sampled_from(["validate", "run", "run"]))
        return {"files": files,
                "args": [command, "scenario.yaml"] + (["-o", "out"] if command == "run" else [])}
    return case()


DAY = {
    "name": "day", "hardware": "trn2u", "duration": "2h", "seed": 0,
    "cluster": {"ultraservers": 4}, "fluid": {"interval": "10min"},
    "failures": {"preset": "llama3", "scale": 10},
    "serve": [{"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4},
               "workload": {"load": {"sinusoid": {"peak": "40/s", "trough": "5/s",
                                                  "peak_at": "1h"}, "noise": 0.05},
                            "input_tokens": {"distribution": "lognormal", "median": 1024,
                                             "sigma": 0.8, "max": 8192},
                            "output_tokens": {"distribution": "lognormal", "median": 256,
                                              "sigma": 0.8, "max": 2048}},
               "slo": {"ttft": "1s", "tpot": "50ms"},
               "autoscale": {"min": 1, "max": 8, "policy": "slo", "headroom": 0.2,
                             "warmup": "2min"}}],
    "jobs": [{"name": "train", "model": "llama3-8b", "global_batch": 64, "instances": 4,
              "parallelism": {"tp": 8, "dp": 32, "zero": 1}}],
    "trace": {"enabled": False},
}


def serving_day_case(mutate: Callable, dump: Callable) -> Any:
    @st.composite
    def case(draw: Any) -> dict[str, Any]:
        """A serving day (a fluid deployment on a load curve beside a training job) with
        keys of serve/fluid/duration mutated; validate or run."""
        raw = copy.deepcopy(DAY)
        mutate(draw, raw, (draw(st.sampled_from(["serve", "fluid", "duration", "jobs"])),),
               (0, 3), keys=("extra", "load", "autoscale", "fidelity", "1"))
        command = draw(st.sampled_from(["validate", "run", "run"]))
        return {"files": {"scenario.yaml": dump(raw)},
                "args": [command, "scenario.yaml"] + (["-o", "out"] if command == "run"
                                                      else [])}
    return case()


SERVING_PLAN = {
    "name": "srvplan", "hardware": "trn2", "duration": "2min", "cluster": {"instances": 2},
    "serve": [{"name": "chat", "model": "llama3.2-1b", "parallelism": {"tp": 1},
               "replicas": 1,
               "workload": {"arrival": "poisson", "rate": "2/s", "requests": 100,
                            "input_tokens": {"distribution": "lognormal", "median": 64,
                                             "sigma": 0.5, "max": 512},
                            "output_tokens": 16},
               "slo": {"ttft": "1s", "tpot": "100ms"}}],
    "trace": {"enabled": False},
}


def serving_plan_case(mutate: Callable, dump: Callable) -> Any:
    @st.composite
    def case(draw: Any) -> dict[str, Any]:
        """The serving planner through the command line (`plan` on a serving scenario),
        with keys of `serve:` and odd flags."""
        raw = copy.deepcopy(SERVING_PLAN)
        mutate(draw, raw, ("serve",), (0, 2), keys=("extra", "rate", "trace", "1"))
        args = ["plan", "scenario.yaml", "-o", draw(st.sampled_from(["p", "p", "precious"]))]
        if draw(st.booleans()):
            args += ["--hardware", draw(st.sampled_from(["trn2", "trn1", "x", ","]))]
        if draw(st.booleans()):
            args += ["--write-scenario", draw(st.sampled_from(["best.yaml", "precious",
                                                              "p/best.yaml"]))]
        if draw(st.integers(0, 3)) == 0:
            args += ["--serve", draw(st.sampled_from(["chat", "x", "0"]))]
        if draw(st.integers(0, 3)) == 0:
            args.append("--force")
        return {"files": {"scenario.yaml": dump(raw), "precious/thesis.tex": "years of work"},
                "args": args}
    return case()


def make_surfaces(mutate: Callable, dump: Callable) -> dict[str, Callable[[], Any]]:
    return {"sites": lambda: sites_case(mutate, dump),
            "fleettrace": lambda: fleet_trace_case(mutate, dump),
            "serveday": lambda: serving_day_case(mutate, dump),
            "serveplan": lambda: serving_plan_case(mutate, dump)}
