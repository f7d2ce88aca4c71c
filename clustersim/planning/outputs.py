"""What a plan writes: `plan.parquet` (every candidate considered, and why each pruned one
is out), `plan.json` (the `--json` document plus the scaling limits), the Pareto plot (time
to train against cost) and, on request, the best candidate as a scenario `run` accepts.

Files are written into a folder the caller provides (the runner stages it and renames it
into place, so nothing is half-written).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

import clustersim
from clustersim.planning.planner import checkpoint_of
from clustersim.planning.plans import PlanResult
from clustersim.training.ranks import DEFAULT_ORDER

__all__ = ["write_plan", "plot_pareto", "best_scenario", "write_scenario", "pareto_front",
           "plan_summary"]


def plan_summary(result: PlanResult) -> dict[str, Any]:
    """The `--json` document and what it leaves out: scaling limits, notes, options."""
    out = result.as_json()
    out["stops_paying_chips"] = result.stops_paying
    out["notes"] = result.notes
    out["objective"] = result.options.objective
    out["tokens"] = result.options.tokens
    return out


def write_plan(result: PlanResult, folder: Path) -> None:
    """plan.parquet, plan.json and pareto.png into `folder`."""
    table = pa.Table.from_pandas(result.rows, preserve_index=False)
    metadata = dict(table.schema.metadata or {})
    metadata.update({
        b"clustersim.version": clustersim.__version__.encode(),
        b"clustersim.scenario": result.scenario.source_yaml.encode(),
        b"clustersim.plan": json.dumps(plan_summary(result), default=str).encode(),
    })
    write_plan_files(table, metadata, plan_summary(result), folder, json_default=str)
    plot_pareto(result, folder / "pareto.png")


def write_plan_files(table: pa.Table, metadata: dict[bytes, bytes], document: dict[str, Any],
                     folder: Path, json_default: Any = None) -> None:
    """What both planners write: plan.parquet (every candidate, with `metadata`) and
    plan.json (`document`)."""
    pq.write_table(table.replace_schema_metadata(metadata), folder / "plan.parquet")
    (folder / "plan.json").write_text(json.dumps(document, indent=2, default=json_default)
                                      + "\n", encoding="utf-8")


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (lower is better)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best_y = [], math.inf
    for i in order:
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return front


def _count(value: float) -> str:
    """`2e12` -> `2T`, `1.5e9` -> `1.5B`."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{_three_digits(value / scale)}{suffix}"
    return _three_digits(value)


def _three_digits(value: float) -> str:
    """3 significant digits written out, no trailing zeros (`,.3g` writes 1000 as `1e+03`)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    text = f"{round(value, digits):,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def usd_text(value: float) -> str:
    """Money as $ (under $10k), $k, $M, $B or $T, 3 significant digits, never `$1e+03M`."""
    if not math.isfinite(value):
        return f"${value}"
    rounded = float(f"{value:.3g}")  # the scale of what is shown: 999,999 is $1M, not $1,000k
    size = abs(rounded)
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e4, "k")):
        if size >= scale:
            return f"${_three_digits(rounded / (1e3 if suffix == 'k' else scale))}{suffix}"
    return f"${value:,.4g}" if abs(value) >= 1 or value == 0 else f"${value:.2g}"


def usd_formatter() -> Any:
    """Money on an axis as $ (under $10k), $k, $M, $B or $T, never with a `1e7` offset."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _: usd_text(value))


def plot_pareto(result: PlanResult, path: Path) -> Path:
    """Time to train (or wall time per million tokens) against cost, every simulated
    candidate, the Pareto front joined, the best circled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokens = result.options.tokens
    rows = [r for r in result.ranked if r.get("cost_usd") is not None]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    if not rows:
        ax.text(0.5, 0.5, "no prices in the catalog for these hardware entries: no cost axis",
                ha="center", va="center", transform=ax.transAxes)
    else:
        def time_of(r: dict[str, Any]) -> float:
            if tokens is not None:
                return r["time_to_train_s"] / 86400
            return 1e6 / (r["tokens_per_s"] * r["ettr"]) if r["ettr"] > 0 else math.inf

        names = list(dict.fromkeys(r["hardware"] for r in rows))
        for index, name in enumerate(names):
            mine = [r for r in rows if r["hardware"] == name]
            ax.scatter([r["cost_usd"] for r in mine], [time_of(r) for r in mine], s=18,
                       color=f"C{index}", alpha=0.6, label=name)
        points = [(r["cost_usd"], time_of(r)) for r in rows]
        front = pareto_front(points)
        ax.plot([points[i][0] for i in front], [points[i][1] for i in front], "k-", lw=1,
                label="Pareto front")
        best = result.best
        if best.get("cost_usd") is not None:
            ax.scatter([best["cost_usd"]], [time_of(best)], s=120, facecolors="none",
                       edgecolors="red", linewidths=1.5, label=f"best ({result.options.objective})")
        for i in front:
            r = rows[i]
            ax.annotate(f"{r['hardware']} {r['chips']:,} chips tp{r['tp']} pp{r['pp']}",
                        points[i], fontsize=7, xytext=(4, 4), textcoords="offset points")
        ax.legend(fontsize=8)
    what = f"{_count(tokens)} tokens" if tokens is not None else "one million tokens"
    ax.set_xlabel(f"cost of {what}, failures included")
    ax.xaxis.set_major_formatter(usd_formatter())
    ax.set_ylabel("time to train (days)" if tokens is not None
                  else "wall time per million tokens (s)")
    job = result.scenario.jobs[0]
    # Says what is drawn: every simulated candidate with a price (the pruned ones are in
    # plan.parquet with their reason).
    ax.set_title(f"plan: {job.model.name}: the {len(rows):,} simulated candidates with a price"
                 f"\n(of {result.considered:,} considered, {result.pruned:,} pruned)", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def best_scenario(result: PlanResult) -> dict[str, Any]:
    """The scenario, its first job set to the best candidate, as a raw mapping `run` takes:
    named `<name>-planned`; the cluster is the job's instances plus the scenario's spares;
    other jobs and any workload are left out (they were not planned); checkpointing is
    written out as assumed; with a token budget, the job's steps are set to it and the
    horizon made long enough."""
    best = result.best
    scenario = result.scenario
    raw = yaml.safe_load(scenario.source_yaml) if scenario.source_yaml else {}
    if best["hardware"] != scenario.hardware.name:
        raw["hardware"] = best["hardware"]
    instances = best["chips"] // _chips_per_instance(result, best["hardware"])
    cluster = dict(raw.get("cluster") or {})
    if cluster.get("sites") and best["hardware"] == scenario.hardware.name:
        # The sites stay as written (the plan's --chips are within them): `sites` replaces
        # instances, ultraservers and spares, which `run` refuses beside it.
        pass
    else:
        if cluster.pop("sites", None) is not None:
            # Another hardware's instances do not fill the sites' UltraServers: one site
            # of the job's size, and no site events without sites.
            cluster.pop("inter_site", None)
            failures = raw.get("failures")
            if isinstance(failures, dict):
                failures.pop("site_events", None)
        cluster.pop("ultraservers", None)
        cluster["instances"] = instances
        if not isinstance(cluster.get("spares"), str):  # a share stays a share
            group = next(g for g in result.groups if g.name == best["hardware"]
                         and g.chips == best["chips"])
            cluster["spares"] = group.key.instances - group.instances
    raw["cluster"] = cluster
    job = dict(raw["jobs"][0])
    job.update({
        "parallelism": {"tp": best["tp"], "cp": best["cp"], "pp": best["pp"], "dp": best["dp"],
                        "ep": best["ep"], "interleave": best["interleave"],
                        "zero": int(best["zero"]),
                        "sequence_parallel": bool(best["sequence_parallel"]),
                        **({"order": best["order"]} if best.get("order", DEFAULT_ORDER)
                           != DEFAULT_ORDER else {})},
        "micro_batch": best["micro_batch"], "recompute": best["recompute"],
        "instances": instances,
    })
    if float(job.get("routing_imbalance", 1.0)) > best["ep"]:  # what the plan costed, as
        job["routing_imbalance"] = float(best["ep"])  # run refuses a load above ep
    ck = checkpoint_of(scenario.jobs[0], scenario, instances)
    job["checkpoint"] = {"interval": "auto" if ck.interval_s == "auto" else ck.interval_s,
                         "write": ck.write_s, "restore": ck.restore_s, "async": ck.async_write}
    options = result.options
    if options.tokens is not None:
        tokens_per_step = scenario.jobs[0].global_batch * scenario.jobs[0].sequence_length
        job["steps"] = math.ceil(options.tokens / tokens_per_step)
        raw["duration"] = max(scenario.duration_s, math.ceil(1.5 * best["time_to_train_s"]))
    raw["jobs"] = [job]
    raw.pop("workload", None)
    raw["name"] = f"{scenario.name}-planned"[:128]  # runs into its own results folder
    # The planned job's own layout, not the planned-from scenario's description (which may
    # name the layout it replaced), as the serving planner writes its description.
    ep = f", EP {best['ep']}" if best["ep"] > 1 else ""
    raw["description"] = (
        f"Planned by clustersim plan ({options.objective}) from {scenario.name}: "
        f"TP {best['tp']}, CP {best['cp']}, PP {best['pp']}, DP {best['dp']:,}{ep}, "
        f"ZeRO-{best['zero']}, micro-batch {best['micro_batch']}, recompute "
        f"{best['recompute']}: step {best['step_time_s']:.4g} s, ETTR {best['ettr']:.3f}.")
    return raw


def _chips_per_instance(result: PlanResult, name: str) -> int:
    return next(g.hw.chips_per_instance for g in result.groups if g.name == name)


def write_scenario(result: PlanResult, path: Path) -> Path:
    """Write the best candidate as a scenario file (see `best_scenario`)."""
    text = yaml.safe_dump(best_scenario(result), sort_keys=False)
    path.write_text("# Written by `clustersim plan`.\n" + text, encoding="utf-8")
    return path
