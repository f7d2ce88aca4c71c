"""Session 18 (fix18g2): output folders that hold the user's data are never replaced without
--force (a PNG of theirs in report/, an earlier run of other settings, a sweep into the
traces' folder); `check` reports the reference scenarios it cannot run; the seed a run used
is the one its outputs record."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import SMALL, invoke, refused, write

from clustersim.analysis.report_names import REPORT_FILES


def _traced(tmp_path: Path, **changes) -> Path:
    """A one-instance training scenario with traces (report reads them)."""
    return write(tmp_path, {**SMALL, "trace": {"enabled": True}, **changes})


@pytest.fixture
def reported(tmp_path: Path) -> tuple[Path, Path]:
    """(scenario, OUT): a run with its report (HTML too)."""
    scenario, out = _traced(tmp_path), tmp_path / "out"
    assert invoke("run", scenario, "-o", out).exit_code == 0
    result = invoke("report", out, "--html")
    assert result.exit_code == 0, result.output
    return scenario, out


def test_the_report_writes_only_files_named_as_its_own(reported: tuple[Path, Path]) -> None:
    _, out = reported
    written = {p.name for p in (out / "report").iterdir()}
    assert written and written <= REPORT_FILES


@pytest.mark.parametrize("command", ["run", "report"])
def test_a_png_of_yours_in_report_is_kept_without_force(reported: tuple[Path, Path],
                                                         command: str) -> None:
    """Any *.png in OUT/report/ counted as the report's: `run` and `report` deleted a
    figure of the user's there without --force. Only the names the report writes count."""
    scenario, out = reported
    mine = out / "report" / "my-own-figure.png"
    mine.write_bytes(b"my figure")
    args = ("run", scenario, "-o", out) if command == "run" else ("report", out)
    refused(invoke(*args), "--force")
    assert mine.read_bytes() == b"my figure"
    assert invoke(*args, "--force").exit_code == 0
