"""The command line: a thin shell over the Python API, one module per command group.

`main` (the console script's and `python -m clustersim`'s entry point) handles SIGINT, SIGTERM
and SIGHUP from its first line, before the command line's modules load: a signal there, or
once the command has returned, exits 128 + its number (130, 143) with a line saying so and
no traceback (it was a KeyboardInterrupt escaping the interpreter, exit -2, or a traceback
and exit 1). Inside a command, `interruptible()` (clustersim.runner.interrupts) takes over
and restores this on the way out. Nothing heavy is imported here.
"""

from __future__ import annotations

import signal
import sys

__all__ = ["main"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupted_outside_a_command(signum: int, _frame: object) -> None:
    """No command is running (it has not started, or has returned): nothing is half-written
    (a command's outputs are committed whole inside it)."""
    try:
        sys.stderr.write(f"interrupted ({signal.Signals(signum).name})\n")
    except Exception:  # noqa: BLE001 - a write the signal interrupted: the status says it
        pass
    raise SystemExit(128 + signum)


def main() -> None:
    """Console-script entry point."""
    for sig in _SIGNALS:
        signal.signal(sig, _interrupted_outside_a_command)
    from clustersim.cli.app import app

    app()
