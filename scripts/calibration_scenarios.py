"""Write every calibration row as a scenario file under scenarios/calibration/.

    python scripts/calibration_scenarios.py

serving/: the published serving rows (with the trace of their requests beside each file);
training/: the published training rows. clustersim/calibration/scenarios.py builds them from
the rows' tables (clustersim/calibration/*.py); tests/test_calibration_scenarios.py fails when
a file in the repository is not what this script writes, so the files cannot drift from the
tables the fits use.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clustersim.calibration.scenarios import CALIBRATION_DIR, write_files  # noqa: E402


def main() -> None:
    written = write_files()
    print(f"wrote {len(written)} files under {CALIBRATION_DIR}")


if __name__ == "__main__":
    main()
