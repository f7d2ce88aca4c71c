"""Fuzz the command line: scenario mutations and argument lists, each case in its own forked
process with a time and memory budget, classified by outcome.

    python scripts/fuzz.py --cases 3000 --seed 1          # prints the count per outcome
    python scripts/fuzz.py --surfaces serve,trace,plan,report,golden,sweep --cases 2000

Surfaces: `scenario` (training scenario mutations), `cli` (argument lists), `serve` (`serve:`
key mutations, run and --find-rate), `trace` (request trace files), `plan` (plan flags and
--write-scenario targets), `report` (damaged run folders), `golden` (damaged goldens under
`check`), `sweep` (sweep grids), and from scripts/fuzz_fleet.py `sites` (multi-site
clusters and site events), `fleettrace` (job traces in the five formats), `serveday`
(fluid deployments on load curves) and `serveplan` (the serving planner, through `plan`),
and from scripts/fuzz_models.py `models` (2025's mixtures, MLA and sliding windows, trained
and served through the serving stacks with their buckets and decode batching).

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
import copy
import sys
import time
from collections import Counter
from typing import Any

# The generators' toolkit, the harness and the output surfaces live beside this file; their
# names are re-exported here for tests/test_fuzz.py and for `python scripts/fuzz.py`.
from fuzz_base import (  # noqa: F401
    BASES,
    INTERESTING,
    SERVE,
    SERVE_EXTRA,
    TINY,
    _dump,
    _mutate,
    _no_local_ray,
    base_scenario,
)
from fuzz_fleet import make_surfaces
from fuzz_harness import OUTCOMES, PASSES, Outcome, classify, inconsistency, run_case, write_case_file  # noqa: F401
from fuzz_models import make_model_surfaces
from fuzz_outputs import golden_case, golden_text, plan_case, report_case, run_files, sweep_case  # noqa: F401
from hypothesis import strategies as st

# ---------------------------------------------------------------------------------------------
# Generators


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
# The newer surfaces: serving and request traces (fuzz_outputs.py: plan, report, check, sweep)

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


SURFACES = {"scenario": lambda: scenario_case(), "cli": lambda: cli_case(),
            "serve": lambda: serve_case(), "trace": lambda: trace_case(),
            "plan": lambda: plan_case(), "report": lambda: report_case(),
            "golden": lambda: golden_case(), "sweep": lambda: sweep_case()}
SURFACES.update(make_surfaces(_mutate, _dump))  # sites, fleettrace, serveday, serveplan
SURFACES.update(make_model_surfaces(_mutate, _dump))  # models (fuzz_models.py)


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
