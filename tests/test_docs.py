"""The documentation is part of the program: it is checked against the code and run.

- docs/scenario.md's key table is the one the scenario models generate;
- docs/cli.md names every command and option, docs/outputs.md every figure of summary.json;
- no link or path mention points at a missing file, or outside the repository;
- every YAML block and every `console` command of the README and docs/ runs (doc test),
  in a temporary copy of the repository's scenarios and goldens, in order, and exits 0.
"""

from __future__ import annotations

import glob
import json
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from clustersim.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
sys.path.insert(0, str(ROOT / "scripts"))

import scenario_docs  # noqa: E402


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Reference pages checked against the code


def test_scenario_key_table_is_generated_from_the_models():
    page = _text(DOCS / "scenario.md")
    assert scenario_docs.MARKER in page
    assert page == scenario_docs.page_text(page), (
        "docs/scenario.md is out of date: run python scripts/scenario_docs.py")


def test_every_documented_scenario_key_exists_and_every_key_is_documented():
    rows = {path for path, *_ in scenario_docs.key_rows()}
    page = _text(DOCS / "scenario.md")
    table = page.split(scenario_docs.MARKER)[1]
    documented = set(re.findall(r"^\| `([^`]+)`", table, re.M))
    assert documented == rows
    # Spot checks that the walk reaches nested models, lists and aliases.
    for key in ("jobs[].checkpoint.interval", "failures.rates[].mtbf", "hardware.chip.hbm",
                "cluster.fabric.oversubscription", "workload.templates[].run_for.median"):
        assert key in rows


def test_every_command_and_option_is_in_the_cli_reference():
    page = _text(DOCS / "cli.md")
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        match = re.search(rf"^## {re.escape(name)}\n(.*?)(?=^## |\Z)", page, re.M | re.S)
        assert match, f"docs/cli.md has no section `## {name}`"
        section = match.group(1)
        for param in command.params:
            if param.param_type_name == "option":
                assert any(opt in section for opt in param.opts), (
                    f"{name} {'/'.join(param.opts)} is not in docs/cli.md")


def _summary_keys(node: Any, prefix: str, out: set[str]) -> None:
    dynamic = {"failures", "failures_by_cause", "interruptions_by_cause", "jobs_by_status",
               "links", "per_chip_bandwidth_gbyte_per_s", "peak_pflops", "status_by_replication"}
    placeholder = {"failures": "<component>", "interruptions_by_cause": "<component>",
                   "status_by_replication": "<status>",
                   "failures_by_cause": "<cause>", "jobs_by_status": "<status>",
                   "links": "<kind>", "per_chip_bandwidth_gbyte_per_s": "<kind>",
                   "peak_pflops": "<precision>"}
    if not isinstance(node, dict):
        out.add(prefix)
        return
    leaf = prefix.rsplit(".", 1)[-1]
    if leaf in dynamic:
        out.add(f"{prefix}.{placeholder[leaf]}")
        return
    if leaf == "memory_gib":
        out.add(prefix)
        return
    for key, value in node.items():
        if key.endswith("_ci95"):
            continue
        _summary_keys(value, f"{prefix}.{key}" if prefix else key, out)


def documented_summary_keys(summary: dict[str, Any]) -> set[str]:
    keys: set[str] = set()
    for key, value in summary.items():
        if key == "jobs":
            for job in value.values():
                _summary_keys(job, "", keys)
        elif key == "cluster":
            _summary_keys(value, "cluster", keys)
        else:
            keys.add(key)
    return keys


@pytest.fixture(scope="module")
def summaries() -> list[dict[str, Any]]:
    """Every golden, plus a fresh run with replications (the _ci95 keys) and prices."""
    from clustersim.runner.api import simulate
    from clustersim.scenario.loader import load_scenario

    found = [json.loads(_text(p)) for p in sorted(ROOT.glob("results/*/summary.json"))]
    scenario = load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["duration=3d"])
    found.append(simulate(scenario, replications=2, workers=1).summary)
    return found


def test_every_summary_figure_is_documented(summaries):
    page = _text(DOCS / "outputs.md")
    documented = set(re.findall(r"`([^`]+)`", page))
    missing = set()
    for summary in summaries:
        missing |= documented_summary_keys(summary) - documented
    assert not missing, f"summary.json keys not in docs/outputs.md: {sorted(missing)}"


# ---------------------------------------------------------------------------------------------
# Links and pointers


_LINK = re.compile(r"\]\(([^)\s]+)\)")
_PATH = re.compile(r"`((?:docs|scenarios|clustersim|scripts|tests)/[^`\s*<>]+)`")


def test_links_and_path_mentions_point_at_files_in_the_repository():
    problems = []
    for page in PAGES:
        text = _text(page)
        for target in _LINK.findall(text):
            if target.startswith(("http://", "https://", "#", "mailto:")):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists() or ROOT not in [path, *path.parents]:
                problems.append(f"{page.name}: link {target}")
        for mention in _PATH.findall(text):
            if not (ROOT / mention.rstrip("/")).exists():
                problems.append(f"{page.name}: path {mention}")
    assert not problems, problems


def test_nothing_in_the_repository_points_outside_it():
    """Users only have the repository: no ../shared, no CALIBRATION.md (the calibration
    data with its sources is docs/calibration.md)."""
    files = [ROOT / "README.md", ROOT / "pyproject.toml"]
    for folder, pattern in (("docs", "*.md"), ("clustersim", "*.py"), ("clustersim", "*.yaml"),
                            ("scripts", "*.py"), ("scenarios", "*.yaml"), ("tests", "*.py")):
        files += sorted((ROOT / folder).rglob(pattern))
    bad = []
    for path in files:
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(_text(path).splitlines(), 1):
            if "../shared" in line or "CALIBRATION.md" in line or "CONTRACT.md" in line:
                bad.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not bad, bad


# ---------------------------------------------------------------------------------------------
# Documentation that runs

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
# A YAML block without `name` is a fragment of a scenario: it runs merged into this base (the
# size of scenarios/mix-128-trn2.yaml, which the README's workload fragment comes from).
_FRAGMENT_BASE = {"name": "doc-fragment", "duration": "7d", "hardware": "trn2",
                  "cluster": {"instances": 128, "spares": 2}}


def doc_blocks(page: Path) -> list[tuple[str, str]]:
    """(language, text) of every fenced block, in order; the README's set-up (indented, as
    it holds `pip install`) runs its `clustersim` command first."""
    blocks = []
    text = _text(page)
    if page.name == "README.md":
        setup = re.search(r"## Set-up\n.*?\n\n((?:    .*\n)+)", text, re.S)
        assert setup, "README: no set-up block"
        commands = [part.strip() for line in setup.group(1).splitlines()
                    for part in line.split("&&") if part.strip().startswith("clustersim ")]
        assert commands, "README set-up: no clustersim command"
        blocks.append(("console", "\n".join(f"$ {c}" for c in commands)))
    blocks += [(lang, body) for lang, body in _FENCE.findall(text)]
    return blocks


def _run_command(runner: CliRunner, line: str, where: str) -> None:
    words = shlex.split(line, comments=True)
    if words[:3] == ["python", "-m", "clustersim"]:
        words = ["clustersim", *words[3:]]
    assert words and words[0] == "clustersim", f"{where}: not a clustersim command: {line}"
    args: list[str] = []
    for word in words[1:]:
        args += sorted(glob.glob(word)) if any(c in word for c in "*?[") else [word]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (f"{where}: `{line}` exited {result.exit_code}:\n"
                                   f"{result.output[-3000:]}\n{result.exception!r}")


def _run_yaml(runner: CliRunner, text: str, where: str, index: int) -> None:
    data = yaml.safe_load(text)
    assert isinstance(data, dict), f"{where}: a YAML block that is not a mapping"
    if "grid" in data or "variants" in data:
        from clustersim.runner.sweep import load_sweep

        path = Path(f"doc-sweep-{index}.yaml")
        path.write_text(text, encoding="utf-8")
        load_sweep(path)
        return
    if "name" not in data:  # a fragment: merged into a small base scenario
        data = {**_FRAGMENT_BASE, **data}
    path = Path(f"doc-scenario-{index}.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    _run_command(runner, f"clustersim validate {path}", where)
    _run_command(runner, f"clustersim run {path} -o results/doc-{index}", where)


# The README's tour and the command-line reference run whole commands for tens of seconds:
# slow, run by .ci/run; the other pages run in the default suite.
_SLOW_PAGES = {"README.md", "cli.md", "planning.md"}


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p.name in _SLOW_PAGES
                                  else p for p in PAGES], ids=lambda p: p.name)
def test_documentation_runs(page, tmp_path, monkeypatch):
    """Every YAML block is validated and run; every console command runs and exits 0; every
    Python block runs; all in order, in a fresh copy of scenarios/ and the goldens."""
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    for golden in ROOT.glob("results/*/summary.json"):
        if {p.name for p in golden.parent.iterdir()} != {"summary.json"}:
            continue  # a run's output (CI runs the quickstart into results/ first), not a golden
        target = tmp_path / golden.relative_to(ROOT)
        target.parent.mkdir(parents=True)
        shutil.copy(golden, target)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    runner = CliRunner()
    blocks = doc_blocks(page)
    for index, (lang, body) in enumerate(blocks):
        where = f"{page.name} block {index + 1}"
        if lang == "console":
            for line in body.splitlines():
                if line.startswith("$ "):
                    _run_command(runner, line[2:], where)
        elif lang == "yaml":
            _run_yaml(runner, body, where, index)
        elif lang == "python":
            exec(compile(body, where, "exec"), {"__name__": "__doc__"})  # noqa: S102
        elif lang not in ("json", "text", ""):
            pytest.fail(f"{where}: a ```{lang} block the doc test does not know how to run")
    stray = sorted(p.name for p in Path(".").iterdir()
                   if p.name not in ("scenarios", "results") and not p.name.startswith("doc-"))
    assert not stray, f"{page.name}: examples wrote outside results/: {stray}"


# ---------------------------------------------------------------------------------------------
# Figures the pages quote, recomputed from the tree (tests/doc_figures.py): a figure that
# drifts from what the tree gives fails here.


def _quoted_range(text: str, pattern: str) -> tuple[float, float]:
    match = re.search(pattern, text, re.S)
    assert match, f"no figure matching {pattern!r}"
    low, high = (float(v.replace(",", "")) for v in match.groups())
    return low, high


@pytest.mark.slow  # about 60 step models over the sites (seconds each)
def test_the_multi_site_figures_are_the_trees():
    import doc_figures

    page = _text(DOCS / "sites.md")
    table = doc_figures.spread_table()
    labels = {"10Gbps": "10 Gbit/s", "40Gbps": "40 Gbit/s", "100Gbps": "100 Gbit/s",
              "200Gbps": "200 Gbit/s", "400Gbps": "400 Gbit/s", "1Tbps": "1 Tbit/s",
              "2Tbps": "2 Tbit/s", "4Tbps": "4 Tbit/s", "10Tbps": "10 Tbit/s"}
    for bandwidth, label in labels.items():
        row = re.search(rf"^\| {re.escape(label)} \| ([0-9.]+) \| ([0-9.]+) \|$", page, re.M)
        assert row, f"docs/sites.md has no row for {label}"
        quoted = tuple(float(v) for v in row.groups())
        assert quoted == tuple(round(v, 2) for v in table[bandwidth]), (label, table[bandwidth])
    # The break-even (spread = one site): in the range both pages quote.
    even_gbit = doc_figures.bandwidth_for("spread", 1.0) / 1e9
    for text, pattern in (
            (page, r"below about ([0-9,]+)-([0-9,]+) Gbit/s between the sites"),
            (_text(ROOT / "README.md"), r"pays from about ([0-9,]+)-([0-9,]+) Gbit/s")):
        low, high = _quoted_range(text, pattern)
        assert low <= even_gbit <= high and high - low <= 0.1 * high, (even_gbit, low, high)
    # 95% scaling, and both thresholds with a cross-site average every 16 steps.
    scaled = float(re.search(r"takes\s+about ([0-9.]+) Tbit/s to reach 95% scaling",
                             page).group(1))
    assert abs(doc_figures.bandwidth_for("spread", 1.9) / 1e12 / scaled - 1) <= 0.15
    low, high = _quoted_range(page, r"pays from about ([0-9]+)-([0-9]+) Gbit/s, 95%")
    assert low <= doc_figures.bandwidth_for("spread-sync-16", 1.0) / 1e9 <= high
    sync95 = float(re.search(r"95% from about ([0-9,]+) Gbit/s", page).group(1).replace(",", ""))
    assert abs(doc_figures.bandwidth_for("spread-sync-16", 1.9) / 1e9 / sync95 - 1) <= 0.15


def test_the_serving_figures_are_the_goldens():
    """docs/serving.md's 405B line and 2/s row are the reference scenarios' figures (their
    goldens, which `clustersim check` holds to the tree); the other rates are the sweeps'."""
    page = _text(DOCS / "serving.md")

    def deployment(scenario: str, name: str) -> dict[str, Any]:
        golden = json.loads(_text(ROOT / "results" / scenario / "summary.json"))
        return golden["deployments"][name]

    trn2, p5en = (deployment(f"serving-llama-{h}", "llama405b") for h in ("trn2", "p5en"))
    line = (f"Trn2 TPOT p50 {trn2['tpot_p50_s'] * 1e3:.1f} ms, SLO goodput "
            f"{trn2['slo_goodput']:.1%},\n${trn2['cost_per_million_output_tokens_usd']:.2f} per "
            f"million output tokens; p5en {p5en['tpot_p50_s'] * 1e3:.1f} ms, "
            f"{p5en['slo_goodput']:.1%}, ${p5en['cost_per_million_output_tokens_usd']:.2f}.")
    assert line in page, line
    trn2, p5en = (deployment(f"serving-llama-{h}", "llama70b") for h in ("trn2", "p5en"))
    row = (f"| 2/s | {trn2['ttft_p99_s']:.2f} s | {trn2['tpot_p50_s'] * 1e3:.1f} ms | "
           f"{trn2['slo_goodput']:.0%} | {trn2['cost_per_million_output_tokens_usd']:.1f} | "
           f"{p5en['ttft_p99_s']:.2f} s | {p5en['tpot_p50_s'] * 1e3:.1f} ms | "
           f"{p5en['slo_goodput']:.0%} | {p5en['cost_per_million_output_tokens_usd']:.1f} |")
    assert row in page, row


@pytest.mark.slow  # two step models of a 512-chip job
def test_the_quickstart_comment_quotes_the_trees_step(tmp_path):
    import doc_figures

    figures = doc_figures.quickstart_steps()
    text = " ".join(_text(ROOT / "scenarios" / "quickstart.yaml").replace("#", " ").split())
    quoted = (f"{figures['step_s']:.2f} s per step at {figures['mfu']:.1%} MFU and "
              f"{figures['memory_gib']:.0f} GiB per chip")
    assert quoted in text, quoted
    wide = f"steps in {figures['tp32_step_s']:.2f} s ({figures['tp32_mfu']:.1%} MFU)"
    assert wide in text, wide
    # the planner's best, as the comment says it (it once claimed the job was that best)
    result = CliRunner().invoke(app, ["plan", str(ROOT / "scenarios" / "quickstart.yaml"),
                                      "--top", "1", "--json", "-o", str(tmp_path / "plan")])
    assert result.exit_code == 0, result.output
    best = json.loads(result.stdout)["best"]
    shorter = 1 - best["step_time_s"] / figures["step_s"]
    layout = (f"finds a step {shorter:.1%} shorter, TP {best['tp']}, CP {best['cp']}, DP "
              f"{best['dp']:,} with ZeRO-{best['zero']}: {best['step_time_s']:.2f} s "
              f"({best['mfu']:.1%} MFU, {best['memory_per_chip_gib']:.0f} GiB per chip)")
    assert layout in text, layout


def test_the_million_chip_step_is_its_goldens():
    page = " ".join(_text(DOCS / "sites.md").split())
    golden = json.loads(_text(ROOT / "results" / "rainier-1m-4-sites" / "summary.json"))
    (job,) = golden["jobs"].values()
    assert f"DP 31,250), steps in {job['step_time_s']:.1f} s" in page, job["step_time_s"]


@pytest.mark.slow  # a plan over 8,192 chips: about 20 s of CPU
def test_the_multi_site_plan_figures_are_the_trees(tmp_path):
    result = CliRunner().invoke(app, [
        "plan", str(ROOT / "scenarios" / "sites-spread.yaml"), "--set", "jobs.0.instances=512",
        "--set", "jobs.0.global_batch=1024", "--set", "jobs.0.parallelism.dp=128",
        "-o", str(tmp_path / "plan")])
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text("utf-8"))
    options = {o["option"]: o for o in plan["sites"]["options"]}
    cut, spread = options["largest single site"], options["spread, synchronous"]
    page = " ".join(_text(DOCS / "sites.md").split())
    quoted = (f"steps in {spread['step_time_s']:.2f} s spread over both sites, against "
              f"{cut['step_time_s']:.2f} s for its largest single-site cut (DP {cut['dp']:,}, "
              f"half the tokens): {spread['tokens_per_s'] / 1e6:.2f} M tokens/s against "
              f"{cut['tokens_per_s'] / 1e6:.2f} M, at ${spread['cost_per_million_tokens_usd']:.2f} "
              f"against ${cut['cost_per_million_tokens_usd']:.2f} per million tokens")
    assert quoted in page, quoted


@pytest.mark.slow  # the serving planner over trn2 and p5en at 2 requests/s (about 8 s)
def test_the_readmes_serving_comparison_is_the_planners(tmp_path):
    """The README's serving bullet quotes the serving plan of scenarios/serving-llama-trn2.yaml
    on trn2 and p5en at the scenario's 2 requests/s: each one's cost at the load and at its
    SLO capacity, and how much cheaper Trn2 is."""
    result = CliRunner().invoke(app, [
        "plan", str(ROOT / "scenarios" / "serving-llama-trn2.yaml"), "--hardware", "trn2,p5en",
        "-o", str(tmp_path / "plan")])
    assert result.exit_code == 0, result.output
    best = json.loads((tmp_path / "plan" / "plan.json").read_text("utf-8"))["best_per_hardware"]
    trn2, p5en = best["trn2"], best["p5en"]
    readme = " ".join(_text(ROOT / "README.md").split())
    at_load = (trn2["cost_per_million_output_tokens_usd"],
               p5en["cost_per_million_output_tokens_usd"])
    quoted = (f"Trn2 with one TP {trn2['tp']} replica, ${at_load[0]:.2f} per million output "
              f"tokens, P5en with one TP {p5en['tp']} replica, ${at_load[1]:.2f}: Trn2 "
              f"{1 - at_load[0] / at_load[1]:.0%} cheaper")
    assert quoted in readme, quoted
    capacity = (f"Trn2 ${trn2['cost_per_million_output_tokens_at_capacity_usd']:.2f}, P5en "
                f"${p5en['cost_per_million_output_tokens_at_capacity_usd']:.2f}")
    assert capacity in readme, capacity


@pytest.mark.slow  # the serving planner's benchmark: about 40 s of CPU
def test_the_serving_plan_benchmark_is_the_planners(tmp_path):
    """docs/planning.md quotes the serving planner's benchmark (Llama 3.1 70B at 40
    requests/s on trn2 and p5en): each best, and how many configurations it ranked and gave
    up on cost."""
    import pandas as pd

    result = CliRunner().invoke(app, [
        "plan", str(ROOT / "scenarios" / "serving-llama-trn2.yaml"), "--hardware", "trn2,p5en",
        "--set", "serve.0.workload.rate=40/s", "--workers", "2", "-o", str(tmp_path / "plan")])
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text("utf-8"))
    rows = pd.read_parquet(tmp_path / "plan" / "plan.parquet")
    t, p = plan["best_per_hardware"]["trn2"], plan["best_per_hardware"]["p5en"]
    cut = int(rows["why"].fillna("").str.startswith("cost: ").sum())
    quoted = (f"answers Trn2 with {t['replicas']} replicas of TP {t['tp']} (max_batch "
              f"{t['max_batch']}) on {t['instances']} instances at "
              f"${t['cost_per_million_output_tokens_usd']:.2f} per million output tokens "
              f"({t['slo_goodput']:.2%} of requests within the SLO) and P5en with "
              f"{p['replicas']} replicas of TP {p['tp']} (max_batch {p['max_batch']}) on "
              f"{p['instances']} instances at ${p['cost_per_million_output_tokens_usd']:.2f}; "
              f"of {plan['considered']} configurations considered, "
              f"{int(rows['meets_slo'].fillna(False).astype(bool).sum())} hold the load and "
              f"are ranked and {cut} are given up on cost")
    assert quoted in " ".join(_text(DOCS / "planning.md").split()), quoted


@pytest.mark.slow
def test_the_serving_stack_tables_are_the_scenario_runs():
    """docs/calibration.md's serving-stack tables (every transformers-neuronx release's rows
    and the stacks' error ranges, TensorRT-LLM's included; the Trn2 stacks' rows of 2025's
    models and the DeepSeek-V3 port's profile) are what scripts/stack_tables.py prints from
    the calibration rows' scenario runs."""
    import stack_tables

    page = _text(DOCS / "calibration.md")
    assert stack_tables.BEGIN in page and stack_tables.END in page
    assert stack_tables.MODELS_BEGIN in page and stack_tables.MODELS_END in page
    assert page == stack_tables.page_text(page, stack_tables.markdown(),
                                          stack_tables.models_markdown()), (
        "docs/calibration.md's stack tables are out of date: run python "
        "scripts/stack_tables.py --write")


@pytest.mark.slow
def test_the_serving_pages_stack_errors_are_the_scenario_runs():
    """docs/serving.md's summary of the Trn1 releases quotes the errors the scenario runs
    give: the batch-4 1,024-token TTFT, Llama 2 13B's 4,096-token TTFT and 8,192-token TPOT,
    the SDK 2.16 Llama 2 70B rows."""
    import stack_tables

    page = " ".join(_text(DOCS / "serving.md").split())
    errors = {(r.model, r.batch, r.input_tokens, r.sdk): e
              for stack in stack_tables.TRN1 for _, r, _, e in stack_tables.trn1_rows(stack)}
    quoted = re.search(r"batch-4 1,024-token prompts \(TTFT (-\d+)%.*?8,192-token TPOT \((-\d+)% "
                       r"each; the TPOT (-\d+)% before.*?Llama 2 70B rows (-\d+)%", page)
    assert quoted, "docs/serving.md: the Trn1 releases' summary moved"
    b4, thirteen, before, seventy = (int(g) for g in quoted.groups())
    assert round(errors[("llama2-70b", 4, 1024, "2.18.0")][0] * 100) == b4
    assert round(errors[("llama2-13b", 1, 4096, "2.18.0")][0] * 100) == thirteen
    assert round(errors[("llama2-13b", 1, 8192, "2.18.0")][1] * 100) == thirteen
    from clustersim.calibration.serving import UNSEEN_SERVING_218, predict_serving
    row = UNSEEN_SERVING_218[6]  # 13B, 8,192 / 8,192; priced with buckets none (NxD's rule)
    ((_, tpot),) = predict_serving(rows=(row,), stack="nxd-inference")
    assert row.input_tokens == 8192 and round((tpot * 1e3 / row.tpot_ms - 1) * 100) == before
    assert {round(errors[("llama2-70b", 1, 256, "2.16")][0] * 100)} == {seventy}
