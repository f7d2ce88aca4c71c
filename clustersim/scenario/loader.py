"""Loading a scenario: the YAML format of docs/scenario.md into an immutable, validated Scenario.

`load_scenario(path, overrides)` reads a file, applies `--set PATH=VALUE` overrides, resolves
catalog names (hardware, model presets), validates every field and the rules that tie them
together (tp x pp x dp equals the job's ranks, heads divisible by tp, ...), and returns a
:class:`Scenario`. Every problem found is reported together in one :class:`ScenarioError`
whose lines name the file, the key path, the offending value and what was expected.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from clustersim.hardware import limits, units
from clustersim.hardware.catalog import catalog_names, deep_merge, resolve_hardware_mapping
from clustersim.hardware.failures import StragglerSpec
from clustersim.hardware.topology import FabricSpec
from clustersim.scenario.errors import Issue, ScenarioCheckError, ScenarioError, WorkloadError
from clustersim.scenario.jobmix import WorkloadSpec, generate_jobs
from clustersim.scenario.messages import collapse_generated, pydantic_issues
from clustersim.scenario.models import (
    TRACE_LEVELS,
    CheckpointSpec,
    ClusterSpec,
    FailuresSpec,
    JobSpec,
    Scenario,
    SchedulerSpec,
    TraceSpec,
)
from clustersim.scenario.reading import (
    OverrideError,
    apply_override,
    parse_override,
    read_yaml_file,
)
from clustersim.scenario.schema import scenario_json_schema
from clustersim.scenario.serving import resolve_serve_models
from clustersim.scenario.traces import TraceTarget
from clustersim.training.transformer import (
    TransformerShape,
    model_preset_names,
    model_preset_values,
)
from clustersim.training.workload import ParallelismSpec

# The names this module has always offered (the specs, errors, reading and schema now live in
# their own modules beside it).
__all__ = [
    "TRACE_LEVELS",
    "Issue",
    "ScenarioError",
    "Scenario",
    "ClusterSpec",
    "FabricSpec",
    "JobSpec",
    "ParallelismSpec",
    "CheckpointSpec",
    "FailuresSpec",
    "SchedulerSpec",
    "StragglerSpec",
    "TraceSpec",
    "load_scenario",
    "scenario_from_dict",
    "apply_override",
    "input_files",
    "with_seed",
    "parse_override",
    "read_yaml_file",
    "scenario_json_schema",
]


def _resolve_catalog_names(raw: dict[str, Any]) -> tuple[dict[str, Any], list[Issue]]:
    """Expand `hardware` and job `model` names (and `base:` mappings) into full mappings."""
    resolved = copy.deepcopy(raw)
    issues: list[Issue] = []
    hardware = resolved.get("hardware")
    if isinstance(hardware, str) or isinstance(hardware, Mapping):
        try:
            resolved["hardware"] = resolve_hardware_mapping(hardware)
        except KeyError:
            where = "hardware" if isinstance(hardware, str) else "hardware.base"
            name = hardware if isinstance(hardware, str) else hardware.get("base")
            issues.append(Issue(
                where, f"unknown hardware; expected one of {', '.join(catalog_names())}",
                name, True,
            ))
    jobs = resolved.get("jobs")
    if isinstance(jobs, list):
        for index, job in enumerate(jobs):
            if isinstance(job, Mapping):
                issues += _resolve_model(job, "model", f"jobs.{index}.model")
    issues += resolve_serve_models(resolved, _resolve_model)
    return resolved, issues


def _resolve_model(holder: dict[str, Any], key: str, where: str) -> list[Issue]:
    """Expand a model preset name (or a `base:` mapping) at holder[key] into its shape."""
    model = holder.get(key)
    base = model if isinstance(model, str) else (
        model.get("base") if isinstance(model, Mapping) else None
    )
    if key in holder and not isinstance(model, str | Mapping | TransformerShape):  # null, 3
        return [Issue(where, f"expected a model preset ({', '.join(model_preset_names())}) "
                      "or a mapping of the shape", model, True)]
    if base is None:
        return []
    where = where + ("" if isinstance(model, str) else ".base")
    try:
        values = model_preset_values(base) if isinstance(base, str) else None
    except KeyError:
        values = None
    if values is None:
        return [Issue(
            where, f"unknown model preset; expected one of "
            f"{', '.join(model_preset_names())}, or a mapping of the shape",
            base, True,
        )]
    if isinstance(model, Mapping):
        extra = {k: v for k, v in model.items() if k != "base"}
        if "window" in extra and extra["window"] is None:
            # `window: null` takes the preset's window away, and with it its kind and
            # global layers (which would otherwise be refused as needing a window)
            values = {k: v for k, v in values.items() if k not in ("window_kind",
                                                                     "global_every")}
        values = deep_merge(values, extra)
        if "name" not in extra:
            values["name"] = f"{base}+custom" if extra else base
    holder[key] = values
    return []


def _trace_target(resolved: dict[str, Any]) -> TraceTarget:
    """What a trace's mapping needs of the hardware and the cluster (None where the file
    does not say yet: its own validation reports that)."""
    hardware = resolved.get("hardware") or {}
    cluster = resolved.get("cluster") or {}
    chips = int(hardware["instance"]["chips"])
    tflops = (hardware.get("chip", {}).get("tflops") or {}).get("bf16")
    limit = _count(cluster.get("instances"))
    if cluster.get("instances") is None and cluster.get("ultraservers") is not None:
        per_us = _count((hardware.get("ultraserver") or {}).get("instances", 1))
        ultraservers = _count(cluster["ultraservers"])
        limit = per_us * ultraservers if per_us and ultraservers else None
    return TraceTarget(chips, float(tflops) if isinstance(tflops, int | float) else None, limit)


def _count(value: Any) -> int | None:
    """A cluster size as its validation will take it, or None when it is not one (its
    validation reports it): int() made ultraservers: nan a `workload` error, [1] a
    TypeError, 1.5 one UltraServer and -2 a bound of -8,192 GPUs."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def _horizon(value: Any) -> float | None:
    """The scenario's duration in seconds, or None when it is not one (its validation says)."""
    try:
        seconds = units.parse_duration(value)
    except (TypeError, ValueError, units.UnitError):
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def _seed(value: Any) -> int | None:
    """The scenario's seed as the job mix draws with it (absent: 0), or None when it is not
    one (NaN, text, a list, negative, past MAX_SEED): `int()` of those raised under the key
    `workload` (or a TypeError, exit 1) where the seed's validation names `seed`."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        value = int(value) if value.is_integer() else None
    elif isinstance(value, str):
        value = int(value) if value.strip().isdigit() and value.isascii() else None
    if not isinstance(value, int) or not 0 <= value <= limits.MAX_SEED:
        return None
    return value


def _expand_workload(raw: dict[str, Any], resolved: dict[str, Any], source: str,
                     base_dir: Path | None) -> None:
    """Append the jobs of a `workload:` section (templates x arrivals, trace file)."""
    spec = resolved.get("workload")
    if not spec:
        return
    try:
        workload = WorkloadSpec.model_validate(spec)
    except ValidationError as error:
        issues = [Issue(f"workload.{i.path}" if i.path else "workload", i.message, i.value,
                        i.has_value) for i in pydantic_issues(error, WorkloadSpec)]
        raise ScenarioError(source, issues) from None
    hardware = resolved.get("hardware")
    try:
        ranks = int(hardware["chip"].get("ranks", 1)) * int(hardware["instance"]["chips"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return  # the hardware's own errors are reported by validation
    seed = workload.seed if workload.seed is not None else _seed(raw.get("seed"))
    if seed is None:
        return  # the seed's own validation reports it (it was refused as `workload`)
    origins: list = []
    trace_rows: dict[str, Any] = {}
    try:
        generated = generate_jobs(workload, seed, ranks, base_dir,
                                  _trace_target(resolved), origins, trace_rows,
                                  _horizon(resolved.get("duration")))
    except WorkloadError as error:  # a file, a trace or their mapping: under its own key
        raise ScenarioError(source, [Issue(error.key, error.detail)]) from None
    except ValueError as error:
        raise ScenarioError(source, [Issue("workload", str(error))]) from None
    jobs = resolved.get("jobs") or []
    resolved["_generated_from"] = len(jobs)
    resolved["_generated_origins"] = origins
    resolved["_trace_rows"] = trace_rows or None
    issues = _share_template_specs(generated, len(jobs))
    if issues:
        raise ScenarioError(source, collapse_generated(issues, len(jobs), origins))
    resolved["jobs"] = list(jobs) + generated


def _share_template_specs(generated: list[dict[str, Any]], first: int) -> list[Issue]:
    """Resolve the generated jobs' model names, and validate once the parts they share.

    Generated jobs are fresh mappings whose nested ones are their template's (never
    changed), so their model names are resolved in place, not on a deep copy of every job.
    The model, the checkpoint and the parallelism (one per size) are the same for many jobs:
    each distinct one is validated once and the jobs are given the validated spec, which
    the scenario's validation takes as it is (validating 100,000 copies was most of a
    100,000-job mix's load time). One that does not validate is left as written, so its
    errors are reported for each job as before."""
    issues: list[Issue] = []
    # id of a template's model or checkpoint entry -> (the entry, kept so its id stays its
    # own; its spec, or None); the parallelism as a key -> its spec, or None
    models: dict[int, tuple[Any, Any]] = {}
    checkpoints: dict[int, tuple[Any, Any]] = {}
    parallelisms: dict[tuple, Any] = {}
    for index, job in enumerate(generated, start=first):
        if not isinstance(job, Mapping):
            continue
        model = job.get("model")
        if id(model) not in models:
            holder = {"model": model}
            models[id(model)] = (model, None if _resolve_model(holder, "model", "model")
                                 else _validated(TransformerShape, holder["model"]))
        shape = models[id(model)][1]
        if shape is None:  # not resolved, or not valid: as before, job by job
            issues += _resolve_model(job, "model", f"jobs.{index}.model")
        else:
            job["model"] = shape
        checkpoint = job.get("checkpoint")
        if isinstance(checkpoint, Mapping):
            if id(checkpoint) not in checkpoints:
                checkpoints[id(checkpoint)] = (checkpoint, _validated(CheckpointSpec, checkpoint))
            spec = checkpoints[id(checkpoint)][1]
            if spec is not None:
                job["checkpoint"] = spec
        parallelism = job.get("parallelism")
        if isinstance(parallelism, Mapping):
            # (each value's type in the key: `tp: true` is not `tp: 1`)
            try:
                key = tuple(sorted((str(k), type(v).__name__, v)
                                   for k, v in parallelism.items()))
                known = key in parallelisms
            except TypeError:  # unhashable or unorderable: validated with its job
                continue
            if not known:
                parallelisms[key] = _validated(ParallelismSpec, parallelism)
            if parallelisms[key] is not None:
                job["parallelism"] = parallelisms[key]
    return issues


def _validated(spec: type, values: Any) -> Any:
    """`spec` validated from `values`, or None if they are not valid."""
    try:
        return spec.model_validate(values)
    except ValidationError:
        return None


def scenario_from_dict(
    raw: Any, source: str = "<scenario>", overrides: Sequence[str] = (),
    base_dir: Path | None = None, planning: bool = False,
) -> Scenario:
    """Validate a raw scenario mapping (as read from YAML), after applying overrides."""
    if not isinstance(raw, dict):
        raise ScenarioError(
            source, [Issue("", "expected a mapping of scenario keys (name, hardware, cluster, ...)",
                           raw, True)]
        )
    raw = copy.deepcopy(raw)
    for text in overrides:
        try:
            path, value = parse_override(text)
            apply_override(raw, path, value)
        except OverrideError as error:
            where = error.path or text.partition("=")[0].strip()
            raise ScenarioError(source, [Issue(where, f"--set {text!r}: {error}")]) from None
    for section in ("jobs", "serve", "failures", "trace"):  # `jobs:` with nothing after it: absent
        if section in raw and raw[section] is None:
            del raw[section]
    resolved, issues = _resolve_catalog_names(raw)
    cluster = resolved.get("cluster")
    cluster_given = not (cluster is None or (isinstance(cluster, Mapping) and not (
        {"instances", "ultraservers", "sites"} & set(cluster))))
    if planning and not cluster_given and isinstance(resolved.get("hardware"), Mapping):
        # `plan --chips` gives the sizes: a stand-in size of one instance (UltraServer), the
        # rest of `cluster:` (spares as a share, the fabric) as written.
        whole = resolved["hardware"].get("ultraserver") is not None
        resolved["cluster"] = {**(cluster or {}), "ultraservers" if whole else "instances": 1}
    if not issues:
        _expand_workload(raw, resolved, source, base_dir)
    generated_from = resolved.pop("_generated_from", None)
    origins = resolved.pop("_generated_origins", None)
    trace_rows = resolved.pop("_trace_rows", None)
    failed_roots = {issue.path.removesuffix(".base") for issue in issues}
    try:
        scenario = Scenario.model_validate(resolved, context={"planning": planning})
    except ValidationError as error:
        issues += [
            i for i in pydantic_issues(error)
            if not any(i.path == r or i.path.startswith(r + ".") for r in failed_roots)
        ]
        raise ScenarioError(source, collapse_generated(issues, generated_from,
                                                        origins)) from None
    except ScenarioCheckError as error:
        raise ScenarioError(source, collapse_generated(issues + error.issues,
                                                        generated_from, origins)) from None
    if issues:
        raise ScenarioError(source, issues)
    _share_fields_sets(scenario.jobs)
    scenario._source_yaml = yaml.safe_dump(_inputs_absolute(raw, base_dir), sort_keys=False)
    scenario._source = source
    scenario._cluster_given = cluster_given
    scenario._trace_rows = trace_rows
    return scenario


def _share_fields_sets(jobs: Sequence[Any]) -> None:
    """Jobs that were given the same keys share one set of them (pydantic's
    `model_fields_set`, which a frozen spec never changes; a copy takes its own): a set of
    11 names is 0.7 KiB, 0.7 GiB of a year's million generated jobs."""
    shared: dict[frozenset, set] = {}
    for job in jobs:
        names = job.__pydantic_fields_set__
        one = shared.setdefault(frozenset(names), names)
        if one is not names:
            object.__setattr__(job, "__pydantic_fields_set__", one)


def with_seed(scenario: Scenario, seed: int | None) -> Scenario:
    """The scenario as a run with `seed` in place of its own (`run --seed`) runs it: its
    effective YAML (OUT/scenario.yaml, the traces' metadata) says `seed: SEED`, and a
    workload's job mix, drawn with the file's seed, keeps it as `workload.seed`, so the
    effective scenario run again gives the same outputs."""
    if seed is None or seed == scenario.seed:
        return scenario
    raw = yaml.safe_load(scenario.source_yaml) if scenario.source_yaml else None
    update: dict[str, Any] = {"seed": seed}
    if scenario.workload is not None and scenario.workload.seed is None:
        update["workload"] = scenario.workload.model_copy(update={"seed": scenario.seed})
        if isinstance(raw, dict) and isinstance(raw.get("workload"), dict):
            raw["workload"]["seed"] = scenario.seed
    seeded = scenario.model_copy(update=update)
    if isinstance(raw, dict):
        if "seed" not in raw:  # after the name, where scenario files give it
            at = list(raw).index("name") + 1 if "name" in raw else 0
            items = list(raw.items())
            raw = dict(items[:at] + [("seed", seed)] + items[at:])
        raw["seed"] = seed
        seeded._source_yaml = yaml.safe_dump(raw, sort_keys=False)
    return seeded


def load_scenario(path: str | Path, overrides: Sequence[str] = (), planning: bool = False
                  ) -> Scenario:
    """Read, override, resolve and validate a scenario file (`planning`: the first job's
    parallelism may be omitted, for `clustersim plan` to choose)."""
    path = Path(path)
    raw = read_yaml_file(path)
    if (isinstance(raw, dict) and "scenario" in raw and "name" not in raw
            and {"grid", "variants", "seeds", "replications"} & raw.keys()):
        raise ScenarioError(str(path), [Issue(
            "", "a sweep file (a scenario and its grid, variants or seeds), not a scenario: run it with "
            "`clustersim sweep FILE` (docs/cli.md#sweep)")])
    return scenario_from_dict(raw, str(path), overrides, base_dir=path.parent,
                              planning=planning)


def _inputs_absolute(raw: dict, base_dir: Path | None) -> dict:
    """`raw` with the files it names (a workload's job file or trace, a deployment's request
    trace) absolute: the effective scenario written beside a run (OUT/scenario.yaml) then
    runs again from there, whose folder holds no copy of them."""
    if base_dir is None:
        return raw
    raw = copy.deepcopy(raw)
    holders = [raw.get("workload")] + [d.get("workload") for d in raw.get("serve") or []
                                       if isinstance(d, dict)]
    for holder in holders:
        for key in ("file", "trace"):
            value = holder.get(key) if isinstance(holder, dict) else None
            if isinstance(value, str) and value and not Path(value).is_absolute():
                holder[key] = str((base_dir / value).resolve())
    return raw


def input_files(scenario: Scenario) -> list[Path]:
    """The files a run of `scenario` reads: the scenario file and the traces it names
    (relative to its folder). An output folder holding one of them is refused."""
    source = Path(scenario.source)
    if not source.is_file():
        return []
    files = [source]
    named = []
    if scenario.workload is not None:
        named += [scenario.workload.file, scenario.workload.trace]
    named += [getattr(d.workload, "trace", None) for d in scenario.serve]
    for text in named:
        if text:
            path = Path(text)
            files.append(path if path.is_absolute() else source.parent / path)
    workload = scenario.workload
    if workload is not None and workload.format == "pai" and workload.trace:
        # PAI's task table, read beside its job table (or in the folder `trace` names)
        table = Path(workload.trace)
        table = table if table.is_absolute() else source.parent / table
        files.append(table / "pai_task_table.csv" if table.is_dir() else
                     table.with_name(table.name.replace("job_table", "task_table")))
    return files
