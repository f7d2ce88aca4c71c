"""Session 17's hardening fixes (helper fix17b2): the run table of replications gives the
±95% interval of every figure that varies between them; the sweep's table keeps teams',
fleet-day and serving sections; the report's fleet plots keep censored waits apart; the
fluid level's capacity per replica does not depend on fluid.curve_requests."""

from __future__ import annotations

import json
import re

from cli_helpers import invoke, write

# A two-site fleet of 20 jobs whose replications differ (harden17b's st.yaml, smaller).
FLEET = {
    "name": "st", "seed": 4, "duration": "2d", "hardware": "trn2",
    "cluster": {"fabric": {"instances_per_leaf": 8},
                "sites": [{"name": "east", "instances": 8},
                          {"name": "west", "instances": 8, "spares": 0}],
                "inter_site": {"links": [{"sites": ["east", "west"], "bandwidth": "800Gbps",
                                          "latency": "5ms"}]}},
    "scheduler": {"policy": "backfill", "preemption": True},
    "workload": {"arrivals": {"rate": "20/d", "count": 20}, "templates": [{
        "name": "small", "instances": {"min": 2, "max": 12},
        "run_for": {"median": "4h", "sigma": 1.0},
        "job": {"model": "llama3-8b", "seq_len": 4096,
                "parallelism": {"tp": 8, "pp": 1, "zero": 1}, "recompute": "selective",
                "checkpoint": {"interval": "auto", "write": "30s", "restore": "2min"}}}]},
    "failures": {"preset": "llama3", "site_events": [
        {"kind": "power", "rate": "1/1d", "share": 0.5, "duration": "3h"},
        {"kind": "partition", "rate": "1/12h", "duration": "1h"}]},
}


def _flat(text: str) -> str:
    """The run table's text as one line: box borders and wrapping removed."""
    return re.sub(r"\s+", " ", re.sub(r"[│┌┐└┘├┤┬┴┼─]", " ", text))


def test_the_run_table_of_replications_gives_the_interval_of_figures_that_vary(tmp_path):
    """4 replications: 15.25 ± 0.80 jobs done, queue wait ± 640 s, fragmentation ± 0.075 in
    summary.json were printed "15 done; queue wait mean 3.9 h; fragmentation 47%" under a
    caption saying a figure without ± is the same in every replication."""
    out = tmp_path / "out"
    result = invoke("run", write(tmp_path, FLEET), "-o", out, "--replications", "4")
    assert result.exit_code == 0, result.output
    text = _flat(result.output)
    cluster = json.loads((out / "summary.json").read_text())["cluster"]
    statuses = cluster["jobs_by_status"]
    for status, count in statuses.items():
        if status.endswith("_ci95") or not statuses.get(f"{status}_ci95"):
            continue
        ci = statuses[f"{status}_ci95"]
        assert f"{count:,.2f}".rstrip("0").rstrip(".") + " ± " + \
            f"{ci:,.2f}".rstrip("0").rstrip(".") + f" {status}" in text, (status, text)
    wait, wait_ci = cluster["mean_queue_wait_s"], cluster["mean_queue_wait_s_ci95"]
    assert wait_ci > 0 and f"queue wait mean {wait / 3600:,.1f} ± {wait_ci / 3600:,.1f} h" in text
    frag, frag_ci = cluster["fragmentation"], cluster["fragmentation_ci95"]
    assert frag_ci > 0 and f"fragmentation {frag:.0%} ± {frag_ci:.0%}" in text
    assert "(each job's mean over replications)" in text

