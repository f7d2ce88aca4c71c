"""The serving stacks' tables of docs/calibration.md, from the calibration rows' scenario runs.

    python scripts/stack_tables.py            # print the markdown (between the page's markers)
    python scripts/stack_tables.py --write    # rewrite that part of docs/calibration.md

Every Trn1 row (each transformers-neuronx release on its own rows: SDK 2.18.0, 2.18.1, 2.16,
2.14) and every TensorRT-LLM row is run from its scenario file under
scenarios/calibration/serving/ as `clustersim run` runs it, and printed with its error
(model / published - 1). tests/test_docs.py fails when the page's tables are not what this
prints. The Trn2 stacks' rows of 2025's models (the DeepSeek-V3 port with its own stack and
the Trinity port judging it, Qwen3-32B with NxD Inference's) and the port's token profile
fill the page's second block
(MODELS_BEGIN to MODELS_END), also from their scenario runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clustersim.calibration.scenarios import (  # noqa: E402
    file_for,
    gpu_name,
    run_serving_row,
    run_throughput_row,
    trn1_file,
)
from clustersim.calibration.serving_stacks import (  # noqa: E402
    per_token_s,
    release_rows,
    withdrawn_rows,
)
from clustersim.hardware.stacks import stack_named  # noqa: E402

PAGE = ROOT / "docs" / "calibration.md"
BEGIN = "<!-- stack tables: python scripts/stack_tables.py --write -->"
END = "<!-- end of stack tables -->"
MODELS_BEGIN = "<!-- models tables: python scripts/stack_tables.py --write -->"
MODELS_END = "<!-- end of models tables -->"
TRN1 = ("transformers-neuronx@2.18.0", "transformers-neuronx@2.18.1",
        "transformers-neuronx@2.16", "transformers-neuronx@2.14")


def _span(errors: list[float]) -> str:
    if not errors:
        return "none"
    return f"{min(errors):+.1%} to {max(errors):+.1%}"


def _constants(stack: str) -> str:
    own = dict(stack_named(stack).serving)
    if not own:
        return "none: the hardware entry's"
    shown = []
    for key, value in own.items():
        if isinstance(value, str):
            shown.append(f"`{key}` {value}")
        else:
            if key.endswith("_element_s"):  # a time per element: picoseconds
                shown.append(f"`{key}` {value * 1e12:.1f} ps per element")
            else:
                shown.append(f"`{key}` {value * 1e6:.2f} us" if key.endswith("_s")
                             else f"`{key}` {value:.3g}")
    return ", ".join(shown)


def trn1_rows(stack: str) -> list[tuple[str, object, tuple[float, ...]]]:
    """(fitted, unseen or withdrawn, row, errors) of a release's rows from their scenario
    runs: (TTFT, TPOT) errors, or the one per-token-latency error for SDK 2.14 and 2.16
    rows."""
    out = []
    fitted, unseen = release_rows(stack)
    for kind, table in (("fitted", fitted), ("unseen", unseen),
                        ("withdrawn", withdrawn_rows(stack))):
        for row in table:
            ttft, tpot = run_serving_row(trn1_file(row))
            if hasattr(row, "ms_per_token"):
                figures = (per_token_s(row, ttft, tpot) * 1e3,)
                errors = (figures[0] / row.ms_per_token - 1,)
            else:
                figures = (ttft * 1e3, tpot * 1e3)
                errors = (figures[0] / row.ttft_ms - 1, figures[1] / row.tpot_ms - 1)
            out.append((kind, row, figures, errors))
    return out


def markdown() -> str:
    from clustersim.calibration.gpu_serving import (
        GPU_SERVING,
        UNSEEN_GPU_MIXTURES,
        UNSEEN_GPU_OTHER,
        UNSEEN_GPU_SERVING,
    )

    runs = {stack: trn1_rows(stack) for stack in TRN1}
    gpu = {kind: [run_throughput_row(file_for("serving", gpu_name(r))) / r.output_tokens_per_s
                  - 1 for r in table]
           for kind, table in (("fitted", GPU_SERVING),
                               ("unseen", UNSEEN_GPU_SERVING + UNSEEN_GPU_OTHER),
                               ("mixtures", UNSEEN_GPU_MIXTURES))}
    lines = ["| stack | its own constants (over the hardware's) | rows fitted | error, fitted "
             "| rows judging | error, judging |", "|---|---|---|---|---|---|"]
    for stack in TRN1:
        kinds = ("fitted", "unseen", "withdrawn")
        errors = {k: [e for kind, _, _, es in runs[stack] if kind == k for e in es]
                  for k in kinds}
        counts = {k: sum(kind == k for kind, *_ in runs[stack]) for k in kinds}
        withdrawn = (f" ({counts['withdrawn']} withdrawn by the publisher: "
                     f"{_span(errors['withdrawn'])})" if counts["withdrawn"] else "")
        lines.append(f"| `{stack}` (trn1, trn1n) | {_constants(stack)} | {counts['fitted']} "
                     f"| {_span(errors['fitted'])} | {counts['unseen']} "
                     f"| {_span(errors['unseen'])}{withdrawn} |")
    lines.append(f"| `tensorrt-llm` (p5, p5e, p5en) | {_constants('tensorrt-llm')} "
                 f"| {len(gpu['fitted'])} | {_span(gpu['fitted'])} | {len(gpu['unseen'])} "
                 f"| {_span(gpu['unseen'])} |")
    lines.append("| `tensorrt-llm` on mixtures (GPT-OSS 20B, 120B; Qwen3-235B-A22B) | none for "
                 "their MoE layers (`mixture_overheads_fitted`: false) | 0 | none "
                 f"| {len(gpu['mixtures'])} | {_span(gpu['mixtures'])} |")
    lines += _trn2_summary()
    lines += ["", "| stack | row | model | batch | in / out | published | model | error |",
              "|---|---|---|---|---|---|---|---|"]
    for stack in TRN1:
        for kind, row, figures, errors in runs[stack]:
            if hasattr(row, "ms_per_token"):
                published = f"{row.ms_per_token:g} ms/token"
                model = f"{figures[0]:.3f} ms/token"
                error = f"{errors[0]:+.1%}"
            else:
                published = f"TTFT {row.ttft_ms:.2f}, TPOT {row.tpot_ms:.2f} ms"
                model = f"TTFT {figures[0]:.2f}, TPOT {figures[1]:.2f} ms"
                error = f"{errors[0]:+.1%}, {errors[1]:+.1%}"
            lines.append(f"| `{stack}` | {kind} | {row.model} | {row.batch} | "
                         f"{row.input_tokens:,} / {row.output_tokens:,} | {published} | "
                         f"{model} | {error} |")
    return "\n".join(lines) + "\n"


def _trn2_summary() -> list[str]:
    """The Trn2 stacks' summary lines: NxD Inference's fitted Llama rows and judging Qwen3
    row; the DeepSeek-V3 port's stack, its fitted row and judging vLLM batches."""
    from clustersim.calibration import models_serving as ms
    from clustersim.calibration.trn2 import TRN2_SERVING, UNFITTED
    errors: dict[tuple[str, str], list[float]] = {}
    for row in TRN2_SERVING:
        if row.name in UNFITTED:
            continue
        ttft, tpot = run_serving_row(file_for("serving", f"trn2-{row.name}"))
        found = errors.setdefault(("nxd-inference", "fitted"), [])
        found.append(ttft * 1e3 / row.ttft_ms - 1)
        if row.tpot_ms is not None:
            found.append(tpot * 1e3 / row.tpot_ms - 1)
    from clustersim.calibration.optimum_neuron import STACK as OPTIMUM
    for stack, _, _, published, model, role in model_rows():
        if stack.startswith("nxd-inference") or stack in (ms.SGLANG_STACK, OPTIMUM):
            kind = "fitted" if role == "fitted" else "judges"
            errors.setdefault((stack, kind), []).append(model / published - 1)
    out = []
    for stack in ("nxd-inference", ms.CONTRIB_STACK, ms.VLLM_STACK, OPTIMUM,
                  ms.SGLANG_STACK):
        fitted, judging = errors.get((stack, "fitted"), []), errors.get((stack, "judges"), [])
        hardware = ", ".join(stack_named(stack).hardware)
        out.append(f"| `{stack}` ({hardware}) | {_constants(stack)} | {len(fitted)} figures "
                   f"| {_span(fitted)} | {len(judging)} figures | {_span(judging)} |")
    return out


def model_rows() -> list[tuple[str, str, str, float, float, str]]:
    """(stack, row, figure, published, model, role) of 2025's models on Trn2, each run from
    its scenario file (times in ms)."""
    from clustersim.calibration import models_serving as ms
    out = []
    runs = [(ms.CONTRIB_STACK, "trn2-deepseek-v3-256-256-nxd-inference-contrib",
             ms.DEEPSEEK_TRN2, ms.DEEPSEEK_TRN2.ttft_ms, "fitted", "fitted")]
    runs += [(ms.VLLM_STACK, f"trn2-deepseek-v3-vllm-batch-{r.batch}", r, ms.VLLM_TTFT_MS,
              "judges (about 1.7 s)",
              "fitted" if r is ms.DEEPSEEK_VLLM_BATCHES[-1] else "judges")
             for r in ms.DEEPSEEK_VLLM_BATCHES]
    runs.append(("nxd-inference", "trn2-qwen3-32b-128-512-nxd-inference", ms.QWEN3_TRN2,
                 ms.QWEN3_TRN2.ttft_ms, "judges", "judges"))
    for stack, name, row, ttft_ms, ttft_role, tpot_role in runs:
        ttft, tpot = run_serving_row(file_for("serving", name))
        out.append((stack, name, "TTFT", ttft_ms, ttft * 1e3, ttft_role))
        out.append((stack, name, "TPOT", row.tpot_ms, tpot * 1e3, tpot_role))
    from clustersim.calibration import optimum_neuron as on
    for row in on.ROWS:
        name = on.row_name(row)
        ttft, itl = on.run_row(row)
        out.append((on.STACK, name, "TTFT", row.ttft_ms, ttft * 1e3,
                    "fitted" if row.model in on.BLOCKWISE_FITTED else "judges"))
        out.append((on.STACK, name, "inter-token", row.itl_ms, itl * 1e3,
                    "fitted" if row in on.FITTED else "judges"))
    from clustersim.calibration import trinity as tr
    for row in tr.TRINITY_ROWS:
        name = tr.row_name(row)
        ttft, tpot = run_serving_row(file_for("serving", name))
        out.append((ms.CONTRIB_STACK, name, "TTFT", row.ttft_ms, ttft * 1e3,
                    "judges (unseen model)"))
        out.append((ms.CONTRIB_STACK, name, "TPOT", row.tkg_ms, tpot * 1e3,
                    "judges (unseen model)"))
    for row in ms.SGLANG_H200:
        name = f"p5en-deepseek-v3-sglang-batch-{row.batch}"
        _, tpot = run_serving_row(file_for("serving", name))
        out.append((ms.SGLANG_STACK, name, "TPOT", row.tpot_ms, tpot * 1e3,
                    "fitted" if row is ms.SGLANG_H200[0] else "judges"))
    parts = ms.deepseek_breakdown()
    for part, published in ms.DEEPSEEK_PROFILE_MS.items():
        out.append((ms.CONTRIB_STACK, "DeepSeek-V3 port, profile of one token (batch 1)",
                    part.replace("_", " "), published, parts[part] * 1e3, "judges"))
    return out


def models_markdown() -> str:
    lines = ["| stack | row (scenario file) | figure | published (ms) | model (ms) | error "
             "| role |", "|---|---|---|---|---|---|---|"]
    for stack, name, figure, published, model, role in model_rows():
        shown = f"`{name}`" if name.startswith(("trn2-", "p5en-")) else name
        lines.append(f"| `{stack}` | {shown} | {figure} | {published:,.2f} | {model:,.2f} "
                     f"| {model / published - 1:+.1%} | {role} |")
    return "\n".join(lines) + "\n"


def _between(page: str, begin: str, end: str, tables: str) -> str:
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{tables}{end}{tail}"


def page_text(page: str, tables: str, models: str | None = None) -> str:
    page = _between(page, BEGIN, END, tables)
    if models is not None:
        page = _between(page, MODELS_BEGIN, MODELS_END, models)
    return page


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/calibration.md")
    args = parser.parse_args()
    tables, models = markdown(), models_markdown()
    if args.write:
        PAGE.write_text(page_text(PAGE.read_text(encoding="utf-8"), tables, models),
                        encoding="utf-8")
        print(f"wrote the stack tables of {PAGE.relative_to(ROOT)}")
    else:
        print(tables + "\n" + models, end="")


if __name__ == "__main__":
    main()
