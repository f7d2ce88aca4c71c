"""Compare the serving iteration model with the published Trn1 serving rows.

Rows: Neuron docs, trn1 inference performance, transformers-neuronx, SDK 2.18 (trn1.32xlarge,
TP 32, bf16; TTFT and TPOT p50). The model's TTFT is one prefill iteration of the batch's
prompts; its TPOT is the mean decode iteration of the batch while the context grows over the
output. Nothing is fitted per row: the catalog's `serving` constants of trn1 apply to all.

    python scripts/calibrate_serving.py [--hbm-efficiency X] [--overhead S]
"""

from __future__ import annotations

import argparse

from clustersim.hardware.catalog import catalog_entry
from clustersim.hardware.topology import build_topology
from clustersim.serving.iteration import IterationModel, ReplicaShape
from clustersim.serving.replica import DecodeCost
from clustersim.training.transformer import TransformerShape, model_preset_values

# model, batch, input, output, TTFT ms, TPOT ms: AWS Neuron docs, trn1 inference performance
# page (transformers-neuronx, SDK 2.18).
ROWS = [
    ("llama2-7b", 1, 128, 8064, 13.32, 6.70),
    ("llama2-70b", 1, 128, 128, 53.91, 25.18),
    ("llama2-70b", 1, 2048, 2048, 690.96, 26.85),
    ("llama3-70b", 1, 2048, 2048, 547.00, 26.20),
    ("llama2-70b", 4, 128, 1024, 156.69, 27.21),
]


def rows(hbm_efficiency: float | None = None, overhead_s: float | None = None) -> list[dict]:
    hw = catalog_entry("trn1")
    update = {}
    if hbm_efficiency is not None:
        update["hbm_efficiency"] = hbm_efficiency
    if overhead_s is not None:
        update["iteration_overhead_s"] = overhead_s
    if update:
        hw = hw.model_copy(update={"serving": hw.serving.model_copy(update=update)})
    topology = build_topology(hw, 1)
    out = []
    for name, batch, inputs, outputs, ttft_ms, tpot_ms in ROWS:
        model = TransformerShape(**model_preset_values(name))
        cost = DecodeCost(IterationModel(ReplicaShape(model, "bf16", 32, 1), topology))
        ttft = cost.target.iteration_s([(inputs, 0)] * batch, 0, 0.0, batch) * 1e3
        n = outputs - 1
        tpot = cost.run_s(batch, batch * (inputs + 1), n) / n * 1e3
        out.append({"model": name, "batch": batch, "tokens": f"{inputs}/{outputs}",
                    "ttft_ms": ttft, "ttft_published_ms": ttft_ms,
                    "ttft_error": ttft / ttft_ms - 1, "tpot_ms": tpot,
                    "tpot_published_ms": tpot_ms, "tpot_error": tpot / tpot_ms - 1})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hbm-efficiency", type=float)
    parser.add_argument("--overhead", type=float, help="seconds per iteration")
    args = parser.parse_args()
    print(f"{'model':<12}{'batch':>6}{'in/out':>11}{'TTFT ms':>10}{'pub':>9}{'err':>8}"
          f"{'TPOT ms':>10}{'pub':>8}{'err':>8}")
    for r in rows(args.hbm_efficiency, args.overhead):
        print(f"{r['model']:<12}{r['batch']:>6}{r['tokens']:>11}{r['ttft_ms']:>10.2f}"
              f"{r['ttft_published_ms']:>9.2f}{r['ttft_error']:>+8.1%}{r['tpot_ms']:>10.2f}"
              f"{r['tpot_published_ms']:>8.2f}{r['tpot_error']:>+8.1%}")


if __name__ == "__main__":
    main()
