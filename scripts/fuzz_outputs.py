"""The fuzz's cases of the output surfaces: `plan` flags and --write-scenario targets, damaged
run folders under `report`, damaged goldens under `check`, sweep grids (scripts/fuzz.py)."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

from fuzz_base import NO_RAY_HERE, SERVE, TINY, _dump, _mutate, _no_local_ray
from hypothesis import strategies as st

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
