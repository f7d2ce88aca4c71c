"""The queueing model of a replica (clustersim.serving.queueing) against the request level
over a grid: one replica, utilisation 10-95% of its saturated capacity (the request level's
all-at-once rate, as the fluid level's curves measure it), lognormal prompts of median 1,024
with sigma 0 to 1.2, Llama 3.1 8B on TP 4 and 70B on TP 16 on Trn2. The model is given that
capacity as its saturated rate (QueueModel's `capacity_per_s`), as the fluid level has it.

The request level's figures of a cell are pooled over several seeds' runs (the first tenth of
each run left out as warm-up), and each cell reports how far its seeds' own figures spread
from the pooled ones and the pooled figure's standard error (the seeds' standard deviation
over the square root of their number). From 85% a run is a few excursions of the admission
queue (the batch full, requests waiting for a place), so seeds of 20,000 requests differ
wildly there and a TTFT p99 pooled over three of them is no reference: the cells pool eight
seeds of 30,000 requests at 70%, sixteen of 100,000 at 85% and twenty-four of 200,000 at
95% (the table gives each cell's standard error and runs). Eight seeds were not enough from
85%: the grid's seeds 5-12 put every cell's TTFT p99 3% to 10% below seeds 13-20's at 85%
and 7% to 16% below seeds 13-20's and 21-28's at 95%, and the wait of those waiting for a
place 4% to 9% below at 95% (the cells share their seeds' arrivals and outputs, so they
err together). Used
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
LOADED = 0.7  # from this utilisation a TTFT p99 from 30,000 requests moves by 5% between seeds
HEAVY = 0.85  # from this utilisation the admission queue's excursions are long


SATURATED = 0.95  # from this utilisation the excursions are longer still


def runs_for(utilisation: float) -> tuple[int, tuple[int, ...]]:
    """(requests per run, seeds) of a cell: enough that the request level is a reference
    (module docstring)."""
    if utilisation < LOADED:
        return 10_000, (5, 6, 7)
    seeds = tuple(range(5, 13))
    if utilisation < HEAVY:
        return 30_000, seeds
    if utilisation < SATURATED:
        return 100_000, tuple(range(5, 21))
    return 200_000, tuple(range(5, 29))


@dataclass(frozen=True)
class Cell:
    model: str
    sigma: float
    utilisation: float
    rate_per_s: float
    measured: tuple[float, float, float]  # request level: TTFT p50, TTFT p99, TPOT p50 (s)
    modelled: tuple[float, float, float]
    seed_spread: tuple[float, float, float]  # largest |seed's figure / pooled - 1|
    standard_error: tuple[float, float, float]  # the pooled figure's, relative to it

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


def _measure(scenario, requests: int, seeds: tuple[int, ...]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pooled figures, largest relative spread of a seed's figures from them, the pooled
    figures' standard error relative to them: the seeds' standard deviation over the
    square root of their number)."""
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
    per_seed = np.array(per_seed)
    spread = np.max(np.abs(per_seed / pooled - 1.0), axis=0)
    error = per_seed.std(axis=0, ddof=1) / np.sqrt(len(seeds)) / pooled
    return pooled, spread, error


def grid(models=MODELS, sigmas=SIGMAS, utilisations=UTILISATIONS) -> list[Cell]:
    cells = []
    for model, tp in models:
        for sigma in sigmas:
            base = cell_scenario(model, tp, sigma, 1.0, 1000)
            capacity = replica_curve(base, base.serve[0]).capacity_per_s
            cost, _, _ = replica_models(base, base.serve[0])
            queue = QueueModel(cost, base.serve[0], capacity)
            for u in utilisations:
                rate = u * capacity
                requests, seeds = runs_for(u)
                measured, spread, error = _measure(cell_scenario(model, tp, sigma, rate, requests),
                                            requests, seeds)
                p50, p99 = queue.ttft_quantiles(rate, np.array([0.5, 0.99]))
                modelled = (float(p50), float(p99), queue.point(rate).tpot_s)
                cells.append(Cell(model, sigma, u, rate, tuple(map(float, measured)),
                                  modelled, tuple(map(float, spread)),
                                  tuple(map(float, error))))
    return cells


def table(cells: list[Cell]) -> str:
    lines = [f"{'model':<13}{'sigma':>6}{'util':>6} | {'TTFT p50 s req/model':>21} "
             f"{'TTFT p99 s req/model':>21} {'TPOT ms req/model':>18} | "
             f"{'gap p50':>7} {'p99':>5} {'tpot':>5} | seeds' spread p50 p99 | s.e. p50 p99 | runs"]
    for c in cells:
        r, m, g, s, e = c.measured, c.modelled, c.gaps, c.seed_spread, c.standard_error
        requests, seeds = runs_for(c.utilisation)
        mark = "" if c.checked else "  beyond CHECKED"
        lines.append(f"{c.model:<13}{c.sigma:>6.1f}{c.utilisation:>6.2f} | "
                     f"{r[0]:9.3f} /{m[0]:9.3f}  {r[1]:9.3f} /{m[1]:9.3f}  "
                     f"{r[2] * 1e3:7.2f} /{m[2] * 1e3:7.2f} | {g[0]:+7.1%} {g[1]:+5.0%} "
                     f"{g[2]:+5.1%} | {s[0]:5.0%} {s[1]:5.0%} | {e[0]:4.1%} {e[1]:4.1%} | "
                     f"{len(seeds)} x {requests:,}{mark}")
    return "\n".join(lines)
