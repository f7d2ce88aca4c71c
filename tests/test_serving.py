"""Serving: closed forms (idle-replica latencies, the HBM floor, Little's law, M/D/1 waits),
determinism of the requests table, and refusal of malformed `serve:` sections."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from cli_helpers import set_key
from typer.testing import CliRunner

from clustersim.cli.app import app
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import catalog_entry
from clustersim.runner.api import run_to
from clustersim.scenario.loader import ScenarioError, scenario_from_dict
from clustersim.serving import deployment_figures, simulate_serving
from clustersim.serving.iteration import IterationModel, ReplicaShape
from clustersim.serving.simulate import replica_models
from clustersim.training.transformer import TransformerShape, model_preset_values

runner = CliRunner()


def scenario(rate: float, duration: str = "2000s", inputs: object = 512, outputs: object = 64,
             **server: object) -> dict:
    return {
        "name": "serve", "duration": duration, "hardware": "trn2",
        "cluster": {"instances": 1},
        "serve": [{
            "name": "chat", "model": "llama3.1-8b", "parallelism": {"tp": 8}, "replicas": 1,
            "server": server or {"max_batch": 32},
            "workload": {"arrival": "poisson", "rate": rate, "input_tokens": inputs,
                         "output_tokens": outputs},
        }],
    }


def run(raw: dict, seed: int = 0):
    s = scenario_from_dict(raw)
    result = simulate_serving(s, np.random.SeedSequence(seed))
    return s, result


def test_low_load_latencies_are_the_idle_iteration_times() -> None:
    s, result = run(scenario(0.02, "20000s"))
    fleet = result.fleets["chat"]
    cost = result.models["chat"][0]
    done = fleet.status == 1
    assert done.sum() > 300
    ttft = fleet.first_token_s[done] - fleet.arrival_s[done]
    prefill = cost.target.prefill_s(512)
    assert np.median(ttft) == pytest.approx(prefill, rel=0.02)
    tpot = (fleet.finish_s[done] - fleet.first_token_s[done]) / 63
    # A batch of one whose context grows from 513 tokens over 63 iterations.
    decode = cost.run_s(1, 513, 63) / 63
    assert np.median(tpot) == pytest.approx(decode, rel=0.02)
    assert cost.run_s(1, 513, 1) == pytest.approx(cost.target.decode_base_s(1)
                                                  + cost.kv_s * 513)


@pytest.mark.parametrize("name,tp,hardware", [("llama3.1-8b", 4, "trn2"),
                                              ("llama3.1-70b", 64, "trn2"),
                                              ("llama3.1-70b", 8, "p5en"),
                                              ("llama2-7b", 32, "trn1")])
def test_decode_never_below_weights_over_hbm_bandwidth(name: str, tp: int, hardware: str) -> None:
    hw = catalog_entry(hardware)
    topology = build_topology(hw, 2)
    model = TransformerShape(**model_preset_values(name))
    it = IterationModel(ReplicaShape(model, "bf16", tp, 1), topology)
    floor = it.weight_bytes_per_chip() / hw.chip.hbm_bandwidth_bytes_per_s
    for batch in (1, 2, 8, 32, 128, 256):
        assert it.decode_base_s(batch) >= floor
        assert it.iteration_s([], batch, batch * 4096.0) >= floor


def test_littles_law_on_the_requests_table(tmp_path: Path) -> None:
    raw = scenario(4.0, "1500s", {"distribution": "lognormal", "median": 400, "sigma": 0.7,
                                  "max": 4000},
                   {"distribution": "lognormal", "median": 120, "sigma": 0.7, "max": 1000})
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    from clustersim.scenario import load_scenario
    run_to(load_scenario(path), tmp_path / "out")
    table = pq.read_table(tmp_path / "out" / "requests.parquet").to_pandas()
    assert set(["deployment", "request", "arrival_s", "first_token_s", "finish_s",
                "input_tokens", "output_tokens", "replica", "status", "retries"]) <= set(table)
    horizon = 1500.0
    arrival = table["arrival_s"].to_numpy()
    finish = table["finish_s"].to_numpy()
    # Mean number in the system over [0, H], by integrating each request's stay in the
    # window, against throughput x mean latency of the requests that arrived in it.
    inside = np.clip(np.minimum(finish, horizon) - arrival, 0, None).sum() / horizon
    lam = len(arrival) / horizon
    wait = (finish - arrival).mean()
    assert inside == pytest.approx(lam * wait, rel=0.02)


def test_one_replica_fixed_lengths_waits_match_md1() -> None:
    # Batch of one: every request is served alone in a fixed time, so the replica is an
    # M/D/1 queue: mean wait = rho x S / (2 (1 - rho)).
    raw = scenario(1.0, "30000s", 128, 8, max_batch=1)
    s = scenario_from_dict(raw)
    cost = replica_models(s, s.serve[0])[0]
    service = cost.target.prefill_s(128) + cost.run_s(1, 129, 7)
    rate = 0.6 / service
    raw["serve"][0]["workload"]["rate"] = rate
    raw["duration"] = 40000 / rate
    s, result = run(raw, seed=3)
    fleet = result.fleets["chat"]
    done = fleet.status == 1
    waits = fleet.first_token_s[done] - fleet.arrival_s[done] - cost.target.prefill_s(128)
    rho = rate * service
    expected = rho * service / (2 * (1 - rho))
    assert waits.mean() == pytest.approx(expected, rel=0.05)


def test_same_seed_same_requests_table(tmp_path: Path) -> None:
    raw = scenario(6.0, "300s", {"distribution": "lognormal", "median": 300, "sigma": 1.0},
                   {"distribution": "lognormal", "median": 80, "sigma": 1.0})
    raw["serve"][0]["router"] = "least_outstanding"
    raw["serve"][0]["replicas"] = 2
    raw["serve"][0]["parallelism"] = {"tp": 32}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    from clustersim.scenario import load_scenario
    for out in ("a", "b"):
        run_to(load_scenario(path), tmp_path / out)
    first = (tmp_path / "a" / "requests.parquet").read_bytes()
    assert first == (tmp_path / "b" / "requests.parquet").read_bytes()
    run_to(load_scenario(path), tmp_path / "c", seed=1)
    assert first != (tmp_path / "c" / "requests.parquet").read_bytes()


@pytest.mark.parametrize("path,value,needle", [
    ("serve.0.workload.rate", -1, "serve.0.workload.rate"),
    ("serve.0.workload.input_tokens", {"distribution": "lognormal", "median": 10,
                                       "sigma": float("nan")}, "sigma"),
    ("serve.0.server.max_batch", 0, "serve.0.server.max_batch"),
    ("serve.0.model", "llama9", "serve.0.model"),
    ("serve.0.replicas", 50, "serve"),
    ("serve.0.router", "random", "serve.0.router"),
    ("serve.0.surprise", 1, "surprise"),
])
def test_malformed_serving_section_exits_2_and_writes_nothing(
        tmp_path: Path, path: str, value: object, needle: str) -> None:
    raw = scenario(1.0)
    set_key(raw, path, value)
    file = tmp_path / "bad.yaml"
    file.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(file), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output
    assert not out.exists()
    with pytest.raises(ScenarioError):
        scenario_from_dict(raw)


def test_missing_trace_file_exits_2(tmp_path: Path) -> None:
    raw = scenario(1.0)
    raw["serve"][0]["workload"] = {"arrival": "trace", "trace": "nope.csv"}
    file = tmp_path / "bad.yaml"
    file.write_text(yaml.safe_dump(raw))
    result = runner.invoke(app, ["run", str(file), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "serve.0.workload.trace" in result.output
    assert not (tmp_path / "out").exists()


def test_a_trace_whose_arrivals_all_fall_past_the_horizon_exits_2(tmp_path: Path) -> None:
    """Arrivals in milliseconds, or a run shorter than the trace's start: none falls within
    the run, which would otherwise pass for an idle deployment's (0 requests, exit 0)."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n5000,64,8\n6000,32,8\n")
    raw = scenario(1.0)
    raw["duration"] = "10min"
    raw["serve"][0]["workload"] = {"arrival": "trace", "trace": str(trace),
                                   "input_tokens": "trace", "output_tokens": "trace"}
    file = tmp_path / "late.yaml"
    file.write_text(yaml.safe_dump(raw))
    result = runner.invoke(app, ["run", str(file), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "serve.0.workload.trace" in result.output
    assert "none of the trace's 2 arrivals falls within the deployment's 10min" in result.output
    assert not (tmp_path / "out").exists()
    raw["duration"] = "2h"  # both arrive within it
    s, run_result = run(raw)
    assert deployment_figures(s, run_result)["chat"]["requests_completed"] == 2


def test_trace_workload_and_summary_figures(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0.5,100,10\n1.0,2000,50\n"
                     "1.2,300,1\n")
    raw = scenario(1.0)
    raw["serve"][0]["workload"] = {"arrival": "trace", "trace": str(trace),
                                   "input_tokens": "trace", "output_tokens": "trace"}
    s, result = run(raw)
    figures = deployment_figures(s, result)["chat"]
    assert figures["requests_completed"] == 3
    fleet = result.fleets["chat"]
    assert fleet.output_tokens.tolist() == [10, 50, 1]
    assert np.all(fleet.finish_s >= fleet.first_token_s)
    for key in ("requests_per_s", "output_tokens_per_s", "ttft_p50_s", "ttft_p90_s",
                "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "e2e_p50_s",
                "e2e_p90_s", "e2e_p99_s", "slo_goodput", "cost_per_million_output_tokens_usd",
                "energy_per_output_token_j"):
        assert key in figures


def test_failures_retry_requests_and_every_request_settles() -> None:
    raw = scenario(3.0, "600s", 256, 64)
    raw["serve"][0]["replicas"] = 4
    raw["serve"][0]["parallelism"] = {"tp": 16}
    raw["failures"] = {"rates": [{"component": "node", "per": "instance", "mtbf": "300s"}],
                       "detect": "10s", "restart": "20s"}
    raw["cluster"] = {"instances": 1, "spares": 1}
    s, result = run(raw)
    fleet = result.fleets["chat"]
    assert fleet.failures > 0
    assert fleet.retries.sum() > 0
    assert np.all(fleet.status == 1)
    assert np.all(fleet.finish_s >= fleet.arrival_s)


@pytest.mark.parametrize("extra", [
    {"disaggregated": {"prefill_replicas": 1, "decode_replicas": 1}, "replicas": 2,
     "parallelism": {"tp": 32}},
    {"speculative": {"draft": "llama3.1-8b", "tokens": 4,
                     "acceptance": 0.7}, "model": "llama3.1-70b", "parallelism": {"tp": 64}},
    {"server": {"max_batch": 64, "kv_full": "preempt", "kv_reserve": 0.78,
                "chunked_prefill": False}},
])
def test_variants_complete_every_request(extra: dict) -> None:
    raw = scenario(1.5, "120s", {"distribution": "lognormal", "median": 1500, "sigma": 0.8,
                                 "max": 8000}, {"distribution": "lognormal", "median": 300,
                                                "sigma": 0.8, "max": 4000})
    raw["serve"][0].update(extra)
    s, result = run(raw)
    fleet = result.fleets["chat"]
    assert np.all(fleet.status == 1)
    tpot = (fleet.finish_s - fleet.first_token_s) / np.maximum(fleet.output_tokens - 1, 1)
    assert np.all(tpot >= 0)
    if "speculative" in extra:
        # At low load (batch of one) decoding is latency-bound: 0.7 of 4 proposals accepted
        # emit ~2.8 tokens per verify pass, worth more than the draft's passes cost.
        low = {**raw, "duration": "600s"}
        low["serve"] = [{**raw["serve"][0], "workload": {"rate": 0.02, "input_tokens": 256,
                                                          "output_tokens": 200}}]
        plain = {**low, "serve": [{k: v for k, v in low["serve"][0].items()
                                   if k != "speculative"}]}
        spec_fleet = run(low)[1].fleets["chat"]
        base_fleet = run(plain)[1].fleets["chat"]
        assert len(spec_fleet.finish_s) > 3
        spec = np.median(spec_fleet.finish_s - spec_fleet.first_token_s)
        base = np.median(base_fleet.finish_s - base_fleet.first_token_s)
        assert spec < base


def test_json_schema_covers_serve() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from clustersim.scenario import scenario_json_schema
    validator = jsonschema.Draft202012Validator(scenario_json_schema())
    root = Path(__file__).resolve().parent.parent / "scenarios"
    files = [p for p in root.glob("*.yaml") if "serv" in p.name]
    assert files
    for path in files:
        assert list(validator.iter_errors(yaml.safe_load(path.read_text()))) == [], path
    raw = scenario(1.0)
    assert list(validator.iter_errors(raw)) == []
    raw["serve"][0]["server"]["max_batch"] = 0
    assert list(validator.iter_errors(raw))
    raw["serve"][0]["server"] = {"max_batch": 8, "batch": 1}
    assert list(validator.iter_errors(raw))


def test_trn1_serving_rows_within_10_percent() -> None:
    """The fitted Trn1 rows (SDK 2.18.0, docs/calibration.md) against the model with the
    catalog's trn1 constants, nothing fitted per row: every TTFT and TPOT within 5% but the
    batch-4 row's (6.7% and 6.2%, held within 7.5%)."""
    from clustersim.calibration.serving import SERVING_MEASUREMENTS, predict_serving
    predicted = predict_serving()
    assert len(predicted) == len(SERVING_MEASUREMENTS) == 6
    for row, (ttft_s, tpot_s) in zip(SERVING_MEASUREMENTS, predicted, strict=True):
        limit = 0.05 if row.batch == 1 else 0.075
        assert abs(ttft_s * 1e3 / row.ttft_ms - 1) < limit, (row, ttft_s)
        assert abs(tpot_s * 1e3 / row.tpot_ms - 1) < limit, (row, tpot_s)


def test_unseen_trn1_llama2_13b_rows() -> None:
    """Not fitted: the SDK 2.14 and 2.16 Llama 2 13B rows of the Neuron data files (request
    time over input + output tokens) stay within 15% (the 70B SDK 2.16 rows, five to six
    times the SDK 2.18 figures, are shown in docs/calibration.md, not held). They run TP 32
    with 40 heads: the model pads them to 64 (two per rank) as NxD does, which costs the
    padded heads' weights and work (+8.5% to +13.2%; within 10% only while the model
    computed one head per rank, fewer heads than the model has)."""
    from clustersim.calibration.serving import UNSEEN_SERVING, predict_token_latency
    rows = [(m, p) for m, p in zip(UNSEEN_SERVING, predict_token_latency(), strict=True)
            if m.model == "llama2-13b"]
    assert len(rows) == 4
    for m, predicted in rows:
        # 3,968/128 is +29% (+19% with the release-mixed fit, +8.7% before the unfused
        # attention term): SDK 2.16's 3,968-token prompt costs a quarter of SDK 2.18.0's
        # 4,096-token one, whose spilled scores the fit prices
        limit = 0.31 if m.input_tokens == 3968 else 0.15
        assert abs(predicted * 1e3 / m.ms_per_token - 1) < limit, (m, predicted)


def test_model_report_prints_the_serving_and_collective_rows(capsys) -> None:
    """scripts/validate_model.py's serving and collectives sections run and print every row
    (the step section is exercised by tests/test_calibration_steps.py)."""
    import importlib.util
    path = Path(__file__).resolve().parent.parent / "scripts" / "validate_model.py"
    spec = importlib.util.spec_from_file_location("validate_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.print_serving()
    module.print_collectives()
    out = capsys.readouterr().out
    assert "unseen, not fitted" in out and "all_reduce cheapest" in out and "unfused" in out
    assert "stack transformers-neuronx@2.18.0" in out
    assert "stack transformers-neuronx@2.18.1" in out
    assert "stack transformers-neuronx@2.16" in out and "stack transformers-neuronx@2.14" in out
    assert out.count("llama2-13b") == 6 and "nccom-test" in out


def test_serving_all_reduce_runs_the_cheapest_unless_auto() -> None:
    """With `serving.all_reduce: cheapest` (trn1's) a replica's TP all-reduce is the
    cheapest of mesh, single-step mesh, RDH and KangaRing; at the 1 MiB of a 128-token Llama 2
    7B prefill on TP 32 that is mesh, well under the RDH that `auto` (the training bands)
    takes there; the cost stays non-decreasing in size."""
    hw = catalog_entry("trn1")
    assert hw.serving.all_reduce == "cheapest"
    auto = hw.model_copy(update={"serving": hw.serving.model_copy(
        update={"all_reduce": "auto"})})
    model = TransformerShape(**model_preset_values("llama2-7b"))
    shape = ReplicaShape(model, "bf16", 32, 1)
    cheapest = IterationModel(shape, build_topology(hw, 1))
    banded = IterationModel(shape, build_topology(auto, 1))
    for size in (128 * model.hidden * 2, 4096 * model.hidden * 2):
        forced = {name: cheapest.collectives.cost("all-reduce", cheapest.tp_group, size,
                                                  intra=name).time_s
                  for name in ("mesh", "mesh1", "rdh", "kangaring")}
        assert cheapest.tp_all_reduce_s(size) == min(forced.values())
    size = 128 * model.hidden * 2
    assert banded.collectives.cost("all-reduce", banded.tp_group, size).algorithm == "rdh"
    assert cheapest.tp_all_reduce_s(size) < banded.tp_all_reduce_s(size)
    assert cheapest._body_s(128) < banded._body_s(128)
    sizes = np.geomspace(8, 2**30, 40)
    times = [cheapest.tp_all_reduce_s(x) for x in sizes]
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))


def test_report_draws_the_serving_plots(tmp_path: Path) -> None:
    raw = scenario(2.0, "120s", 256, 32)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    from clustersim.analysis.report import write_report
    from clustersim.scenario import load_scenario
    run_to(load_scenario(path), tmp_path / "out")
    report = write_report(tmp_path / "out")
    for name in ("latency.png", "serving.png", "kv.png"):
        assert (tmp_path / "out" / "report" / name).stat().st_size > 10_000
    text = report.read_text()
    assert "| chat |" in text and "Serving latency" in text


def test_find_rate_brackets_the_slo() -> None:
    from clustersim.serving.capacity import find_rate
    raw = scenario(2.0, "300s", 512, 64)
    raw["serve"][0]["slo"] = {"ttft": "0.5s", "tpot": "50ms"}
    s = scenario_from_dict(raw)
    search = find_rate(s, goodput=0.95, bisections=4)
    assert search.rate_per_s is not None
    rates = dict(search.tried)
    assert rates[search.rate_per_s] >= 0.95
    above = [r for r in rates if r > search.rate_per_s]
    assert above and all(rates[r] < 0.95 for r in above if r <= min(above))


def test_parquet_trace_and_gamma_arrivals(tmp_path: Path) -> None:
    import pyarrow as pa
    trace = tmp_path / "t.parquet"
    pq.write_table(pa.table({"arrival_s": [3.0, 0.5, 1.0], "input_tokens": [64, 32, 16],
                             "output_tokens": [4, 2, 8]}), trace)
    raw = scenario(1.0)
    raw["serve"][0]["workload"] = {"arrival": "trace", "trace": str(trace),
                                   "input_tokens": "trace", "output_tokens": "trace"}
    _, result = run(raw)
    fleet = result.fleets["chat"]
    assert fleet.arrival_s.tolist() == [0.5, 1.0, 3.0]  # sorted, lengths follow their rows
    assert fleet.input_tokens.tolist() == [32, 16, 64]
    # Gamma gaps: mean 1 / rate, coefficient of variation cv.
    from clustersim.scenario.serving import RequestWorkloadSpec
    from clustersim.serving.requests import generate_requests
    spec = RequestWorkloadSpec.model_validate({"arrival": "gamma", "rate": 50, "cv": 3.0})
    gaps = np.diff(generate_requests(spec, 4000.0, np.random.SeedSequence(1)).arrival_s)
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=5, deadline=None)
@given(rate=st.floats(0.5, 8.0), median_in=st.integers(16, 2048),
       median_out=st.integers(2, 300), max_batch=st.integers(1, 64),
       policy=st.sampled_from(["queue", "preempt"]), chunked=st.booleans(),
       router=st.sampled_from(["round_robin", "least_outstanding", "kv_aware"]))
def test_every_request_settles_in_order(rate, median_in, median_out, max_batch, policy,
                                        chunked, router) -> None:
    """Whatever the load and policy: a request completes or is still in flight when the
    drain ends (overload), its first token comes after its arrival and its last after its
    first, each decode step takes at least the weights over the HBM bandwidth, and replica
    series never overfill the KV cache or the batch."""
    raw = scenario(rate, "60s", {"distribution": "lognormal", "median": median_in,
                                 "sigma": 1.0, "max": 8192},
                   {"distribution": "lognormal", "median": median_out, "sigma": 1.0,
                    "max": 1024}, max_batch=max_batch, kv_full=policy,
                   chunked_prefill=chunked, kv_reserve=0.8)
    raw["serve"][0].update(replicas=2, parallelism={"tp": 32}, router=router)
    s, result = run(raw)
    fleet = result.fleets["chat"]
    cost, capacity, _ = result.models["chat"]
    done = fleet.status == 1
    assert np.all((fleet.status == 1) | (fleet.status == 0))
    assert np.all(np.isnan(fleet.finish_s[~done]))
    assert np.all(fleet.first_token_s[done] >= fleet.arrival_s[done])
    assert np.all(fleet.finish_s[done] >= fleet.first_token_s[done])
    steps = np.maximum(fleet.output_tokens - 1, 1)
    floor = cost.target.weight_bytes_per_chip() / s.hardware.chip.hbm_bandwidth_bytes_per_s
    decoding = done & (fleet.output_tokens > 1)
    assert np.all(((fleet.finish_s - fleet.first_token_s) / steps)[decoding] >= floor * 0.999)
    series = fleet.series
    assert np.all(series["kv_tokens"] <= capacity + 1e-6)
    assert np.all(series["batch"] <= max_batch)


@pytest.mark.slow  # (a few seconds: the fast suite stays under 3 minutes)
def test_training_jobs_are_placed_around_the_serving_replicas(monkeypatch) -> None:
    """A scenario with both: the deployments hold the first instances for the whole run and
    the timeline never places a job there, through failures and recoveries (no spare: a job
    that loses an instance waits for its repair rather than take a serving one); and the
    replicas fail exactly when the timeline downs their instances."""
    from clustersim.cluster.owners import SERVING
    from clustersim.cluster.timeline import Timeline
    from clustersim.runner.api import simulate, step_profiles
    from clustersim.serving.fleet import Fleet
    raw = scenario(0.5, "3d")
    raw["cluster"] = {"instances": 4}
    raw["serve"][0]["parallelism"] = {"tp": 64}  # one whole trn2 instance per replica
    raw["serve"][0]["replicas"] = 2
    raw["jobs"] = [{"name": "train", "model": "llama3.1-8b", "seq_len": 4096,
                    "global_batch": 64, "parallelism": {"tp": 8, "dp": 16}}]
    raw["failures"] = {"preset": "none", "repair": "2h", "detect": "1min", "restart": "5min",
                       "rates": [{"component": "host", "per": "instance", "mtbf": "12h"}]}
    s = scenario_from_dict(raw)
    t = Timeline(s, step_profiles(s), np.random.SeedSequence(3))
    placed: list[np.ndarray] = []
    place = t.place

    def recording_place(*args, **kwargs):
        chosen = place(*args, **kwargs)
        if chosen is not None:
            placed.append(np.asarray(chosen))
        return chosen

    t.place = recording_place  # type: ignore[method-assign]
    result = t.run()
    assert t.serving_instances == 2
    assert np.all(t.owner[:2] == SERVING) and np.all(t.owner[2:] != SERVING)
    assert len(placed) > 1 and all(np.all(np.asarray(p) >= 2) for p in placed)
    assert sum(result.failures.values()) > 0
    assert result.jobs["train"].useful_s > 0

    calls: list[tuple[float, int, float]] = []
    fail = Fleet.fail

    def recording_fail(self, index: int, down_s: float) -> None:
        if self.replicas[index].up:
            calls.append((self.env.now, index, down_s))
        fail(self, index, down_s)

    monkeypatch.setattr(Fleet, "fail", recording_fail)
    run = simulate(s)
    assert run.summary["cluster"]["serving_instances"] == 2
    outages = run.timelines[0].serving_outages
    assert outages and all(down == 60 + 7200 + 300 for _, _, _, down in outages)
    # Each replica is down from an outage of its instance until detect + repair + restart
    # later; outages of a replica already down change nothing.
    expected, up_at = [], [0.0, 0.0]
    for time_s, slot, chip, down in outages:
        assert chip == -1
        if time_s >= up_at[slot]:
            expected.append((time_s, slot, down))
            up_at[slot] = time_s + down
    assert calls == expected
    assert run.summary["deployments"]["chat"]["replica_failures"] == len(expected)


def test_timeline_outages_take_down_the_replicas_on_the_instance_or_chip() -> None:
    """Outages (time, slot, chip or -1, down seconds) fail exactly the replicas with ranks
    on that instance, or on that chip: a second failure of a replica still down changes
    nothing, a slot beyond the deployment none; software failures are still drawn."""
    from clustersim.serving.simulate import replicas_on_instance
    raw = scenario(0.2, "4h")
    raw["cluster"] = {"instances": 4}
    raw["serve"][0]["replicas"] = 16  # tp 8 on trn2: 8 replicas an instance, 2 instances
    raw["failures"] = {"preset": "none", "repair": "2h", "detect": "1min", "restart": "5min"}
    s = scenario_from_dict(raw)
    d = s.serve[0]
    assert list(replicas_on_instance(s, d, 0)) == list(range(8))
    assert list(replicas_on_instance(s, d, 1)) == list(range(8, 16))
    # trn2 at LNC=2: 4 ranks a chip, so a tp-8 replica spans 2 chips
    assert list(replicas_on_instance(s, d, 1, chip=5)) == [10]
    down = 7560.0
    outages = [(100.0, 1, -1, down), (200.0, 1, -1, down), (300.0, 3, -1, down)]
    result = simulate_serving(s, np.random.SeedSequence(0), outages=outages)
    assert result.fleets["chat"].failures == 8
    # A chip's failure downs its whole instance in the timeline: every replica on it too.
    chip = simulate_serving(s, np.random.SeedSequence(0), outages=[(100.0, 0, 3, down)])
    assert chip.fleets["chat"].failures == 8
    assert simulate_serving(s, np.random.SeedSequence(0), outages=[]).fleets[
        "chat"].failures == 0
    # The llama3 preset's software causes are per chip: drawn here, never from the timeline.
    raw["failures"]["rates"] = [{"component": "software", "per": "chip", "mtbf": "8h"}]
    soft = simulate_serving(scenario_from_dict(raw), np.random.SeedSequence(0), outages=[])
    assert soft.fleets["chat"].failures > 0


def test_a_hot_spare_takes_a_failed_serving_instance_slot() -> None:
    """With spares, a failed serving instance hands its slot to a free one at once: the
    replicas are down for detection and restart only, and the timeline's serving instances
    stay as many as the deployments need."""
    from clustersim.cluster.owners import SERVING
    from clustersim.cluster.timeline import Timeline
    from clustersim.runner.api import step_profiles
    raw = scenario(0.2, "4d")
    raw["cluster"] = {"instances": 4, "spares": 2}
    raw["serve"][0]["parallelism"] = {"tp": 64}
    raw["serve"][0]["replicas"] = 2
    raw["failures"] = {"preset": "none", "repair": "1d", "detect": "1min", "restart": "5min",
                       "rates": [{"component": "host", "per": "instance", "mtbf": "1d"}]}
    s = scenario_from_dict(raw)
    t = Timeline(s, step_profiles(s), np.random.SeedSequence(1))
    result = t.run()
    outages = result.serving_outages
    assert outages and any(down == 360.0 for *_, down in outages)
    assert int(np.count_nonzero(t.owner == SERVING)) == 2
    assert sorted(t.serving_slot[t.owner == SERVING].tolist()) == [0, 1]


def test_a_replica_spanning_instances_runs_mesh_over_its_instances() -> None:
    """Llama 3.1 405B at TP 128 over two trn2u instances (the Z rings): the TP all-reduce
    has a reduce-scatter stage inside each instance, where single-step mesh does not apply;
    the replica runs (it raised an internal error before)."""
    raw = scenario(0.05, "10min", 512, 64)
    raw["hardware"] = "trn2u"
    raw["cluster"] = {"instances": 4}
    raw["serve"][0].update(model="llama3.1-405b", parallelism={"tp": 128}, replicas=1)
    s, result = run(raw)
    fleet = result.fleets["chat"]
    assert (fleet.status == 1).sum() > 10
    cost = result.models["chat"][0].target
    size = 64 * s.serve[0].model.hidden * 2
    assert cost.tp_all_reduce_s(size) <= cost.collectives.cost(
        "all-reduce", cost.tp_group, size).time_s


def test_deployments_leave_whole_ultraservers_for_a_job_that_needs_them() -> None:
    """A job whose TP spans instances of a trn2u UltraServer runs on whole UltraServers:
    a deployment that touches one leaves too few (exit 2 with the reason), where counting
    instances alone would pass and the job would never start."""
    raw = scenario(0.1, "1d")
    raw["hardware"] = "trn2u"
    raw["cluster"] = {"instances": 8}
    raw["serve"][0]["parallelism"] = {"tp": 64}  # one instance of the first UltraServer
    raw["jobs"] = [{"name": "big", "model": "llama3.1-405b", "seq_len": 4096,
                    "global_batch": 64, "parallelism": {"tp": 128, "pp": 3}}]
    with pytest.raises(ScenarioError, match="whole UltraServer"):
        scenario_from_dict(raw)
    raw["jobs"][0]["parallelism"] = {"tp": 128, "pp": 2}  # 4 instances: one UltraServer
    scenario_from_dict(raw)


def test_a_failed_decode_replica_sends_its_requests_back_to_prefill() -> None:
    """Disaggregated serving: the requests a decode replica held lose their KV cache with it
    and start over in the prefill pool; each completes with a first token (they used to go
    to another decode replica with no first token: summary.json then failed on a NaN)."""
    raw = scenario(40.0, "60s", {"distribution": "lognormal", "median": 512, "sigma": 0.8,
                                 "max": 8192}, 200, max_batch=64)
    raw["cluster"] = {"instances": 2}
    raw["serve"][0].update(parallelism={"tp": 16}, replicas=8,
                           disaggregated={"prefill_replicas": 3, "decode_replicas": 5})
    raw["failures"] = {"preset": "none", "detect": "5s", "restart": "10s", "repair": "1h"}
    s = scenario_from_dict(raw)
    # trn2 at LNC=2: 4 ranks a chip, 4 TP-16 replicas an instance; replica 4 (a decode
    # replica) is on chips 0-3 of the second instance.
    # A chip's failure downs its instance: decode replicas 4-7 fail together.
    result = simulate_serving(s, np.random.SeedSequence(0), outages=[(20.0, 1, 1, 15.0)])
    fleet = result.fleets["chat"]
    assert fleet.failures == 4 and fleet.retries.sum() > 5
    done = fleet.status == 1
    assert done.sum() > 1000 and np.all(np.isfinite(fleet.first_token_s[done]))
    figures = deployment_figures(s, result)["chat"]
    assert all(np.isfinite(v) for v in figures.values() if isinstance(v, float))


def test_serving_instances_do_not_count_as_fragmentation() -> None:
    """A leaf whose only busy instances are a deployment's is wholly free for jobs: the free
    instances beside a replica are not fragmented (they were counted so: 1.0 here)."""
    from clustersim.cluster.timeline import Timeline
    from clustersim.runner.api import step_profiles
    raw = scenario(0.2, "1h")
    raw["cluster"] = {"instances": 4}
    raw["serve"][0]["parallelism"] = {"tp": 64}
    # a short job on one instance: once it is done, instances 1-3 are free beside the replica
    raw["jobs"] = [{"name": "train", "model": "llama3.1-8b", "seq_len": 4096,
                    "global_batch": 16, "parallelism": {"tp": 8, "dp": 8}, "steps": 3}]
    s = scenario_from_dict(raw)
    t = Timeline(s, step_profiles(s), np.random.SeedSequence(0))
    result = t.run()
    assert t.serving_instances == 1 and result.jobs["train"].status == "done"
    assert result.fragmentation_mean < 0.1
