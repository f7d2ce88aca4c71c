"""The queueing model of a replica (clustersim.serving.queueing) against the request level
over a grid: one replica, utilisation 10-95% of its saturated capacity (the request level's
all-at-once rate, as the fluid level's curves measure it), lognormal prompts of median 1,024
with sigma 0 to 1.2, Llama 3.1 8B on TP 4 and 70B on TP 16 on Trn2.

The request level's figures of a cell are pooled over three seeds' runs (the first tenth of
each run left out as warm-up), and each cell reports how far its seeds' own figures spread
from the pooled ones: a TTFT p99 from a few thousand requests moves by 10% between seeds
(it is the few longest prompts'), and near saturation a run is one excursion of the
admission queue, so the cells from 85% run twice as long. Used
by tests/test_fluid_queue.py (which prints the grid and checks it) and quoted in
docs/fleet-day.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clustersim.scenario.loader import scenario_from_dict
from clustersim.serving.curves import replica_curve
from clustersim.serving.queueing import QueueModel, checked
from clustersim.serving.simulate import replica_models, simulate_serving

__all__ = ["MODELS", "SIGMAS", "UTILISATIONS", "Cell", "cell_scenario", "grid", "table",
           "runs_for"]

MODELS = (("llama3.1-8b", 4), ("llama3.1-70b", 16))
SIGMAS = (0.0, 0.4, 0.8, 1.2)
UTILISATIONS = (0.1, 0.3, 0.5, 0.7, 0.85, 0.95)
HEAVY = 0.85  # from this utilisation the admission queue's excursions are long


def runs_for(utilisation: float) -> tuple[int, tuple[int, ...]]:
    """(requests per run, seeds) of a cell."""
    if utilisation < HEAVY:
        return 10_000, (5, 6, 7)
    return 20_000, (5, 6, 7)


@dataclass(frozen=True)
class Cell:
    model: str
    sigma: float
    utilisation: float
    rate_per_s: float
    measured: tuple[float, float, float]  # request level: TTFT p50, TTFT p99, TPOT p50 (s)
    modelled: tuple[float, float, float]
    seed_spread: tuple[float, float, float]  # largest |seed's figure / pooled - 1|

    @property
    def gaps(self) -> tuple[float, float, float]:
        return tuple(m / r - 1 for m, r in zip(self.modelled, self.measured, strict=True))

    @property
    def checked(self) -> bool:
        return checked(self.utilisation, self.sigma)


def cell_scenario(model: str, tp: int, sigma: float, rate_per_s: float, requests: int):
    prompts = ({"distribution": "lognormal", "median": 1024, "sigma": sigma, "max": 8192}
               if sigma > 0 else {"distribution": "fixed", "value": 1024})
    d = {"name": "chat", "model": model, "parallelism": {"tp": tp}, "replicas": 1,
         "fidelity": "requests", "slo": {"ttft": "2s", "tpot": "100ms"},
         "workload": {"rate": f"{rate_per_s}/s", "requests": requests, "input_tokens": prompts,
                      "output_tokens": {"distribution": "lognormal", "median": 256,
                                        "sigma": 0.8, "max": 2048}}}
    return scenario_from_dict({"name": "grid", "duration": "1d", "hardware": "trn2",
                               "cluster": {"instances": 4}, "serve": [d]})


def _figures(ttft: np.ndarray, tpot: np.ndarray) -> np.ndarray:
    return np.array([np.quantile(ttft, 0.5), np.quantile(ttft, 0.99), np.median(tpot)])


def _measure(scenario, requests: int, seeds: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(pooled figures, largest relative spread of a seed's figures from them)."""
    ttfts, tpots, per_seed = [], [], []
    for seed in seeds:
        f = simulate_serving(scenario, np.random.SeedSequence(seed)).fleets["chat"]
        keep = (f.status == 1) & (np.arange(len(f.status)) >= requests // 10)
        ttft = f.first_token_s[keep] - f.arrival_s[keep]
        outputs = f.output_tokens[keep]
        decoding = outputs > 1
        tpot = ((f.finish_s[keep] - f.first_token_s[keep])
                / np.maximum(outputs - 1, 1))[decoding]
        ttfts.append(ttft)
        tpots.append(tpot)
        per_seed.append(_figures(ttft, tpot))
    pooled = _figures(np.concatenate(ttfts), np.concatenate(tpots))
    spread = np.max(np.abs(np.array(per_seed) / pooled - 1.0), axis=0)
    return pooled, spread


def grid(models=MODELS, sigmas=SIGMAS, utilisations=UTILISATIONS) -> list[Cell]:
    cells = []
    for model, tp in models:
        for sigma in sigmas:
            base = cell_scenario(model, tp, sigma, 1.0, 1000)
            capacity = replica_curve(base, base.serve[0]).capacity_per_s
            cost, _, _ = replica_models(base, base.serve[0])
            queue = QueueModel(cost, base.serve[0])
            for u in utilisations:
                rate = u * capacity
                requests, seeds = runs_for(u)
                measured, spread = _measure(cell_scenario(model, tp, sigma, rate, requests),
                                            requests, seeds)
                p50, p99 = queue.ttft_quantiles(rate, np.array([0.5, 0.99]))
                modelled = (float(p50), float(p99), queue.point(rate).tpot_s)
                cells.append(Cell(model, sigma, u, rate, tuple(map(float, measured)),
                                  modelled, tuple(map(float, spread))))
    return cells


def table(cells: list[Cell]) -> str:
    lines = [f"{'model':<13}{'sigma':>6}{'util':>6} | {'TTFT p50 s req/model':>21} "
             f"{'TTFT p99 s req/model':>21} {'TPOT ms req/model':>18} | "
             f"{'gap p50':>7} {'p99':>5} {'tpot':>5} | seeds' spread p50 p99"]
    for c in cells:
        r, m, g, s = c.measured, c.modelled, c.gaps, c.seed_spread
        mark = "" if c.checked else "  beyond CHECKED"
        lines.append(f"{c.model:<13}{c.sigma:>6.1f}{c.utilisation:>6.2f} | "
                     f"{r[0]:9.3f} /{m[0]:9.3f}  {r[1]:9.3f} /{m[1]:9.3f}  "
                     f"{r[2] * 1e3:7.2f} /{m[2] * 1e3:7.2f} | {g[0]:+7.1%} {g[1]:+5.0%} "
                     f"{g[2]:+5.1%} | {s[0]:5.0%} {s[1]:5.0%}{mark}")
    return "\n".join(lines)
