"""Sweeps: a scenario's variants x grid x seeds, each a full run, on local processes or Ray.

A sweep file (docs/scenario.md, with `variants`):

```yaml
scenario: ../compare-1024-chips.yaml      # relative to the sweep file
grid:                                     # every combination is one variant
  jobs.0.checkpoint.interval: [10min, 30min, 1h]
  failures.scale: [0.5, 1, 2]
variants:                                 # optional: named sets of overrides applied
  - {name: trn2, set: {hardware: trn2, cluster.instances: 64}}   # together, crossed with grid
  - {name: p5en, set: {hardware: p5en, cluster.instances: 128}}
seeds: [0, 1, 2]                          # or `replications: 3` (the scenario's seed, +1, +2)
```

Results: `sweep.parquet`, one row per variant, grid point and seed, with the grid values as
columns named by their path, `variant`, `seed`, `status` (ok or error), `error`, and every
number of the summary as `<job>.<figure>`, `<deployment>.<figure>`, `cluster.<figure>`,
`teams.<team>.<figure>`, `fleet_day.<figure>`, `serving.<figure>` and `trace_rows.<figure>`
(nested figures by dotted path; a count a run's summary leaves out, a failure cause that did
not occur there, is 0: `fill_counts`); `sweep_summary.parquet`, per variant and grid point, the
mean of each figure over the seeds with `<figure>_ci95`, the half-width of its 95%
interval. A variant that fails is a row with its error; the others still run. The same rows
come out of either engine.
"""

from __future__ import annotations

import itertools
import json
import math
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, ValidationError, model_validator

from clustersim.cluster.fleet import COUNT_FAMILIES
from clustersim.hardware import limits
from clustersim.hardware.paths import flatten
from clustersim.hardware.spec import Spec
from clustersim.planning.engine import start_ray
from clustersim.runner.api import simulate
from clustersim.runner.figures import capped_workers, t_quantile
from clustersim.runner.interrupts import Interrupted, interrupt_handled, worker_pool
from clustersim.runner.outputs import atomic_output_dir
from clustersim.scenario.errors import Issue, ScenarioError
from clustersim.scenario.loader import input_files, load_scenario
from clustersim.scenario.messages import pydantic_issues
from clustersim.scenario.reading import read_yaml_file

__all__ = ["SweepSpec", "Variant", "Task", "load_sweep", "sweep_tasks", "run_task", "run_sweep",
           "summarise", "write_sweep", "t_quantile", "SweepInterrupted", "INPUT_FAULTS",
           "fill_counts", "sweep_inputs"]


# summary.json's sections kept as columns under their own name, beside the jobs', the
# deployments' and the cluster's (a job or deployment of one of these names: refused below)
SECTIONS = ("teams", "fleet_day", "serving", "trace_rows")


class Variant(Spec):
    name: str = Field(min_length=1)
    set: dict[str, Any] = Field(default_factory=dict, description="path -> value overrides")


RESERVED_COLUMNS = ("task", "variant", "seed", "status", "error")


def _kind(value: Any) -> str:
    """The column kind a grid value makes in sweep.parquet (ints and floats are numbers)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "text"
    return "structure"  # lists and mappings are written as JSON text, each alike


def _repeated(values: list[Any]) -> tuple[int, int] | None:
    """Where a value of `values` is first given and where again (1 and 1.0 alike), or None."""
    seen: dict[Any, int] = {}
    for index, value in enumerate(values):
        key = (float(value) if isinstance(value, int | float) and not isinstance(value, bool)
               else json.dumps(value, sort_keys=True, default=str))
        if key in seen:
            return seen[key], index
        seen[key] = index
    return None


class SweepSpec(Spec):
    scenario: str
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    variants: list[Variant] = Field(default_factory=list)
    seeds: list[Annotated[int, Field(ge=0, le=limits.MAX_SEED)]] | None = Field(
        default=None, min_length=1)
    replications: int | None = Field(default=None, gt=0, le=limits.MAX_REPLICATIONS)

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        if self.seeds is not None and self.replications is not None:
            raise ValueError("give seeds or replications, not both")
        for path, values in self.grid.items():
            if not values:
                raise ValueError(f"grid.{path}: expected at least one value")
            if path in RESERVED_COLUMNS:
                raise ValueError(f"grid.{path}: {path!r} is a column of sweep.parquet"
                                 + ("; give the seeds as `seeds: [...]`" if path == "seed"
                                    else "; expected a scenario key path"))
            kinds = {_kind(v) for v in values}
            if len(kinds) > 1:
                shown = ", ".join(f"{v!r} ({_kind(v)})" for v in values[:6])
                raise ValueError(f"grid.{path}: values of mixed kinds ({shown}); expected one "
                                 "kind per column (YAML reads 1e9 as text: write 1.0e9)")
            repeated = _repeated(values)
            if repeated is not None:
                first, again = repeated
                raise ValueError(f"grid.{path}.{again}: {values[again]!r}, the value of "
                                 f"grid.{path}.{first} ({values[first]!r}) again; expected "
                                 "each value once (the runs of both would count as seeds of "
                                 "one grid point: give `seeds` or `replications`)")
        if self.seeds is not None:
            repeated = _repeated(self.seeds)
            if repeated is not None:
                first, again = repeated
                raise ValueError(f"seeds.{again}: {self.seeds[again]}, the seed of "
                                 f"seeds.{first} again; expected each seed once (a seed run "
                                 "twice is one run, which the interval would count as two)")
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError("variant names must be unique")
        return self


@dataclass(frozen=True)
class Task:
    """One run of a sweep: which variant and grid point, its overrides, its seed."""

    index: int
    scenario_path: str
    variant: str
    grid: tuple[tuple[str, Any], ...]
    overrides: tuple[str, ...]
    seed: int


def load_sweep(path: str | Path) -> tuple[SweepSpec, Path]:
    """Read and validate a sweep file; errors name the file and key path (exit 2)."""
    path = Path(path)
    raw = read_yaml_file(path)
    if not isinstance(raw, dict):
        raise ScenarioError(str(path), [Issue("", "expected a mapping (scenario, grid, seeds)",
                                              raw, True)])
    if "scenario" not in raw and "name" in raw and {"hardware", "cluster"} & raw.keys():
        raise ScenarioError(str(path), [Issue(
            "", "a scenario, not a sweep file: run it with `clustersim run FILE`, or sweep it "
            "from a sweep file naming it (scenario: FILE, with a grid, variants or seeds: "
            "docs/cli.md#sweep)")])
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as error:
        raise ScenarioError(str(path), pydantic_issues(error, SweepSpec)) from None
    runs = (max(1, len(spec.variants)) * math.prod(len(v) for v in spec.grid.values())
            * (len(spec.seeds) if spec.seeds is not None else spec.replications or 1))
    if runs > limits.MAX_SWEEP_RUNS:
        raise ScenarioError(str(path), [Issue(
            "grid", f"the sweep would make {runs:,} runs (variants x grid points x seeds); "
            f"expected at most {limits.MAX_SWEEP_RUNS:,} (docs/limits.md)")])
    scenario = (path.parent / spec.scenario).resolve()
    if not scenario.exists():
        raise ScenarioError(str(path), [Issue("scenario", f"no such file {scenario}",
                                              spec.scenario, True)])
    return spec, scenario


def _override(path: str, value: Any) -> str:
    return f"{path}={json.dumps(value)}"


def sweep_tasks(spec: SweepSpec, scenario_path: Path) -> list[Task]:
    """Every run of the sweep, in a fixed order."""
    if spec.seeds is not None:
        seeds = list(spec.seeds)
    else:
        base = load_scenario(scenario_path).seed
        seeds = [base + i for i in range(spec.replications or 1)]
    variants = spec.variants or [Variant(name="base")]
    paths = list(spec.grid)
    tasks = []
    for variant in variants:
        for values in itertools.product(*(spec.grid[p] for p in paths)):
            overrides = [_override(p, v) for p, v in variant.set.items()]
            overrides += [_override(p, v) for p, v in zip(paths, values, strict=True)]
            for seed in seeds:
                tasks.append(Task(len(tasks), str(scenario_path), variant.name,
                                  tuple(zip(paths, values, strict=True)), tuple(overrides), seed))
    return tasks


def sweep_inputs(sweep_path: str | Path, scenario_path: Path,
                 tasks: list[Task]) -> list[Path]:
    """The files a sweep reads: the sweep file, and what a run of each variant reads (its
    scenario file and the traces it names: `input_files`, as `run` protects them). An OUT
    holding one is refused even with --force: replacing it would delete them."""
    found = [Path(sweep_path), scenario_path]
    # (only the overrides that can name a trace: a scenario loaded per grid point would
    # cost a fleet's generation each)
    named = {tuple(o for o in task.overrides if o.partition("=")[0].split(".")[0]
                   in ("workload", "serve")) for task in tasks}
    for overrides in sorted(named) or [()]:
        try:
            found += input_files(load_scenario(scenario_path, list(overrides)))
        except ScenarioError:  # that variant's runs are refused with the error
            continue
    return list(dict.fromkeys(found))


def run_task(task: Task) -> dict[str, Any]:
    """Run one variant and seed; a failure becomes a row with its error."""
    row: dict[str, Any] = {"task": task.index, "variant": task.variant, "seed": task.seed}
    for path, value in task.grid:
        row[path] = value if isinstance(value, int | float | str | bool) else json.dumps(value)
    try:
        scenario = load_scenario(task.scenario_path, list(task.overrides))
        summary = simulate(scenario, seed=task.seed).summary
    except Exception as error:  # a variant's failure is reported, the sweep goes on
        row.update(status="error", error=f"{type(error).__name__}: {error}")
        return row
    cluster = {k: v for k, v in summary["cluster"].items()
               if k not in ("links", "per_chip_bandwidth_gbyte_per_s", "peak_pflops")}
    parts = [flatten(summary["jobs"]), flatten(summary.get("deployments", {})),
             flatten({"cluster": cluster})]  # serving: <deployment>.<figure>
    # the sections beside them, after (the columns above keep their names and order):
    # teams.<team>.<figure>, fleet_day.<figure>, serving.<figure>, trace_rows.<figure>
    parts += [flatten({section: summary[section]}) for section in SECTIONS
              if isinstance(summary.get(section), dict)]
    leaves = {k: v for part in parts for k, v in part.items() if k not in row}  # grid first
    clash = sorted(k for k in leaves if sum(k in part for part in parts) > 1)
    if clash:  # a job named `cluster`, say: one column would hold two figures
        row.update(status="error", error=f"figures named alike ({', '.join(clash[:5])}): "
                   "rename the job or deployment")
        return row
    figures = {path: float(value) for path, value in leaves.items()
               if isinstance(value, int | float)}  # numbers only (true and false as 1 and 0)
    row.update(status="ok", error="", **figures)
    return row


def _local(tasks: list[Task], workers: int | None) -> Iterator[dict[str, Any]]:
    workers = capped_workers(workers, len(tasks))
    if workers <= 1:
        for task in tasks:
            yield run_task(task)
        return
    # Leaving this generator early (Ctrl-C, SIGTERM) terminates the workers: queued runs are
    # dropped, not waited for.
    with worker_pool(workers) as pool:
        yield from pool.imap_unordered(run_task, tasks)


def _ray(tasks: list[Task], address: str | None) -> Iterator[dict[str, Any]]:
    ray = start_ray(address)
    remote = ray.remote(run_task)
    pending = [remote.remote(task) for task in tasks]
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            yield ray.get(ref)


class SweepInterrupted(Interrupted):
    """A sweep stopped by Ctrl-C or SIGTERM: `rows` and `summary` hold the finished runs."""

    def __init__(self, signum: int, rows: pd.DataFrame | None = None,
                 summary: pd.DataFrame | None = None, total: int = 0):
        super().__init__(signum)
        self.rows = rows if rows is not None else pd.DataFrame()
        self.summary = summary if summary is not None else pd.DataFrame()
        self.total = total


# Errors that are the sweep's input at fault (a grid value the scenario refuses, figures of
# a job and the cluster named alike), not a bug: how a failed row's `error` begins.
INPUT_FAULTS = ("ScenarioError", "JobDoesNotFit", "OutputDirError", "TopologyTooLarge",
                "figures named alike")


def run_sweep(path: str | Path, engine: str = "local", workers: int | None = None,
              address: str | None = None,
              progress: Callable[[int, int], None] | None = None) -> tuple[pd.DataFrame,
                                                                          pd.DataFrame]:
    """Run every task of a sweep file; return (rows, summary) DataFrames. Interrupted, it
    stops its workers at once and raises SweepInterrupted with the rows finished so far."""
    spec, scenario_path = load_sweep(path)
    tasks = sweep_tasks(spec, scenario_path)
    if engine not in ("local", "ray"):
        raise ValueError(f"unknown engine {engine!r}; expected local or ray")
    results = _local(tasks, workers) if engine == "local" else _ray(tasks, address)
    rows: list[dict[str, Any]] = []
    try:
        for row in results:
            rows.append(row)
            if progress is not None:
                progress(len(rows), len(tasks))
    except KeyboardInterrupt as interrupt:
        results.close()  # terminates the workers before the partial tables are built
        interrupt_handled()
        frame = _frame(rows, spec)
        raise SweepInterrupted(getattr(interrupt, "signum", signal.SIGINT), frame,
                               summarise(frame, list(spec.grid)), len(tasks)) from None
    frame = _frame(rows, spec)
    return frame, summarise(frame, list(spec.grid))


def _frame(rows: list[dict[str, Any]], spec: SweepSpec) -> pd.DataFrame:
    first = ["task", "variant", *spec.grid, "seed", "status", "error"]
    if not rows:
        return pd.DataFrame(columns=first)
    frame = pd.DataFrame(rows).sort_values("task", ignore_index=True)
    # Columns in a fixed order whichever run finished first: keys, then figures by name.
    return fill_counts(frame[[c for c in first if c in frame]
                             + sorted(c for c in frame if c not in first)])


def _count_parent(column: str) -> str | None:
    """The figure a count column belongs to (`cluster` of `cluster.failures.nic`, the job of
    `<job>.interruptions_by_cause.chip`), or None for a column of no count family."""
    for family in COUNT_FAMILIES:
        if column.startswith(f"{family}."):
            return ""
        at = column.rfind(f".{family}.")
        if at >= 0:
            return column[:at]
    return None


def fill_counts(rows: pd.DataFrame) -> pd.DataFrame:
    """0 for a count a run's summary left out (a failure cause, an interruption cause, a job
    status that did not occur in that run) where another run of the sweep has it: the summary
    writes only the counts that occurred, so the union of the runs' columns holds NaN there.
    Only in runs that have the figure the count belongs to (a job of another variant stays
    NaN) and that succeeded; figures that are undefined (a slowdown of a job that never
    started) stay NaN."""
    ok = (rows["status"] == "ok") if "status" in rows else pd.Series(True, index=rows.index)
    parents: dict[str, list[str]] = {}
    for column in rows.columns:
        parent = _count_parent(column)
        if parent is not None:
            parents.setdefault(parent, []).append(column)
    if not parents:
        return rows
    rows = rows.copy()
    for parent, counts in parents.items():
        counted = set(counts)
        # The run has the figure when it has any other number of it (its job ran there).
        others = [c for c in rows.columns if c not in counted and c.startswith(f"{parent}.")
                  and pd.api.types.is_numeric_dtype(rows[c])] if parent else []
        has = (rows[others].notna().any(axis=1) | rows[counts].notna().any(axis=1)
               if others else pd.Series(True, index=rows.index)) & ok
        for column in counts:
            rows.loc[has & rows[column].isna(), column] = 0.0
    return rows


def summarise(rows: pd.DataFrame, grid_paths: list[str]) -> pd.DataFrame:
    """Mean and 95% interval half-width of every figure per variant and grid point."""
    keys = ["variant"] + grid_paths
    ok = rows[rows["status"] == "ok"] if "status" in rows else rows
    figures = [c for c in ok.columns if c not in keys + ["task", "seed", "status", "error"]
               and pd.api.types.is_numeric_dtype(ok[c])]
    out = []
    for values, group in rows.groupby(keys, sort=False, dropna=False):
        values = values if isinstance(values, tuple) else (values,)
        record: dict[str, Any] = dict(zip(keys, values, strict=True))
        good = group[group["status"] == "ok"]
        record["runs"] = len(good)
        record["failed"] = int((group["status"] != "ok").sum())
        for figure in figures:
            data = good[figure].dropna().to_numpy(dtype=float)
            record[figure] = float(data.mean()) if len(data) else np.nan
            # the same in every run: 0, not the rounding noise of its standard deviation
            record[f"{figure}_ci95"] = (np.nan if len(data) < 2 else 0.0 if (
                data == data[0]).all() else float(t_quantile(len(data) - 1)
                                                  * data.std(ddof=1) / math.sqrt(len(data))))
        out.append(record)
    return pd.DataFrame(out)


def write_sweep(rows: pd.DataFrame, summary: pd.DataFrame, sweep_path: str | Path,
                out: str | Path, force: bool = False, partial: str | None = None,
                inputs: list[Path] | tuple = ()) -> Path:
    """OUT/sweep.parquet, OUT/sweep_summary.parquet and a copy of the sweep file, atomically.
    A `partial` note (an interrupted sweep) goes into both tables' metadata
    (`clustersim.partial`) and into OUT/PARTIAL.txt. An OUT holding one of `inputs`
    (`sweep_inputs`) is refused even with `force`."""
    with atomic_output_dir(Path(out), force=force, inputs=inputs) as staging:
        _to_parquet(rows, staging / "sweep.parquet", partial)
        _to_parquet(summary, staging / "sweep_summary.parquet", partial)
        (staging / "sweep.yaml").write_text(Path(sweep_path).read_text(encoding="utf-8"))
        if partial is not None:
            (staging / "PARTIAL.txt").write_text(partial + "\n", encoding="utf-8")
    return Path(out)


def _to_parquet(frame: pd.DataFrame, path: Path, partial: str | None) -> None:
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if partial is not None:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               b"clustersim.partial": partial.encode()})
    pq.write_table(table, path)
