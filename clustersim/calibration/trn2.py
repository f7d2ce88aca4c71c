"""Published Trainium2 measurements: what the trn2 constants are fitted to, and what judges them.

Collectives: the 16-rank `--show-algorithm` example of the nccom-test page (Neuron docs,
tools/neuron-sys-tools/nccom-test, added in SDK 2.28; fp32 all-reduce). It names mesh, RDH and
KangaRing, and KangaRing exists only on Trn2, so these are Trn2 rows: 16 ranks at LNC 2 fill
4 chips of one trn2.48xlarge (4 ranks per chip, as the runtime places them). The example's
small sizes sit on a flat 300 us floor (4 B to 8 KiB), far above the 1-2 us per hop the same
page gives inside an instance: that floor is the example's (its harness), not the hardware's,
so a row's model time is max(floor, the algorithm's time).

Serving (NxD Inference on one trn2.48xlarge, LNC 2, TP 64, bf16, vLLM; TTFT and TPOT p50):
- the Llama 3.3 70B tutorial (SDK 2.29 data file llama70b_perf_comparison.csv): batch 1,
  10,000 input and 1,500 output tokens, without speculation and with fused speculation
  (Llama 3.2 1B draft, 7 speculative tokens). The model is compiled with bucketing up to a
  12,288-token context (`--max-context-length 12288 --enable-bucketing`): NxD's default
  context-encoding buckets are powers of two up to that length, so a 10,000-token prompt runs
  the 12,288-token bucket (`prefill_tokens`).
- the prefix-caching tutorial's rows without cache hits (llama70b_apc_perf_comparison.csv:
  compiled batch 4, context-encoding buckets 512 to 8,192, one prompt encoded at a time):
  HumanEval (no cache hit: prompts under 512 tokens) and dynamic sonnet 1k and 2k without
  prefix caching, read as prompts of 1,024 and 2,048 tokens each in its bucket.
- the Llama 3.1 405B tutorials' rows on the same instance (llama405b_perf_comparison.csv and
  trn2-llama3.1-405b-tutorial: 10,000 in, about 1,785 out, context-encoding buckets 2,048 /
  4,096 / 10,240 / 12,288), fitted since they were needed to separate decode's weight
  streaming from its fixed time per iteration; they judged the fit before.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.collectives.model import CollectiveModel, place_ranks
from clustersim.hardware.build import build_topology
from clustersim.hardware.catalog import HardwareSpec, catalog_entry

__all__ = ["Trn2Collective", "TRN2_COLLECTIVES", "EXAMPLE_FLOOR_US", "predict_trn2_collectives",
           "Trn2Serving", "TRN2_SERVING", "UNSEEN_TRN2_SERVING", "predict_trn2_serving", "UNFITTED",
           "step_band"]

EXAMPLE_FLOOR_US = 300.0  # the 16-rank example's flat floor from 4 B to 8 KiB

_NCCOM = "Neuron docs, nccom-test (16-rank --show-algorithm example, SDK 2.28)"


@dataclass(frozen=True)
class Trn2Collective:
    ranks: int
    size_bytes: float
    algorithm: str  # as the example prints it; the model runs the same one
    time_us: float
    busbw_gb_s: float
    source: str = _NCCOM


TRN2_COLLECTIVES: tuple[Trn2Collective, ...] = (
    Trn2Collective(16, 131072, "mesh", 574, 0.43),
    Trn2Collective(16, 2e6, "rdh", 686, 5.7),
    Trn2Collective(16, 32e6, "kangaring", 2754, 22.8),
    Trn2Collective(16, 512e6, "kangaring", 9690, 103.9),
)


def predict_trn2_collectives(hardware: HardwareSpec | None = None) -> list[float]:
    """Model time (s) of every 16-rank row on one trn2.48xlarge (or on `hardware`), with the
    algorithm the example chose and the example's floor."""
    hardware = hardware or catalog_entry("trn2")
    topology = build_topology(hardware, 1)
    model = CollectiveModel(topology)
    out = []
    for m in TRN2_COLLECTIVES:
        group = place_ranks(topology, m.ranks, 1)
        time_s = model.cost("all-reduce", group, m.size_bytes, intra=m.algorithm).time_s
        out.append(max(EXAMPLE_FLOOR_US * 1e-6, time_s))
    return out


_TUTORIAL = "Neuron docs, NxD Inference tutorial Llama 3.3 70B on trn2 (SDK 2.29)"
_APC = "Neuron docs, NxD Inference prefix-caching tutorial, Llama 3.3 70B on trn2, no cache hits"
_405B = "Neuron docs, NxD Inference Llama 3.1 405B tutorials on trn2"


@dataclass(frozen=True)
class Trn2Serving:
    """One published NxD Inference run on one trn2.48xlarge at TP 64: one request at a time
    (TTFT: its prompt, padded to the compiled bucket `prefill_tokens`, alone)."""

    name: str
    model: str
    input_tokens: int
    output_tokens: int
    prefill_tokens: int  # the context-encoding bucket the prompt runs in
    ttft_ms: float
    tpot_ms: float | None  # None: TTFT only
    precision: str = "bf16"
    draft: str | None = None  # fused speculation: the draft model
    speculative_tokens: int = 0
    source: str = _TUTORIAL
    tp: int = 64


TRN2_SERVING: tuple[Trn2Serving, ...] = (
    Trn2Serving("llama3.3-70b 10000/1500", "llama3.1-70b", 10000, 1500, 12288, 814.3, 19.66),
    Trn2Serving("llama3.3-70b 10000/1500 fused speculation", "llama3.1-70b", 10000, 1500,
                12288, 870.1, 5.39, draft="llama3.2-1b", speculative_tokens=7),
    Trn2Serving("llama3.3-70b HumanEval (prefix caching off)", "llama3.1-70b", 512, 1, 512,
                89.7, None, source=_APC),
    Trn2Serving("llama3.3-70b sonnet 1k (prefix caching off)", "llama3.1-70b", 1024, 1, 1024,
                123.08, None, source=_APC),
    Trn2Serving("llama3.3-70b sonnet 2k (prefix caching off)", "llama3.1-70b", 2048, 1, 2048,
                592.8, None, source=_APC),
    # The Llama 3.1 405B rows joined the fit (they judged it before): the 70B rows alone
    # cannot tell decode's weight streaming from its fixed time per iteration (docs).
    Trn2Serving("llama3.1-405b 10000/1785", "llama3.1-405b", 10000, 1785, 10240, 2442.0, 37.9,
                source=_405B),
    Trn2Serving("llama3.1-405b fp8 10000/1785 fused speculation", "llama3.1-405b", 10000,
                1785, 10240, 2255.0, 8.27, precision="fp8", draft="llama3.2-1b",
                speculative_tokens=7, source=_405B),
)

# Reported with weight 0 in the fit: the other three TTFTs of the same model and instance lie
# on one line (about 0.062 ms per prompt token over 58 ms), which puts a 2,048-token prompt
# near 185 ms; 592.8 ms is 3.2 times that (the table gives neither the prompts' lengths nor
# the client's concurrency, so queueing or longer prompts may be in it).
UNFITTED = ("llama3.3-70b sonnet 2k (prefix caching off)",)

# No Trn2 serving row is left unseen: the 405B rows are in the fit since the 70B rows alone
# left the decode HBM efficiency open (docs/calibration.md).
UNSEEN_TRN2_SERVING: tuple[Trn2Serving, ...] = ()


def _decode_cost(row: Trn2Serving, topology):
    """The replica's decode costs. NxD Inference's fused speculation runs the draft on the
    target's tensor-parallel group, in bf16, inside the target's graph; its acceptance is the
    serving model's documented default (not fitted here). fp8 weights on Neuron are
    weight-only: activations and the KV cache stay bf16."""
    from clustersim.scenario.serving import DEFAULT_ACCEPTANCE
    from clustersim.serving.iteration import IterationModel, ReplicaShape
    from clustersim.serving.replica import DecodeCost
    from clustersim.training.transformer import TransformerShape, model_preset_values

    def shape(model: str, precision: str) -> ReplicaShape:
        return ReplicaShape(TransformerShape(**model_preset_values(model)), precision, row.tp,
                            1, "bf16", "bf16")

    target = IterationModel(shape(row.model, row.precision), topology)
    if row.draft is None:
        return DecodeCost(target)
    draft = IterationModel(shape(row.draft, "bf16"), topology)
    return DecodeCost(target, draft, row.speculative_tokens, DEFAULT_ACCEPTANCE, fused=True)


def predict_trn2_serving(hardware: HardwareSpec | None = None,
                         rows: tuple[Trn2Serving, ...] = TRN2_SERVING
                         ) -> list[tuple[float, float | None] | None]:
    """Model (TTFT s, TPOT s or None) of every row on one trn2.48xlarge (or on `hardware`);
    None for a row the serving model cannot price."""
    hardware = hardware or catalog_entry("trn2")
    topology = build_topology(hardware, 1)
    out: list[tuple[float, float | None] | None] = []
    for row in rows:
        cost = _decode_cost(row, topology)
        ttft = cost.prefill_s([(row.prefill_tokens, 0)], 0, 0.0, 1)
        tpot = None
        if row.tpot_ms is not None:
            n = row.output_tokens - 1
            iterations = n / cost.tokens_per_iteration
            tpot = cost.run_s(1, row.input_tokens + 1, iterations) / n
        out.append((ttft, tpot))
    return out


def step_band(trn1_band: tuple[float, float], hardware: HardwareSpec | None = None
              ) -> tuple[float, float]:
    """Trn2's step-time error band: Trn1's (the Trainium family's `vector` and
    `pass_overhead`, which the Trn2 rows only bound, and the training model's structure are
    tested there), widened by the errors of the Trn2 training rows (AXLearn, fitted) and of
    the Trn2 prefill rows (large GEMMs and TP collectives; fitted with weight and unseen),
    each as published time / model time - 1 (positive: the model too fast)."""
    from clustersim.calibration.trn2_training import trn2_errors

    low, high = trn1_band
    if hardware is None:  # the training rows run the catalog's trn2
        for _, _, e in trn2_errors():
            low, high = min(low, e), max(high, e)
    rows = tuple(r for r in TRN2_SERVING if r.name not in UNFITTED) + UNSEEN_TRN2_SERVING
    for row, (ttft, _) in zip(rows, predict_trn2_serving(hardware, rows), strict=True):
        e = row.ttft_ms * 1e-3 / ttft - 1
        low, high = min(low, e), max(high, e)
    return round(low, 3), round(high, 3)
