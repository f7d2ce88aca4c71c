"""`clustersim` command line: a thin shell over the Python API (docs/cli.md).

One module per command group, registered here in the order `--help` lists them: `run`;
`sweep` and `check` (experiments); `validate`, `topology`, `hardware`, `models` and `schema` (inspect);
`step` and `collective` (model); `plan`; `report`. Shared consoles, options and error
handling are in `clustersim.cli.common`.

Exit status: 0 success; 2 bad scenario, bad arguments or refused output directory (a message
on stderr naming the file, key path, value and what was expected, never a traceback);
1 anything else.
"""

from __future__ import annotations

from typing import Annotated

import typer

from clustersim.cli import experiments, inspect, model, plan, report, run
from clustersim.cli.common import out_console

app = typer.Typer(
    name="clustersim",
    help="Simulate large AWS Trainium clusters: topology, collectives, steps, failures, goodput.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        import clustersim

        out_console.print(f"clustersim {clustersim.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """clustersim: a discrete-event simulator of large Trainium clusters."""


for _command in (
    run.run,
    experiments.sweep,
    experiments.check,
    inspect.validate,
    inspect.topology,
    model.step,
    inspect.hardware,
    inspect.models,
    model.collective,
    plan.plan,
    report.report,
    inspect.schema,
):
    app.command()(_command)


def main() -> None:
    """Console-script entry point (clustersim.cli.main: signals handled from its first line)."""
    from clustersim.cli import main as entry

    entry()


if __name__ == "__main__":
    main()
