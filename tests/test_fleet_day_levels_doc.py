"""docs/fleet-day.md's table of the fluid level beside the request level is what
`scripts/bench.py --only "fluid vs request"` prints today (it went stale once: the request
level's TTFT p50 had moved from 68.0 to 59.5 ms and the table still said 68.0)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NAME = "fleet day: fluid vs request level, a day of 8 Llama 3.1 8B replicas at 8-32 requests/s"


def _rows(figures: dict) -> list[str]:
    req, fluid = figures["requests_level"], figures["fluid_level"]
    diff = figures["fluid_vs_requests"]
    rows = [f"| throughput (requests/s) | {req['requests_per_s']:.3f} | "
            f"{fluid['requests_per_s']:.3f} | {diff['requests_per_s']} |"]
    for key, label, digits in (("ttft_p50_s", "TTFT p50", 1), ("ttft_p99_s", "TTFT p99", 1),
                               ("tpot_p50_s", "TPOT p50", 2), ("tpot_p99_s", "TPOT p99", 2)):
        rows.append(f"| {label} | {req[key] * 1e3:.{digits}f} ms | {fluid[key] * 1e3:.{digits}f} ms"
                    f" | {diff[key]} |")
    return rows


@pytest.mark.slow  # a day of 1.7 M requests at the request level (about 31 s of CPU)
def test_the_fluid_against_request_table_is_the_benchmarks():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    result = bench.run_one(bench.BENCHMARKS[NAME][0])
    assert "figures" in result, result
    page = (ROOT / "docs" / "fleet-day.md").read_text()
    missing = [row for row in _rows(result["figures"]) if row not in page]
    assert not missing, missing
