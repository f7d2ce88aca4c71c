"""Compare the serving iteration model with the published Trn1 serving rows.

Rows (`clustersim.calibration.serving`, sources in docs/calibration.md): Neuron docs, trn1
inference performance, transformers-neuronx, SDK 2.18 (trn1.32xlarge, TP 32, bf16; TTFT and
TPOT p50). The model's TTFT is one prefill iteration of the batch's prompts; its TPOT is the
mean decode iteration of the batch while the context grows over the output. Nothing is
fitted per row: the catalog's trn1 constants apply to all (they are fitted, with the
collectives constants, by scripts/calibrate_collectives.py).

    python scripts/calibrate_serving.py [--hbm-efficiency X] [--overhead S]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clustersim.calibration.serving import SERVING_MEASUREMENTS, predict_serving  # noqa: E402
from clustersim.hardware.catalog import catalog_entry  # noqa: E402


def rows(hbm_efficiency: float | None = None, overhead_s: float | None = None) -> list[dict]:
    hw = catalog_entry("trn1")
    update = {}
    if hbm_efficiency is not None:
        update["hbm_efficiency"] = hbm_efficiency
    if overhead_s is not None:
        update["iteration_overhead_s"] = overhead_s
    if update:
        hw = hw.model_copy(update={"serving": hw.serving.model_copy(update=update)})
    out = []
    for m, (ttft, tpot) in zip(SERVING_MEASUREMENTS, predict_serving(hw), strict=True):
        out.append({"model": m.model, "batch": m.batch,
                    "tokens": f"{m.input_tokens}/{m.output_tokens}",
                    "ttft_ms": ttft * 1e3, "ttft_published_ms": m.ttft_ms,
                    "ttft_error": ttft * 1e3 / m.ttft_ms - 1, "tpot_ms": tpot * 1e3,
                    "tpot_published_ms": m.tpot_ms, "tpot_error": tpot * 1e3 / m.tpot_ms - 1})
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
