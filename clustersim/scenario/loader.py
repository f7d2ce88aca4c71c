"""Scenario files: the YAML format of CONTRACT.md as immutable pydantic specs, validated once.

`load_scenario(path, overrides)` reads a file, applies `--set PATH=VALUE` overrides, resolves
catalog names (hardware, model presets), validates every field and the rules that tie them
together (tp x pp x dp equals the job's ranks, heads divisible by tp, ...), and returns a
:class:`Scenario`. Every problem found is reported together in one :class:`ScenarioError`
whose lines name the file, the key path, the offending value and what was expected.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from clustersim.hardware import units
from clustersim.hardware.catalog import (
    HardwareSpec,
    catalog_names,
    deep_merge,
    resolve_hardware_mapping,
)
from clustersim.hardware.failures import FailureRateSpec, StragglerSpec, failure_preset_names
from clustersim.hardware.spec import Duration, NonNegativeDuration, Spec
from clustersim.hardware.topology import FabricSpec
from clustersim.scenario.jobmix import WorkloadSpec, generate_jobs
from clustersim.training.transformer import TransformerShape, model_preset_names, model_preset_values
from clustersim.training.workload import ParallelismSpec

__all__ = [
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
    "parse_override",
    "scenario_json_schema",
]

TRACE_LEVELS = ("cluster", "job", "ultraserver", "instance")


# ---------------------------------------------------------------------------------------------
# Errors


@dataclass(frozen=True)
class Issue:
    """One problem: where (key path), what was there (value) and what was expected."""

    path: str
    message: str
    value: Any = None
    has_value: bool = False
    line: int | None = None

    def render(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line else source
        shown = f" = {_short_repr(self.value)}" if self.has_value else ""
        if self.path:
            return f"{where}: {self.path}{shown}: {self.message}"
        if self.has_value:
            return f"{where}: {self.message}, got {_short_repr(self.value)}"
        return f"{where}: {self.message}"


class ScenarioError(Exception):
    """A scenario that cannot be used, with every issue found."""

    def __init__(self, source: str, issues: Sequence[Issue]):
        self.source = source
        self.issues = list(issues)
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(issue.render(self.source) for issue in self.issues)


class ScenarioCheckError(Exception):
    """Raised inside validation for cross-field problems; carries exact key paths.

    Not a ValueError on purpose: pydantic passes it through instead of folding it into one
    root-level message, and the loader turns it into a ScenarioError.
    """

    def __init__(self, issues: Sequence[Issue]):
        self.issues = list(issues)
        super().__init__("; ".join(f"{i.path}: {i.message}" for i in self.issues))


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value) if isinstance(value, str) else yaml.safe_dump(
        value, default_flow_style=True, width=10_000, sort_keys=False
    ).strip().removesuffix("...").strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _path_text(loc: Iterable[Any]) -> str:
    return ".".join(str(part) for part in loc)


# ---------------------------------------------------------------------------------------------
# Specs


class ClusterSpec(Spec):
    """How many instances (or UltraServers) the cluster has, its hot spares and fabric."""

    instances: int | None = Field(default=None, gt=0)
    ultraservers: int | None = Field(default=None, gt=0)
    spares: int = Field(default=0, ge=0, description="hot-spare instances, beyond the rest")
    fabric: FabricSpec = FabricSpec()

    @model_validator(mode="after")
    def _one_size(self) -> ClusterSpec:
        if (self.instances is None) == (self.ultraservers is None):
            raise ValueError("give exactly one of instances or ultraservers")
        return self


class CheckpointSpec(Spec):
    interval_s: Duration | Literal["auto"] = Field(
        default="auto", alias="interval", description="time between checkpoints, or auto (Daly)"
    )
    write_s: NonNegativeDuration = Field(default=60.0, alias="write")
    restore_s: NonNegativeDuration = Field(default=300.0, alias="restore")
    async_write: bool = Field(default=False, alias="async")

    @model_validator(mode="after")
    def _check(self) -> CheckpointSpec:
        if self.interval_s == "auto" and self.write_s <= 0:
            # Young/Daly's interval is sqrt(2 x write x MTBF): zero with a free write.
            raise ValueError("interval auto needs a write time above zero (with a free write "
                             "the Daly interval is zero); give the interval")
        return self


class JobSpec(Spec):
    name: str = Field(min_length=1)
    model: TransformerShape
    seq_len: int | None = Field(default=None, gt=0, description="defaults to the model's")
    global_batch: int = Field(gt=0, description="sequences per step")
    micro_batch: int = Field(default=1, gt=0)
    parallelism: ParallelismSpec = ParallelismSpec()
    precision: Literal["bf16", "fp16", "fp8", "tf32", "fp32"] = "bf16"
    recompute: Literal["none", "selective", "full"] = "none"
    instances: int | None = Field(default=None, gt=0)
    submit_s: NonNegativeDuration = Field(default=0.0, alias="submit")
    steps: int | None = Field(default=None, gt=0, description="default: run to the horizon")
    run_for_s: Duration | None = Field(
        default=None, alias="run_for", description="ends after this long since it started"
    )
    deadline_s: Duration | None = Field(
        default=None, alias="deadline", description="stopped this long after submission"
    )
    priority: int = Field(default=0, description="higher runs first (priority, backfill)")
    checkpoint: CheckpointSpec | None = None

    @property
    def ranks(self) -> int:
        return self.parallelism.ranks

    @property
    def sequence_length(self) -> int:
        return self.seq_len if self.seq_len is not None else self.model.seq_len


class FailuresSpec(Spec):
    preset: str = "none"
    scale: float = Field(default=1.0, ge=0, description="multiplies every rate")
    rates: list[FailureRateSpec] = Field(default_factory=list)
    detect_s: NonNegativeDuration = Field(default=120.0, alias="detect")
    repair_s: NonNegativeDuration | Literal["never"] = Field(
        default=4 * 3600.0, alias="repair", description="time to repair an instance, or never"
    )
    restart_s: NonNegativeDuration = Field(default=600.0, alias="restart")

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        if value not in failure_preset_names():
            raise ValueError(
                f"unknown failure preset; expected one of {', '.join(failure_preset_names())}"
            )
        return value


class SchedulerSpec(Spec):
    """How queued jobs start: fifo, priority or backfill (EASY); preemption of lower
    priorities by a job that does not fit."""

    policy: Literal["fifo", "priority", "backfill"] = "fifo"
    preemption: bool = False


class TraceSpec(Spec):
    enabled: bool = True
    bin_s: Duration = Field(default=60.0, alias="bin", description="utilisation time bin")
    levels: list[Literal["cluster", "job", "ultraserver", "instance"]] = Field(
        default_factory=lambda: ["cluster", "job"]
    )


class Scenario(Spec):
    """A whole scenario, validated; see CONTRACT.md for the file format."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=128)
    description: str = ""
    seed: int = Field(default=0, ge=0)
    duration_s: Duration = Field(default=30 * 86400.0, alias="duration")
    hardware: HardwareSpec
    cluster: ClusterSpec
    jobs: list[JobSpec] = Field(default_factory=list)
    failures: FailuresSpec = FailuresSpec()
    scheduler: SchedulerSpec = SchedulerSpec()
    workload: WorkloadSpec | None = None
    stragglers: StragglerSpec = StragglerSpec()
    trace: TraceSpec = TraceSpec()

    _source_yaml: str = PrivateAttr(default="")
    _source: str = PrivateAttr(default="<scenario>")

    @model_validator(mode="after")
    def _check_together(self, info: ValidationInfo) -> Scenario:
        planning = bool(info.context and info.context.get("planning"))
        issues = list(_cross_checks(self, planning))
        if issues:
            raise ScenarioCheckError(issues)
        return self

    # Derived figures.
    @property
    def working_instances(self) -> int:
        """Instances available to jobs (not counting hot spares)."""
        if self.cluster.instances is not None:
            return self.cluster.instances
        assert self.cluster.ultraservers is not None
        return self.cluster.ultraservers * self.hardware.instances_per_ultraserver

    @property
    def total_instances(self) -> int:
        return self.working_instances + self.cluster.spares

    @property
    def total_chips(self) -> int:
        return self.total_instances * self.hardware.chips_per_instance

    def job_instances(self, job: JobSpec) -> int:
        """Instances a job holds: as written, or its ranks over ranks per instance."""
        if job.instances is not None:
            return job.instances
        return job.ranks // self.hardware.ranks_per_instance

    @property
    def source(self) -> str:
        """Where the scenario came from (its file), for error messages."""
        return self._source

    @property
    def source_yaml(self) -> str:
        """The effective scenario (file plus overrides) as YAML, for trace metadata."""
        return self._source_yaml


def _cross_checks(s: Scenario, planning: bool = False) -> Iterable[Issue]:
    hw = s.hardware
    per_us = hw.instances_per_ultraserver
    if s.cluster.ultraservers is not None and hw.ultraserver is None:
        yield Issue(
            "cluster.ultraservers", f"hardware {hw.name} has no UltraServer; give instances",
            s.cluster.ultraservers, True,
        )
    if hw.ultraserver is not None:
        if s.cluster.instances is not None and s.cluster.instances % per_us:
            yield Issue(
                "cluster.instances",
                f"{hw.name} instances come in UltraServers of {per_us}; expected a multiple "
                f"of {per_us} (or give ultraservers)",
                s.cluster.instances, True,
            )
        if s.cluster.spares % per_us:
            yield Issue(
                "cluster.spares",
                f"spares of {hw.name} are whole UltraServers; expected a multiple of {per_us}",
                s.cluster.spares, True,
            )
    per_leaf = s.cluster.fabric.instances_per_leaf
    if per_leaf is not None and per_leaf % per_us:
        yield Issue(
            "cluster.fabric.instances_per_leaf",
            f"a leaf holds whole UltraServers; expected a multiple of {per_us}",
            per_leaf, True,
        )
    if s.trace.bin_s > s.duration_s:
        yield Issue("trace.bin", f"longer than the scenario's duration "
                    f"({units.format_duration(s.duration_s)})",
                    units.format_duration(s.trace.bin_s), True)

    seen: set[str] = set()
    rpi = hw.ranks_per_instance
    for index, job in enumerate(s.jobs):
        at = f"jobs.{index}"
        par = job.parallelism
        if job.name in seen:
            yield Issue(f"{at}.name", "job names must be unique", job.name, True)
        seen.add(job.name)
        if "parallelism" not in job.model_fields_set:
            # `clustersim plan` chooses the first job's parallelism; a run needs it written.
            if not (planning and index == 0):
                yield Issue(f"{at}.parallelism", "required key is missing: give {tp, pp, dp} "
                            "or let `clustersim plan SCENARIO --write-scenario FILE` choose it")
            continue
        shown = f"tp {par.tp} x pp {par.pp} x dp {par.dp} = {par.ranks} ranks"
        if job.instances is not None:
            if par.ranks != job.instances * rpi:
                yield Issue(
                    f"{at}.parallelism",
                    f"{shown}; expected {job.instances * rpi} = {job.instances} instances x "
                    f"{rpi} ranks per {hw.instance.name}",
                    {"tp": par.tp, "pp": par.pp, "dp": par.dp}, True,
                )
        elif par.ranks % rpi:
            yield Issue(
                f"{at}.parallelism",
                f"{shown} is not a whole number of {hw.instance.name} instances "
                f"({rpi} ranks each); expected a multiple of {rpi}",
                {"tp": par.tp, "pp": par.pp, "dp": par.dp}, True,
            )
        instances = s.job_instances(job)
        if instances > s.working_instances:
            written = job.instances is not None
            yield Issue(
                f"{at}.instances" if written else f"{at}.parallelism",
                f"the job needs {instances} instances but the cluster has "
                f"{s.working_instances} (plus {s.cluster.spares} spares)",
                instances if written else {"tp": par.tp, "pp": par.pp, "dp": par.dp}, True,
            )
        model = job.model
        if model.heads % par.tp:
            yield Issue(
                f"{at}.parallelism.tp",
                f"the model's {model.heads} attention heads are not divisible by tp",
                par.tp, True,
            )
        kv = model.n_kv_heads
        if kv % par.tp and par.tp % kv:
            yield Issue(
                f"{at}.parallelism.tp",
                f"kv_heads {kv} and tp must divide one another (KV heads are split or "
                f"replicated across tp)",
                par.tp, True,
            )
        if par.ep > 1 and not model.moe:
            yield Issue(f"{at}.parallelism.ep",
                        f"expert parallelism needs a mixture-of-experts model; {model.name} "
                        f"is dense (experts: 1)", par.ep, True)
        elif par.ep > 1 and (par.dp % par.ep or model.experts % par.ep):
            yield Issue(f"{at}.parallelism.ep",
                        f"ep must divide both dp ({par.dp}) and the model's {model.experts} "
                        f"experts", par.ep, True)
        stages = par.pp * par.interleave
        if model.layers % stages:
            yield Issue(
                f"{at}.parallelism",
                f"the model's {model.layers} layers do not split into pp x interleave = "
                f"{stages} equal stages",
                {"pp": par.pp, "interleave": par.interleave}, True,
            )
        if par.interleave > 1 and par.pp == 1:
            yield Issue(
                f"{at}.parallelism.interleave",
                "interleaved schedules need pp greater than 1", par.interleave, True,
            )
        microbatches = job.global_batch // (job.micro_batch * par.dp)
        if par.interleave > 1 and microbatches % par.pp:
            yield Issue(
                f"{at}.parallelism.interleave",
                f"the interleaved schedule needs the {microbatches} micro-batches per step "
                f"(global_batch / (micro_batch x dp)) to be a multiple of pp = {par.pp}",
                par.interleave, True,
            )
        if job.global_batch % (job.micro_batch * par.dp):
            yield Issue(
                f"{at}.global_batch",
                f"not divisible by micro_batch x dp = {job.micro_batch} x {par.dp}",
                job.global_batch, True,
            )
        if job.precision not in hw.chip.tflops:
            yield Issue(
                f"{at}.precision",
                f"{hw.chip.name} has no {job.precision} figure; expected one of "
                f"{', '.join(hw.chip.tflops)}",
                job.precision, True,
            )
        if job.submit_s >= s.duration_s:
            yield Issue(f"{at}.submit", f"at or after the end of the scenario "
                        f"({units.format_duration(s.duration_s)})",
                        units.format_duration(job.submit_s), True)


# ---------------------------------------------------------------------------------------------
# Loading


class OverrideError(ValueError):
    """A `--set` that cannot be applied; `path` is the key path it reached."""

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(message)


def parse_override(text: str) -> tuple[str, Any]:
    """`jobs.0.checkpoint.interval=30min` -> ("jobs.0.checkpoint.interval", "30min").

    The value is read as YAML, so `2` is a number, `[a, b]` a list and `null` clears a key.
    """
    path, sep, value_text = text.partition("=")
    if not sep or not path.strip():
        raise OverrideError("", "expected PATH=VALUE, e.g. jobs.0.checkpoint.interval=30min")
    try:
        value = yaml.safe_load(value_text) if value_text.strip() else ""
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or str(error)
        raise OverrideError(path.strip(), f"cannot read the value as YAML: {problem}") from None
    return path.strip(), value


def apply_override(raw: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path (list indices as numbers) in a raw scenario mapping, in place.

    A catalog name met on the way (`hardware: trn2`, `model: llama3-8b`) becomes `{base: name}`
    so that `--set hardware.chip.hbm=64GiB` derives from it.
    """
    parts = path.split(".")
    node: Any = raw
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        here = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            if not re.fullmatch(r"\d+", part) or int(part) >= len(node):
                raise OverrideError(
                    here, f"no list item {part!r}; the list has {len(node)} (indices from 0)"
                )
            key: Any = int(part)
        elif isinstance(node, dict):
            key = part
        else:
            raise OverrideError(
                ".".join(parts[:depth]), f"is the value {_short_repr(node)}, not a mapping or list"
            )
        if last:
            node[key] = value
            return
        child = node[key] if (isinstance(node, list) or key in node) else None
        if isinstance(child, str) and part in ("hardware", "model"):
            child = {"base": child}
        elif child is None:
            child = {}
        node[key] = child
        node = child


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
            if not isinstance(job, Mapping):
                continue
            model = job.get("model")
            base = model if isinstance(model, str) else (
                model.get("base") if isinstance(model, Mapping) else None
            )
            if base is None:
                continue
            where = f"jobs.{index}.model" + ("" if isinstance(model, str) else ".base")
            try:
                values = model_preset_values(base) if isinstance(base, str) else None
            except KeyError:
                values = None
            if values is None:
                issues.append(Issue(
                    where, f"unknown model preset; expected one of "
                    f"{', '.join(model_preset_names())}, or a mapping of the shape",
                    base, True,
                ))
                continue
            if isinstance(model, Mapping):
                extra = {k: v for k, v in model.items() if k != "base"}
                values = deep_merge(values, extra)
                if "name" not in extra:
                    values["name"] = f"{base}+custom" if extra else base
            job["model"] = values
    return resolved, issues


def _allowed_keys(model: type[Spec], loc: Sequence[Any]) -> list[str] | None:
    """Keys the spec at `loc` (a path of field aliases and list indices) accepts."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, Spec)):
            return None
        field = next(
            (f for name, f in current.model_fields.items() if (f.alias or name) == part), None
        )
        if field is None:
            return None
        current = _spec_in(field.annotation)
    if isinstance(current, type) and issubclass(current, Spec):
        return [f.alias or name for name, f in current.model_fields.items()]
    return None


def _spec_in(annotation: Any) -> Any:
    """The Spec class inside an annotation such as `list[JobSpec]` or `CheckpointSpec | None`."""
    if isinstance(annotation, type) and issubclass(annotation, Spec):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _spec_in(arg)
        if found is not None:
            return found
    return None


_MESSAGES = {
    "missing": "required key is missing",
    "int_type": "expected a whole number",
    "int_parsing": "expected a whole number",
    "int_from_float": "expected a whole number",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "tuple_type": "expected a list",
}


def _pydantic_issues(error: ValidationError) -> list[Issue]:
    issues = []
    for detail in error.errors(include_url=False):
        loc = [part for part in detail["loc"] if not _is_union_tag(part)]
        kind = detail["type"]
        value = detail.get("input")
        if kind == "extra_forbidden":
            allowed = _allowed_keys(Scenario, loc[:-1])
            hint = f"; expected one of {', '.join(allowed)}" if allowed else ""
            issues.append(Issue(_path_text(loc), f"unknown key{hint}"))
            continue
        if kind in _MESSAGES:
            message = _MESSAGES[kind]
        else:
            message = detail["msg"].removeprefix("Value error, ")
            message = message.replace("Input should be", "expected").replace(
                "String should match pattern", "expected letters, digits, '.', '_' or '-', "
                "matching"
            )
        if kind == "missing":
            issues.append(Issue(_path_text(loc), message))
        else:
            shown = not isinstance(value, Mapping)
            issues.append(Issue(_path_text(loc), message, value, shown))
    return _deduplicate(issues)


def _is_union_tag(part: Any) -> bool:
    """Pydantic names union members in error locations (`float`, `literal['auto']`)."""
    return isinstance(part, str) and (
        part in {"float", "int", "str", "function-after[positive(), float]"}
        or part.startswith(("literal[", "function-", "lax-", "constrained-"))
    )


def _deduplicate(issues: list[Issue]) -> list[Issue]:
    """One line per key path: the alternatives of a union are joined with 'or'."""
    merged: dict[str, Issue] = {}
    for issue in issues:
        earlier = merged.get(issue.path)
        if earlier is None:
            merged[issue.path] = issue
        elif issue.message not in earlier.message:
            merged[issue.path] = Issue(
                issue.path, f"{earlier.message}; or {issue.message}", earlier.value,
                earlier.has_value, earlier.line,
            )
    return list(merged.values())


def _collapse_generated(issues: list[Issue], first: int | None) -> list[Issue]:
    """One line per problem of the jobs a workload generated, with how many it hit."""
    if first is None:
        return issues
    out: list[Issue] = []
    seen: dict[tuple[str, str], list[int]] = {}
    for issue in issues:
        match = re.match(r"jobs\.(\d+)(.*)", issue.path)
        if match is None or int(match.group(1)) < first:
            out.append(issue)
            continue
        key = (match.group(2), issue.message)
        if key not in seen:
            seen[key] = []
            out.append(issue)
        seen[key].append(int(match.group(1)))
    for index, issue in enumerate(out):
        match = re.match(r"jobs\.(\d+)(.*)", issue.path)
        if match is None or int(match.group(1)) < first:
            continue
        hit = seen[(match.group(2), issue.message)]
        if len(hit) > 1:
            out[index] = Issue(issue.path, f"{issue.message} (and {len(hit) - 1} more jobs the "
                               f"workload generated)", issue.value, issue.has_value, issue.line)
    return out


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
                        i.has_value) for i in _pydantic_issues(error)]
        raise ScenarioError(source, issues) from None
    hardware = resolved.get("hardware")
    try:
        ranks = int(hardware["chip"].get("ranks", 1)) * int(hardware["instance"]["chips"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return  # the hardware's own errors are reported by validation
    try:
        generated = generate_jobs(workload, int(raw.get("seed", 0) or 0), ranks, base_dir)
    except ValueError as error:
        raise ScenarioError(source, [Issue("workload", str(error))]) from None
    jobs = resolved.get("jobs") or []
    resolved["_generated_from"] = len(jobs)
    resolved["jobs"] = list(jobs) + generated
    _, issues = _resolve_catalog_names({"jobs": resolved["jobs"]})
    if issues:
        raise ScenarioError(source, issues)
    resolved["jobs"] = _resolve_catalog_names({"jobs": resolved["jobs"]})[0]["jobs"]


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
    for section in ("jobs", "failures", "trace"):  # `jobs:` with nothing after it: absent
        if section in raw and raw[section] is None:
            del raw[section]
    resolved, issues = _resolve_catalog_names(raw)
    if not issues:
        _expand_workload(raw, resolved, source, base_dir)
    generated_from = resolved.pop("_generated_from", None)
    failed_roots = {issue.path.removesuffix(".base") for issue in issues}
    try:
        scenario = Scenario.model_validate(resolved, context={"planning": planning})
    except ValidationError as error:
        issues += [
            i for i in _pydantic_issues(error)
            if not any(i.path == r or i.path.startswith(r + ".") for r in failed_roots)
        ]
        raise ScenarioError(source, _collapse_generated(issues, generated_from)) from None
    except ScenarioCheckError as error:
        raise ScenarioError(source, _collapse_generated(issues + error.issues,
                                                        generated_from)) from None
    if issues:
        raise ScenarioError(source, issues)
    scenario._source_yaml = yaml.safe_dump(raw, sort_keys=False)
    scenario._source = source
    return scenario


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key written twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"the key {key!r} appears twice (first on line {seen[key] + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_scenario(path: str | Path, overrides: Sequence[str] = (), planning: bool = False
                  ) -> Scenario:
    """Read, override, resolve and validate a scenario file (`planning`: the first job's
    parallelism may be omitted, for `clustersim plan` to choose)."""
    path = Path(path)
    return scenario_from_dict(read_yaml_file(path), str(path), overrides, base_dir=path.parent,
                              planning=planning)


def read_yaml_file(path: Path) -> Any:
    """A YAML file's content; a missing or unreadable file, a directory, a syntax error or a
    key written twice is a ScenarioError naming the file (and line)."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(source, [Issue("", "no such file")]) from None
    except IsADirectoryError:
        raise ScenarioError(source, [Issue("", "is a directory, expected a YAML file")]) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ScenarioError(source, [Issue("", f"cannot read: {error}")]) from None
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        problem = getattr(error, "problem", None) or str(error)
        line = mark.line + 1 if mark is not None else None
        column = f", column {mark.column + 1}" if mark is not None else ""
        raise ScenarioError(
            source, [Issue("", f"YAML syntax error{column}: {problem}", line=line)]
        ) from None
    return raw


# ---------------------------------------------------------------------------------------------
# JSON Schema for editors


def scenario_json_schema() -> dict[str, Any]:
    """JSON Schema of scenario files, as users write them (catalog names or mappings)."""
    schema = Scenario.model_json_schema(by_alias=True)
    defs = schema.setdefault("$defs", {})
    properties = schema["properties"]
    # Users write a catalog name, or a partial mapping with `base:` (a full one without).
    hardware_mapping = _partial(defs, "HardwareSpec")
    hardware_mapping["properties"]["base"] = {"enum": catalog_names()}
    hardware_mapping["properties"].pop("sources", None)
    defs["HardwareMapping"] = hardware_mapping
    properties["hardware"] = {
        "anyOf": [{"enum": catalog_names()}, {"$ref": "#/$defs/HardwareMapping"}],
        "description": "a catalog name, or a mapping (with base: to derive from an entry)",
    }
    model_mapping = _partial(defs, "TransformerShape")
    model_mapping["properties"]["base"] = {"enum": model_preset_names()}
    defs["ModelMapping"] = model_mapping
    defs["JobSpec"]["properties"]["model"] = {
        "anyOf": [{"enum": model_preset_names()}, {"$ref": "#/$defs/ModelMapping"}],
        "description": "a model preset name, or a mapping of the shape",
    }
    defs["FailuresSpec"]["properties"]["preset"]["enum"] = failure_preset_names()
    schema["title"] = "clustersim scenario"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def _partial(defs: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of a definition with nothing required and every nested spec partial too."""
    partial = copy.deepcopy(defs[name])
    partial.pop("required", None)
    partial["title"] = f"{name} (partial)"
    for prop in partial.get("properties", {}).values():
        _point_to_partials(prop, defs)
    return partial


def _point_to_partials(node: Any, defs: dict[str, Any]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = ref.removeprefix("#/$defs/")
            partial_name = f"{target}Partial"
            if partial_name not in defs and target in defs:
                defs[partial_name] = {}
                defs[partial_name] = _partial(defs, target)
            node["$ref"] = f"#/$defs/{partial_name}"
        for value in node.values():
            _point_to_partials(value, defs)
    elif isinstance(node, list):
        for value in node:
            _point_to_partials(value, defs)
