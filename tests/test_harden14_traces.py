"""A published trace replays for a window shorter than the trace: the jobs submitted at or
after the scenario's end are left out and counted (`after_end`), not a refusal of the run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cli_helpers import invoke

ROOT = Path(__file__).resolve().parent.parent


def _philly(tmp_path: Path, duration: str) -> tuple[dict, str]:
    for name in ("trace-philly.yaml", "traces/philly-sample.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "scenarios" / name, tmp_path / name)
    result = invoke("run", tmp_path / "trace-philly.yaml", "--set", f"duration={duration}",
                    "--set", "trace.enabled=false", "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out/summary.json").read_text("utf-8"))
    return summary, result.stdout


def test_a_window_of_a_trace_replays_the_jobs_submitted_in_it(tmp_path: Path):
    # the sample's submissions, from its first: 0, 47.5 min, 1 h 48 min (no attempts), 2 h 48 min
    summary, table = _philly(tmp_path, "2h")
    rows = summary["trace_rows"]
    assert rows["replayed"] == 2 and len(summary["jobs"]) == 2
    assert rows["left_out"] == {"no_attempts": 1, "never_started": 0, "no_gpus": 0,
                                "zero_length": 0, "after_end": 1}
    assert rows["rows"] == rows["replayed"] + sum(rows["left_out"].values())
    trace_cell = " ".join(w for line in table.splitlines() if "│" in line
                          for w in line.split("│")[2].split())
    assert "1 submitted at or after the scenario's end" in trace_cell


def test_a_row_s_own_reason_comes_before_the_window(tmp_path: Path):
    # 1 h 30 min: the row without attempts (at 1 h 48 min) is still counted as such
    summary, _ = _philly(tmp_path, "90min")
    assert summary["trace_rows"]["left_out"] == {"no_attempts": 1, "never_started": 0,
                                                 "no_gpus": 0, "zero_length": 0,
                                                 "after_end": 1}
    assert summary["trace_rows"]["replayed"] == 2


def test_the_whole_trace_within_the_duration_leaves_nothing_out(tmp_path: Path):
    summary, _ = _philly(tmp_path, "4d")
    assert summary["trace_rows"]["left_out"]["after_end"] == 0
    assert summary["trace_rows"]["replayed"] == 3
