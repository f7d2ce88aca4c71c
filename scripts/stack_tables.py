"""The serving stacks' tables of docs/calibration.md, from the calibration rows' scenario runs.

    python scripts/stack_tables.py            # print the markdown (between the page's markers)
    python scripts/stack_tables.py --write    # rewrite that part of docs/calibration.md

Every Trn1 row (each transformers-neuronx release on its own rows: SDK 2.18.0, 2.18.1, 2.16,
2.14) and every TensorRT-LLM row is run from its scenario file under
scenarios/calibration/serving/ as `clustersim run` runs it, and printed with its error
(model / published - 1). tests/test_docs.py fails when the page's tables are not what this
prints.
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
from clustersim.calibration.serving_stacks import per_token_s, release_rows  # noqa: E402
from clustersim.hardware.stacks import stack_named  # noqa: E402

PAGE = ROOT / "docs" / "calibration.md"
BEGIN = "<!-- stack tables: python scripts/stack_tables.py --write -->"
END = "<!-- end of stack tables -->"
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
        shown.append(f"`{key}` {value * 1e6:.2f} us" if key.endswith("_s")
                     else f"`{key}` {value:.3g}")
    return ", ".join(shown)


def trn1_rows(stack: str) -> list[tuple[str, object, tuple[float, ...]]]:
    """(fitted or unseen, row, errors) of a release's rows from their scenario runs:
    (TTFT, TPOT) errors, or the one per-token-latency error for SDK 2.14 and 2.16 rows."""
    out = []
    fitted, unseen = release_rows(stack)
    for kind, table in (("fitted", fitted), ("unseen", unseen)):
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
        UNSEEN_GPU_OTHER,
        UNSEEN_GPU_SERVING,
    )

    runs = {stack: trn1_rows(stack) for stack in TRN1}
    gpu = {kind: [run_throughput_row(file_for("serving", gpu_name(r))) / r.output_tokens_per_s
                  - 1 for r in table]
           for kind, table in (("fitted", GPU_SERVING),
                               ("unseen", UNSEEN_GPU_SERVING + UNSEEN_GPU_OTHER))}
    lines = ["| stack | its own constants (over the hardware's) | rows fitted | error, fitted "
             "| rows judging | error, judging |", "|---|---|---|---|---|---|"]
    for stack in TRN1:
        errors = {k: [e for kind, _, _, es in runs[stack] if kind == k for e in es]
                  for k in ("fitted", "unseen")}
        counts = {k: sum(kind == k for kind, *_ in runs[stack]) for k in ("fitted", "unseen")}
        lines.append(f"| `{stack}` (trn1, trn1n) | {_constants(stack)} | {counts['fitted']} "
                     f"| {_span(errors['fitted'])} | {counts['unseen']} "
                     f"| {_span(errors['unseen'])} |")
    lines.append(f"| `tensorrt-llm` (p5, p5e, p5en) | {_constants('tensorrt-llm')} "
                 f"| {len(gpu['fitted'])} | {_span(gpu['fitted'])} | {len(gpu['unseen'])} "
                 f"| {_span(gpu['unseen'])} |")
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


def page_text(page: str, tables: str) -> str:
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{tables}{END}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/calibration.md")
    args = parser.parse_args()
    tables = markdown()
    if args.write:
        PAGE.write_text(page_text(PAGE.read_text(encoding="utf-8"), tables), encoding="utf-8")
        print(f"wrote the stack tables of {PAGE.relative_to(ROOT)}")
    else:
        print(tables, end="")


if __name__ == "__main__":
    main()
