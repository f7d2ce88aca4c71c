"""Serving stacks and their releases, each fitted on its own published rows.

transformers-neuronx on trn1.32xlarge has two releases in the Neuron docs' SDK 2.18 data
files: 2.18.0 (the rows the trn1 entry's serving constants are fitted on, with the Trn1
collectives and step constants: scripts/calibrate_collectives.py --joint) and 2.18.1 (the
Llama 3 70B rows, which encode long contexts 26-49% faster than the 2.18.0 fit gives). The
2.18.1 release (`stack: transformers-neuronx@2.18.1`, catalog/stacks.yaml) keeps the
hardware's constants but two, fitted here on its six rows: `matmul_efficiency` (the fraction
of peak its context-encoding matmuls reach: its batch-4 short prompts are 12% faster) and
`score_efficiency` (the HBM rate of its spilled unfused score passes: its 2,048-token
prompts). Nothing is fitted per row.

The same page's older data files (SDK 2.14 and 2.16: "latency per token", a request's time
over its input and output tokens) are two more releases, each fitted on its own Llama 2 13B
rows: `transformers-neuronx@2.16` with `tp_step_latency_s` (the per-step time of its TP
all-reduce, which the 13B's decode at TP 32 is mostly made of: 80 all-reduces a token) and
`score_efficiency` (its 3,968-token prompt), `transformers-neuronx@2.14` with
`tp_step_latency_s` alone (its one row). The 2.16 file's two Llama 2 70B rows, five to six
times slower than any 2.18 row of that model on the same instance, were withdrawn by their
publisher (`withdrawn_rows`): shown with their error, they judge nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from clustersim.calibration.serving import (
    SERVING_MEASUREMENTS,
    UNSEEN_SERVING,
    UNSEEN_SERVING_218,
    TokenLatencyMeasurement,
    predict_serving,
)
from clustersim.hardware.catalog import catalog_entry
from clustersim.hardware.stacks import stack_named, with_stack

__all__ = ["RELEASE_2181", "RELEASE_FITTED", "RELEASES", "release_rows", "predict_release",
           "fit_release", "per_token_s", "withdrawn_rows"]

RELEASE_2181 = "transformers-neuronx@2.18.1"
RELEASE_FITTED = ("matmul_efficiency", "score_efficiency")
_BOUNDS = {"matmul_efficiency": (0.3, 0.9), "score_efficiency": (0.05, 1.0),
           "tp_step_latency_s": (1e-6, 3e-5)}


def _sdk(version: str, model: str | None = None, keep: bool = True) -> tuple:
    return tuple(r for r in UNSEEN_SERVING if r.sdk == version and not r.withdrawn
                 and (model is None or (r.model == model) == keep))


def withdrawn_rows(stack: str) -> tuple:
    """A release's rows that their publisher withdrew (clustersim.calibration.serving): run
    and shown with their error, neither fitted nor judging."""
    return tuple(r for r in UNSEEN_SERVING if r.withdrawn
                 and stack == f"transformers-neuronx@{r.sdk}")


# stack: (its fitted rows, its unseen rows, the constants fitted on them)
RELEASES: dict[str, tuple[tuple, tuple, tuple[str, ...]]] = {
    RELEASE_2181: (tuple(r for r in UNSEEN_SERVING_218 if r.sdk == "2.18.1"), (),
                   RELEASE_FITTED),
    "transformers-neuronx@2.16": (_sdk("2.16", "llama2-13b"), _sdk("2.16", "llama2-13b", False),
                                  ("tp_step_latency_s", "score_efficiency")),
    "transformers-neuronx@2.14": (_sdk("2.14"), (), ("tp_step_latency_s",)),
}


def release_rows(stack: str) -> tuple[tuple, tuple]:
    """(fitted, unseen) rows of a transformers-neuronx release (ServingMeasurement rows, or
    TokenLatencyMeasurement rows for SDK 2.14 and 2.16)."""
    if stack in RELEASES:
        fitted, unseen, _ = RELEASES[stack]
        return fitted, unseen
    return SERVING_MEASUREMENTS, tuple(r for r in UNSEEN_SERVING_218 if r.sdk == "2.18.0")


def per_token_s(row, ttft_s: float, tpot_s: float) -> float:
    """A token-latency row's figure from TTFT and TPOT: the request's time over its input
    plus output tokens."""
    return (ttft_s + tpot_s * (row.output_tokens - 1)) / (row.input_tokens + row.output_tokens)


def predict_release(stack: str, rows: tuple,
                    constants: Mapping[str, float] | None = None) -> list[tuple[float, float]]:
    """(TTFT s, TPOT s) of rows on trn1 with the release's serving constants (or trial
    ones)."""
    hardware = with_stack(catalog_entry("trn1"), stack_named(stack))
    if constants:
        hardware = hardware.model_copy(update={
            "serving": hardware.serving.model_copy(update=dict(constants))})
    return predict_serving(hardware, rows, stack)


def _loss(stack: str, rows, constants: Mapping[str, float]) -> float:
    total = 0.0
    for row, (ttft, tpot) in zip(rows, predict_release(stack, rows, constants), strict=True):
        if isinstance(row, TokenLatencyMeasurement):
            total += math.log(per_token_s(row, ttft, tpot) * 1e3 / row.ms_per_token) ** 2
        else:
            total += (math.log(ttft * 1e3 / row.ttft_ms) ** 2
                      + math.log(tpot * 1e3 / row.tpot_ms) ** 2)
    return total



def golden_log_minimum(loss: Callable[[float], float], bounds: tuple[float, float],
                       tolerance: float) -> float:
    """The value within bounds minimising loss, by golden-section search on its log (the
    fits' constants span decades), until the log interval is narrower than tolerance."""
    ratio = (math.sqrt(5) - 1) / 2
    lo, hi = (math.log(b) for b in bounds)
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = loss(math.exp(a)), loss(math.exp(b))
    while hi - lo > tolerance:
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = loss(math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = loss(math.exp(b))
    return math.exp((lo + hi) / 2)

def fit_release(stack: str = RELEASE_2181, start: Mapping[str, float] | None = None,
                rounds: int = 4) -> dict[str, float]:
    """Coordinate search (golden section on each constant's log, in turn) of the release's
    constants on its rows' squared log errors."""
    rows, _ = release_rows(stack)
    keys = RELEASES[stack][2]
    hardware = with_stack(catalog_entry("trn1"), stack_named(stack))
    defaults = {"matmul_efficiency": 0.583,
                "tp_step_latency_s": hardware.collectives.step_latency_s}
    values = dict(start or {k: getattr(hardware.serving, k) or defaults[k] for k in keys})
    for _ in range(rounds if len(keys) > 1 else 1):
        for key in keys:
            values[key] = golden_log_minimum(
                lambda v, key=key: _loss(stack, rows, {**values, key: v}), _BOUNDS[key], 1e-3)
    return values
