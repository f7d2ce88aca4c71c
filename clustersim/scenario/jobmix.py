"""Job mixes: jobs drawn from templates with an arrival process, or read from a trace file.

A scenario's `workload:` section adds jobs to its `jobs:` list, drawn with the scenario's
seed (a stream of its own, so `--seed` on `run` varies failures, not the job mix):

```yaml
workload:
  arrivals: {rate: 20/d, count: 120}      # Poisson arrivals; stop at `count` or `until`
  templates:
    - name: small
      weight: 3                             # how often this template is drawn
      instances: [1, 2, 4, 8]               # one drawn uniformly; or {min: 1, max: 64}:
                                            # a power of two, log-uniform between them
      run_for: {median: 6h, sigma: 1.0}     # log-normal run time (or steps: 5000)
      microbatches: 8                       # per data-parallel replica and step
      job: {model: llama3-8b, seq_len: 4096, parallelism: {tp: 8, pp: 1}, priority: 0,
            recompute: selective, checkpoint: {interval: 1h, write: 30s}}
  file: jobs.csv                            # optional: jobs from a trace, beside the scenario
```

Data parallelism follows from the size: dp = instances x ranks per instance / (tp x pp), and
the global batch is dp x micro_batch x microbatches.

Trace files (CSV or Parquet), one job a row, relative to the scenario file: `submit`
(seconds, or a duration such as `2h`), `instances`, `template` (the template giving the
model, parallelism and batch), and optionally `run_for` (seconds or a duration), `steps`,
`priority`, `name`, `team`. Published cluster traces (Philly, Helios, PAI, Acme) are read by
`workload.trace` (clustersim.scenario.traces).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from clustersim.hardware import limits, units
from clustersim.hardware.spec import Duration, Rate, Spec
from clustersim.scenario.errors import WorkloadError
from clustersim.scenario.job_table import read_job_table, unread_mapping_key
from clustersim.scenario.reading import regular_file_problem
from clustersim.scenario.trace_names import TraceNames
from clustersim.scenario.traces import COLUMNS, TraceMapping, TraceTarget, read_trace

__all__ = ["WorkloadSpec", "JobTemplate", "default_template", "generate_jobs"]



class SizeRange(Spec):
    min: int = Field(gt=0)
    max: int = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> SizeRange:
        if self.max < self.min:
            raise ValueError(f"max {self.max} is below min {self.min}")
        if self.min < self.max and 1 << (self.min - 1).bit_length() > self.max:
            # (the draw is a power of two, clipped to the bounds: only min and max would come)
            raise ValueError(f"min {self.min} to max {self.max} holds no power of two: a range "
                             "draws powers of two between its bounds; expected a range holding "
                             f"one, or a list of the sizes ({list(range(self.min, self.max + 1))[:8]})")
        return self


class RunTime(Spec):
    """A log-normal run time: its median and the sigma of its logarithm (0: fixed)."""

    median_s: Duration = Field(alias="median")
    sigma: float = Field(default=0.0, ge=0, le=limits.MAX_RUN_TIME_SIGMA)


class JobTemplate(Spec):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    weight: float = Field(default=1.0, gt=0)
    teams: dict[str, float] | None = Field(default=None, description="team -> weight: each "
                                           "job's team drawn from these")
    instances: list[int] | SizeRange = Field(description=(
        "a list (each size as likely) or {min, max}: a power of two, 2 to the power "
        "round(u) with u uniform over [log2 min, log2 max], clipped to the bounds ({min: 1, "
        "max: 4}: 1, 2 and 4 a quarter, a half and a quarter of the time); a range must hold "
        "a power of two unless min = max"))
    run_for: RunTime | None = None
    steps: int | None = Field(default=None, gt=0)
    microbatches: int = Field(default=8, gt=0, description="per data-parallel replica per step")
    job: dict[str, Any] = Field(description="the job's fields but name, instances, dp, batch")

    @model_validator(mode="after")
    def _check(self) -> JobTemplate:
        if isinstance(self.instances, list) and (not self.instances or min(self.instances) < 1):
            raise ValueError("instances: expected a non-empty list of positive counts")
        if self.teams is not None and (not self.teams or min(self.teams.values()) <= 0):
            raise ValueError("teams: expected team names with positive weights")
        for key in ("name", "instances", "global_batch", "submit"):
            if key in self.job:
                raise ValueError(f"job.{key} is set by the template; remove it")
        return self


class Arrivals(Spec):
    rate_per_s: Rate = Field(alias="rate", description="Poisson arrivals per unit time")
    count: int | None = Field(default=None, gt=0, le=limits.MAX_JOBS)
    until_s: Duration | None = Field(default=None, alias="until")

    @model_validator(mode="after")
    def _bounded(self) -> Arrivals:
        if self.count is None and self.until_s is None:
            raise ValueError("give count or until (or both)")
        return self


class WorkloadSpec(Spec):
    arrivals: Arrivals | None = None
    templates: list[JobTemplate] = Field(default_factory=list)
    file: str | None = Field(default=None, description="CSV or Parquet job trace")
    trace: str | None = Field(default=None, description="a published cluster trace "
                              "(docs/traces-in.md), beside the scenario")
    format: Literal["philly", "helios", "pai", "acme", "native"] | None = Field(
        default=None, description="the trace's format")
    mapping: TraceMapping = Field(default_factory=TraceMapping,
                                  description="GPU jobs to Trainium jobs (docs/traces-in.md)")
    seed: int | None = Field(
        default=None, ge=0, le=limits.MAX_SEED,
        description="the job mix's seed (default: the scenario's `seed`); a run's `--seed` "
                    "keeps the mix, and its OUT/scenario.yaml records the mix's seed here")

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        if self.arrivals is not None and not self.templates:
            raise ValueError("arrivals need at least one template")
        if self.trace is not None and self.format is None:
            raise ValueError("trace needs its format: philly, helios, pai, acme or native")
        if self.trace is not None and self.format == "native" and not self.templates:
            raise ValueError("a native trace needs the templates its rows name")
        if self.mapping.template is not None and self.mapping.template not in {
                t.name for t in self.templates}:
            raise ValueError(f"mapping.template {self.mapping.template!r} is not a template")
        names = [t.name for t in self.templates]
        if len(set(names)) != len(names):
            raise ValueError("template names must be unique")
        return self


def _size(template: JobTemplate, rng: np.random.Generator) -> int:
    if isinstance(template.instances, list):
        return int(template.instances[rng.integers(len(template.instances))])
    low = math.log2(template.instances.min)
    high = math.log2(template.instances.max)
    exponent = rng.uniform(low, high)
    return int(min(template.instances.max, max(template.instances.min, 2 ** round(exponent))))


def _whole(value: Any) -> int | None:
    """A whole positive count as written (not a boolean, text or 2.5), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value != int(value) or value < 1:
        return None
    return int(value)


def _job(template: JobTemplate, instances: int, ranks_per_instance: int, name: str,
         submit_s: float, run_for_s: float | None, steps: int | None,
         priority: int | None) -> dict[str, Any]:
    # A shallow copy: nothing here changes a nested mapping but the parallelism, copied,
    # and the loader only replaces the model name (a deep copy per job of a 100,000-job mix
    # was most of its load time).
    job = dict(template.job)
    given = job.get("parallelism")
    parallelism = dict(given) if isinstance(given, dict) else {}
    tp, pp = _whole(parallelism.get("tp", 1)), _whole(parallelism.get("pp", 1))
    micro = _whole(job.get("micro_batch", 1))
    ranks = instances * ranks_per_instance
    if tp is None or pp is None or micro is None:
        # not whole positive counts (tp: 0 divided by zero): the job's validation names the
        # template's key; dp and the batch are placeholders until then
        parallelism["dp"], micro = 1, 1
    else:
        parallelism["dp"] = (max(1, ranks // (tp * pp)) if ranks % (tp * pp) == 0
                             else ranks / (tp * pp))
    if given is not None and not isinstance(given, dict):
        parallelism = given  # as written, for validation to refuse
    dp = parallelism["dp"] if isinstance(parallelism, dict) else 1
    job.update({
        "name": name, "instances": instances, "parallelism": parallelism, "submit": submit_s,
        "global_batch": int(dp * micro * template.microbatches) if isinstance(dp, int) else 1,
    })
    if run_for_s is not None:
        job["run_for"] = run_for_s
    if steps is not None:
        job["steps"] = steps
    if priority is not None:
        job["priority"] = priority
    return job


def _shares(weights: list[float]) -> np.ndarray:
    """Weights as shares of their sum; weights whose sum overflows (two of 1e308) are taken
    over their largest first (their sum was inf, every share NaN: the first always drawn)."""
    w = np.array(weights, dtype=float)
    with np.errstate(over="ignore"):
        total = w.sum()
    if not math.isfinite(total):
        w = w / w.max()
        total = w.sum()
    return w / total


def _cumulative(p: np.ndarray) -> np.ndarray:
    """What `Generator.choice(len(p), p=p)` searches: the cumulative sum, over its last."""
    cdf = p.cumsum()
    cdf /= cdf[-1]
    return cdf


def _draw(rng: np.random.Generator, cdf: np.ndarray) -> int:
    """`rng.choice(len(p), p=p)` with `cdf = _cumulative(p)`: the same draw from the same
    stream (one uniform, searched), without checking p again at every job."""
    return int(cdf.searchsorted(rng.random(), side="right"))


def generate_jobs(workload: WorkloadSpec, seed: int, ranks_per_instance: int,
                  base_dir: Path | None, target: TraceTarget | None = None,
                  origins: list[tuple[int | str, str | None, dict[str, str]]] | None = None,
                  trace_rows: dict[str, Any] | None = None,
                  horizon_s: float | None = None) -> list[dict[str, Any]]:
    """Raw job mappings (validated later with the rest of the scenario). `origins`, if
    given, gets one entry a job: its template's index, its trace row (None for an arrival)
    and the row's column names by job key, for messages naming what the user wrote;
    `trace_rows`, if given, what became of a published trace's rows (read_trace);
    `horizon_s`, the scenario's duration when known: an arrival at or past it is refused
    at once (a million of them were drawn, then refused one by one, in 40 s of CPU)."""
    origins = origins if origins is not None else []
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x6A6F62]))
    jobs: list[dict[str, Any]] = []
    templates = {t.name: t for t in workload.templates}
    unread_mapping_key(workload)
    if workload.arrivals is not None:
        a = workload.arrivals
        which = _cumulative(_shares([t.weight for t in workload.templates]))
        team_choice = {}
        for template in workload.templates:
            if template.teams is not None:
                names = list(template.teams)
                team_choice[template.name] = (
                    names, _cumulative(_shares([template.teams[n] for n in names])))
        index_of = {t.name: i for i, t in enumerate(workload.templates)}  # (names unique)
        t = 0.0
        while True:
            t += rng.exponential(1.0 / a.rate_per_s)
            if a.until_s is not None and t >= a.until_s:
                break
            if a.count is not None and len(jobs) >= a.count:
                break
            if horizon_s is not None and t >= horizon_s:
                _past_horizon(a, len(jobs), t, horizon_s)
            if len(jobs) >= limits.MAX_JOBS:
                raise WorkloadError("workload.arrivals",
                                    f"more than {limits.MAX_JOBS:,} jobs before `until` "
                                    "(docs/limits.md); expected a lower rate, an earlier until "
                                    "or a count")
            template = workload.templates[_draw(rng, which)]
            run_for = None
            if template.run_for is not None:
                run_for = float(template.run_for.median_s * math.exp(
                    template.run_for.sigma * rng.standard_normal()))
            job = _job(template, _size(template, rng), ranks_per_instance,
                       f"{template.name}-{len(jobs):04d}", t, run_for, template.steps, None)
            origins.append((index_of[template.name], None, {}))
            if template.teams is not None:
                names, cumulative = team_choice[template.name]
                job["team"] = names[_draw(rng, cumulative)]
            jobs.append(job)
    if workload.file is not None:
        jobs += _from_file(workload.file, templates, ranks_per_instance, base_dir,
                           origins, f"workload.file {workload.file}")
    if workload.trace is not None:
        jobs += _from_trace(workload, templates, ranks_per_instance, base_dir, target, origins,
                            trace_rows if trace_rows is not None else {}, horizon_s)
    return jobs


def _past_horizon(a: Arrivals, drawn: int, t: float, horizon_s: float) -> None:
    """Refuse arrivals that reach the scenario's end (every job there would be refused)."""
    what = (f"count {a.count:,}" if a.until_s is None else
            f"until {units.format_duration(a.until_s)}")
    raise WorkloadError("workload.arrivals", f"job {drawn + 1:,} of {what} arrives at "
                        f"{units.format_duration(t)}, at or after the end of the scenario "
                        f"({units.format_duration(horizon_s)}); expected an until within "
                        f"the duration, a count it holds (about {a.rate_per_s * horizon_s:,.0f}"
                        " at this rate) or a longer duration")


def default_template(ranks_per_instance: int) -> JobTemplate:
    """The template of a trace's jobs when the scenario gives none (docs/traces-in.md): Llama
    3 8B at 4,096 tokens, tensor-parallel within an instance (TP 8, or the largest power of
    two dividing its ranks), data-parallel over the job's size as the trace gives it, ZeRO-1,
    selective recompute, 8 micro-batches a step, checkpoints at the interval that maximises
    goodput."""
    tp = math.gcd(8, ranks_per_instance)
    return JobTemplate.model_validate({
        "name": "default", "instances": [1], "job": {
            "model": "llama3-8b", "seq_len": 4096, "recompute": "selective",
            "parallelism": {"tp": tp, "pp": 1, "zero": 1, "sequence_parallel": tp > 1},
            "checkpoint": {"interval": "auto", "write": "30s", "restore": "2min"}}})


def _index(workload: WorkloadSpec, template: str) -> int:
    return next(i for i, t in enumerate(workload.templates) if t.name == template)


def _trace_path(text: str, base_dir: Path | None, key: str = "workload.trace") -> Path:
    """A job file or trace path, relative to the scenario's folder, refused (under `key`) if
    it is not a regular file within the trace size limit."""
    path = Path(text)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    problem = regular_file_problem(path, limits.MAX_TRACE_FILE_BYTES, "a trace file")
    if problem is not None:
        raise WorkloadError(key, f"{path}: {problem}")
    return path


def _from_trace(workload: WorkloadSpec, templates: dict[str, JobTemplate],
                ranks_per_instance: int, base_dir: Path | None,
                target: TraceTarget | None, origins: list, trace_rows: dict[str, Any],
                horizon_s: float | None = None) -> list[dict[str, Any]]:
    assert workload.trace is not None and workload.format is not None
    path = Path(workload.trace)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if workload.format == "pai" and path.is_dir():  # PAI as published: its folder of tables
        path = path / "pai_job_table.csv"
    path = _trace_path(str(path), None)
    target = target or TraceTarget(1, None, None)
    if workload.format == "native":
        return _native(path, templates, ranks_per_instance, target, origins,
                       f"workload.trace {workload.trace}")
    if templates:
        template = templates[workload.mapping.template or next(iter(templates))]
        label: int | str = _index(workload, template.name)
    else:
        template, label = default_template(ranks_per_instance), "default"
    jobs = []
    columns = COLUMNS[workload.format]
    rows, stats = read_trace(path, workload.format, workload.mapping, target, horizon_s)
    trace_rows.update(stats)
    ids, teams = TraceNames(row.id for row in rows), TraceNames(row.team for row in rows)
    for row in rows:
        origins.append((label, f"workload.trace {workload.trace}, {row.where}", columns))
        job = _job(template, row.instances, ranks_per_instance,
                   f"{workload.format}-{ids(row.id)}", row.submit_s, row.run_for_s,
                   None, None)
        team = teams(row.team)
        if team is not None:
            job["team"] = team
        if row.outcome is not None:
            job["trace_outcome"] = row.outcome
        jobs.append(job)
    return jobs


def _native(path: Path, templates: dict[str, JobTemplate], ranks_per_instance: int,
            target: TraceTarget, origins: list, where: str) -> list[dict[str, Any]]:
    """The native trace (the `file:` columns) with the trace checks: names once, rows in
    submission order, run times >= 0, sizes within the cluster."""
    jobs = _from_file(str(path), templates, ranks_per_instance, None, origins, where,
                      "workload.trace")
    seen: dict[str, int] = {}
    previous = -math.inf
    for number, job in enumerate(jobs, start=1):
        where = f"{path}, row {number}"
        if job["name"] in seen:
            raise WorkloadError("workload.trace", f"{where}, column name: {job['name']!r} is "
                                f"also row {seen[job['name']]}; expected each job once")
        seen[job["name"]] = number
        if job["submit"] < previous:
            raise WorkloadError("workload.trace", f"{where}, column submit: before the row "
                                "above; expected rows in submission order")
        previous = job["submit"]
        if target.max_instances is not None and job["instances"] > target.max_instances:
            raise WorkloadError("workload.trace", f"{where}, column instances: "
                                f"{job['instances']:,} is more than the cluster's "
                                f"{target.max_instances:,} instances")
    return jobs


def _from_file(path_text: str, templates: dict[str, JobTemplate], ranks_per_instance: int,
               base_dir: Path | None, origins: list, where: str, key: str = "workload.file"
               ) -> list[dict[str, Any]]:
    """The jobs of a job file, one a row; `origins` gets each one's template index and row
    (`where`, row N); refused under `key` (a native trace is `workload.trace`)."""
    import pandas as pd

    path = _trace_path(path_text, base_dir, key)
    frame = read_job_table(path, key)
    jobs = []
    teams = TraceNames(str(team) for team in frame.get("team", []) if isinstance(team, str)
                       or (team is not None and not pd.isna(team)))
    for number, row in enumerate(frame.to_dict("records")):
        try:
            jobs.append(_trace_job(row, number, path, templates, ranks_per_instance, teams))
            origins.append((list(templates).index(str(row["template"])),
                            f"{where}, row {number + 1}", {}))
        except (TypeError, OverflowError, units.UnitError, ValueError) as error:
            raise WorkloadError(key, f"{path}, row {number + 1}: {error}") from None
    return jobs


def _trace_job(row: dict[str, Any], number: int, path: Path, templates: dict[str, JobTemplate],
               ranks_per_instance: int, teams: TraceNames) -> dict[str, Any]:
    """One job of a trace file's row (ValueError, TypeError or OverflowError if malformed)."""
    template = templates.get(str(row["template"]))
    if template is None:
        raise ValueError(f"unknown template {row['template']!r}; expected one of "
                         f"{', '.join(templates)}")

    def value(key: str, row: dict = row) -> Any:
        item = row.get(key)
        if isinstance(item, str) and not item.strip():
            return None  # an empty cell (read as written, not as NaN)
        return None if item is None or (isinstance(item, float) and math.isnan(item)) else item

    def whole(key: str, low: int, high: int) -> int | None:
        """A count as written: 2.7 or true is not 2 or 1 (they were coerced)."""
        item = value(key)
        if item is None:
            return None
        if isinstance(item, bool) or type(item).__name__ == "bool_":
            raise ValueError(f"column {key} {item!r}: expected a whole number, not a boolean")
        if isinstance(item, str):
            text = item.strip()
            if not text.lstrip("+-").isdigit() or not text.isascii():
                raise ValueError(f"column {key} {item!r}: expected a whole number")
            item = int(text)
        number = float(item)
        if not math.isfinite(number) or number != math.floor(number):
            raise ValueError(f"column {key} {item!r}: expected a whole number")
        if not low <= number <= high:
            raise ValueError(f"column {key} {item!r}: expected {low:,} to {high:,}")
        return int(item)

    if value("instances") is None:
        raise ValueError("instances is empty; expected a whole number of instances")
    run_for = value("run_for")
    steps = whole("steps", 1, limits.MAX_STEPS)
    priority = whole("priority", -limits.MAX_PRIORITY, limits.MAX_PRIORITY)
    instances = whole("instances", 1, limits.MAX_INSTANCES)
    try:
        submit = units.parse_duration(row["submit"])
    except (TypeError, ValueError, units.UnitError) as error:
        raise ValueError(f"column submit: {error}") from None
    if run_for is not None and units.parse_duration(run_for) < limits.MIN_TRACE_RUN_S:
        raise ValueError(f"column run_for {run_for!r}: expected at least "  # (1e-9s: 0 steps)
                         f"{limits.MIN_TRACE_RUN_S:g} s (docs/limits.md)")
    job = _job(
        template, instances, ranks_per_instance,
        str(value("name") or f"{template.name}-trace-{number:04d}"),
        submit,
        units.parse_duration(run_for) if run_for is not None else (
            float(template.run_for.median_s) if template.run_for else None),
        steps if steps is not None else template.steps, priority)
    if value("team") is not None:
        job["team"] = teams(str(value("team")))
    return job
