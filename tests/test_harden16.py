"""The 2026 model surfaces under adversarial use (session 16), found by trying them as a
demanding user would: a capacity factor past every token, disaggregated pools the
outputs did not show, a model on another model's port stack, a draft of another
tokenizer, and (beside, in
tests/test_harden14_serve.py and tests/test_mixture_fit_flag.py) MX activations on Trn3 and
the planner's note on hardware without a stack."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import invoke, refused, write


def _job(**keys: object) -> dict:
    return {"name": "q30", "model": "qwen3-30b-a3b", "global_batch": 1024, "seq_len": 4096,
            "parallelism": {"tp": 4, "pp": 4, "dp": 64, "ep": 16, "order": "tp-cp-ep-pp-dp",
                            "zero": 1}, **keys}


def _scenario(tmp_path: Path, job: dict) -> Path:
    return write(tmp_path, {"name": "h16", "duration": "1d", "hardware": "trn2",
                            "cluster": {"instances": 16}, "jobs": [job]})


@pytest.mark.parametrize("command", ["step", "validate"])
def test_a_capacity_factor_past_every_token_is_refused(tmp_path: Path, command: str) -> None:
    """capacity_factor 17 on Qwen3-30B-A3B (128 experts, top 8) was accepted and padded
    every expert to 17x its mean tokens, past the 16x that is every token (128.5 GiB a
    chip): an expert's capacity beyond every routed token is padding none fills."""
    result = invoke(command, _scenario(tmp_path, _job(capacity_factor=17)))
    refused(result, "jobs.0.capacity_factor = 17", "at most 16", "128 experts over top_k 8")


def test_a_capacity_factor_of_every_token_is_accepted(tmp_path: Path) -> None:
    result = invoke("validate", _scenario(tmp_path, _job(capacity_factor=16)))
    assert result.exit_code == 0, result.output


def _serving(tmp_path: Path, **deployment: object) -> Path:
    serve = {"name": "m", "model": "llama3.1-8b", "parallelism": {"tp": 4}, "replicas": 2,
             "workload": {"arrival": "poisson", "rate": "2/s", "input_tokens": 512,
                          "output_tokens": 32}, **deployment}
    return write(tmp_path, {"name": "h16s", "duration": "1min", "hardware": "trn2",
                            "cluster": {"instances": 1}, "serve": [serve]})


def test_disaggregated_pools_are_in_the_run_table_and_the_summary(tmp_path: Path) -> None:
    """Separate prefill and decode pools ran (their TPOT differed from one pool's) but
    neither the run table nor summary.json said so: '2 replicas of tp 64' either way."""
    import json

    out = tmp_path / "out"
    scenario = _serving(tmp_path, disaggregated={"prefill_replicas": 1, "decode_replicas": 1})
    result = invoke("run", scenario, "-o", out)
    assert result.exit_code == 0, result.output
    table = " ".join(result.output.replace("│", " ").split())
    assert "disaggregated: a prefill pool of 1 replica and a decode pool of 1 replica" in table
    pools = json.loads((out / "summary.json").read_text())["deployments"]["m"]["disaggregated"]
    assert pools["prefill_replicas"] == 1 and pools["decode_replicas"] == 1
    # over the instance's own chips: well under the prefill of the 1,024 tokens it moves
    assert 0 < pools["kv_transfer_s_per_1k_tokens"] < 0.1
    together = tmp_path / "together"
    result = invoke("run", _serving(tmp_path), "-o", together)
    assert result.exit_code == 0, result.output
    assert "prefill pool" not in " ".join(result.output.replace("│", " ").split())
    summary = json.loads((together / "summary.json").read_text())
    assert summary["deployments"]["m"]["disaggregated"] is None


def test_a_model_on_another_models_port_stack_is_warned(tmp_path: Path) -> None:
    """Llama 3.1 70B on nxd-inference-contrib (the DeepSeek-V3 port's script) ran with the
    port's 1.5 ms host time an iteration, its TPOT 30% under NxD Inference's, with no word."""
    scenario = _serving(tmp_path, model="llama3.1-70b", parallelism={"tp": 16}, replicas=1,
                        stack="nxd-inference-contrib")
    result = invoke("run", scenario, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    table = " ".join(result.output.replace("│", " ").split())
    assert "warning: nxd-inference-contrib is the script of NxD Inference's contrib ports" \
        in table
    ported = _serving(tmp_path, model="trinity-nano", stack="nxd-inference-contrib-vllm")
    result = invoke("run", ported, "-o", tmp_path / "ported")
    assert result.exit_code == 0, result.output
    assert "contrib ports" not in " ".join(result.output.replace("│", " ").split())


def test_a_draft_of_another_tokenizer_is_refused(tmp_path: Path) -> None:
    """A Qwen3-8B draft (151,936 tokens) for a Llama 3.1 70B target (128,256) was accepted:
    its proposals could never be the target's tokens."""
    spec = {"draft": "qwen3-8b", "tokens": 4}
    scenario = _serving(tmp_path, model="llama3.1-70b", parallelism={"tp": 16}, replicas=1,
                        speculative=spec)
    refused(invoke("validate", scenario), "serve.0.speculative.draft = 'qwen3-8b'",
            "151,936 tokens, the target's 128,256")
    same = _serving(tmp_path, model="llama3.1-70b", parallelism={"tp": 16}, replicas=1,
                    speculative={"draft": "llama3.2-1b", "tokens": 4})
    assert invoke("validate", same).exit_code == 0


# -- traces (helper harden16b)

_TEMPLATE = {"name": "research", "instances": [1],
             "job": {"model": "llama3-8b", "seq_len": 4096,
                     "parallelism": {"tp": 4, "pp": 1, "zero": 1}}}


def _trace_scenario(tmp_path: Path, trace: str, text: str, fmt: str, **mapping: object) -> Path:
    (tmp_path / trace).write_text(text, encoding="utf-8")
    return write(tmp_path, {"name": "h16t", "duration": "2d", "hardware": "trn2u",
                            "cluster": {"ultraservers": 4},
                            "workload": {"trace": trace, "format": fmt, "mapping": mapping,
                                         "templates": [_TEMPLATE]}})


def _jobs(out: Path):
    import pandas as pd
    return pd.read_parquet(out / "job_summary.parquet").set_index("name")["team"].to_dict()


def test_a_native_trace_keeps_na_and_none_as_written(tmp_path: Path) -> None:
    """pandas read 'None', 'NA' and 'null' as missing: the job named None was renamed
    research-trace-0001, teams NA and null became no team, and run_for NA ran the job to
    the horizon with no word."""
    text = ("name,submit,instances,template,run_for,priority,team\n"
            "alpha,0,1,research,6h,0,研究\nNone,1h,1,research,1h,0,開発\n"
            "beta,2h,1,research,1h,0,NA\ngamma,3h,1,research,1h,0,null\n")
    out = tmp_path / "out"
    result = invoke("run", _trace_scenario(tmp_path, "t.csv", text, "native"), "-o", out)
    assert result.exit_code == 0, result.output
    # the two non-ASCII teams stay two (they were both 't__', one team)
    assert _jobs(out) == {"alpha": "u7814u7a76", "None": "u958bu767a", "beta": "NA",
                          "gamma": "null"}
    bad = text.replace("beta,2h,1,research,1h", "beta,2h,1,research,NA")
    result = invoke("validate", _trace_scenario(tmp_path, "bad.csv", bad, "native"))
    refused(result, "bad.csv, row 3", "cannot read 'NA' as a duration")


def test_trace_ids_that_clean_to_one_name_stay_two_jobs(tmp_path: Path) -> None:
    """Philly job ids 'a b' and 'a_b' (and virtual clusters 'vc 1' and 'vc_1') cleaned to
    one name: the run was refused ('job names must be unique') and the teams merged."""
    import json

    def job(jobid: str, vc: str, hour: int) -> dict:
        at = f"2017-10-07 0{hour}:00:00"
        return {"status": "Pass", "vc": vc, "jobid": jobid, "user": "u",
                "submitted_time": at,
                "attempts": [{"start_time": at, "end_time": "2017-10-07 05:00:00",
                              "detail": [{"ip": "m", "gpus": [f"gpu{i}" for i in range(8)]}]}]}

    text = json.dumps([job("a b", "vc 1", 1), job("a_b", "vc_1", 2)])
    out = tmp_path / "out"
    scenario = _trace_scenario(tmp_path, "p.json", text, "philly", rule="instances",
                               gpus_per_instance=8, team="vc")
    result = invoke("run", scenario, "-o", out)
    assert result.exit_code == 0, result.output
    assert _jobs(out) == {"philly-a_b": "vc_1", "philly-a_b-2": "vc_1-2"}


# -- fair share at scale (helper harden16b)

def _fair_share_fleet(tmp_path: Path, jobs: int) -> Path:
    checkpoint = {"interval": "auto", "write": "30s", "restore": "2min"}
    return write(tmp_path, {
        "name": "h16f", "seed": 5, "duration": "1d", "hardware": "trn2u",
        "cluster": {"ultraservers": 12, "fabric": {"instances_per_leaf": 16}},
        "scheduler": {"policy": "fairshare", "preemption": True, "borrowing": True},
        "teams": [{"name": "pre", "quota": 24, "share": 2}, {"name": "res", "quota": 12},
                  {"name": "tiny", "quota": 4}],
        "workload": {"arrivals": {"rate": "1/min", "count": jobs}, "templates": [
            {"name": "t", "weight": 70, "instances": {"min": 1, "max": 4},
             "run_for": {"median": "2h", "sigma": 1.0}, "teams": {"tiny": 1, "res": 2},
             "job": {"model": "llama3-8b", "seq_len": 4096, "parallelism": {"tp": 8},
                     "checkpoint": checkpoint}},
            {"name": "big", "weight": 5, "instances": [8, 16],
             "run_for": {"median": "8h", "sigma": 0.5}, "teams": {"pre": 1},
             "job": {"model": "llama3.1-70b", "seq_len": 8192,
                     "parallelism": {"tp": 64, "zero": 1, "sequence_parallel": True},
                     "recompute": "full", "priority": 2, "checkpoint": checkpoint}}]},
        "failures": {"preset": "llama3", "scale": 50, "detect": "2min", "repair": "4h"}})


def test_the_fair_share_walk_gives_only_the_jobs_their_teams_room_admits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fair-share pass visited every waiting job of a team over its quota, one by one
    (10,000 jobs: 36 s against backfill's 5.5 s; 20,000 passed 390 s); then a team without
    room for its smallest job was passed over at once, but a team with room for a few of its
    jobs was still walked job by job (a 20,000-job fleet: 1.39 M jobs given in 22,000
    passes). The walk (`FairShareWalk`) now gives only the jobs of a size its team's room
    admits, and in a backfill pass only those of a size that could start: the same runs to
    the byte as the walk of every job (the scheduler refused the others in turn, nothing
    moving between them), preemptions that give quota back included."""
    from clustersim.cluster import queues

    scenario = _fair_share_fleet(tmp_path, 600)
    visited = {True: 0, False: 0}

    class Counting:
        def __init__(self, inner, skipping: bool):
            self.inner, self.skipping = inner, skipping

        def __iter__(self):
            return self

        def __next__(self):
            run = next(self.inner)
            visited[self.skipping] += 1
            return run

        def rooms_rose(self) -> None:  # the walk of every job reads each job's room anew
            if self.skipping:
                self.inner.rooms_rose()

        def __getattr__(self, name: str):  # `narrowed` (backfill's bounds), where it is
            method = getattr(self.inner, name)
            return lambda *bounds: (method(*bounds), self)[1]

    def walk(skipping: bool):
        def ordered(self, admissible: bool = False):
            assert admissible  # (the scheduler's walk)
            inner = queues.FairShareWalk(self) if skipping else self._every()
            return Counting(inner, skipping)
        return ordered

    out = {}
    for skipping in (True, False):
        monkeypatch.setattr(queues.FairShareQueue, "ordered", walk(skipping))
        out[skipping] = tmp_path / f"admissible-{skipping}"
        result = invoke("run", scenario, "-o", out[skipping])
        assert result.exit_code == 0, result.output
    for name in ("job_summary.parquet", "jobs.parquet", "intervals.parquet"):
        assert (out[True] / name).read_bytes() == (out[False] / name).read_bytes(), name
    # the fleet has teams over their quota with jobs waiting (docs/fleet.md, "Scale")
    assert visited[True] < visited[False] / 50, visited


@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_replications_of_a_fleet_with_serving_say_whose_serving_figures_they_are(
        tmp_path: Path) -> None:
    """With --replications, an event-driven fleet's serving figures were the first
    replication's but read as means (no ±, under 'a figure without ± is the same in every
    replication'), and idle_or_down_share subtracted that one replication's serving share
    from the mean training share."""
    import json

    import yaml

    raw = yaml.safe_load(_FLUID_FLEET)
    scenario = write(tmp_path, raw)
    out = tmp_path / "out"
    result = invoke("run", scenario, "-o", out, "--replications", "2")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["serving_replication"] == 0
    cluster = summary["cluster"]
    assert "serving_utilisation_ci95" in cluster
    assert cluster["idle_or_down_share"] == pytest.approx(
        1 - cluster["serving_utilisation"] - cluster["utilisation"])
    caption = " ".join(result.output.split())
    assert "but the serving deployments' figures, which are the first replication's" \
        in caption
    single = tmp_path / "single"
    assert invoke("run", scenario, "-o", single).exit_code == 0
    assert "serving_replication" not in json.loads((single / "summary.json").read_text())


_FLUID_FLEET = """
name: h16r
seed: 5
duration: 12h
hardware: trn2u
cluster: {ultraservers: 12, fabric: {instances_per_leaf: 16}}
scheduler: {policy: backfill, preemption: true}
workload:
  arrivals: {rate: 200/d, count: 40}
  templates:
    - name: t
      instances: {min: 1, max: 4}
      run_for: {median: 2h, sigma: 1.0}
      job: {model: llama3-8b, seq_len: 4096, parallelism: {tp: 8, pp: 1, zero: 1}}
failures: {preset: llama3, scale: 50, detect: 2min, repair: 4h, restart: 10min}
fluid: {interval: 5min}
serve:
  - name: chat
    model: llama3.1-8b
    parallelism: {tp: 4}
    workload:
      load: {sinusoid: {peak: 300/s, trough: 30/s, peak_at: 17h}, noise: 0.05}
      input_tokens: {distribution: lognormal, median: 1024, sigma: 0.8, max: 8192}
      output_tokens: {distribution: lognormal, median: 256, sigma: 0.8, max: 2048}
    slo: {ttft: 1s, tpot: 50ms}
    autoscale: {min: 2, max: 40, target: 0.7, interval: 5min, warmup: 2min, drain: 2min,
                scale_down_after: 30min, priority: 1}
"""


def test_a_pai_job_with_a_task_still_running_has_no_end(tmp_path: Path) -> None:
    """A PAI job one of whose started tasks has no end was replayed as finished at its
    other tasks' latest end (4,100 s); it had not ended: counted with the jobs of no end."""
    import json

    folder = tmp_path / "pai"
    folder.mkdir()
    (folder / "pai_job_table.csv").write_text(
        "jA,iA,uX,Terminated,1000.0,5000.0\njB,iB,uY,Terminated,2000.0,3000.0\n")
    (folder / "pai_task_table.csv").write_text(
        "jA,worker,2.0,Terminated,900.0,5000.0,600,29,100.0,V100\n"
        "jA,worker2,1.0,Running,1000.0,,600,29,100.0,V100\n"
        "jB,worker,1.0,Terminated,2100.0,2900.0,600,29,100.0,V100\n")
    scenario = write(tmp_path, {"name": "h16p", "duration": "2d", "hardware": "trn2u",
                                "cluster": {"ultraservers": 4},
                                "workload": {"trace": "pai", "format": "pai",
                                             "mapping": {"team": "user"},
                                             "templates": [_TEMPLATE]}})
    out = tmp_path / "out"
    result = invoke("run", scenario, "-o", out)
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "summary.json").read_text())["trace_rows"]
    assert rows["replayed"] == 1 and rows["left_out"]["no_end"] == 1, rows


@pytest.mark.parametrize("change, words", [
    ({"status": ["x"]}, "column status: expected text or null"),
    ({"attempts": [{"start_time": "2017-10-07 01:00:00", "end_time": "2017-10-07 05:00:00"}]},
     "column attempts.detail missing from a started attempt")])
def test_a_philly_job_with_a_malformed_column_is_refused(tmp_path: Path, change: dict,
                                                         words: str) -> None:
    """A status given as a list became the outcome "['x']", and a started attempt without
    its detail was counted CPU-only, where traces-in.md refuses a missing column."""
    import json

    at = "2017-10-07 01:00:00"
    job = {"status": "Pass", "vc": "vc1", "jobid": "j1", "user": "u", "submitted_time": at,
           "attempts": [{"start_time": at, "end_time": "2017-10-07 05:00:00",
                         "detail": [{"ip": "m", "gpus": ["gpu0"]}]}], **change}
    scenario = _trace_scenario(tmp_path, "p.json", json.dumps([job]), "philly", team="vc")
    refused(invoke("validate", scenario), "job 1 (jobid j1)", words)


@pytest.mark.parametrize("value, message", [
    ("0", "workload.templates.0.instances.min = 0: expected greater than 0"),
    ("5", "workload.templates.0.instances: max 4 is below min 5")])
def test_a_size_range_error_names_the_range_not_the_list_branch(tmp_path: Path, value: str,
                                                                 message: str) -> None:
    """`instances: {min: 0, max: 4}` said 'instances.list[int]: expected a list' (the
    union's list branch) beside, or instead of, what was wrong with the range."""
    scenario = write(tmp_path, {
        "name": "h16i", "duration": "1d", "hardware": "trn2u", "cluster": {"ultraservers": 4},
        "workload": {"arrivals": {"rate": "10/d", "count": 5}, "templates": [
            {**_TEMPLATE, "instances": {"min": 1, "max": 4}, "run_for": {"median": "1h"}}]}})
    result = invoke("validate", scenario, "--set", f"workload.templates.0.instances.min={value}")
    refused(result, message)
    assert "list[int]" not in result.output and "expected a list" not in result.output


def test_a_native_trace_with_empty_cells_keeps_its_numbers(tmp_path: Path) -> None:
    """With 'NA' read as written, a column with an empty cell came back as text, and the
    '100.0' pandas writes for a whole-number column with a gap was refused (review of
    session 16). Empty cells stay missing, numbers stay numbers."""
    text = ("name,submit,instances,template,run_for,steps,priority\n"
            "a,0,1,research,2h,100.0,1.0\nb,3600,2,research,1h,,\n")
    result = invoke("validate", _trace_scenario(tmp_path, "t.csv", text, "native"))
    assert result.exit_code == 0, result.output


def test_a_philly_user_written_as_a_number_is_a_team(tmp_path: Path) -> None:
    """The column check of this session refused a numeric user (even with team: none)."""
    import json

    at = "2017-10-07 01:00:00"
    job = {"status": "Pass", "vc": "vc1", "jobid": "j1", "user": 12345, "submitted_time": at,
           "attempts": [{"start_time": at, "end_time": "2017-10-07 05:00:00",
                         "detail": [{"ip": "m", "gpus": ["gpu0"]}]}]}
    for team in ("user", "none"):
        scenario = _trace_scenario(tmp_path, "p.json", json.dumps([job]), "philly", team=team)
        result = invoke("validate", scenario)
        assert result.exit_code == 0, result.output
