"""What every command shares: the consoles, the error handling (exit 2 for the user's mistakes,
1 for anything else) and the options several commands take.

Nothing heavy is imported here: `clustersim --version` and `--help` should not pay for numpy,
pandas or pydantic. Commands import the layers they use inside their bodies.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape


class _Console(Console):
    """A line of text goes to a file or a pipe whole: rich would break it at 80 columns
    mid-phrase there. A terminal, or a width asked for with COLUMNS, still wraps at words;
    tables always fit the width."""

    def print(self, *objects: Any, soft_wrap: bool | None = None, **options: Any) -> None:
        if soft_wrap is None:
            soft_wrap = not self.is_terminal and "COLUMNS" not in os.environ
        super().print(*objects, soft_wrap=soft_wrap, **options)


# emoji=False: `A:B:STEP` and user text stay as written (rich turns `:B:` into an emoji).
out_console = _Console(highlight=False, emoji=False)
err_console = _Console(stderr=True, highlight=False, emoji=False)

F = TypeVar("F", bound=Callable[..., Any])


def goodput_share(value: float) -> float:
    """--goodput's check (a range alone let nan through as 'less than or equal to 1')."""
    if not (math.isfinite(value) and 0.01 <= value <= 1.0):
        raise typer.BadParameter(f"{value!r}: expected a share of requests from 0.01 to 1, "
                                 "such as 0.99")
    return value


class UsageProblem(Exception):
    """A bad argument the command itself found (exit 2)."""


def _user_error_types() -> tuple[type[Exception], ...]:
    """The exceptions that mean bad input, not a bug (imported only once something failed)."""
    from clustersim.hardware.topology import TopologyTooLarge
    from clustersim.planning.engine import EngineUnavailable
    from clustersim.runner.outputs import OutputDirError
    from clustersim.scenario.errors import ScenarioError
    from clustersim.training.profile import JobDoesNotFit

    return (ScenarioError, OutputDirError, UsageProblem, JobDoesNotFit, TopologyTooLarge,
            EngineUnavailable)


def user_errors(command: F) -> F:
    """Turn user mistakes into a message and exit 2, and anything else into exit 1. Ctrl-C
    and SIGTERM (raised as KeyboardInterrupt) say so and exit 130 and 143; outputs are
    written whole or not at all, so nothing was written."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from clustersim.runner.interrupts import exit_status, interruptible

        try:
            with interruptible():
                return command(*args, **kwargs)
        except KeyboardInterrupt as interrupt:
            err_console.print("[red]interrupted[/red], nothing written")
            raise typer.Exit(exit_status(interrupt)) from None
        except (typer.Exit, typer.Abort, BrokenPipeError):
            raise  # (a closed stdout, `| head`: clustersim.cli.main ends quietly)
        except Exception as error:
            if isinstance(error, _user_error_types()):
                err_console.print(f"[red]error:[/red] {escape(str(error))}", soft_wrap=True)
                raise typer.Exit(2) from None
            if os.environ.get("CLUSTERSIM_DEBUG"):  # a bug or an environment problem
                raise
            err_console.print(
                f"[red]internal error:[/red] {type(error).__name__}: {escape(str(error))}\n"
                "(set CLUSTERSIM_DEBUG=1 for a traceback)", soft_wrap=True,
            )
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


ScenarioArg = Annotated[Path, typer.Argument(help="Scenario YAML file.", show_default=False)]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a scenario key: PATH=VALUE (repeatable).",
                 show_default=False),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead.")]
