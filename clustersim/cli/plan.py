"""`clustersim plan`: the best parallelism, size and hardware for a scenario's first job,
failures included. A thin shell over `clustersim.planning.plan`; it parses the flags, picks
the engine and writes OUT through the runner's atomic output folders."""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from clustersim.cli.common import (
    JsonOption,
    ScenarioArg,
    SetOption,
    UsageProblem,
    err_console,
    goodput_share,
    user_errors,
)
from clustersim.cli.plan_tables import _print_plan, _print_serving_plan

_DECIMAL = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_count(text: str, what: str, binary: bool = False) -> float:
    """`15T` (decimal prefixes; `binary` for batch sizes: 16M = 16 x 2^20) -> a number."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGBTP]?)\s*(tokens?)?\s*",
                         text, flags=re.IGNORECASE)
    prefixes = _BINARY if binary else _DECIMAL
    if match is None or match.group(2).upper() not in prefixes:
        raise UsageProblem(f"{what} {text!r}: expected a count such as "
                           f"{'2048 (sequences) or 16M (tokens)' if binary else '15T'}")
    value = float(match.group(1)) * prefixes[match.group(2).upper()]
    if not math.isfinite(value) or value <= 0:
        raise UsageProblem(f"{what} {text!r}: expected a positive, finite count")
    return value


def parse_chips(text: str) -> tuple[int, ...]:
    """`4096`, `1024,2048,4096`, `1024:16384` (doubling from A to B, B included) or
    `1024:4096:512` (A to B by S). Every count at most limits.MAX_CHIPS and at most
    limits.MAX_PLAN_SIZES of them, checked before any list is made."""
    from clustersim.hardware import limits

    usage = (f"--chips {text!r}: expected N, A,B,C, LOW:HIGH (doubling) or LOW:HIGH:STEP with positive "
             "whole numbers")
    if len(text) > 10_000:
        raise UsageProblem(usage)
    try:
        parts = [int(p) for p in text.split(":" if ":" in text else ",")]
    except ValueError:
        raise UsageProblem(usage) from None
    if not parts or min(parts) <= 0 or (":" in text and (len(parts) not in (2, 3)
                                                        or parts[0] > parts[1])):
        raise UsageProblem(usage)
    largest = parts[1] if ":" in text else max(parts)
    if largest > limits.MAX_CHIPS:
        raise UsageProblem(f"--chips {text!r}: {largest:,} chips; expected at most "
                           f"{limits.MAX_CHIPS:,} (docs/limits.md)")
    if ":" in text:
        first, last = parts[0], parts[1]
        if len(parts) == 3:
            count = (last - first) // parts[2] + 1
        else:
            count = (last // first).bit_length() + 1
    else:
        count = len(set(parts))
    if count > limits.MAX_PLAN_SIZES:
        raise UsageProblem(f"--chips {text!r}: {count:,} sizes; expected at most "
                           f"{limits.MAX_PLAN_SIZES} (docs/limits.md)")
    if ":" not in text:
        return tuple(sorted(set(parts)))
    if len(parts) == 3:
        return tuple(range(first, last + 1, parts[2]))
    out, chips = [], first
    while chips < last:
        out.append(chips)
        chips *= 2
    return tuple(out + [last])


def default_plan_dir(name: str) -> Path:
    """results/plan-NAME/, without doubling a scenario's own `plan-` prefix
    (plan-trn2-vs-p5en plans into results/plan-trn2-vs-p5en/)."""
    return Path("results") / f"plan-{name.removeprefix('plan-')}"


def _duration(text: str | None, what: str) -> float | None:
    if text is None:
        return None
    from clustersim.hardware.units import UnitError, parse_duration

    try:  # a bare number was taken as seconds: `--deadline 40` most likely meant days
        float(text)
    except ValueError:
        pass
    else:
        raise UsageProblem(f"{what} {text!r}: a number without a unit; expected a duration "
                           f"with its unit, e.g. {text.strip()}d (days), {text.strip()}h or "
                           f"{text.strip()}s")
    try:
        value = parse_duration(text)
    except UnitError as error:
        raise UsageProblem(f"{what} {text!r}: {error}") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageProblem(f"{what} {text!r}: expected a positive duration such as 60d")
    return value


@user_errors
def plan(
    scenario: ScenarioArg,
    hardware: Annotated[str | None, typer.Option(
        help="Hardware to compare, comma-separated catalog names [default: the scenario's].")
    ] = None,
    chips: Annotated[str | None, typer.Option(
        # LOW:HIGH, not A:B: the help is rich markup, where `:B:` is an emoji code
        help="Chip counts: N, A,B,C, LOW:HIGH (doubling) or LOW:HIGH:STEP [default: the "
        "scenario's].")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model preset instead of the job's.")] = None,
    global_batch: Annotated[str | None, typer.Option(
        help="Global batch: sequences (2048) or tokens (16M, binary prefixes).")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Sequence length.", min=1)] = None,
    objective: Annotated[str, typer.Option(
        help="step, cost, energy or time-to-train.")] = "step",
    tokens: Annotated[str | None, typer.Option(help="Token budget to train, e.g. 15T.")] = None,
    deadline: Annotated[str | None, typer.Option(
        help="Train the tokens by then, with a unit: 60d, 12h.")] = None,
    budget: Annotated[float | None, typer.Option(help="Most USD to spend on the tokens.")
                      ] = None,
    max_chips: Annotated[int | None, typer.Option(help="Largest size to consider.", min=1)
                         ] = None,
    memory_headroom: Annotated[float | None, typer.Option(
        help="Fraction of HBM kept free for the runtime and fragmentation [default: 0.10, "
        "catalog/planning.yaml].", min=0.0, max=0.9)] = None,
    top: Annotated[int, typer.Option(help="Candidates to show and print.", min=1)] = 10,
    engine: Annotated[str, typer.Option(help="local or ray.")] = "local",
    workers: Annotated[int | None, typer.Option(help="Processes (at most the cores).",
                                                show_default="cores", min=1)
                       ] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster address.")] = None,
    out: Annotated[Path | None, typer.Option(
        "-o", "--out", help="Output directory [default: results/plan-NAME/].")] = None,
    write_scenario: Annotated[Path | None, typer.Option(
        help="Write the best candidate as a scenario file.")] = None,
    overrides: SetOption = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty OUT / the file.")
                     ] = False,
    json_out: JsonOption = False,
    serve: Annotated[str | None, typer.Option(
        "--serve", help="Plan this serving deployment instead of the first job [default: the "
        "first deployment of a scenario without jobs].")] = None,
    goodput: Annotated[float, typer.Option(
        help="Serving: share of requests that must meet the SLO.",
        callback=goodput_share)] = 0.99,
) -> None:
    """Search parallelism, size and hardware for the first job (failure-aware time and cost),
    or for a serving deployment (replica shape, batch limit and replicas at its load and SLO,
    by cost per million output tokens)."""
    from clustersim.planning import PlanOptions
    from clustersim.planning.outputs import write_scenario as write_best
    from clustersim.scenario.loader import load_scenario

    sets = list(overrides or [])
    _check_engine(engine, address)
    # Serving or training is the scenario's (and --set's) to say, before the training flags
    # become jobs.0 keys a serving scenario does not have.
    if serve is not None or _serving_only(scenario, sets):
        given = {"--chips": chips, "--model": model, "--global-batch": global_batch,
                 "--seq-len": seq_len, "--tokens": tokens, "--deadline": deadline,
                 "--budget": budget, "--max-chips": max_chips}
        training_only = [k for k, v in given.items() if v is not None]
        if objective != "step":
            training_only.append("--objective")
        if training_only:
            raise UsageProblem(f"{', '.join(training_only)}: training options; a serving plan "
                               "takes --hardware, --serve, --goodput, --top, --engine, "
                               "--workers, --address, -o, --write-scenario, --set and --json")
        _plan_serving(scenario, sets, hardware, serve, goodput, top, out, write_scenario, force,
                      json_out, (engine, workers, address))
        return
    if model is not None:
        sets.append(f"jobs.0.model={model}")
    if seq_len is not None:
        sets.append(f"jobs.0.seq_len={seq_len}")
    if global_batch is not None:
        if re.fullmatch(r"\s*[0-9]+\s*", global_batch):
            sets.append(f"jobs.0.global_batch={int(global_batch)}")
        else:
            spec = load_scenario(scenario, sets, planning=True)
            length = spec.jobs[0].sequence_length if spec.jobs else 1
            batch_tokens = parse_count(global_batch, "--global-batch", binary=True)
            if batch_tokens % length:
                raise UsageProblem(f"--global-batch {global_batch!r}: {batch_tokens:,.0f} tokens "
                                   f"is not a whole number of sequences of {length}")
            sets.append(f"jobs.0.global_batch={int(batch_tokens // length)}")
    spec = load_scenario(scenario, sets, planning=True)
    options = PlanOptions(
        hardware=_hardware_list(hardware),
        chips=parse_chips(chips) if chips else (), objective=objective,
        tokens=parse_count(tokens, "--tokens") if tokens else None,
        deadline_s=_duration(deadline, "--deadline"), budget_usd=budget, max_chips=max_chips,
        top=top, **({} if memory_headroom is None else {"memory_headroom": memory_headroom}),
    )
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise UsageProblem(f"--budget {budget}: expected a positive amount of USD")
    out_dir = out if out is not None else default_plan_dir(spec.name)
    with _scenario_file(write_scenario, out_dir, force, spec) as (temporary, commit):
        also = None if temporary is None else (lambda r: (write_best(r, temporary), commit()))
        result = _plan_into(spec, options, engine, workers, address, out_dir, force, scenario,
                            also)
    if json_out:
        print(json.dumps(result.as_json(), indent=2))
        return
    _print_plan(result, out_dir, write_scenario)


@contextlib.contextmanager
def _scenario_file(write_scenario: Path | None, out_dir: Path, force: bool,
                   spec: Any = None) -> Iterator[Any]:
    """Check OUT (never holding the scenario or its traces, even with --force) and
    --write-scenario before any work (as `run` checks OUT) and hold the file's lock; yields
    (temporary, commit), or (None, None) without --write-scenario."""
    from clustersim.runner.outputs import (
        OutputDirError,
        atomic_output_file,
        check_output_dir,
        check_output_file,
    )
    from clustersim.scenario.loader import input_files

    resolved_out = check_output_dir(out_dir, force,
                                    inputs=input_files(spec) if spec is not None else ())
    if write_scenario is None:
        yield None, None
        return
    try:
        target = check_output_file(write_scenario, force, "the planned scenario")
    except OutputDirError as error:
        raise UsageProblem(f"--write-scenario {error}") from None
    if target == resolved_out or resolved_out in target.parents:
        raise UsageProblem(f"--write-scenario {write_scenario}: is -o {out_dir} or inside it; "
                           "expected a file elsewhere, e.g. scenarios/NAME.yaml")
    with atomic_output_file(write_scenario, force, "the planned scenario") as pair:
        yield pair


def _plan_into(spec: Any, options: Any, engine: str, workers: int | None, address: str | None,
               out_dir: Path, force: bool, scenario: Path, also: Any = None) -> Any:
    """Search, then write OUT (and, through `also`, the planned scenario) as one step: `also`
    runs last inside OUT's staging, so a failure of either leaves neither."""
    from clustersim.planning import Engine, PlanError
    from clustersim.planning import plan as make_plan
    from clustersim.planning.outputs import write_plan
    from clustersim.runner.outputs import atomic_output_dir

    try:
        with Engine(engine, workers, address) as runner, _progress() as progress:
            result = make_plan(spec, options, runner, progress)
    except PlanError as error:
        raise UsageProblem(f"{scenario}: {error}") from None
    with atomic_output_dir(out_dir, force=force) as staging:
        write_plan(result, staging)
        if also is not None:
            also(result)
    return result


class _progress:
    """Simulations done against those that may be needed, on stderr, only on a terminal."""

    def __enter__(self) -> Any:
        if not err_console.is_terminal:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self._bar = Progress("plan: {task.description}", BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), console=err_console, transient=True)
        self._bar.start()
        self._task = self._bar.add_task("starting", total=None)

        def update(done: int, total: int, what: str = "simulating candidates") -> None:
            self._bar.update(self._task, completed=done, total=total, description=what)

        return update

    def __exit__(self, *exc: Any) -> None:
        if getattr(self, "_bar", None) is not None:
            self._bar.stop()


def _check_engine(engine: str, address: str | None) -> None:
    """--engine and --address, before any work (both planners take them)."""
    if engine not in ("local", "ray"):
        raise UsageProblem(f"--engine {engine!r}: expected local or ray")
    if address is not None and engine != "ray":
        raise UsageProblem(f"--address {address!r}: a Ray cluster address, used only with "
                           "--engine ray")
    if engine == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise UsageProblem("--engine ray needs Ray: pip install -e '.[ray]'")


def _serving_only(scenario: Path, sets: list[str]) -> bool:
    """A scenario with deployments and no jobs is planned as serving."""
    from clustersim.scenario.loader import load_scenario

    spec = load_scenario(scenario, sets, planning=True)
    return bool(spec.serve) and not spec.jobs and spec.workload is None


def _hardware_list(hardware: str | None) -> tuple[str, ...]:
    """--hardware's entries in order, each once: `trn2,trn2` planned trn2 twice over."""
    names = [h.strip() for h in hardware.split(",")] if hardware is not None else []
    if hardware is not None and not all(names):
        raise UsageProblem(f"--hardware {hardware!r}: an empty entry; expected catalog names "
                           "separated by commas, such as trn2,p5en")
    return tuple(dict.fromkeys(names))


def _plan_serving(scenario: Path, sets: list[str], hardware: str | None, serve: str | None,
                  goodput: float, top: int, out: Path | None, write_scenario: Path | None,
                  force: bool, json_out: bool,
                  engine: tuple[str, int | None, str | None] = ("local", None, None)) -> None:
    """The serving planner (clustersim.planning.serving_plan): the cheapest configuration per
    hardware meeting the deployment's SLO at its load, its candidates searched on `engine`
    (kind, workers, address) as the training planner's are."""
    import yaml

    from clustersim.planning import Engine
    from clustersim.planning.serving_outputs import serving_plan_scenario, write_serving_plan
    from clustersim.planning.serving_plan import ServingPlanOptions, plan_serving
    from clustersim.planning.serving_space import ServingPlanError
    from clustersim.runner.api import simulate
    from clustersim.runner.outputs import atomic_output_dir
    from clustersim.scenario.loader import load_scenario

    spec = load_scenario(scenario, sets)
    out_dir = out if out is not None else default_plan_dir(spec.name)
    options = ServingPlanOptions(
        hardware=_hardware_list(hardware),
        deployment=serve, goodput=goodput, top=top)
    with _scenario_file(write_scenario, out_dir, force, spec) as (temporary, commit):
        try:
            with Engine(*engine) as runner, _progress() as progress:
                result = plan_serving(spec, options, Path(scenario).parent, simulate=simulate,
                                      progress=progress, engine=runner)
        except ServingPlanError as error:
            raise UsageProblem(f"{scenario}: {error}") from None
        with atomic_output_dir(out_dir, force=force) as staging:
            write_serving_plan(result, staging)
            if temporary is not None:  # last inside OUT's staging: both or neither
                text = yaml.safe_dump(serving_plan_scenario(result), sort_keys=False)
                temporary.write_text("# Written by `clustersim plan` (serving).\n" + text,
                                     encoding="utf-8")
                commit()
    if json_out:
        print(json.dumps(result.as_json(), indent=2))
        return
    _print_serving_plan(result, out_dir, write_scenario)


