"""Fit the Trainium constants of the collectives and serving models (and, with --joint, the
Trn1 step constants) to the published measurements, one family at a time.

    python scripts/calibrate_collectives.py --joint    # the Trn1 fit: print its values
    python scripts/calibrate_collectives.py --check    # errors of the catalog values only
    python scripts/calibrate_collectives.py --check --joint   # ... with the training rows
    python scripts/calibrate_collectives.py --only score_efficiency   # one constant alone
    python scripts/calibrate_collectives.py --family trn2     # the Trn2 fit (Trn2 data only)
    python scripts/calibrate_collectives.py --family trn2 --check

Trn1 data (sources in docs/calibration.md): the four Trn1 nccom-test rows of the Neuron docs
and the full curves of the same page (`clustersim.calibration.collectives`: fp32 all-reduce,
2 ranks on one instance from 1 KiB to 1 GiB, 64 ranks on two instances from 8 B to 1 GiB;
the page names no instance type, 32 ranks per instance and its date make them
trn1.32xlarge, ranks filling a chip's two cores first), the six Trn1 serving rows of SDK
2.18.0 (`clustersim.calibration.serving`; the SDK 2.18.1 rows judge) and, with --joint, the
four Trn1 training rows (`clustersim.calibration.step`). Every Trn1 figure depends on the
collective costs, so the catalog's values come from the joint fit; without --joint the step
constants stay at the catalog's values.

Fitted on Trn1: the six `collectives` constants of trn1 (NeuronLink and EFA efficiency, the
HBM efficiency of collective data movement, the fixed time of an algorithm step over
NeuronLink, on one chip and over EFA), four `serving` constants (HBM efficiency of decode,
a fixed time per iteration, a fixed time per layer of a prefill, the HBM efficiency of
unfused attention's spilled score passes) with `--all-reduce` the serving all-reduce choice,
and with --joint the three step constants (`matmul`, `vector`, `pass_overhead`); a refit
with --joint keeps every training row no worse than before the prefill terms and every
serving row no worse than before or 10% (SERVING_BEFORE, STEP_BEFORE). The fit (a
coordinate search: multiplicative steps, additive ones for a
constant at zero) minimises the summed squared log errors: nccom-test points (1 MiB and up
weigh 3x), serving TTFTs and TPOTs (3x), training rows (3x), with a steep penalty beyond 20%
on the 2-rank and 64-rank curves from 1 MiB up, 14% on a serving figure and 7.5% on a
training row (the tests hold them to 25%, 15% and 8%).

Trn2 (`--family trn2`, `clustersim.calibration.trn2`): the 16-rank nccom-test example (mesh,
RDH, KangaRing: a Trn2 example, with its 300 us floor) and the NxD Inference Llama 3.3 70B
rows on trn2.48xlarge; the constants and what stays borrowed are listed below at
TRN2_PARAMETERS. The `serving.all_reduce` switch is chosen by fitting both and keeping the
lower loss.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clustersim.calibration.collectives import MEASUREMENTS, predict_times  # noqa: E402
from clustersim.calibration.serving import SERVING_MEASUREMENTS, predict_serving  # noqa: E402
from clustersim.calibration.step import error, family_rows, predict_step  # noqa: E402
from clustersim.hardware.catalog import catalog_entry  # noqa: E402

LARGE_BYTES = 2**20  # weigh the bandwidth-dominated points 3x

CURVE_LIMIT = 0.20  # the fit keeps the 2-rank and 64-rank curves this close from 1 MiB up
SERVING_LIMIT = 0.14  # and every serving TTFT and TPOT this close (the tests hold 15%)

PARAMETERS = ("link_efficiency", "efa_efficiency", "hbm_efficiency", "step_latency",
              "chip_step_latency", "efa_step_latency", "serving_hbm_efficiency",
              "serving_overhead", "prefill_layer_overhead", "score_efficiency")
SERVING = {"serving_hbm_efficiency": "hbm_efficiency", "serving_overhead": "iteration_overhead_s",
           "prefill_layer_overhead": "prefill_layer_overhead_s",
           "score_efficiency": "score_efficiency"}
STEP = ("matmul", "vector", "pass_overhead")  # with --joint: the Trainium step constants too
STEP_LIMIT = 0.075  # --joint keeps every Trn1 training row this close (the tests ask for 8%)
BOUNDS = {"link_efficiency": (0.05, 0.95), "efa_efficiency": (0.05, 0.95),
          "hbm_efficiency": (0.02, 1.0), "step_latency": (1e-6, 300e-6),
          "chip_step_latency": (1e-6, 300e-6), "efa_step_latency": (1e-6, 2000e-6),
          "serving_hbm_efficiency": (0.3, 0.95), "serving_overhead": (0.0, 5e-3),
          "prefill_layer_overhead": (0.0, 2e-3), "score_efficiency": (0.02, 1.0),
          # as scripts/calibrate_step.py bounds them (clustersim/calibration/step.py)
          "matmul": (0.3, 0.9), "vector": (0.25, 0.95), "pass_overhead": (1e-4, 0.1)}
FIELDS = {"link_efficiency": "link_efficiency", "efa_efficiency": "efa_efficiency",
          "hbm_efficiency": "hbm_efficiency", "step_latency": "step_latency_s",
          "chip_step_latency": "chip_step_latency_s", "efa_step_latency": "efa_step_latency_s"}


TRN1_ALL_REDUCE: str | None = None  # --all-reduce: the trn1 serving.all_reduce to fit with
# The errors before the refit (--joint): no training row may get worse, no serving row worse
# than its error or 10%, whichever is larger.
BEFORE: dict[str, np.ndarray] = {}
NO_WORSE_SLACK = 0.0
# The Trn1 rows' errors before unfused attention and the per-layer prefill overhead:
# (TTFT, TPOT) per serving row, and per training row; docs/calibration.md.
SERVING_BEFORE = {("llama2-7b", 1, 128, 8064): (-0.032, 0.020),
                  ("llama2-70b", 1, 128, 128): (-0.043, 0.018),
                  ("llama2-70b", 1, 2048, 2048): (-0.115, -0.034),
                  ("llama2-70b", 4, 128, 1024): (-0.052, 0.076)}
STEP_BEFORE = {"llama2-7b trn1 x16": -0.002, "llama2-13b trn1 x32": -0.001,
               "llama3.1-8b trn1 x32 (SDK 2.24)": -0.063,
               "llama3.1-8b trn1 x32 (SDK 2.21)": 0.070}


def hardware(values: dict[str, float]):
    base = catalog_entry("trn1")
    constants = base.collectives.model_copy(
        update={FIELDS[name]: values[name] for name in FIELDS})
    update = {SERVING[name]: values[name] for name in SERVING}
    if TRN1_ALL_REDUCE is not None:
        update["all_reduce"] = TRN1_ALL_REDUCE
    serving = base.serving.model_copy(update=update)
    return base.model_copy(update={"collectives": constants, "serving": serving})


def predict(values: dict[str, float]) -> list[float]:
    """Predicted time (s) of every nccom-test measurement with these constants on trn1."""
    return predict_times(hardware(values))


def serving_errors(values: dict[str, float]) -> np.ndarray:
    """Log errors of every serving row's TTFT and TPOT."""
    predicted = predict_serving(hardware(values))
    return np.array([math.log(p / (m * 1e-3)) for (ttft, tpot), row in
                     zip(predicted, SERVING_MEASUREMENTS, strict=True)
                     for p, m in ((ttft, row.ttft_ms), (tpot, row.tpot_ms))])


def step_errors(values: dict[str, float]) -> np.ndarray:
    """Log errors of the Trn1 training rows with these collectives and step constants."""
    collectives = {name: values[name] for name in FIELDS}  # the scenario keys
    efficiency = {name: values[name] for name in STEP}
    out = []
    for m in family_rows("trainium"):
        row = replace(m, hardware={"base": m.hardware, "collectives": collectives})
        predicted, _ = predict_step(row, efficiency)
        out.append(math.log1p(error(m, predicted)))
    return np.array(out)


def loss(values: dict[str, float]) -> float:
    predicted = np.array(predict(values))
    measured = np.array([m.time_us * 1e-6 for m in MEASUREMENTS])
    weights = np.array([3.0 if m.size_bytes >= LARGE_BYTES else 1.0
                        for m in MEASUREMENTS])
    errors = np.log(predicted / measured)
    curve = np.array([m.ranks in (2, 64) and m.size_bytes >= LARGE_BYTES for m in MEASUREMENTS])
    excess = np.maximum(0.0, np.abs(errors[curve]) - math.log(1 + CURVE_LIMIT))
    serving = serving_errors(values)
    serving_excess = np.maximum(0.0, np.abs(serving) - math.log(1 + SERVING_LIMIT))
    total = float(np.sum(weights * errors**2) + 1000.0 * np.sum(excess**2)
                  + 3.0 * np.sum(serving**2) + 1000.0 * np.sum(serving_excess**2))
    if "serving" in BEFORE:
        limit = np.maximum(BEFORE["serving"], math.log(1.10))
        total += 1000.0 * float(np.sum(np.maximum(0.0, np.abs(serving) - limit) ** 2))
    if "matmul" in values:
        steps = step_errors(values)
        steps_excess = np.maximum(0.0, np.abs(steps) - math.log(1 + STEP_LIMIT))
        total += 3.0 * float(np.sum(steps**2)) + 1000.0 * float(np.sum(steps_excess**2))
        if "steps" in BEFORE:
            worse = np.maximum(0.0, np.abs(steps) - BEFORE["steps"] - NO_WORSE_SLACK)
            total += 1000.0 * float(np.sum(worse**2))
    return total


def fit(start: dict[str, float], objective=None, bounds=None) -> dict[str, float]:
    """Coordinate search in log space, shrinking the step until it stops improving."""
    objective = objective or loss
    bounds = bounds or BOUNDS
    values = dict(start)
    best = objective(values)
    step = 0.5
    while step > 0.005:
        improved = False
        for name in values:
            for direction in (1, -1):
                trial = dict(values)
                low, high = bounds[name]
                if values[name] > 0:
                    moved = values[name] * math.exp(direction * step)
                else:  # a constant at zero: a step of the scale of its upper bound
                    moved = direction * step * 0.01 * high
                trial[name] = min(high, max(low, moved))
                score = objective(trial)
                if score < best - 1e-12:
                    values, best, improved = trial, score, True
        if not improved:
            step /= 2
    return values


def report(values: dict[str, float]) -> None:
    predicted = predict(values)
    print(f"{'ranks':>5} {'nodes':>5} {'size':>12} {'measured us':>12} {'model us':>10} "
          f"{'time err':>9} {'busbw err':>9}  source")
    for m, t in zip(MEASUREMENTS, predicted, strict=True):
        err = t / (m.time_us * 1e-6) - 1
        bus = "" if m.busbw_gib_s is None else f"{(m.time_us * 1e-6) / t - 1:+9.1%}"
        print(f"{m.ranks:5d} {m.instances:5d} {m.size_bytes:12.0f} {m.time_us:12.0f} "
              f"{t * 1e6:10.0f} {err:+9.1%} {bus:>9}  {m.source}")
    print(f"\n{'model':<12}{'batch':>6}{'in/out':>11}{'TTFT ms':>10}{'pub':>9}{'err':>8}"
          f"{'TPOT ms':>10}{'pub':>8}{'err':>8}")
    for (ttft, tpot), r in zip(predict_serving(hardware(values)), SERVING_MEASUREMENTS,
                               strict=True):
        print(f"{r.model:<12}{r.batch:>6}{f'{r.input_tokens}/{r.output_tokens}':>11}"
              f"{ttft * 1e3:>10.2f}{r.ttft_ms:>9.2f}{ttft * 1e3 / r.ttft_ms - 1:>+8.1%}"
              f"{tpot * 1e3:>10.2f}{r.tpot_ms:>8.2f}{tpot * 1e3 / r.tpot_ms - 1:>+8.1%}")
    if "matmul" in values:
        print()
        for m, e in zip(family_rows("trainium"), np.expm1(step_errors(values)), strict=True):
            print(f"{m.name:36s} published {m.measured:8.3f}  error {e:+7.1%}")


# --------------------------------------------------------------------------- Trn2
# Fitted on Trn2 data only (clustersim.calibration.trn2): the 16-rank nccom-test example and
# the NxD Inference Llama 3.3 70B rows. What they constrain: NeuronLink and HBM efficiency of
# collectives and the step latencies over NeuronLink and on one chip (the example's four
# rows; the TTFTs' large all-reduces; the TPOT's 160 small ones), the serving HBM efficiency,
# iteration and per-layer prefill overheads (the TPOTs, the short-prompt TTFTs) and the matmul
# efficiency (prefill: NxD Inference's NKI kernels, not a training step). No Trn2 training
# step is published: the step constants (`matmul`, `vector`, `pass_overhead`) and EFA stay
# Trn1's (borrowed), and the Trn2 step band is Trn1's widened by the Trn2 rows' errors.
TRN2_PARAMETERS = ("link_efficiency", "hbm_efficiency", "step_latency", "chip_step_latency",
                   "serving_hbm_efficiency", "serving_overhead", "prefill_layer_overhead",
                   "matmul")
TRN2_COLLECTIVE_LIMIT = 0.25  # the bandwidth-bound 512 MB KangaRing row stays this close
# NxD Inference under vLLM: the fixed host time per iteration may be far above Trn1's
TRN2_BOUNDS = {**BOUNDS, "serving_overhead": (0.0, 0.05), "prefill_overhead": (0.0, 0.2)}
TRN2_SERVING_LIMIT = 0.09  # every fitted Trn2 TTFT and TPOT this close (the issue asks 10%)


def trn2_hardware(values: dict[str, float], all_reduce: str):
    base = catalog_entry("trn2")
    constants = base.collectives.model_copy(
        update={FIELDS[name]: values[name] for name in FIELDS if name in values})
    serving = base.serving.model_copy(update={
        **{SERVING[name]: values[name] for name in SERVING if name in values},
        "all_reduce": all_reduce,
        "overlap_collectives": True, "prefill_overhead_s": values.get("prefill_overhead", 0.0),
        "matmul_efficiency": values["matmul"]})
    return base.model_copy(update={"collectives": constants, "serving": serving})


def trn2_errors(values: dict[str, float], all_reduce: str):
    """(collective log errors, serving log errors with their weights)."""
    from clustersim.calibration.trn2 import (
        TRN2_COLLECTIVES,
        TRN2_SERVING,
        UNFITTED,
        predict_trn2_collectives,
        predict_trn2_serving,
    )
    hw = trn2_hardware(values, all_reduce)
    coll = np.array([math.log(t / (m.time_us * 1e-6)) for m, t in
                     zip(TRN2_COLLECTIVES, predict_trn2_collectives(hw), strict=True)])
    serving, weights = [], []
    for row, predicted in zip(TRN2_SERVING, predict_trn2_serving(hw), strict=True):
        if predicted is None:
            continue
        weight = 0.0 if row.name in UNFITTED else 1.0
        for p, m in zip(predicted, (row.ttft_ms, row.tpot_ms), strict=True):
            if p is not None and m is not None:
                serving.append(math.log(p / (m * 1e-3)))
                weights.append(weight)
    return coll, np.array(serving), np.array(weights)


# The runtime's algorithm choices the model's `auto` must keep (cheapest within Neuron's size
# bands): the 16-rank example's (mesh, RDH, KangaRing, KangaRing) and RDH inside its band on
# a whole instance (64 ranks: 8 MB and 40 MB), Neuron's documented choice there.
TRN2_CHOICES = ((16, 131072, ("mesh", "mesh1")), (16, 2e6, ("rdh",)), (16, 32e6, ("kangaring",)),
                (16, 512e6, ("kangaring",)), (64, 8e6, ("rdh",)), (64, 40e6, ("rdh",)))


KEEP_CHOICES = False  # --keep-choices: penalise them (the catalog's fit does not: see docs)


def trn2_choice_misses(hw) -> np.ndarray:
    """Log of (time of the algorithm auto takes / time of the runtime's), 0 where they agree."""
    from clustersim.collectives.model import CollectiveModel, place_ranks
    from clustersim.hardware.build import build_topology
    model = CollectiveModel(build_topology(hw, 1))
    out = []
    for ranks, size, expected in TRN2_CHOICES:
        group = place_ranks(model.topology, ranks, 1)
        chosen = model.cost("all-reduce", group, size)
        if chosen.algorithm in expected:
            out.append(0.0)
            continue
        published = min(model.cost("all-reduce", group, size, intra=a).time_s for a in expected)
        out.append(math.log(published / chosen.time_s) + 0.01)
    return np.array(out)


def trn2_loss(values: dict[str, float], all_reduce: str) -> float:
    coll, serving, weights = trn2_errors(values, all_reduce)
    misses = (trn2_choice_misses(trn2_hardware(values, all_reduce)) if KEEP_CHOICES
              else np.zeros(1))
    excess = np.maximum(0.0, np.abs(serving) - math.log(1 + TRN2_SERVING_LIMIT)) * weights
    bandwidth = max(0.0, abs(coll[-1]) - math.log(1 + TRN2_COLLECTIVE_LIMIT))
    return float(np.sum(coll**2) + 3.0 * np.sum(weights * serving**2)
                 + 1000.0 * np.sum(excess**2) + 1000.0 * bandwidth**2
                 + 1000.0 * np.sum(misses**2))


def trn2_main(check: bool, choices: tuple[str, ...] = ("mesh", "auto")) -> None:
    from clustersim.calibration.trn2 import (
        TRN2_COLLECTIVES,
        TRN2_SERVING,
        UNFITTED,
        UNSEEN_TRN2_SERVING,
        predict_trn2_collectives,
        predict_trn2_serving,
    )
    hw = catalog_entry("trn2")
    c = hw.collectives
    start = {name: getattr(c, FIELDS[name]) for name in TRN2_PARAMETERS if name in FIELDS}
    start.update(serving_hbm_efficiency=hw.serving.hbm_efficiency,
                 serving_overhead=hw.serving.iteration_overhead_s,
                 prefill_layer_overhead=hw.serving.prefill_layer_overhead_s,
                 matmul=hw.serving.matmul_efficiency or hw.chip.efficiency.matmul)
    if start["chip_step_latency"] is None:
        start["chip_step_latency"] = start["step_latency"]
    all_reduce = hw.serving.all_reduce
    if not check:
        # a start off the lower bound: the search moves a constant by factors
        start["serving_overhead"] = max(1e-3, start["serving_overhead"])
        start["prefill_layer_overhead"] = max(1e-5, start["prefill_layer_overhead"])
        best = None
        for choice in choices:
            values = fit(start, lambda v, choice=choice: trn2_loss(v, choice), TRN2_BOUNDS)
            score = trn2_loss(values, choice)
            print(f"all_reduce {choice}: loss {score:.4f}")
            if best is None or score < best[0]:
                best = (score, values, choice)
        _, start, all_reduce = best
        print(f"fitted constants (trn2, all_reduce {all_reduce}):")
        for name, value in start.items():
            shown = (f"{value * 1e6:.1f}us" if "latency" in name or "overhead" in name
                     else f"{value:.3f}")
            print(f"  {name}: {shown}")
    hw = trn2_hardware(start, all_reduce)
    print(f"\n{'ranks':>5} {'size':>12} {'algorithm':>10} {'published us':>13} {'model us':>9} "
          f"{'error':>8}")
    for m, t in zip(TRN2_COLLECTIVES, predict_trn2_collectives(hw), strict=True):
        print(f"{m.ranks:5d} {m.size_bytes:12.0f} {m.algorithm:>10} {m.time_us:13.0f} "
              f"{t * 1e6:9.0f} {t / (m.time_us * 1e-6) - 1:+8.1%}")
    misses = trn2_choice_misses(hw)
    for (ranks, size, expected), miss in zip(TRN2_CHOICES, misses, strict=True):
        if miss:
            print(f"auto on {ranks} ranks at {size:.0f} B does not take {'/'.join(expected)} "
                  f"(the runtime's choice; it would cost {math.exp(miss - 0.01) - 1:+.0%})")
    for title, rows in (("fitted", TRN2_SERVING), ("unseen (not fitted)", UNSEEN_TRN2_SERVING)):
        print(f"\n-- Trn2 serving rows, {title}")
        for row, p in zip(rows, predict_trn2_serving(hw, rows), strict=True):
            if p is None:
                print(f"{row.name:52s} not priced (no draft costs in the serving model)")
                continue
            tpot = "" if row.tpot_ms is None else (
                f"  TPOT {p[1] * 1e3:7.2f} pub {row.tpot_ms:6.2f} "
                f"{p[1] * 1e3 / row.tpot_ms - 1:+7.1%}")
            note = "  (set apart, not fitted: weight 0)" if row.name in UNFITTED else ""
            print(f"{row.name:52s} TTFT {p[0] * 1e3:8.1f} pub {row.ttft_ms:7.1f} "
                  f"{p[0] * 1e3 / row.ttft_ms - 1:+7.1%}{tpot}{note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report the catalog's values only")
    parser.add_argument("--joint", action="store_true",
                        help="fit the Trainium step constants too, with the Trn1 training rows")
    parser.add_argument("--family", choices=("trn1", "trn2"), default="trn1",
                        help="trn1 (default) or trn2: fit that family on its own data only")
    parser.add_argument("--all-reduce", choices=("mesh", "auto", "cheapest"), action="append",
                        help="trn2: the serving.all_reduce choices to fit (default mesh and "
                        "auto); trn1: the one to fit with (default the catalog's)")
    parser.add_argument("--keep-choices", action="store_true",
                        help="trn2: also hold auto to the runtime's algorithm choices")
    parser.add_argument("--only", nargs="+", choices=PARAMETERS + STEP, metavar="NAME",
                        help="trn1: fit these constants alone, the others held at the "
                        "catalog's (e.g. score_efficiency, which only the prompts whose "
                        "scores spill move)")
    args = parser.parse_args()
    if args.only and (args.check or args.family == "trn2"):
        parser.error("--only fits some trn1 constants: it does not go with --check or "
                     "--family trn2")
    if args.only and not args.joint and set(args.only) & set(STEP):
        parser.error(f"--only {' '.join(sorted(set(args.only) & set(STEP)))}: the step "
                     "constants are fitted with --joint only")
    if args.family == "trn2":
        global KEEP_CHOICES
        KEEP_CHOICES = args.keep_choices
        trn2_main(args.check, tuple(args.all_reduce or ("mesh", "auto")))
        return
    c = catalog_entry("trn1").collectives
    current = {name: getattr(c, field) for name, field in FIELDS.items()}
    serving = catalog_entry("trn1").serving
    current.update({name: getattr(serving, field) for name, field in SERVING.items()})
    if args.joint:
        efficiency = catalog_entry("trn1").chip.efficiency
        current.update(matmul=efficiency.matmul, vector=efficiency.vector,
                       pass_overhead=efficiency.pass_overhead_s)
    if current["chip_step_latency"] is None:
        current["chip_step_latency"] = current["step_latency"]
    if args.all_reduce:
        global TRN1_ALL_REDUCE
        TRN1_ALL_REDUCE = args.all_reduce[0]
    if args.joint and not args.check:
        BEFORE["serving"] = np.array([
            abs(math.log1p(e)) for m in SERVING_MEASUREMENTS
            for e in SERVING_BEFORE.get((m.model, m.batch, m.input_tokens, m.output_tokens),
                                        (SERVING_LIMIT, SERVING_LIMIT))])
        BEFORE["steps"] = np.array([abs(math.log1p(STEP_BEFORE[m.name]))
                                    for m in family_rows("trainium")])
    if not args.check:
        if args.only:
            held = {name: value for name, value in current.items() if name not in args.only}
            fitted = fit({name: current[name] for name in args.only},
                         lambda free: loss({**held, **free}))
            current = {**held, **fitted}
        else:
            current = fit(current)
        print("fitted constants:")
        for name in current:
            shown = (f"{current[name] * 1e6:.1f}us" if "latency" in name or "overhead" in name
                     else f"{current[name]:.3f}")
            print(f"  {name}: {shown}")
        print(f"loss: {loss(current):.3f}")
    report(current)


if __name__ == "__main__":
    main()
