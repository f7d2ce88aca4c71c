"""`plan --chips` for a new user (issue 34): a size that factors badly is flagged with sizes
near it that factor well, and hardware of different UltraServer sizes are compared on one
--chips list (each at the whole UltraServers that fit in the size)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clustersim.cli.app import app
from clustersim.planning.planner import _factoring_note, _largest_prime

ROOT = Path(__file__).resolve().parent.parent


def test_a_count_with_a_large_prime_factor_is_flagged_with_neighbours_that_factor_well():
    # 131,328 Trn3 Gen2 chips are 912 UltraServers of 144 = 2^4 x 3 x 19 (the plan's best
    # had PP 57 and 7.5% MFU); 147,456 are 1,024
    (note,) = _factoring_note("trn3-gen2", 131_328, 144, "UltraServers")
    assert "prime 19" in note and "124,416 and 139,968 chips" in note
    assert _factoring_note("trn3-gen2", 147_456, 144, "UltraServers") == []
    assert _largest_prime(864) == 3 and _largest_prime(972) == 3 and _largest_prime(19) == 19


@pytest.mark.slow  # two hardware entries at 2,700 chips: about 8 s of CPU
def test_hardware_of_different_ultraserver_sizes_share_one_chips_list(tmp_path: Path):
    result = CliRunner().invoke(app, [
        "plan", str(ROOT / "scenarios" / "quickstart.yaml"), "--hardware", "trn2u,trn3-gen2",
        "--chips", "2736", "-o", str(tmp_path / "plan")])
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    notes = " ".join(plan["notes"])
    # both are planned on the one list: trn2u rounded down to whole UltraServers; 19 Trn3
    # UltraServers leave no layout (tp at most the 32 query heads, dp 19 does not divide the
    # batch), which the plan says rather than dropping the hardware
    assert {c["hardware"] for c in plan["candidates"]} <= {"trn2u", "trn3-gen2"}
    assert "trn2u" in {c["hardware"] for c in plan["candidates"]}
    assert ("trn3-gen2" in {c["hardware"] for c in plan["candidates"]}
            or "trn3-gen2 x 2,736 chips: nothing runs" in notes)
    assert "trn2u: 2,736 chips" in notes and "planned at 2,688" in notes  # 42 of 64 chips
    assert "trn3-gen2: 2,736 chips is 19 UltraServers" in notes and "factors badly" in notes
    assert "factors badly" in result.output  # printed, not only in plan.json
