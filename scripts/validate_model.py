"""The model against every published figure it is calibrated on or checked against.

    python scripts/validate_model.py            # every row: published, model, error
    python scripts/validate_model.py --steps    # training steps only (skip collectives)
    python scripts/validate_model.py --steps --markdown   # the step tables of docs/calibration.md

Training steps (clustersim/calibration/step.py, each run from its scenario file under
scenarios/calibration/training/ as `clustersim step` runs it): per chip family, the calibration rows (the
family's three constants were fitted to these) and the unseen rows (published runs the
constants were not fitted to), each with the published figure, the model's and the error
(model throughput / published throughput - 1, equal to published step time / model step time
- 1: positive means the model is too fast), then the family's fitted constants with their
meaning and the step-time error band that `clustersim step` and summary.json carry (the
largest under- and over-prediction over all the family's rows).
Collectives (clustersim/calibration/collectives.py): every nccom-test point, published and
model time, and the Trn2 16-rank example (clustersim/calibration/trn2.py). Serving: every
Trn1 row's TTFT and TPOT (clustersim/calibration/serving.py), every Trn2 row's
(clustersim/calibration/trn2.py) and every GPU max-throughput row's output tokens/s
(clustersim/calibration/gpu_serving.py), published and model, fitted and unseen.
Everything is computed here from the catalog's constants; nothing is cached.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # calibrate_serving's row printing

from clustersim.calibration.step import (  # noqa: E402
    FAMILIES,
    error,
    error_band,
    family_rows,
)
from clustersim.hardware.catalog import catalog_entry, catalog_sources
from clustersim.hardware.constants import Efficiency

_UNITS = {"sequences_per_s": "seq/s", "hfu": "HFU", "step_time_s": "s/step"}


def step_rows(family: str, visible: bool) -> list[tuple[str, float, float, float, str]]:
    """Each row run from its scenario file (scenarios/calibration/training/), as `clustersim
    step` runs it, with the schedule written there."""
    from clustersim.calibration.scenarios import file_for, run_training_row
    from clustersim.scenario.loader import load_scenario

    out = []
    for m in family_rows(family, visible):
        path = file_for("training", m.name)
        predicted = run_training_row(path, m.metric)
        job = load_scenario(path).jobs[0]
        note = f"micro-batch {job.micro_batch}, interleave {job.parallelism.interleave}"
        out.append((m.name, m.measured, predicted, error(m, predicted),
                    f"{_UNITS[m.metric]}; {note}; {m.source}"))
    return out


def print_steps() -> None:
    for family, (entry, members) in FAMILIES.items():
        hardware = catalog_entry(entry)
        eff = hardware.chip.efficiency
        print(f"\n== {family} family (fitted on {entry}; used by {', '.join(members)})")
        for visible, title in ((True, "calibration rows"), (False, "unseen rows (not fitted)")):
            rows = step_rows(family, visible)
            if not rows:
                continue
            print(f"-- {title}")
            print(f"  {'row':36s} {'published':>10s} {'model':>10s} {'error':>7s}")
            for name, published, predicted, err, note in rows:
                print(f"  {name:36s} {published:10.3f} {predicted:10.3f} {err:+7.1%}  {note}")
            errors = [r[3] for r in rows]
            mean = sum(abs(e) for e in errors) / len(errors)
            low, high = error_band(errors)
            print(f"  mean absolute error {mean:.1%}; largest {max(abs(e) for e in errors):.1%}; "
                  f"band [{low:+.1%}, {high:+.1%}]")
        print("-- constants (clustersim/catalog/hardware.yaml)")
        fields = Efficiency.model_fields
        sources = catalog_sources(entry)
        for key, value in (("matmul", eff.matmul), ("vector", eff.vector),
                           ("pass_overhead", f"{eff.pass_overhead_s * 1e3:.2f} ms"),
                           ("tile", eff.tile), ("k_tile", eff.k_tile),
                           ("wave_units", eff.wave_units),
                           ("step_error_band", list(eff.step_error_band))):
            name = key if key in fields else f"{key}_s"
            fitted = "fitted" if key in ("matmul", "vector", "pass_overhead") else "physical"
            if sources.get(f"chip.efficiency.{key}", "").startswith("BOUND-"):
                fitted = "bounded"
            if key == "step_error_band":
                fitted = "from the residuals"
            print(f"  {key:16s} {value!s:>14s}  ({fitted}) {fields[name].description}")
        framework = hardware.chip.framework
        print(f"  framework: attention {framework.attention}, gradients {framework.gradients}")


def print_markdown() -> None:
    """The step rows as the markdown tables of docs/calibration.md."""
    for family, (entry, _) in FAMILIES.items():
        eff = catalog_entry(entry).chip.efficiency
        for visible in (True, False):
            rows = step_rows(family, visible)
            if not rows:
                continue
            kind = "calibration" if visible else "unseen"
            print(f"\n{family}, {kind} rows:\n")
            print("| row | published | model | error | unit; schedule; source |")
            print("|---|---|---|---|---|")
            for name, published, predicted, err, note in rows:
                print(f"| {name} | {published:.3f} | {predicted:.3f} | {err:+.1%} | {note} |")
            errors = [r[3] for r in rows]
            print(f"\nMean absolute error {sum(abs(e) for e in errors) / len(errors):.1%}, "
                  f"largest {max(abs(e) for e in errors):.1%}.")
        print(f"\n{family} constants: matmul {eff.matmul}, vector {eff.vector}, pass_overhead "
              f"{eff.pass_overhead_s * 1e3:.2f} ms, band {list(eff.step_error_band)}")


def print_collectives() -> None:
    try:
        from clustersim.calibration.collectives import MEASUREMENTS, predict_times
    except ImportError as exc:  # the collectives calibration is being reshaped
        print(f"\n== collectives: not available ({exc})")
        return
    print("\n== collectives (trn1, nccom-test all-reduce; time in microseconds)")
    print(f"  {'ranks':>5s} {'instances':>9s} {'size':>12s} {'published':>10s} {'model':>10s} "
          f"{'error':>7s}")
    errors = []
    for m, predicted in zip(MEASUREMENTS, predict_times(), strict=True):
        err = predicted * 1e6 / m.time_us - 1
        errors.append(err)
        print(f"  {m.ranks:5d} {m.instances:9d} {m.size_bytes:12.0f} {m.time_us:10.0f} "
              f"{predicted * 1e6:10.0f} {err:+7.1%}  {m.source}")
    print(f"  mean absolute error {sum(abs(e) for e in errors) / len(errors):.1%}")
    from clustersim.calibration.trn2 import (
        EXAMPLE_FLOOR_US,
        TRN2_COLLECTIVES,
        predict_trn2_collectives,
    )
    print(f"\n== collectives (trn2, the 16-rank nccom-test example: 4 chips at LNC 2, the "
          f"algorithm it chose, its {EXAMPLE_FLOOR_US:.0f} us floor)")
    for m, predicted in zip(TRN2_COLLECTIVES, predict_trn2_collectives(), strict=True):
        print(f"  {m.ranks:5d} {1:9d} {m.size_bytes:12.0f} {m.time_us:10.0f} "
              f"{predicted * 1e6:10.0f} {predicted * 1e6 / m.time_us - 1:+7.1%}  {m.algorithm}")


def print_serving_trn2() -> None:
    """The Trn2 serving rows as scripts/calibrate_serving.py prints them, and the constants."""
    from calibrate_serving import print_trn2

    print_trn2()
    serving = catalog_entry("trn2").serving
    print(f"  constants: serving.hbm_efficiency {serving.hbm_efficiency}, "
          f"iteration_overhead {serving.iteration_overhead_s * 1e3:g} ms, "
          f"all_reduce {serving.all_reduce}, overlap_collectives {serving.overlap_collectives}")


def print_serving_gpu() -> None:
    """The GPU rows as scripts/calibrate_serving.py prints them (from their scenario runs)."""
    from calibrate_serving import print_gpu

    print_gpu()


def print_serving() -> None:
    """The Trn1 rows per transformers-neuronx release (its stack: SDK 2.18.0, 2.18.1, 2.16
    and 2.14), from their scenario runs as scripts/calibrate_serving.py prints them."""
    from calibrate_serving import print_trn1

    serving = catalog_entry("trn1").serving
    print("\n== serving (trn1.32xlarge, TP 32, bf16; transformers-neuronx; milliseconds)")
    print_trn1()
    print(f"  constants: serving.hbm_efficiency {serving.hbm_efficiency}, "
          f"iteration_overhead {serving.iteration_overhead_s * 1e3:g} ms, "
          f"prefill_layer_overhead {serving.prefill_layer_overhead_s * 1e3:g} ms, "
          f"attention {serving.attention} (score_efficiency {serving.score_efficiency}), "
          f"all_reduce {serving.all_reduce}")
    from clustersim.calibration.speculation import TRN2_SPECULATION, predict_speculation
    print("\n== serving on trn2 (check: NxD Inference Llama 3.3 70B tutorial, TP 64, "
          "10,000 in / 1,500 out; milliseconds)")
    for m, (ttft, tpot) in zip(TRN2_SPECULATION, predict_speculation(), strict=True):
        print(f"  {m.run:18s} TTFT {m.ttft_ms:8.1f} {ttft * 1e3:8.1f} "
              f"{ttft * 1e3 / m.ttft_ms - 1:+7.1%}   TPOT {m.tpot_ms:6.2f} {tpot * 1e3:6.2f} "
              f"{tpot * 1e3 / m.tpot_ms - 1:+7.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", action="store_true", help="training steps only")
    parser.add_argument("--markdown", action="store_true", help="step rows as markdown tables")
    args = parser.parse_args()
    if args.markdown:
        print_markdown()
        return
    print_steps()
    if not args.steps:
        print_collectives()
        print_serving()
        print_serving_trn2()
        print_serving_gpu()


if __name__ == "__main__":
    main()
