"""Fuzz the command line: scenario mutations and argument lists, each case in its own forked
process with a time and memory budget, classified by outcome.

    python scripts/fuzz.py --cases 3000 --seed 1          # prints the count per outcome
    python scripts/fuzz.py --surfaces serve,trace,plan,report,golden,sweep --cases 2000

Surfaces: `scenario` (training scenario mutations), `cli` (argument lists), `serve` (`serve:`
key mutations, run and --find-rate), `trace` (request trace files), `plan` (plan flags and
--write-scenario targets), `report` (damaged run folders), `golden` (damaged goldens under
`check`), `sweep` (sweep grids), and from scripts/fuzz_fleet.py `sites` (multi-site
clusters and site events), `fleettrace` (job traces in the five formats), `serveday`
(fluid deployments on load curves) and `serveplan` (the serving planner, through `plan`).

    python scripts/fuzz.py --surfaces sites,fleettrace,serveday,serveplan --cases 3000 \
        --budget 4500

A case passes when it exits 0 or 2 (never 1 or a traceback for the input's faults), within
its time budget, leaves no temporary (`.NAME.tmp-*`, `.old-*`, `.lock`) behind, writes and
prints only strict JSON (no bare NaN or Infinity), and every summary it writes is internally
consistent (useful time within the wall time, none without a completed step, ETTR = useful /
wall). tests/test_fuzz.py runs a few hundred cases of the same generators in the suite.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import pickle
import resource
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from fuzz_fleet import make_surfaces
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
# Bases: the library's small scenarios (a month of one UltraServer simulates in a tenth of a
# second) and a tiny one of our own.
BASES = ["single-trn2", "one-ultraserver", "compare-1024-chips", "checkpoint-study",
         "mixtral-trn2", "quickstart"]
TINY = {
    "name": "tiny", "hardware": "trn2", "duration": "3d", "cluster": {"instances": 2},
    "jobs": [{"name": "j", "model": "llama3-8b", "global_batch": 32, "recompute": "selective",
              "parallelism": {"tp": 8, "dp": 16, "zero": 1, "sequence_parallel": True},
              "checkpoint": {"interval": "auto", "write": "30s"}}],
    "failures": {"preset": "llama3", "scale": 10},
    "trace": {"enabled": True, "bin": "1h"},
}

OUTCOMES = ("ok", "refused", "differs", "harness", "internal-error", "traceback", "timeout",
            "killed", "bad-json", "leftover", "inconsistent")

PASSES = ("ok", "refused", "differs")  # differs: `check` found a figure moved (exit 1)

INTERESTING = [
    0, 1, -1, 2, 3, 7, 64, 1000, 2**31, 2**63, 2**70, 10**400, 0.5, -0.5, 1e-300, 1e300,
    1e-30, 1e30, float("nan"), float("inf"), float("-inf"), True, False, None, "", "x",
    "١٢", "1ns", "1us", "1ms", "1s", "1min", "1h", "30d", "100y", "1e9", "inf", "nan",
    "1/d", "1e30/s", "1/0s", "2.9TB/s", "1e-30B/s", "200Gbps", "96GiB", "auto", "never",
    "x" * 300, [], {}, [1, 2], {"a": 1}, [[[[[[[[]]]]]]]], "trn2", "llama3-8b", "weibull",
]


# ---------------------------------------------------------------------------------------------
# Generators


def base_scenario(name: str) -> dict[str, Any]:
    if name == "tiny":
        return copy.deepcopy(TINY)
    return yaml.safe_load((ROOT / "scenarios" / f"{name}.yaml").read_text())


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a raw scenario (list items by index)."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out += _paths(value, prefix + (index,))
    return out


def _set(raw: Any, path: tuple, value: Any, delete: bool = False) -> None:
    node = raw
    for part in path[:-1]:
        node = node[part]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value


def _value(draw: Any, current: Any) -> Any:
    choice = draw(st.integers(0, 5))
    if choice == 0 and isinstance(current, int | float) and not isinstance(current, bool):
        factor = draw(st.sampled_from([0, -1, 1e-12, 1e-3, 0.5, 2, 10, 1e3, 1e6, 1e12]))
        return type(current)(current * factor) if isinstance(current, float) or factor == int(
            factor) else current * factor
    if choice == 1:
        return draw(st.floats(allow_nan=True, allow_infinity=True))
    if choice == 2:
        return draw(st.integers(-(2**80), 2**80))
    if choice == 3:
        return draw(st.text(max_size=12))
    return copy.deepcopy(draw(st.sampled_from(INTERESTING)))  # never the shared constant


@st.composite
def scenario_case(draw: Any) -> dict[str, Any]:
    """A library scenario with one to three keys replaced, deleted or added, and a command."""
    raw = base_scenario(draw(st.sampled_from(BASES + ["tiny"] * 3)))
    _mutate(draw, raw, keys=("extra", "seed", "x.y", "1"))
    command = draw(st.sampled_from(["validate", "run", "run", "run", "step", "topology"]))
    args = [command, "scenario.yaml"]
    if command == "run":
        args += ["-o", "out"]
        if draw(st.booleans()):
            args += ["--replications", str(draw(st.sampled_from([1, 2, 3])))]
    elif command in ("step", "topology") and draw(st.booleans()):
        args.append("--json")
    return {"files": {"scenario.yaml": _dump(raw)}, "args": args}


def _dump(raw: Any) -> str:
    try:
        return yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)
    except (yaml.YAMLError, ValueError, OverflowError):
        return yaml.safe_dump({"name": "unrepresentable"})


OPTION_VALUES = ["0", "1", "2", "-1", "3", "40", "1000000000", str(2**70), "1e3", "nan", "",
                 "x", "١٢", "inf"]
PATHS = ["out", "out/..", "out/typo/..", "precious/typo/..", "precious", "x" * 300,
         "a/b/c/d", ".", "..", "scenario.yaml", "/dev/null", "file.txt/out", "./out/"]
SETS = ["duration=1d", "duration=100y", "seed=-1", "failures.scale=.inf", "jobs.0.global_batch=0",
        "cluster.instances=1000000", "jobs.0.parallelism.dp=true", "trace.bin=1ms", "nope=1",
        "jobs.9.name=x", "hardware.chip.hbm=1B", "name=other", "jobs=[]", "duration",
        "=1", "x=[&a [1,1], [*a,*a]]", "trace.enabled=false", "stragglers.slowdown=1e9"]


@st.composite
def cli_case(draw: Any) -> dict[str, Any]:
    """An argument list for any command, from pools of odd values, over a tiny scenario, a
    precious folder, a file and a sweep file."""
    command = draw(st.sampled_from(["run", "validate", "step", "topology", "collective",
                                    "sweep", "report", "check", "hardware", "schema"]))
    args = [command]
    if command in ("run", "validate", "step", "topology"):
        args.append(draw(st.sampled_from(["scenario.yaml"] * 4 + ["missing.yaml", "precious",
                                                                  "file.txt", "/dev/null"])))
    if command == "sweep":
        args.append(draw(st.sampled_from(["sweep.yaml", "badsweep.yaml", "scenario.yaml"])))
    if command == "report":
        args.append(draw(st.sampled_from(["precious", "out", "scenario.yaml", "missing"])))
    if command == "hardware" and draw(st.booleans()):
        args.append(draw(st.sampled_from(["trn2", "nope", "p5en"])))
    if command == "check":
        args.append(draw(st.sampled_from(["scenario.yaml", "missing.yaml"])))
    options = {
        "run": ["-o", "--seed", "--replications", "--workers", "--set", "--force"],
        "sweep": ["-o", "--workers", "--force", "--engine"],
        "validate": ["--set"], "step": ["--set", "--json"],
        "topology": ["--set", "--json", "--draw"], "report": [], "check": [],
        "hardware": ["--json"], "schema": ["-o"],
        "collective": ["--hardware", "--op", "--ranks", "--instances", "--sizes",
                       "--algorithm", "--json"],
    }[command]
    if command == "collective":
        args += ["--hardware", draw(st.sampled_from(["trn2", "trn1", "p5en", "x"])),
                 "--op", draw(st.sampled_from(["all-reduce", "all-gather", "alltoall", "x"])),
                 "--ranks", draw(st.sampled_from(["1", "2", "64", "128", "1000", "0",
                                                  "10000000", str(2**70)]))]
    for _ in range(draw(st.integers(0, 4))):
        if not options:
            break
        option = draw(st.sampled_from(options))
        if option in ("--force", "--json"):
            args.append(option)
        elif option in ("-o", "--draw"):
            args += [option, draw(st.sampled_from(PATHS + ["t.png", "ro/t.png"]))]
        elif option == "--set":
            args += [option, draw(st.sampled_from(SETS))]
        elif option == "--sizes":
            args += [option, draw(st.sampled_from(["1KiB", "1:1GiB", "1KiB:1GiB:1", "0", "x",
                                                   "1B:1EB:1.0001", "8MB"]))]
        elif option == "--engine":
            args += [option, draw(st.sampled_from(["local", "ray", "x"]))]
        elif option == "--algorithm":
            args += [option, draw(st.sampled_from(["auto", "ring", "mesh", "x"]))]
        else:
            args += [option, draw(st.sampled_from(OPTION_VALUES))]
    _no_local_ray(draw, args)
    tiny = dict(copy.deepcopy(TINY), duration="1d")
    sweep = {"scenario": "scenario.yaml", "grid": {"failures.scale": [1, 2]}, "seeds": [0]}
    return {"files": {"scenario.yaml": _dump(tiny), "file.txt": "not a folder",
                      "precious/thesis.tex": "years of work", "sweep.yaml": _dump(sweep),
                      "badsweep.yaml": _dump({"scenario": "scenario.yaml", "seed": 1})},
            "args": args}


# ---------------------------------------------------------------------------------------------
# The newer surfaces: serving, request traces, plan, report, check, sweep

# Addresses where no Ray cluster answers, refused at once. A local Ray cluster is not started
# by a case: its daemons need far more address space than a case's 4 GiB (the raylet dies,
# ray.init waits past the budget) and outlive it; tests/test_ray.py covers that engine.
NO_RAY_HERE = ["localhost:1", "ray://127.0.0.1:1", "ray://nowhere.invalid:1", "x"]


def _no_local_ray(draw: Any, args: list[str]) -> None:
    """`--engine ray` with no `--address` would start a local Ray cluster: give it one of
    NO_RAY_HERE."""
    engines = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--engine"]
    if engines and engines[-1] == "ray" and "--address" not in args:  # the last one counts
        args += ["--address", draw(st.sampled_from(NO_RAY_HERE))]


SERVE = {
    "name": "srv", "hardware": "trn2", "duration": "2min", "cluster": {"instances": 2},
    "failures": {"preset": "llama3", "scale": 100},
    "jobs": [{"name": "j", "model": "llama3-8b", "global_batch": 16, "instances": 1,
              "recompute": "selective",
              "parallelism": {"tp": 8, "dp": 8, "zero": 1, "sequence_parallel": True}}],
    "serve": [{"name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 4}, "replicas": 2,
               "router": "least_outstanding",
               "server": {"max_batch": 16, "kv_block_tokens": 16},
               "workload": {"arrival": "poisson", "rate": "2/s", "requests": 200,
                            "input_tokens": {"distribution": "lognormal", "median": 64,
                                             "sigma": 0.5, "max": 512},
                            "output_tokens": 16},
               "slo": {"ttft": "1s", "tpot": "100ms"}}],
    "trace": {"enabled": True, "bin": "1min", "levels": ["cluster", "job"]},
}
SERVE_EXTRA = [
    ("speculative", {"draft": "llama3.2-1b", "tokens": 4, "acceptance": 0.7}),
    ("disaggregated", {"prefill_replicas": 1, "decode_replicas": 1}),
    ("start", "30s"), ("precision", "fp8"), ("parallelism", {"tp": 1}),
    ("parallelism", {"tp": 4, "pp": 2}), ("model", "llama3.1-405b"), ("name", "j"),
    ("name", "cluster"),
]


def _mutate(draw: Any, raw: dict[str, Any], prefix: tuple = (), times: tuple = (1, 3),
            keys: tuple[str, ...] = ("extra", "rate", "requests", "1")) -> None:
    """Replace, delete or add one to three keys of `raw` (under `prefix` when given; an added
    key is one of `keys`)."""
    for _ in range(draw(st.integers(*times))):
        paths = [p for p in _paths(raw) if p[: len(prefix)] == prefix] or _paths(raw)
        if not paths:  # an earlier mutation emptied it: nothing left to change
            return
        path = draw(st.sampled_from(paths))
        try:
            node = raw
            for part in path:
                node = node[part]
        except (KeyError, IndexError, TypeError):
            continue
        action = draw(st.integers(0, 9))
        if action == 0:
            _set(raw, path, None, delete=True)
        elif action == 1 and isinstance(node, dict):
            node[draw(st.sampled_from(list(keys)))] = _value(draw, None)
        else:
            _set(raw, path, _value(draw, node))


@st.composite
def serve_case(draw: Any) -> dict[str, Any]:
    """The serving scenario with a feature added and keys of `serve:` mutated; validate, run
    (with traces), or --find-rate."""
    raw = copy.deepcopy(SERVE)
    if draw(st.booleans()):
        key, value = draw(st.sampled_from(SERVE_EXTRA))
        raw["serve"][0][key] = copy.deepcopy(value)
    _mutate(draw, raw, ("serve",), (0, 3))
    command = draw(st.sampled_from(["validate", "run", "run", "find-rate"]))
    if command == "find-rate":
        args = ["run", "scenario.yaml", "--find-rate", "--goodput",
                draw(st.sampled_from(["0.5", "0.99", "0.01", "1"]))]
    else:
        args = [command, "scenario.yaml"] + (["-o", "out"] if command == "run" else [])
    return {"files": {"scenario.yaml": _dump(raw)}, "args": args}


TRACE_CELLS = ["0", "1", "2.5", "16", "-1", "", "nan", "inf", "true", "x", "1e300",
               "9223372036854775807", "2024-01-01T00:00:00", "3000000000", "0.001", "4194305"]


@st.composite
def trace_case(draw: Any) -> dict[str, Any]:
    """A request trace (CSV or Parquet) with odd columns and cells, replayed or lengths only."""
    columns = list(draw(st.lists(st.sampled_from(
        ["arrival_s", "input_tokens", "output_tokens", "extra"]), min_size=0, max_size=5)))
    if draw(st.integers(0, 3)):  # mostly the three columns, sometimes more
        columns = ["arrival_s", "input_tokens", "output_tokens"] + columns[:1]
    rows = draw(st.integers(0, 6))
    cells = [[draw(st.sampled_from(TRACE_CELLS)) if draw(st.integers(0, 4)) == 0
              else str(draw(st.integers(1, 64))) for _ in columns] for _ in range(rows)]
    parquet = draw(st.booleans())
    raw = copy.deepcopy(SERVE)
    workload = raw["serve"][0]["workload"]
    if draw(st.booleans()):
        workload.update(arrival="trace", input_tokens="trace", output_tokens="trace")
        del workload["rate"]
    else:
        workload["output_tokens"] = "trace"
    workload["trace"] = "trace.parquet" if parquet else "trace.csv"
    if parquet:
        trace: Any = {"__parquet__": {"columns": columns, "rows": cells,
                                      "typed": draw(st.booleans())}}
    else:
        trace = "\n".join([",".join(columns)] + [",".join(r) for r in cells]) + "\n"
    return {"files": {"scenario.yaml": _dump(raw), workload["trace"]: trace},
            "args": ["run", "scenario.yaml", "-o", "out"] if draw(st.integers(0, 4))
            else ["validate", "scenario.yaml"]}


PLAN = {
    "name": "plan-tiny", "hardware": "trn1", "cluster": {"instances": 1, "spares": 1},
    "jobs": [{"name": "train", "model": {"name": "tiny", "layers": 2, "hidden": 512, "heads": 4,
                                         "vocab": 1000, "seq_len": 512},
              "seq_len": 512, "global_batch": 4,
              "checkpoint": {"interval": "auto", "write": "10s"}}],
    "failures": {"preset": "llama3"},
}
PLAN_VALUES = {
    "--chips": ["16", "16,32", "16:64", "16:64:16", "7", "0", "-16", "16:8", "x", "1:3:0",
                "16:4194304", "64:2097152:64", "1:100000000000000000000", "1:100000000000:1",
                "1" * 400, "16,16,16"],
    "--global-batch": ["4", "8", "16M", "3K", "0", "-4", "16777216", "16777217", "2.5", "x",
                       "1e30", "nan", "720720"],
    "--objective": ["step", "cost", "energy", "time-to-train", "speed", ""],
    "--tokens": ["1T", "15T", "0", "-1", "x", "1e400", "nan", "1"],
    "--deadline": ["1d", "60d", "0s", "-1d", "x", "1e30y", "1ns"],
    "--budget": ["1000000", "0.000001", "0", "-1", "nan", "inf", "1e300"],
    "--max-chips": ["1", "16", "0", str(2**70)],
    "--memory-headroom": ["0", "0.5", "0.9", "1", "-0.1", "nan"],
    "--top": ["1", "3", "0", "1000000000"],
    "--engine": ["local", "ray", "x"], "--workers": ["1", "2", "0", "100000"],
    "--address": NO_RAY_HERE, "--hardware": ["trn1", "trn1,trn2", "x", ","],
    "--seq-len": ["512", "0", "4194305"], "--model": ["llama3-8b", "x"],
    "-o": ["p", "p/..", "precious", ".", "scenario.yaml", "x" * 300, "ro/p"],
    "--write-scenario": ["best.yaml", "precious", "precious/thesis.tex", "p", "p/best.yaml",
                         "nowhere/best.yaml", "ro/best.yaml", "fifo", "scenario.yaml"],
    "--set": ["jobs.0.checkpoint.interval=never", "jobs.0.model.layers=96",
              "jobs.0.global_batch=720720", "failures.scale=1e4", "jobs=[]", "nope=1"],
}


# A valid plan of a catalog model is real work: Llama 3 8B at the largest global batch is
# 45 s of CPU, over two hardware and several sizes 11 s, past a case's budget at nice 10 on a
# shared machine (the tiny model's 1,000 layers, 26 s: 96 here; test_harden covers 1,000).
# Such cases keep their search small; the limits themselves are drawn with the tiny model.
_SMALLER = {"--global-batch": {"16M": "720720", "16777216": "720720"},
            "--hardware": {"trn1,trn2": "trn1"}, "--chips": {"16:64": "16,32", "16:64:16": "16,32"}}


def _small_plan(args: list[str]) -> None:
    models = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--model"]
    if not models or models[-1] == "x":
        return
    for i, a in enumerate(args[:-1]):
        args[i + 1] = _SMALLER.get(a, {}).get(args[i + 1], args[i + 1])


@st.composite
def plan_case(draw: Any) -> dict[str, Any]:
    """`plan` over a tiny model with flags drawn from pools of odd values."""
    args = ["plan", "scenario.yaml"]
    if not draw(st.integers(0, 3)):
        args.append("--json")
    for _ in range(draw(st.integers(0, 4))):
        option = draw(st.sampled_from(list(PLAN_VALUES) + ["--force"]))
        args += [option] if option == "--force" else [option, draw(st.sampled_from(
            PLAN_VALUES[option]))]
    if "-o" not in args:
        args += ["-o", "p"]
    _no_local_ray(draw, args)
    _small_plan(args)
    return {"files": {"scenario.yaml": _dump(PLAN), "precious/thesis.tex": "years of work",
                      "fifo": {"__fifo__": True}}, "args": args}


RUN_SCENARIO = dict(copy.deepcopy(SERVE), name="run", duration="1h")


def run_files() -> dict[str, bytes]:
    """The files of a real run (training and serving, every trace), made once per process."""
    global _RUN_FILES
    if _RUN_FILES is None:
        from typer.testing import CliRunner

        from clustersim.cli.app import app

        with tempfile.TemporaryDirectory(prefix="clustersim-fuzz-run-") as tmp:
            path = Path(tmp) / "s.yaml"
            path.write_text(_dump(RUN_SCENARIO), encoding="utf-8")
            result = CliRunner().invoke(app, ["run", str(path), "-o", str(Path(tmp) / "out")])
            assert result.exit_code == 0, result.output
            _RUN_FILES = {p.name: p.read_bytes() for p in (Path(tmp) / "out").iterdir()
                          if p.is_file()}
    return _RUN_FILES


_RUN_FILES: dict[str, bytes] | None = None


def _damaged_json(draw: Any, text: str) -> str:
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    if choice == 1:
        return draw(st.sampled_from(["[]", "null", "1e400", "[" * 50_000 + "]" * 50_000,
                                     '{"jobs": NaN}', "", "\u0000", '{"a": 1e400}']))
    try:
        summary = json.loads(text)
    except (ValueError, RecursionError):  # already damaged by an earlier draw (or deep)
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    _mutate(draw, summary)
    return json.dumps(summary, allow_nan=True, default=str)


@st.composite
def report_case(draw: Any) -> dict[str, Any]:
    """`report` on a real run's folder with one to three kinds of damage."""
    files: dict[str, Any] = {f"out/{name}": data for name, data in run_files().items()}
    tables = [n for n in run_files() if n.endswith(".parquet")]
    for _ in range(draw(st.integers(1, 3))):
        damage = draw(st.sampled_from(["summary", "summary", "swap", "truncate", "delete",
                                       "scenario", "report-file", "fifo"]))
        if damage == "summary":
            current = files.get("out/summary.json", run_files()["summary.json"])
            if isinstance(current, dict):  # a named pipe by now
                continue
            files["out/summary.json"] = _damaged_json(
                draw, current.decode() if isinstance(current, bytes) else current)
        elif damage == "swap":
            a, b = draw(st.sampled_from(tables)), draw(st.sampled_from(tables))
            files[f"out/{a}"] = run_files()[b]
        elif damage == "truncate":
            name = draw(st.sampled_from(tables))
            data = run_files()[name]
            files[f"out/{name}"] = data[: draw(st.integers(0, len(data) - 1))]
        elif damage == "delete":
            files.pop(f"out/{draw(st.sampled_from(tables + ['summary.json']))}", None)
        elif damage == "scenario":
            files["out/scenario.yaml"] = draw(st.sampled_from(
                ["{{{ not yaml", "[]", "x: &a [*a]", "name: 1", ""]))
        elif damage == "report-file":
            files["out/report/notes.txt"] = "mine"
        else:
            files[f"out/{draw(st.sampled_from(tables + ['summary.json']))}"] = {"__fifo__": True}
    args = ["report", "out"] + (["--force"] if draw(st.booleans()) else [])
    return {"files": files, "args": args}


GOLDEN_SCENARIO = dict(copy.deepcopy(TINY), name="tiny", duration="1d",
                       trace={"enabled": False})


def golden_text() -> str:
    global _GOLDEN
    if _GOLDEN is None:
        from clustersim.runner.api import simulate
        from clustersim.runner.check import normalise
        from clustersim.scenario.loader import scenario_from_dict

        summary = normalise(simulate(scenario_from_dict(copy.deepcopy(GOLDEN_SCENARIO))).summary)
        _GOLDEN = json.dumps(summary, indent=2)
    return _GOLDEN


_GOLDEN: str | None = None


@st.composite
def golden_case(draw: Any) -> dict[str, Any]:
    """`check` of a scenario whose golden summary is damaged (or a named pipe)."""
    golden: Any = (_damaged_json(draw, golden_text()) if draw(st.integers(0, 5))
                   else {"__fifo__": True})
    if not draw(st.integers(0, 19)):  # beyond MAX_SUMMARY_BYTES (or tiny)
        golden = '{"a": "' + "x" * (300 * 2**20 if draw(st.booleans()) else 10) + '"}'
    args = ["check", "scenario.yaml"] + (["--update"] if not draw(st.integers(0, 5)) else [])
    return {"files": {"scenario.yaml": _dump(GOLDEN_SCENARIO),
                      "results/tiny/summary.json": golden}, "args": args}


SWEEP_PATHS = ["failures.scale", "duration", "seed", "jobs.0.checkpoint.interval", "jobs.0.name",
               "trace.bin", "task", "status", "cluster.instances", "jobs.0.global_batch",
               "serve.0.name", "jobs.9.x", ""]
SWEEP_VALUES = [1, 2, 0.5, "1e9", 1e9, "1h", "30min", True, None, "x", [1], {"a": 1}, -1,
                float("nan"), "cluster", "j", 10**30, "never", "auto"]


@st.composite
def sweep_case(draw: Any) -> dict[str, Any]:
    """A sweep of the tiny scenario over one or two drawn grid paths, seeds or replications."""
    grid = {}
    for _ in range(draw(st.integers(0, 2))):
        grid[draw(st.sampled_from(SWEEP_PATHS))] = [
            copy.deepcopy(draw(st.sampled_from(SWEEP_VALUES)))
            for _ in range(draw(st.integers(0, 3)))]
    sweep: dict[str, Any] = {"scenario": draw(st.sampled_from(
        ["scenario.yaml", "scenario.yaml", "missing.yaml", "precious"])), "grid": grid}
    choice = draw(st.integers(0, 3))
    if choice == 0:
        sweep["seeds"] = draw(st.sampled_from([[0], [0, 1], [], [-1], [2**70], ["x"]]))
    elif choice == 1:
        sweep["replications"] = draw(st.sampled_from([1, 2, 0, 10**6]))
    elif choice == 2:
        sweep["variants"] = draw(st.sampled_from([
            [{"name": "a", "set": {"failures.scale": 2}}],
            [{"name": "a"}, {"name": "a"}], [{"name": "cluster", "set": {"jobs.0.name": "cluster"}}]]))
    scenario = dict(copy.deepcopy(TINY), duration="6h", trace={"enabled": False})
    if draw(st.booleans()):
        scenario["jobs"][0]["name"] = draw(st.sampled_from(["cluster", "j", "seed"]))
    args = ["sweep", "sweep.yaml", "-o", draw(st.sampled_from(["out", "out", "precious"])),
            "--workers", "1"] + (["--force"] if draw(st.booleans()) else [])
    return {"files": {"scenario.yaml": _dump(scenario), "sweep.yaml": _dump(sweep),
                      "precious/thesis.tex": "years of work"}, "args": args}


SURFACES = {"scenario": lambda: scenario_case(), "cli": lambda: cli_case(),
            "serve": lambda: serve_case(), "trace": lambda: trace_case(),
            "plan": lambda: plan_case(), "report": lambda: report_case(),
            "golden": lambda: golden_case(), "sweep": lambda: sweep_case()}
SURFACES.update(make_surfaces(_mutate, _dump))  # sites, fleettrace, serveday, serveplan


# ---------------------------------------------------------------------------------------------
# Running one case


def warm_up() -> None:
    """Import and cache in the parent what every case needs (catalog, presets, the CLI), so
    that each forked case starts warm."""
    from typer.testing import CliRunner

    import clustersim.analysis.report  # noqa: F401
    import clustersim.runner.api  # noqa: F401
    import clustersim.runner.sweep  # noqa: F401
    from clustersim.cli.app import app
    from clustersim.runner.api import simulate, step_profiles, topology_for
    from clustersim.scenario.loader import scenario_from_dict

    scenario = scenario_from_dict(dict(copy.deepcopy(TINY), duration="1h"))
    topology_for(scenario)
    step_profiles(scenario)
    simulate(scenario)
    for name in BASES:
        base_scenario(name)
    CliRunner().invoke(app, ["hardware", "--json"])
    import clustersim.planning.outputs  # noqa: F401
    import clustersim.serving.capacity  # noqa: F401

    run_files()
    golden_text()


@dataclass
class Outcome:
    kind: str
    exit_code: int | None
    detail: str = ""
    args: list[str] = field(default_factory=list)


def _mapped_bytes() -> int:
    """This process's virtual size (Linux's /proc; 0 where it is not there)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _child(args: list[str], folder: Path, memory_bytes: int, write_fd: int) -> None:
    """In the forked process: limits, then the command in-process (typer's runner)."""
    from typer.testing import CliRunner

    from clustersim.cli.app import app

    # The budget is on top of what the forked parent already maps: a long pytest process
    # (pyarrow's and Ray's reservations) can map gigabytes it never touches, and a fixed cap
    # then fails a case's first allocation as a MemoryError of the harness, not the input.
    limit_bytes = _mapped_bytes() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    os.chdir(folder)
    result = CliRunner().invoke(app, args, env={"COLUMNS": "100", "CLUSTERSIM_DEBUG": ""})
    exception = result.exception
    escaped = exception is not None and not isinstance(exception, SystemExit)
    payload = {"exit_code": result.exit_code, "stdout": result.stdout[-200_000:],
               "stderr": result.stderr[-20_000:],
               "escaped": f"{type(exception).__name__}: {exception}" if escaped else ""}
    with os.fdopen(write_fd, "wb") as pipe:
        pipe.write(pickle.dumps(payload))


def run_case(case: dict[str, Any], timeout_s: float = 30.0, memory_bytes: int = 4 * 2**30
             ) -> Outcome:
    """Run one case in a forked child in a fresh folder; classify what it did."""
    args = [str(a) for a in case["args"]]
    with tempfile.TemporaryDirectory(prefix="clustersim-fuzz-") as tmp:
        folder = Path(tmp)
        for name, content in case["files"].items():
            write_case_file(folder / name, content)
        (folder / "ro").mkdir(mode=0o500)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child never returns into the caller
            code = 0
            try:
                os.close(read_fd)
                os.setpgid(0, 0)
                _child(args, folder, memory_bytes, write_fd)
            except BaseException:  # noqa: BLE001 - reported through the pipe's absence
                code = 3
            finally:
                os._exit(code)
        os.close(write_fd)
        payload, status = _collect(pid, read_fd, timeout_s)
        if status == "timeout":
            return Outcome("timeout", None, f"no answer in {timeout_s:.0f} s", args)
        if payload is None:
            return Outcome("killed", None, status, args)
        return classify(payload, folder, args, case["files"])


def write_case_file(path: Path, content: Any) -> None:
    """Text, bytes, a named pipe (`{"__fifo__": True}`) or a Parquet file built from cells
    (`{"__parquet__": {"columns", "rows", "typed"}}`: typed converts cells to numbers)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, dict) and "__fifo__" in content:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.mkfifo(path)
    elif isinstance(content, dict) and "__parquet__" in content:
        spec = content["__parquet__"]

        def cell(text: str) -> Any:
            if not spec["typed"]:
                return text
            for kind in (int, float):
                with contextlib.suppress(ValueError):
                    return kind(text)
            return {"true": True, "false": False}.get(text, text)

        columns = {f"{name}{'_' * index}": [cell(r[index]) for r in spec["rows"]]
                   for index, name in enumerate(spec["columns"])}
        try:
            table = pa.table(columns)
            if len(set(spec["columns"])) < len(spec["columns"]):  # duplicated names, as asked
                table = table.rename_columns(spec["columns"])
            pq.write_table(table, path)
        except (pa.ArrowException, OverflowError, ValueError, TypeError):
            path.write_bytes(b"PAR1 not parquet")
    else:
        path.write_text(content, encoding="utf-8")


def _collect(pid: int, read_fd: int, timeout_s: float) -> tuple[dict | None, str]:
    deadline = time.monotonic() + timeout_s
    chunks = []
    os.set_blocking(read_fd, False)
    with os.fdopen(read_fd, "rb") as pipe:
        while True:
            with contextlib.suppress(BlockingIOError):
                data = pipe.read()
                if data:
                    chunks.append(data)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                with contextlib.suppress(BlockingIOError, TypeError):
                    rest = pipe.read()
                    if rest:
                        chunks.append(rest)
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None, "timeout"
            time.sleep(0.005)
    # Any worker processes of the case go with it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    raw = b"".join(chunks)
    if not raw:
        how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exit {os.WEXITSTATUS(status)}")
        return None, f"no result ({how}; out of memory?)"
    return pickle.loads(raw), "done"  # noqa: S301 - our own child's bytes


def _strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"bare {name}")

    return json.loads(text, parse_constant=refuse)


def _unchanged(path: Path, folder: Path, given: dict[str, Any] | None) -> bool:
    content = (given or {}).get(str(path.relative_to(folder)))
    if content is None or not isinstance(content, str | bytes):
        return False
    data = content.encode() if isinstance(content, str) else content
    return path.stat().st_size == len(data) and path.read_bytes() == data


def classify(payload: dict[str, Any], folder: Path, args: list[str],
             given: dict[str, Any] | None = None) -> Outcome:
    code = payload["exit_code"]
    output = payload["stdout"] + payload["stderr"]
    if payload["escaped"] or "Traceback" in output:
        return Outcome("traceback", code, payload["escaped"] or output[-2000:], args)
    moved = (args[:1] == ["check"] and code == 1 and "moved beyond the tolerance"
             in payload["stderr"] and "internal error" not in payload["stderr"])
    if code not in (0, 2) and not moved:  # `check` exits 1 when a figure moved: its answer
        return Outcome("internal-error", code, payload["stderr"][-2000:], args)
    left = [str(p.relative_to(folder)) for p in folder.rglob("*")
            if ".tmp-" in p.name or ".old-" in p.name or p.name.endswith(".lock")]
    if left:
        return Outcome("leftover", code, ", ".join(left), args)
    if code == 0 and "--json" in args:
        try:
            _strict(payload["stdout"])
        except ValueError as error:
            return Outcome("bad-json", code, f"stdout: {error}", args)
    for summary_path in folder.rglob("summary.json"):
        if not summary_path.is_file():  # a named pipe a case planted: reading it would block
            continue
        if _unchanged(summary_path, folder, given):
            continue  # the case's own (damaged) input, not something the command wrote
        try:
            summary = _strict(summary_path.read_text(encoding="utf-8"))
        except ValueError as error:
            return Outcome("bad-json", code, f"{summary_path.name}: {error}", args)
        problem = inconsistency(summary)
        if problem:
            return Outcome("inconsistent", code, problem, args)
    return Outcome("differs" if moved else "ok" if code == 0 else "refused", code, "", args)


def inconsistency(summary: dict[str, Any]) -> str:
    """What is contradictory in a run's summary, or ''."""
    for name, job in (summary.get("jobs") or {}).items():
        useful, wall = job.get("useful_s"), job.get("wall_s")
        if useful is None or wall is None or "ettr" not in job:
            continue  # a serving deployment or a figure set without them
        if not (-1e-6 <= useful <= wall * (1 + 1e-9) + 1e-6):
            return f"job {name}: useful_s {useful} outside 0..wall_s {wall}"
        if job.get("steps_completed", 1) == 0 and useful > 1e-6:
            return f"job {name}: useful_s {useful} with no completed step"
        expected = useful / wall if wall > 0 else 0.0
        if "ettr_ci95" not in job and not math.isclose(job["ettr"], expected, rel_tol=1e-6,
                                                       abs_tol=1e-9):
            return f"job {name}: ettr {job['ettr']} is not useful_s / wall_s = {expected}"
        if not 0 <= job["ettr"] <= 1 + 1e-9:
            return f"job {name}: ettr {job['ettr']} outside 0..1"
    return ""


# ---------------------------------------------------------------------------------------------
# The long run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds in all")
    parser.add_argument("--show", type=int, default=3, help="examples printed per failure class")
    parser.add_argument("--surfaces", default="scenario,cli",
                        help=f"comma-separated, from {', '.join(SURFACES)} (or all)")
    options = parser.parse_args()
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed

    surfaces = list(SURFACES) if options.surfaces == "all" else [
        name.strip() for name in options.surfaces.split(",") if name.strip()]
    unknown = [name for name in surfaces if name not in SURFACES]
    if unknown or not surfaces:
        parser.error(f"--surfaces: unknown {', '.join(unknown)}; expected {', '.join(SURFACES)}")
    warm_up()
    counts: Counter = Counter()
    examples: dict[str, list[Outcome]] = {}
    started = time.monotonic()

    @hypothesis_seed(options.seed)
    @settings(max_examples=options.cases, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def explore(data: Any) -> None:
        kind = data.draw(st.sampled_from(surfaces))
        try:
            case = data.draw(SURFACES[kind]())
        except Exception as error:  # noqa: BLE001 - a generator's bug, not clustersim's
            counts[(kind, "harness")] += 1
            examples.setdefault("harness", []).append(Outcome("harness", None, repr(error)))
            return
        if time.monotonic() - started > options.budget:
            return  # drawn all the same: hypothesis wants the same draws on a replay
        outcome = run_case(case, options.timeout)
        counts[(kind, outcome.kind)] += 1
        examples.setdefault(outcome.kind, []).append(outcome)

    explore()
    elapsed = time.monotonic() - started
    total = sum(counts.values())
    print(f"{total:,} cases in {elapsed:,.0f} s (seed {options.seed}, {options.timeout:g} s "
          f"and 4 GiB per case)")
    for kind in surfaces:
        row = {o: counts[(kind, o)] for o in OUTCOMES if counts[(kind, o)]}
        print(f"  {kind:9s} {sum(row.values()):6,}: "
              + ", ".join(f"{o} {n:,}" for o, n in row.items()))
    failures = [o for o in OUTCOMES if o not in PASSES and o in examples]
    for kind in failures:
        for outcome in examples[kind][: options.show]:
            print(f"{kind}: clustersim {' '.join(outcome.args)[:200]}\n    "
                  f"{outcome.detail[:500]}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
