"""The run table's rows for serving deployments and fleet days (clustersim run), and the
small formatters the job rows share with them."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _on_stack(d: dict[str, Any]) -> str:
    """The deployment's serving stack (its hardware's default unless the scenario chose one)."""
    return f" on {d['stack']}" if d.get("stack") else ""


def _level_rows(table: Table, d: dict[str, Any]) -> None:
    """Which level simulated the deployment and why; a warning outside its checked range."""
    if "fidelity" not in d:
        return
    table.add_row("", f"{d['fidelity']} level: {escape(d['fidelity_reason'])}")
    if d.get("fidelity_checked") is False:
        table.add_row("", "[bold]warning[/bold]: the fluid level's latency and SLO figures "
                      "are outside the range it was checked on (docs/fleet-day.md)")


def _mixture_row(table: Table, d: dict[str, Any]) -> None:
    """A warning for a mixture whose stack and hardware have no fitted MoE time."""
    if d.get("mixture_overheads_fitted") is False:
        table.add_row("", "[bold]warning[/bold]: no mixture row is fitted for this stack and "
                      "hardware: its MoE layers cost their reads, FLOPs and all-to-all only, "
                      "fast at small batches (docs/calibration.md, \"A mixture on a stack "
                      "without a mixture fit\")")


def _stackless_row(table: Table, d: dict[str, Any]) -> None:
    """A warning for hardware no serving stack is fitted on (Trn3, A100): its serving
    constants are another family's, assumed."""
    if "stack" in d and d["stack"] is None:
        table.add_row("", "[bold]warning[/bold]: no serving stack is fitted on this hardware "
                      "and no serving row of it is in the calibration: its serving constants "
                      "are another family's, assumed (docs/calibration.md, \"Per hardware "
                      "family\")")


def _port_row(table: Table, d: dict[str, Any]) -> None:
    """A warning for a model run on a stack that is another model's port (a contrib
    model's own script, fitted on that model)."""
    from clustersim.hardware.stacks import stack_named
    stack = stack_named(d["stack"]) if d.get("stack") else None
    if stack is not None and stack.ports and d["model"] not in stack.ports:
        table.add_row("", f"[bold]warning[/bold]: {stack.name} is the script of NxD "
                      f"Inference's contrib ports of {', '.join(stack.ports)}, fitted on "
                      f"them: {escape(d['model'])} runs there with their host time, not "
                      "NxD Inference's own (stack nxd-inference)")


def _held_rows(table: Table, name: str, d: dict[str, Any]) -> None:
    """A fluid deployment the event-driven fleet held beside its jobs."""
    table.add_row(f"serve {escape(name)}", f"{d['model']}{_on_stack(d)}, tp {d['tp']} x pp "
                  f"{d['pp']}{_over('ep', d, True)}: {d['replicas_min']:,}-{d['replicas_max']:,} replicas "
                  f"({d['replica_shortfall_hours']:,.0f} replica-hours short of its plan), "
                  f"peak {d['peak_load_per_s']:,.1f}/s, SLO goodput "
                  f"{_percent(d['slo_goodput'])}, {d['chip_hours']:,.0f} chip-hours")
    _level_rows(table, d)
    _stackless_row(table, d)
    _mixture_row(table, d)
    _port_row(table, d)


def _deployment_rows(table: Table, summary: dict[str, Any]) -> None:
    from clustersim.hardware.units import format_latencies
    for name, d in summary.get("deployments", {}).items():
        if "level" in d:
            _held_rows(table, name, d)
            continue
        table.add_row(f"serve {escape(name)}",
                      f"{d['model']}{_on_stack(d)}: {_plural(d['replicas'], 'replica')} of tp "
                      f"{d['tp']} x pp {d['pp']}{_over('ep', d, True)} on "
                      f"{_plural(d['instances'], 'instance')}")
        if d.get("disaggregated"):
            pools = d["disaggregated"]
            table.add_row("", f"disaggregated: a prefill pool of "
                          f"{_plural(pools['prefill_replicas'], 'replica')} and a decode pool "
                          f"of {_plural(pools['decode_replicas'], 'replica')}; a prompt's KV "
                          f"cache moves to the decode pool in "
                          f"{pools['kv_transfer_s_per_1k_tokens'] * 1e3:,.3g} ms per 1,024 tokens")
        _level_rows(table, d)
        _stackless_row(table, d)
        _mixture_row(table, d)
        _port_row(table, d)
        if d.get("requests") or d["requests_completed"]:  # none completed is an answer
            table.add_row("", f"{d['requests_completed']:,} requests, {d['requests_per_s']:,.2f}"
                          f"/s, {d['output_tokens_per_s']:,.0f} output tokens/s within the "
                          f"horizon; SLO goodput {d['slo_goodput']:.1%}")
        if d.get("saturated"):
            table.add_row("", f"[bold]saturated[/bold]: the queue grew over the horizon "
                          f"({d['requests_outstanding_at_end']:,} requests outstanding at its "
                          "end); the throughput above is what the deployment sustains")
        if d.get("requests_drained"):
            table.add_row("", f"{d['requests_drained']:,} more finished while draining, "
                          f"{d['drain_s']:,.3g} s after the horizon (not in the rates)")
        lost = [f"{d[key]:,} {what}" for key, what in (
            ("requests_unfinished", "still running when the drain stopped (one more horizon)"),
            ("requests_rejected", "rejected (prompt and output larger than a replica's KV "
             f"cache, {d.get('kv_capacity_tokens_per_replica') or 0:,} tokens)")) if d.get(key)]
        if lost:
            table.add_row("", "; ".join(lost) + ": in no latency, counted as missing the SLO")
        if d["ttft_p50_s"] is not None:  # any request completed, inside the horizon or after
            table.add_row("", f"{format_latencies('TTFT', d['ttft_p50_s'], d['ttft_p99_s'])}; "
                          + format_latencies("TPOT", d["tpot_p50_s"], d["tpot_p99_s"]))
        if d["cost_per_million_output_tokens_usd"] is not None:
            table.add_row("", f"${d['cost_per_million_output_tokens_usd']:,.2f} per million "
                          f"output tokens")


def _money(value: float | None, unit: str) -> str:
    return "no price" if value is None else f"${value:,.3g} {unit}"


def _fleet_day_rows(table: Table, summary: dict[str, Any]) -> None:
    """A fleet-day run (docs/fleet-day.md): chip-hours by state, deployments, jobs."""
    from clustersim.hardware.units import format_latencies
    day = summary["fleet_day"]
    hours = day["chip_hours"]
    total = max(day["chip_hours_total"], 1e-9)
    table.add_row("chip-hours", ", ".join(f"{k} {v:,.0f} ({v / total:.1%})"
                                          for k, v in hours.items()))
    serving = _money(day["serving_cost_per_million_output_tokens_usd"], "per M output tokens")
    training = _money(day["training_cost_per_million_tokens_usd"], "per M tokens")
    table.add_row("cost", f"serving {serving}, training {training}")
    table.add_row("peak load", f"{day['peak_load_per_s']:,.0f} requests/s over the deployments")
    for name, d in summary["deployments"].items():
        table.add_row(f"serve {escape(name)}", f"{d['model']}{_on_stack(d)}, tp {d['tp']} x pp "
                      f"{d['pp']}{_over('ep', d, True)}: "
                      f"{d['replicas_min']:,}-{d['replicas_max']:,} replicas, peak "
                      f"{d['peak_load_per_s']:,.1f}/s, SLO goodput "
                      f"{_percent(d['slo_goodput'])}")
        _level_rows(table, d)
        _stackless_row(table, d)
        _mixture_row(table, d)
        table.add_row("", f"{format_latencies('TTFT', d['ttft_p50_s'], d['ttft_p99_s'])}; "
                      + format_latencies("TPOT", d["tpot_p50_s"], d["tpot_p99_s"]))
    for name, job in summary["jobs"].items():
        table.add_row(f"job {escape(name)}", f"{job['status']}: {job['tokens_trained']:,.3g} "
                      f"tokens, ETTR {job['ettr']:.1%}, {job['preemptions']} preemptions, "
                      f"{job['interruptions']} failures, lost {job['lost_work_s'] / 3600:,.1f} h")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"  # None: no requests (not 0.0%)


def _over(degree: str, figures: dict[str, Any], aside: bool = False) -> str:
    """" x cp 2" or " (ep 8)" where the degree is above 1 (an older summary has none)."""
    value = figures.get(degree, 1)
    if value == 1:
        return ""
    return f" ({degree} {value})" if aside else f" x {degree} {value}"
