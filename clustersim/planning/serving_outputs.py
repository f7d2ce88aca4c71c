"""The serving planner's outputs: plan.parquet, plan.json, the Pareto plot and the planned scenario."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from clustersim.planning.serving_plan import ServingPlanResult, _deployment_index

__all__ = [
    "plot_serving_pareto",
    "serving_plan_scenario",
    "write_serving_plan",
]


def serving_plan_scenario(result: ServingPlanResult, hardware: str | None = None
                          ) -> dict[str, Any]:
    """The best configuration (of `hardware`, default overall) as a raw scenario `run` takes."""
    row = result.best if hardware is None else result.best_per_hardware()[hardware]
    mapping = copy.deepcopy(result.best_scenarios[row["hardware"]])
    mapping["name"] = f"{result.scenario.name}-planned"[:128]
    ep = f" x ep {row['ep']}" if "ep" in row else ""  # a mixture's expert parallelism
    figures = (f"Planned by clustersim plan: {row['replicas']} replica(s) of tp {row['tp']} x "
               f"pp {row['pp']}{ep} on {row['instances']} {row['hardware']} instance(s), max_batch "
               f"{row['max_batch']}, at {result.load_rate_per_s:g} requests/s: TTFT p99 "
               f"{row['ttft_p99_s']:.3g} s, TPOT p99 {row['tpot_p99_s']:.3g} s, "
               f"{row['slo_goodput']:.1%} within the SLO")
    if row["cost_per_million_output_tokens_usd"] is not None:
        figures += f", ${row['cost_per_million_output_tokens_usd']:.2f} per million output tokens"
    mapping["description"] = figures + "."
    return mapping


def write_serving_plan(result: ServingPlanResult, folder: Path) -> None:
    """plan.parquet (every candidate), plan.json and pareto.png into `folder`."""
    import json

    import pyarrow as pa

    from clustersim.planning.outputs import write_plan_files

    table = pa.Table.from_pandas(result.rows, preserve_index=False)
    meta = {b"clustersim.scenario": result.scenario.source_yaml.encode(),
            b"clustersim.plan": json.dumps(result.as_json()).encode()}
    write_plan_files(table, meta, result.as_json(), folder)
    plot_serving_pareto(result, folder / "pareto.png")


def plot_serving_pareto(result: ServingPlanResult, path: Path) -> Path:
    """Cost per million output tokens at the load against p99 TTFT and p99 TPOT, every
    simulated candidate that holds the load, the SLO bounds dashed, the best circled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from clustersim.planning.outputs import pareto_front, usd_formatter

    d = result.scenario.serve[_deployment_index(result.scenario, result.deployment)]
    rows = [r for r in result.ranked if r["cost_per_million_output_tokens_usd"] is not None]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    names = list(dict.fromkeys(r["hardware"] for r in rows))
    for ax, key, bound, label in ((axes[0], "ttft_p99_s", d.slo.ttft_s, "TTFT p99 (s)"),
                                  (axes[1], "tpot_p99_s", d.slo.tpot_s, "TPOT p99 (s)")):
        for index, name in enumerate(names):
            mine = [r for r in rows if r["hardware"] == name]
            ax.scatter([r["cost_per_million_output_tokens_usd"] for r in mine],
                       [r[key] for r in mine], s=22, color=f"C{index}", alpha=0.7, label=name)
        if rows:
            points = [(r["cost_per_million_output_tokens_usd"], r[key]) for r in rows]
            front = pareto_front(points)
            ax.plot([points[i][0] for i in front], [points[i][1] for i in front], "k-", lw=1,
                    label="Pareto front")
            best = result.best
            if best["cost_per_million_output_tokens_usd"] is not None:
                ax.scatter([best["cost_per_million_output_tokens_usd"]], [best[key]], s=130,
                           facecolors="none", edgecolors="red", linewidths=1.5, label="best")
            for i in front:
                r = rows[i]
                ep = f" ep{r['ep']}" if "ep" in r else ""
                ax.annotate(f"{r['hardware']} tp{r['tp']} pp{r['pp']}{ep} x{r['replicas']}",
                            points[i], fontsize=7, xytext=(4, 4), textcoords="offset points")
        ax.axhline(bound, color="grey", linestyle="--", linewidth=1, label=f"SLO {bound:g} s")
        ax.set_xlabel("cost per million output tokens at the load")
        ax.xaxis.set_major_formatter(usd_formatter())
        ax.set_ylabel(label)
        # The SLO line inside the axes with room above it (autoscaling put it on the frame
        # when the slowest candidate sat near the bound).
        ax.set_ylim(0, 1.12 * max([bound] + [r[key] for r in rows if r[key] is not None]))
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"serving plan: {d.name} ({d.model.name}) at {result.load_rate_per_s:g} "
                 f"requests/s: the {len(rows):,} simulated configurations that hold it\n(of "
                 f"{result.considered:,} considered, {result.pruned:,} pruned)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
