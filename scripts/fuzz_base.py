"""The fuzz's mutation toolkit: the scenarios cases start from and how a case replaces,
deletes or adds keys (scripts/fuzz.py, fuzz_outputs.py and fuzz_fleet.py draw from it)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
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


def _dump(raw: Any) -> str:
    try:
        return yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)
    except (yaml.YAMLError, ValueError, OverflowError):
        return yaml.safe_dump({"name": "unrepresentable"})



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
